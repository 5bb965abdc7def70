"""`tensorlang data verify`: stored schedules replayed in full (postprocessors, coverage, conversion)."""
import json
import subprocess
import sys

from tensorlang import api
from tensorlang.data import dataset
from tensorlang.data.collect import op_hash
from tensorlang.data.corpus_check import verify
from tensorlang.space import sentence as S
from tensorlang.space.space import Point, Space

from conftest import ROOT


def _write_corpus(root):
    """Sampled sentences of softmax (CPU) as the pre-training corpus stores them, measured-style records of
    matmul (sketch + decisions), and one matmul record whose tile factors do not multiply to the extent."""
    file = str(ROOT / "examples" / "matmul.tsched")
    doc = api.load(file)
    mm = Space(doc.model.ops["matmul"], doc.primfunc("matmul"), doc.model.targets["cpu"])
    sm_file = str(ROOT / "examples" / "softmax.tsched")
    sm_doc = api.load(sm_file)
    sm = Space(sm_doc.model.ops["softmax"], sm_doc.primfunc("softmax"), sm_doc.model.targets["cpu"])
    with dataset.Writer(root / "pre") as w:
        for i, (sketch, decisions, kinds) in enumerate(sm.sample_decisions(3, seed=1)):
            w.append({"key": f"s{i}", "task": {"file": sm_file, "op": "softmax", "hash": op_hash(sm.op)},
                      "target": "cpu", "sentence": " ".join(S.encode(sm, Point(sketch, decisions), list(kinds)))})
    with dataset.Writer(root / "measured") as w:
        points, _ = mm.sample(2, seed=2)
        bad = [list(d) if isinstance(d, tuple) else d for d in points[0].decisions]
        bad[0] = [bad[0][0] * 2] + bad[0][1:]  # factors no longer multiply to the loop's extent
        for i, decisions in enumerate([points[0].decisions, points[1].decisions, bad]):
            w.append({"key": f"m{i}", "task": {"file": file, "op": "matmul", "hash": op_hash(mm.op)}, "target": "cpu",
                      "sketch": points[0 if i != 1 else 1].sketch,
                      "decisions": [list(d) if isinstance(d, tuple) else d for d in decisions]})


def test_verify_replays_every_record_and_names_the_one_outside_the_space(tmp_path):
    _write_corpus(tmp_path)
    rep = verify([tmp_path / "pre", tmp_path / "measured"], per_task=3)
    assert (rep.tasks, rep.replayed, rep.skipped) == (2, 6, [])
    [(label, target, sketch, why)] = rep.rejected
    assert label.endswith("matmul.tsched:matmul") and target == "cpu" and "decision 0" in why and "outside" in why


def test_verify_cli_exit_status_and_json(tmp_path):
    _write_corpus(tmp_path)
    out = subprocess.run([sys.executable, "-m", "tensorlang", "data", "verify", str(tmp_path / "pre"), "--per-task", "1",
                          "--json", str(tmp_path / "r.json")], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "1 tasks, 1 schedules replayed in full, 0 rejected" in out.stdout
    assert json.loads((tmp_path / "r.json").read_text())["replayed"] == 1
    out = subprocess.run([sys.executable, "-m", "tensorlang", "data", "verify", str(tmp_path / "measured"),
                          "--per-task", "3"], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert out.returncode == 1 and "1 rejected" in out.stdout and "rejected: " in out.stdout
