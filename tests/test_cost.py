"""The cost model (tensorlang/cost): per-store features of replayed records, XGBoost trained on measured
records, the rule that keeps the one-pass schedule unless a sample is clearly better, policy `tlm-ranked:K`,
and `tensorlang cost-model` with its feature cache. The records are the repository's own measurements of the
bundled examples."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_choose_keeps_the_one_pass_schedule_unless_a_sample_is_predicted_clearly_faster():
    from tensorlang.cost.model import MARGIN, choose
    assert MARGIN == pytest.approx(0.1)
    assert choose([0.5, 0.55, 0.59]) == 0  # the best sample is within the margin
    assert choose([0.5, 0.7, 0.61]) == 1
    assert choose([0.5, 0.61, 0.7, 0.7]) == 2  # ties: the lowest index
    assert choose([0.9]) == 0
    assert choose([0.5, 0.55], margin=0.0) == 1


@pytest.fixture(scope="module")
def example_records():
    """Correct records of two bundled examples, timed on one machine (the corpus's own)."""
    from tensorlang.data import dataset
    out = {}
    for r in dataset.read(ROOT / "data" / "measured" / "llvm"):
        if r.get("status") == "ok" and r["task"]["file"] in ("examples/matmul.tsched", "examples/softmax.tsched"):
            out.setdefault(r.get("machine"), []).append(r)
    machine = max(out, key=lambda m: len(out[m]))
    recs = out[machine]
    return [r for r in recs if r["task"]["op"] == "matmul"][:24] + [r for r in recs if r["task"]["op"] == "softmax"][:24]


@pytest.fixture(scope="module")
def example_features(example_records):
    from tensorlang.cost.features import record_features
    old = os.getcwd()
    os.chdir(ROOT)  # records name their files relative to the repository
    try:
        return record_features(example_records, workers=1)
    finally:
        os.chdir(old)


def test_features_are_fixed_width_deterministic_and_tell_schedules_apart(example_records, example_features,
                                                                        monkeypatch):
    from tensorlang.cost.features import WIDTH, record_features
    feats, failed = example_features
    assert failed == [] and set(feats) == {r["key"] for r in example_records}
    assert all(v.shape == (WIDTH,) and np.isfinite(v).all() for v in feats.values())
    first = example_records[:3]
    monkeypatch.chdir(ROOT)
    again, _ = record_features(first, workers=1)
    for r in first:
        np.testing.assert_array_equal(again[r["key"]], feats[r["key"]])
    # different decisions of one task are different loop nests
    mm = [r for r in example_records if r["task"]["op"] == "matmul"]
    distinct = {tuple(map(str, r["decisions"])) for r in mm}
    assert len({feats[r["key"]].tobytes() for r in mm}) >= len(distinct) - 2


def test_trained_model_picks_fast_schedules_of_its_tasks_and_round_trips(tmp_path, example_records, example_features):
    from tensorlang.cost import model as C
    from tensorlang.cost.features import FEATURES_VERSION
    feats, _ = example_features
    model = C.train(example_records, feats, validation=example_records, rounds=60)
    card = model.card
    assert card["records"] == len(example_records) and card["tasks"] == 2 and card["features"] == FEATURES_VERSION
    q = card["validation"]  # here the training records themselves: the fit
    assert q["tasks"] == 2 and q["picked_over_best"] > max(0.8, q["random_over_best"])
    model.save(tmp_path / "cm")
    back = C.CostModel.load(tmp_path / "cm")
    X = np.stack([feats[r["key"]] for r in example_records])
    np.testing.assert_allclose(back.predict(X), model.predict(X), rtol=1e-6)
    assert back.card == card
    (tmp_path / "cm" / C.CARD_FILE).write_text('{"features": "another:9"}')
    with pytest.raises(ValueError, match="another:9"):
        C.CostModel.load(tmp_path / "cm")


def _matmul():
    from tensorlang import api
    doc = api.load(ROOT / "examples" / "matmul.tsched")
    op = doc.model.ops["matmul"]
    return doc, op


def test_policy_tlm_ranked_keeps_the_candidate_the_cost_model_chooses():
    from tensorlang.baselines import generate
    from tensorlang.baselines.tlm import candidates
    from tensorlang.cost.features import features
    from tensorlang.cost.model import CostModel, choose
    from tensorlang.lm.generate import default_generator
    from tensorlang.space.space import Space
    doc, op = _matmul()
    cpu = doc.model.targets["cpu"]
    space = Space(op, doc.primfunc("matmul"), cpu)
    outs = candidates(default_generator(), space, 6, seed=0, per_sketch=True)
    sampled = default_generator().sample(space, 6, seed=0)  # the samples first, then the other sketches' schedules
    assert [o.schedule_text for o in outs[:len(sampled)]] == [o.schedule_text for o in sampled]
    assert len({o.point.sketch for o in outs}) == len(space.usable)  # every sketch among the candidates
    quality = CostModel.load().predict(np.stack([features(space, o.point.mod) for o in outs]))
    expected = outs[choose(quality)].schedule_text
    g = generate("tlm-ranked:6", doc.primfunc("matmul"), op, cpu)
    assert g.policy == "tlm-ranked:6" and g.schedule_text == expected
    assert not [d for d in g.diagnostics if d.code == "TS411"]
    # a GPU target: no GPU measurement in the cost model's data, so the one-pass schedule, said once
    gpu = doc.model.targets["h200"]
    g = generate("tlm-ranked:6", doc.primfunc("matmul"), op, gpu)
    one_pass = default_generator().generate(Space(op, doc.primfunc("matmul"), gpu)).schedule_text
    assert g.schedule_text == one_pass
    assert [d.code for d in g.diagnostics if d.code == "TS411"] == ["TS411"]


def test_cost_model_cli_trains_on_a_dataset_and_featurizes_only_new_records(tmp_path, example_records):
    from tensorlang.cost.model import CostModel
    from tensorlang.data.dataset import Writer
    data = tmp_path / "measured"
    with Writer(data) as w:
        for r in example_records[:10] + example_records[24:34]:
            w.append(r)
    cmd = [sys.executable, "-m", "tensorlang", "cost-model", "--measured", str(data), "--cache",
           str(tmp_path / "f.npz"), "--workers", "1", "--rounds", "20", "-o", str(tmp_path / "cm")]
    env = dict(os.environ, TENSORLANG_MEASURE_LOCK=str(tmp_path / "lock"))
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "featurizing 20 records (0 cached)" in r.stderr
    assert CostModel.load(tmp_path / "cm").card["records"] == 20
    with Writer(data) as w:
        for rec in example_records[10:12]:
            w.append(rec)
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "featurizing 2 records (20 cached)" in r.stderr
    assert CostModel.load(tmp_path / "cm").card["records"] == 22


def test_generate_ranked_says_which_candidate_the_cost_model_kept():
    from tensorlang import api
    from tensorlang.baselines.tlm import candidates
    from tensorlang.cost.features import features
    from tensorlang.cost.model import CostModel, choose
    from tensorlang.lm.generate import default_generator
    from tensorlang.space.space import Space
    file = ROOT / "examples" / "auto.tsched"
    src = file.read_text()
    r = subprocess.run([sys.executable, "-m", "tensorlang", "generate", str(file), "--target", "llvm", "--op",
                        "attention_scores", "--samples", "4", "--ranked"],
                       capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert r.returncode == 0, r.stderr
    d = api.load(file)
    space = Space(d.model.ops["attention_scores"], d.primfunc("attention_scores"), api.resolve_target(d, "llvm"))
    outs = candidates(default_generator(), space, 4, seed=0, per_sketch=True)
    kept = choose(CostModel.load().predict(np.stack([features(space, o.point.mod) for o in outs])))
    assert f"candidate {kept} of {len(outs)} as ranked by the cost model cost-perstore164" in r.stdout
    assert "schedule attention_scores on llvm" in r.stdout
    assert src == file.read_text()  # written only with --write
