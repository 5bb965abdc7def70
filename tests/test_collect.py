"""The measured dataset survives kill -9 at any point: no loss, no duplicates, no torn records."""
import gzip
import json
import os
import random
import signal
import subprocess
import sys
import time

import pytest

from tensorlang.data import dataset
from tensorlang import machine
from tensorlang.data.collect import record_key, stats
from tensorlang.machine import HOST_ENV

from conftest import ROOT

WRITER = r"""
import sys
from tensorlang.data.dataset import Writer
root, n = sys.argv[1], int(sys.argv[2])
w = Writer(root, shard_records=7)
for i in range(n):
    key = f"k{i:05d}"
    if w.append({"key": key, "payload": "x" * (i % 50), "i": i}):
        print(key, flush=True)  # acknowledged: durable on disk
w.close(compress_open=True)
print("done", flush=True)
"""


ROWSUM = ("target cpu = llvm(cores = 1)\n\nop rowsum(X: f32[64, 256]) -> S: f32[64] {\n"
          "    S[i] += X[i, k]\n}\n")


def rowsum_tasks(tmp_path):
    """A directory holding one small reduction task, and an environment whose measurement lock is the
    test's own (a background collector's lock must not make the test wait) and that measures as the real
    host (collect refuses to record under the host override: test_machine.py)."""
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    (tasks / "rowsum.tsched").write_text(ROWSUM)
    env = dict(os.environ, TENSORLANG_MEASURE_LOCK=str(tmp_path / "lock"))
    env.pop(HOST_ENV, None)
    return tasks, env


def _drain(p, acknowledged):
    for line in p.stdout:
        if line.strip() and line.strip() != "done":
            acknowledged.add(line.strip())


def test_dataset_survives_kill_minus_nine_at_random_points(tmp_path):
    root = tmp_path / "ds"
    rng = random.Random(1234)
    acknowledged = set()
    n = 20000  # 24 writers killed within 0.5 s of their start write ~7,000 on a fast disk (znver4): 5,000 were done
    for _ in range(24):  # 24 kills, each at a random moment of a writer's life
        p = subprocess.Popen([sys.executable, "-c", WRITER, str(root), str(n)], stdout=subprocess.PIPE, text=True)
        time.sleep(rng.uniform(0.08, 0.5))
        p.send_signal(signal.SIGKILL)
        p.wait()
        _drain(p, acknowledged)
        plain = sorted(root.glob("shard-*.jsonl"))
        if plain and rng.random() < 0.5:  # a torn tail, as a kill in the middle of a write leaves
            with open(plain[-1], "a") as f:
                f.write('{"key": "torn", "i": ')
    assert len(acknowledged) < n  # the kills came before the end
    p = subprocess.run([sys.executable, "-c", WRITER, str(root), str(n)], capture_output=True, text=True, timeout=300)
    assert p.stdout.strip().endswith("done")
    records = list(dataset.read(root))
    keys = [r["key"] for r in records]
    assert len(keys) == len(set(keys)) == n  # everything, once
    assert acknowledged <= set(keys)  # nothing acknowledged was lost
    assert all(r["sha256"] == dataset.checksum(r) for r in records)
    assert not list(root.glob("*.tmp")) and not list(root.glob("shard-*.jsonl"))  # compressed at the end


def test_a_kill_between_compressing_a_shard_and_removing_its_plain_copy_leaves_no_leftover(tmp_path):
    """`compress` puts the .gz in place, then removes the plain shard; a kill between the two leaves both.
    The reader prefers the .gz; the next writer -- even one with nothing new to write -- removes the copy
    (this was the kill test's flake: a final writer with nothing to write left shard-*.jsonl behind)."""
    root = tmp_path / "ds"
    with dataset.Writer(root, shard_records=3) as w:
        for i in range(4):
            w.append({"key": f"k{i}"})
    gz = root / "shard-000000.jsonl.gz"  # full, so compressed when the writer moved on to shard 1
    (root / "shard-000000.jsonl").write_bytes(gzip.decompress(gz.read_bytes()))  # the copy a kill leaves
    assert sorted(r["key"] for r in dataset.read(root)) == ["k0", "k1", "k2", "k3"]
    w = dataset.Writer(root, shard_records=3)
    assert not w.append({"key": "k1"})  # nothing new
    w.close(compress_open=True)
    assert sorted(p.name for p in root.iterdir()) == ["shard-000000.jsonl.gz", "shard-000001.jsonl.gz"]
    assert sorted(r["key"] for r in dataset.read(root)) == ["k0", "k1", "k2", "k3"]


def test_collect_resumes_after_kills_without_duplicates(tmp_path):
    tasks, env = rowsum_tasks(tmp_path)
    out = tmp_path / "measured"
    cmd = [sys.executable, "-m", "tensorlang", "collect", str(tasks), "--target", "cpu", "--trials", "6",
           "--batch", "2", "--repeat", "2", "-o", str(out)]
    for delay in (9.0, 13.0):
        p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
                             start_new_session=True)
        time.sleep(delay)
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr
    records = list(dataset.read(out))
    keys = [x["key"] for x in records]
    assert len(keys) == len(set(keys)) == 6
    assert {x["status"] for x in records} == {"ok"}
    from tensorlang.space import sentence as S
    assert all(x["sentence"].split()[:4] == S.version_tokens() for x in records)
    real = machine._host(None)  # each record names the CPU that timed it and the one it was built for
    assert {x["machine"] for x in records} == {x["host"]["id"] for x in records} == {real.id}
    assert {x["host"]["cpu"] for x in records} == {x["compiled_for"] for x in records} == {real.name}
    assert all(x["key"] == record_key(x["task"]["hash"], "cpu", real.id, x["sketch"], x["decisions"]) for x in records)
    s = stats([out])
    assert s["tasks"] == 1 and s["measured_records"] == 6 and "pretrain_sentences" in s
    again = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert "'written': 0" in again.stdout and "'skipped': 6" in again.stdout


def test_sigterm_ends_a_collect_with_its_workers_and_keeps_what_it_measured(tmp_path):
    """`kill -TERM` of a collect (what a job runner sends) ends it as Ctrl-C does: its build workers and kernel
    runners go with it instead of living on as orphans, and a rerun measures only what is left."""
    import psutil
    tasks, env = rowsum_tasks(tmp_path)
    out = tmp_path / "measured"
    cmd = [sys.executable, "-m", "tensorlang", "collect", str(tasks), "--target", "cpu", "--trials", "8",
           "--batch", "2", "--repeat", "2", "-o", str(out)]
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, start_new_session=True)
    try:
        parent, workers, deadline = psutil.Process(p.pid), [], time.monotonic() + 120
        while time.monotonic() < deadline and not (len(workers) >= 2 and list(dataset.read(out))):
            time.sleep(0.5)  # until the build pool and a kernel runner are up and a record is written
            workers = parent.children(recursive=True)
        assert len(workers) >= 2 and p.poll() is None
        p.send_signal(signal.SIGTERM)
        assert p.wait(timeout=60) == 128 + signal.SIGTERM
        gone, alive = psutil.wait_procs(workers, timeout=15)
        assert alive == []
        # the shard it was writing is compressed on the way out: nothing to compress by hand before a commit
        assert list(out.glob("shard-*.jsonl.gz")) and not list(out.glob("shard-*.jsonl"))
    finally:  # whatever is left of the run's process group (all of it, when the test fails)
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        p.wait()
    first = len(list(dataset.read(out)))
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr
    keys = [x["key"] for x in dataset.read(out)]
    assert len(keys) == len(set(keys)) == 8 and f"'skipped': {first}" in r.stdout


def test_candidates_are_the_seeded_samples_and_measured_ones_are_not_replayed(monkeypatch):
    """candidates_for draws decisions first: the same candidates as roller + `space.sample(count, seed)`, and
    the ones already measured are left out before any replay (a rerun used to re-sample them all)."""
    from tensorlang import api
    from tensorlang.baselines.roller import roller_point
    from tensorlang.data.collect import candidates_for, task_hash
    from tensorlang.space.space import Space
    doc = api.load(ROOT / "examples" / "softmax.tsched")
    space = Space(doc.model.ops["softmax"], doc.primfunc("softmax"), doc.model.targets["cpu"])
    key = task_hash(space)
    cands, known = candidates_for(space, key, 10)
    roller = roller_point(space)
    samples, _ = space.sample(10, seed=int(key, 16) % (1 << 31))
    want = [(roller.sketch, roller.decisions)] + [(p.sketch, p.decisions) for p in samples
                                                   if (p.sketch, p.decisions) != (roller.sketch, roller.decisions)]
    assert [(p.sketch, p.decisions) for _, p in cands] == want[:10] and known == 0
    assert [pol for pol, _ in cands] == ["roller"] + ["random"] * 9
    assert all(p.stmts for _, p in cands)  # replayed in full, with their statements
    # the very schedules `sample` gives (a replay that is handed its decision points -- replay(known=...) --
    # skips the lookups TVM records in the trace while they are made, and converts to other statements)
    by_point = {(p.sketch, p.decisions): p for p in samples}
    for _, p in cands[1:]:
        assert p.stmts == by_point[(p.sketch, p.decisions)].stmts
    measured = set(want[:4])
    replays = []
    real = space.replay
    monkeypatch.setattr(space, "replay", lambda sketch, choose, **kw: (
        replays.append(sketch) if kw.get("convert", True) else None, real(sketch, choose, **kw))[1])
    roller_point(space)
    by_roller = len(replays)
    rest, known = candidates_for(space, key, 10, lambda sketch, decisions: (sketch, decisions) in measured)
    assert [(p.sketch, p.decisions) for _, p in rest] == want[4:10] and known == 4
    assert len(replays) - 2 * by_roller == 6  # replayed in full: the 6 to measure, not the 3 measured samples
    # a one-point space gives up after a few draws, not 50 per candidate
    doc = api.load_text("target cpu = llvm()\n\nop cp(X: f32[4, 4]) -> Y: f32[4, 4] {\n    Y[i, j] = X[i, j]\n}\n",
                        "cp.tsched")
    small = Space(doc.model.ops["cp"], doc.primfunc("cp"), doc.model.targets["cpu"])
    bound, _ = small.count(limit=0)
    calls = []
    real_small = small.replay
    monkeypatch.setattr(small, "replay", lambda sketch, choose, **kw: (calls.append(1), real_small(sketch, choose, **kw))[1])
    points, _ = small.sample(12, seed=0)
    assert len(points) <= bound and len(calls) <= 30 * bound + 30 + len(small.usable)


def test_data_stats_json_keys(tmp_path):
    out = subprocess.run([sys.executable, "-m", "tensorlang", "data", "stats", "--json", "--measured",
                          str(tmp_path), "--pretrain", str(tmp_path)], capture_output=True, text=True, timeout=120)
    data = json.loads(out.stdout)
    assert {"tasks", "measured_records", "pretrain_sentences"} <= set(data)


def test_collect_measures_metaschedule_candidates_once(tmp_path):
    """--metaschedule N: MetaSchedule's best schedules are located in the space, measured and recorded;
    a rerun neither searches again nor measures anything twice."""
    tasks, env = rowsum_tasks(tmp_path)
    out = tmp_path / "measured"
    cmd = [sys.executable, "-m", "tensorlang", "collect", str(tasks), "--target", "cpu", "--trials", "1",
           "--repeat", "2", "--metaschedule", "4", "-o", str(out)]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr
    records = list(dataset.read(out))
    ms = [x for x in records if x["policy"] == "metaschedule:4"]
    assert ms and all(x["status"] == "ok" for x in ms)
    assert len({x["key"] for x in records}) == len(records)
    again = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert "MetaSchedule" not in again.stderr and "'written': 0" in again.stdout


def test_pretrain_sentences_decode_to_legal_points_and_grow_on_rerun(tmp_path):
    """The corpus is sampled without the postprocessors (speed); every sentence must still decode to a
    point that the full replay -- postprocessors included -- accepts, and a rerun with a larger
    per-task count only adds."""
    from tensorlang import api
    from tensorlang.data.collect import pretrain
    from tensorlang.space import sentence as S
    from tensorlang.space.space import Space
    task = tmp_path / "mm.tsched"
    task.write_text("target cpu = llvm(cores = 1)\ntarget gpu = cuda(arch = \"sm_90\")\n\n"
                    "op mm(A: f32[64, 32], B: f32[32, 64]) -> C: f32[64, 64] {\n    C[i, j] += A[i, k] * B[k, j]\n}\n")
    for target in ("cpu", "gpu"):
        out = tmp_path / target
        assert pretrain([str(task)], target, out, per_task=12, log=lambda m: None)["written"] == 12
        assert pretrain([str(task)], target, out, per_task=20, log=lambda m: None) == {"written": 8, "total": 20}
        records = list(dataset.read(out))
        assert len({r["key"] for r in records}) == 20
        doc = api.load(task)
        space = Space(doc.model.ops["mm"], doc.primfunc("mm"), doc.model.targets[target])
        for r in records[:6]:
            sketch, decisions = S.decode(space, r["sentence"].split())
            point = space.replay(sketch, lambda _, made, d=decisions: d[len(made)])  # raises if refused
            assert point.decisions == decisions


def test_data_best_finds_the_workload_under_other_names(tmp_path):
    """best-K is keyed by the operator's name-independent form: a renamed copy of a measured task gets
    its fastest schedules, rendered with its own names."""
    tasks, env = rowsum_tasks(tmp_path)
    out = tmp_path / "measured"
    subprocess.run([sys.executable, "-m", "tensorlang", "collect", str(tasks), "--target", "cpu", "--trials", "3",
                    "--repeat", "2", "-o", str(out)], check=True, capture_output=True, env=env, timeout=600)
    renamed = tmp_path / "renamed.tsched"
    renamed.write_text("target cpu = llvm(cores = 1)\n\nop total(Y: f32[64, 256]) -> T: f32[64] {\n"
                       "    T[r] += Y[r, c]\n}\n")
    r = subprocess.run([sys.executable, "-m", "tensorlang", "data", "best", str(renamed), "--target", "cpu", "-k", "2",
                        "--measured", str(out)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    fastest = min(x["median_s"] for x in dataset.read(out) if x["status"] == "ok")
    assert r.stdout.startswith(f"# 1. {fastest * 1e3:.4f} ms")
    assert r.stdout.count("schedule total on cpu {") == 2 and "rowsum" in r.stdout  # measured for rowsum.tsched
    import re
    body = "".join(line for line in r.stdout.splitlines(True) if not line.startswith("#"))
    assert re.search(r"\bT[.,)]", body) and not re.search(r"\b[SX][.,)]", body)  # this file's names only


def test_relabel_names_the_host_and_keeps_the_old_key(tmp_path):
    """Records made before records named their host get the id of the CPU that timed them, a key made
    with it, `host` and `compiled_for`; the old key stays as key_v1; a second run changes nothing."""
    from tensorlang.data.relabel import described_cpu, relabel
    old_machine = "8e794705f1fd"
    root = tmp_path / "m"
    sentences = ["grammar:1 TARGET llvm cpu:znver4 cores 2 OP", "grammar:1 TARGET llvm cpu:sapphirerapids cores 2 OP"]
    with dataset.Writer(root, shard_records=2) as w:
        for i in range(5):
            d = [[1, i + 1], 2, -2]
            w.append({"key": record_key("t0", "cpu", old_machine, 0, d), "task": {"file": "f", "op": "o", "hash": "t0"},
                      "target": "cpu", "machine": old_machine, "sketch": 0, "decisions": d, "status": "ok",
                      "median_s": 1e-3 * (i + 1), "policy": "random", "sentence": sentences[i % 2]})
        w.close(compress_open=True)
    (root / "metaschedule-32.done").write_text(f"t0|cpu|{old_machine}\n")
    zen4 = described_cpu("znver4", 2, "AMD EPYC")
    assert relabel(root, zen4, old_machine) == {"relabelled": 5, "unchanged": 0, "machine": zen4.id}
    recs = list(dataset.read(root))
    assert len(recs) == 5 and zen4.id != old_machine
    for r in recs:
        assert r["key_v1"] == record_key("t0", "cpu", old_machine, 0, r["decisions"])
        assert r["key"] == record_key("t0", "cpu", zen4.id, 0, r["decisions"])
        assert r["machine"] == r["host"]["id"] == zen4.id and r["host"]["cpu"] == "znver4"
    assert sorted(r["compiled_for"] for r in recs) == ["sapphirerapids"] * 2 + ["znver4"] * 3
    assert (root / "metaschedule-32.done").read_text() == f"t0|cpu|{zen4.id}\n"
    assert stats([root])["per_host"] == {f"znver4 ({zen4.id})": 5}
    assert relabel(root, zen4) == {"relabelled": 0, "unchanged": 5, "machine": zen4.id}
    assert sorted(r["key"] for r in dataset.read(root)) == sorted(r["key"] for r in recs)


def test_rename_machine_rekeys_one_machines_records_and_leaves_the_others(tmp_path):
    from tensorlang.data.relabel import rename_machine
    root = tmp_path / "m"
    with dataset.Writer(root, shard_records=2) as w:
        for i, m in enumerate(["old", "old", "other"]):
            d = [[1, i + 1], -2]
            w.append({"key": record_key("t0", "llvm", m, 0, d), "task": {"file": "f", "op": "o", "hash": "t0"},
                      "target": "llvm", "machine": m, "host": {"id": m}, "sketch": 0, "decisions": d, "status": "ok",
                      "median_s": 1e-3 * (i + 1), "policy": "random"})
        w.close(compress_open=True)
    (root / "metaschedule-32.done").write_text("t0|llvm|old\nt1|llvm|other\n")
    (root / "model-candidates.done").write_text("t0|llvm|old|tlm-4x256_v2+ab|beams=1||samples=8|T=0.4\n")
    assert rename_machine(root, "old", "new") == {"renamed": 2, "unchanged": 1, "machine": "new"}
    recs = list(dataset.read(root))
    assert [r["machine"] for r in recs] == ["new", "new", "other"]
    assert [r["host"]["id"] for r in recs] == ["old", "old", "other"]  # what timed them stays said
    assert all(r["key"] == record_key("t0", "llvm", r["machine"], 0, r["decisions"]) for r in recs)
    assert (root / "metaschedule-32.done").read_text() == "t0|llvm|new\nt1|llvm|other\n"
    assert (root / "model-candidates.done").read_text() == "t0|llvm|new|tlm-4x256_v2+ab|beams=1||samples=8|T=0.4\n"
    assert rename_machine(root, "old", "new")["renamed"] == 0


def test_the_committed_split_is_the_one_the_workloads_give(monkeypatch):
    """data/split.json is derived from the workloads and the task key: regenerate it (`tensorlang data split`)
    whenever either changes. Held out: keys of held-out models that no training model of the split's shares; a
    key shared with one stays in; a training model added later (TinyLlama) holds its copies of held-out keys out."""
    from tensorlang.data import split
    monkeypatch.chdir(ROOT)
    committed = json.loads(split.DEFAULT_PATH.read_text())
    assert committed == split.compute()
    assert committed["heldout"] and committed["shared_with_training"]
    fixed = tuple(f"/{m}" for m in split.FIXED_TRAINING_MODELS)
    for key, files in committed["heldout"].items():
        assert any(("efficientnet-b0" in f or "llama7b-layer" in f) for f in files), files
        assert not any(m in f for f in files for m in fixed), files
    for key, models in committed["shared_with_training"].items():
        assert key not in committed["heldout"] and set(models) & set(split.FIXED_TRAINING_MODELS)
    # TinyLlama's softmax over 32 heads x 128 x 128 is LLaMA-7B's: held out, although TinyLlama is a training model
    softmax = [k for k, fs in committed["heldout"].items() if any("tinyllama-layer/fused_softmax" in f for f in fs)]
    assert len(softmax) == 1 and any("llama7b-layer/" in f for f in committed["heldout"][softmax[0]])


def _collect_rowsum_held_out(tmp_path, *options):
    """`collect` of the rowsum task under a split that holds it out: (its key, the run, training dir, held-out dir)."""
    from tensorlang import api
    from tensorlang.data.collect import op_hash
    tasks, env = rowsum_tasks(tmp_path)
    key = op_hash(api.load(tasks / "rowsum.tsched").model.ops["rowsum"])
    (tmp_path / "split.json").write_text(json.dumps({"heldout": {key: ["rowsum.tsched:rowsum"]}}))
    out, held = tmp_path / "measured" / "llvm", tmp_path / "heldout"
    r = subprocess.run([sys.executable, "-m", "tensorlang", "collect", str(tasks), "--target", "cpu", "--trials", "2",
                        *options, "-o", str(out), "--split", str(tmp_path / "split.json"),
                        "--heldout-output", str(held)], capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr
    return key, r, out, held


def test_collect_records_heldout_tasks_apart(tmp_path):
    key, _, out, held = _collect_rowsum_held_out(tmp_path, "--repeat", "1")
    assert list(dataset.read(out)) == []
    assert [x["task"]["hash"] for x in dataset.read(held)] == [key, key]


def test_move_heldout_takes_the_heldout_tasks_out_of_the_training_data(tmp_path):
    from tensorlang.data.split import move_heldout
    (tmp_path / "split.json").write_text(json.dumps({"heldout": {"h1": ["x.tsched:x"]}}))
    train = tmp_path / "measured" / "llvm"
    with dataset.Writer(train) as w:
        for i, task in enumerate(["t0", "h1", "t0", "h1", "t2"]):
            w.append({"key": f"k{i}", "task": {"hash": task}})
    (train / "metaschedule-32.done").write_text("t0|llvm|m\n")
    assert move_heldout(train, tmp_path / "heldout", tmp_path / "split.json") == {"moved": 2, "kept": 3}
    assert sorted(r["key"] for r in dataset.read(train)) == ["k0", "k2", "k4"]
    assert sorted(r["key"] for r in dataset.read(tmp_path / "heldout")) == ["k1", "k3"]
    assert (train / "metaschedule-32.done").read_text() == "t0|llvm|m\n"
    assert not list(train.parent.glob("llvm.*"))


def test_move_heldout_matches_records_of_an_older_key_by_their_file(tmp_path):
    from tensorlang.data.split import move_heldout
    (tmp_path / "split.json").write_text(json.dumps({"heldout": {"h1": ["m/x.tsched:x"]}}))
    train = tmp_path / "llvm"
    with dataset.Writer(train) as w:
        w.append({"key": "k0", "task": {"hash": "v1-of-h1", "file": "m/x.tsched", "op": "x"}})
        w.append({"key": "k1", "task": {"hash": "t0", "file": "m/y.tsched", "op": "y"}})
    assert move_heldout(train, tmp_path / "heldout", tmp_path / "split.json") == {"moved": 1, "kept": 1}


def test_fewest_records_first_puts_the_least_measured_tasks_first(tmp_path):
    """collect --order fewest-records: tasks ordered by how many records this machine timed of them
    (stable among equals), counted from the dataset by task key."""
    from tensorlang import api
    from tensorlang.data.collect import fewest_records_first, find_tasks, op_hash, record_counts
    files = [str(ROOT / "examples" / f) for f in ("matmul.tsched", "softmax.tsched", "dense_gelu.tsched")]
    tasks = find_tasks(files)
    keys = [op_hash(api.load_text(t.text, t.file).model.ops[t.op]) for t in tasks]
    w = dataset.Writer(tmp_path)
    n = 0
    for key, count in ((keys[0], 3), (keys[2], 1)):
        for _ in range(count):
            n += 1
            w.append({"key": f"r{n}", "task": {"hash": key}, "machine": "m1", "status": "ok"})
    w.append({"key": "other", "task": {"hash": keys[1]}, "machine": "m2", "status": "ok"})  # another machine
    w.close()
    counts = record_counts([tmp_path], "m1")
    assert counts == {keys[0]: 3, keys[2]: 1}
    assert [t.op for t in fewest_records_first(tasks, counts)] == [tasks[1].op, tasks[2].op, tasks[0].op]


def test_collect_writes_into_the_targets_own_dataset_by_default(tmp_path):
    """Without -o the records go to data/measured/<target>, where the next run finds them: a second run
    measures nothing again (the old default, data/measured/cpu for every target, re-measured a whole
    llvm run's candidates)."""
    tasks, env = rowsum_tasks(tmp_path)
    env["PYTHONPATH"] = str(ROOT)
    (tmp_path / "split.json").write_text(json.dumps({"heldout": {}}))
    cmd = [sys.executable, "-m", "tensorlang", "collect", str(tasks), "--target", "llvm", "--trials", "2",
           "--repeat", "1", "--split", str(tmp_path / "split.json")]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert len(list(dataset.read(tmp_path / "data" / "measured" / "llvm"))) == 2
    again = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600, cwd=tmp_path)
    assert again.returncode == 0 and "'written': 0" in again.stdout and "2 records already in" in again.stderr


def test_skip_heldout_leaves_the_heldout_tasks_out_before_any_work(tmp_path):
    _, r, out, held = _collect_rowsum_held_out(tmp_path, "--skip-heldout")
    assert "collect: 0 tasks" in r.stderr and "'written': 0" in r.stdout
    assert not held.exists() and list(dataset.read(out)) == []


def test_interleave_takes_one_task_of_each_path_in_turn(tmp_path):
    """collect --order interleave: the paths' tasks alternate (each path's in its own order), so a budgeted
    run reaches every model; a path given as a file counts as its own source."""
    from tensorlang.data.collect import find_tasks, interleaved
    a, b = tmp_path / "a", tmp_path / "b"
    for d, names in ((a, ("p", "q", "r")), (b, ("x",))):
        d.mkdir()
        for n in names:
            (d / f"{n}.tsched").write_text(ROWSUM.replace("rowsum", n))
    single = str(ROOT / "examples" / "softmax.tsched")
    paths = [str(a), str(b), single]
    tasks = find_tasks(paths)
    assert [t.op for t in tasks] == ["p", "q", "r", "x", "softmax"]
    assert [t.op for t in interleaved(tasks, paths)] == ["p", "x", "softmax", "q", "r"]


def test_a_space_whose_every_point_is_measured_gets_no_search():
    """collect --metaschedule skips a task whose space holds no more points than its records on this machine
    (a reshape's single point): MetaSchedule could only find what is measured. Counted exactly, never
    from the bound, so a large space is always searched."""
    from tensorlang import api
    from tensorlang.data.collect import measured_whole
    from tensorlang.space.space import Space
    f = ROOT / "data/workloads-variants/bert-base-seq384/fused_reshape1_add.tsched"
    doc = api.load(f)
    (name, op), = doc.model.ops.items()
    tiny = Space(op, doc.primfunc(name), doc.model.targets["llvm"])
    assert tiny.count() == (1, True)
    assert not measured_whole(tiny, 0)
    assert measured_whole(tiny, 1)
    doc = api.load(ROOT / "examples" / "matmul.tsched")
    big = Space(doc.model.ops["matmul"], doc.primfunc("matmul"), doc.model.targets["cpu"])
    assert not measured_whole(big, 500)


def test_a_second_writer_of_a_dataset_is_refused_until_the_first_closes(tmp_path):
    """One writer at a time: a second Writer -- here another process, as a `collect` beside a running one --
    is refused while the first is open (it would compress the shard the first appends to: those records
    went to an unlinked file), and allowed once the first is closed or its process is gone."""
    import pytest
    w = dataset.Writer(tmp_path)
    w.append({"key": "a"})
    probe = [sys.executable, "-c", "import sys\nfrom tensorlang.data.dataset import Writer, DatasetBusy\n"
             "try:\n    Writer(sys.argv[1]).close()\nexcept DatasetBusy:\n    sys.exit(3)\n", str(tmp_path)]
    assert subprocess.run(probe, cwd=ROOT).returncode == 3
    with pytest.raises(dataset.DatasetBusy):
        dataset.Writer(tmp_path)  # another Writer in this process too
    w.close(compress_open=True)
    assert subprocess.run(probe, cwd=ROOT).returncode == 0
    with dataset.Writer(tmp_path) as again:
        assert again.keys == {"a"}
    killed = subprocess.Popen([sys.executable, "-c", "import sys, time\nfrom tensorlang.data.dataset import Writer\n"
                               "w = Writer(sys.argv[1])\nprint('open', flush=True)\ntime.sleep(60)", str(tmp_path)],
                              cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert killed.stdout.readline().strip() == "open"
    assert subprocess.run(probe, cwd=ROOT).returncode == 3
    killed.kill()
    killed.wait()
    assert subprocess.run(probe, cwd=ROOT).returncode == 0  # a dead writer's lock is gone with it


def _points_dataset(root, space, key, v1_key):
    """Records of `space`'s first samples on two machines, with made-up latencies: machine A's i-th sample
    takes (i + 1) ms, B's (8 - i) ms; A's last one is stored under sentences v1 (its v1 task hash), and one
    more record holds a point outside the space."""
    from tensorlang.data.collect import candidates_for
    from tensorlang.space.sentence import version_tokens
    cands, _ = candidates_for(space, key, 4)
    w = dataset.Writer(root)
    for m, latency in (("A", lambda i: (i + 1) * 1e-3), ("B", lambda i: (8 - i) * 1e-3)):
        for i, (policy, p) in enumerate(cands):
            v1 = m == "A" and i == len(cands) - 1
            w.append({"key": f"{m}{i}", "task": {"hash": v1_key if v1 else key}, "machine": m, "policy": policy,
                      "status": "ok", "median_s": latency(i), "sketch": p.sketch,
                      "decisions": [list(d) if isinstance(d, tuple) else d for d in p.decisions],
                      "sentence": "v1 ..." if v1 else " ".join(version_tokens())})
    bad = [list(d) if isinstance(d, tuple) else d for d in cands[0][1].decisions][:-1]  # a decision short
    w.append({"key": "bad", "task": {"hash": key}, "machine": "A", "policy": "random", "status": "ok",
              "median_s": 5e-4, "sketch": cands[0][1].sketch, "decisions": bad, "sentence": ""})
    w.close()
    return [(p.sketch, p.decisions) for _, p in cands]


def test_recorded_points_are_each_machines_fastest_replayed_in_full(tmp_path):
    """--points-from: the records' points replayed in today's space (the v1 record's by its v1 task hash),
    each machine's K fastest, fastest first; a point the space does not hold is left out with its reason."""
    from tensorlang import api
    from tensorlang.data.collect import RecordedPoints, task_hash
    from tensorlang.data.reencode import v1_hash
    from tensorlang.space.space import Space
    doc = api.load(ROOT / "examples" / "softmax.tsched")
    space = Space(doc.model.ops["softmax"], doc.primfunc("softmax"), doc.model.targets["cpu"])
    key = task_hash(space)
    points = _points_dataset(tmp_path / "d", space, key, v1_hash(space.op))
    every, refused = RecordedPoints(tmp_path / "d").candidates(space, key)
    assert [(p.sketch, p.decisions) for _, p in every] == points  # B's repeat A's: each point once
    assert all(p.stmts for _, p in every) and [pol for pol, _ in every] == ["roller"] + ["random"] * 3
    n = len(points[0][1])  # the bad record has one decision fewer
    assert refused == [f"bad (random, A): {n - 1} decisions stored, the sketch has more"]
    top, _ = RecordedPoints(tmp_path / "d", top=1).candidates(space, key)
    # the bad record is A's fastest (0.5 ms) and is refused; then B's fastest (its last sample, 5 ms)
    assert [(p.sketch, p.decisions) for _, p in top] == [points[3]]
    top2, _ = RecordedPoints(tmp_path / "d", top=2).candidates(space, key)
    assert [(p.sketch, p.decisions) for _, p in top2] == [points[0], points[3], points[2]]


def test_collect_measures_the_points_of_another_dataset(tmp_path):
    """collect --trials 0 --points-from DIR measures exactly DIR's candidates (same sketch and decisions,
    the records' policies), and a rerun measures none again."""
    tasks, env = rowsum_tasks(tmp_path)
    first, second = tmp_path / "first", tmp_path / "second"
    base = [sys.executable, "-m", "tensorlang", "collect", str(tasks), "--target", "cpu", "--repeat", "1",
            "--min-repeat-ms", "5"]
    r = subprocess.run(base + ["--trials", "3", "-o", str(first)], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    cmd = base + ["--trials", "0", "--points-from", str(first), "-o", str(second)]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr

    def points(d):
        return sorted((x["policy"], x["sketch"], json.dumps(x["decisions"])) for x in dataset.read(d))
    assert len(points(first)) == 3 and points(second) == points(first)
    assert all(x["status"] == "ok" for x in dataset.read(second))
    again = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert "'written': 0" in again.stdout and "'skipped': 3" in again.stdout


def recording_harness(events: list):
    """A Harness that builds and times nothing: it records the order of its calls in `events` and gives
    every candidate 1 ms."""
    from tensorlang.bench import harness as H

    class Recording:
        def __init__(self, rpc=None):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            pass

        def prestart(self):
            events.append("prestart")

        def prepare(self, candidates, **kw):
            events.append(f"prepare {candidates[0].op_name} x{len(candidates)}")
            return candidates

        def finish(self, candidates, repeat, timeout_s, **kw):
            events.append(f"finish {candidates[0].op_name}")
            return [H.Result(c.name, c.op_name, "llvm", H.OK, times_s=[1e-3]) for c in candidates]
    return Recording


def test_a_rerun_does_not_decode_the_model_candidates_it_recorded(tmp_path, monkeypatch):
    """collect --model: once a task's model candidates are all recorded, its key (task, target, machine and the
    model's run: name, version, decoding, samples) is in model-candidates.done, and a rerun does not decode them
    again; another sample count is another run. A fake harness times them."""
    from tensorlang.bench import harness as H
    from tensorlang.data import collect as C
    from tensorlang.lm import model as M
    monkeypatch.setenv("TENSORLANG_MEASURE_LOCK", str(tmp_path / "lock"))  # a background collector's is not ours
    monkeypatch.setattr(H, "Harness", recording_harness([]))
    decoded = []
    real = C.model_candidates
    monkeypatch.setattr(C, "model_candidates", lambda space, *a, **kw: (decoded.append(space.op.name),
                                                                        real(space, *a, **kw))[1])
    files = [str(ROOT / "examples" / f) for f in ("matmul.tsched", "softmax.tsched")]
    first = C.collect(files, "llvm", tmp_path / "d", trials=0, model=M.DEFAULT_DIR, model_samples=2)
    assert decoded == ["matmul", "softmax"] and first["written"] == 4
    lines = (tmp_path / "d" / "model-candidates.done").read_text().split()
    assert len(lines) == 2 and all(x.split("|")[1] == "llvm" and "|samples=2|" in x for x in lines)
    again = C.collect(files, "llvm", tmp_path / "d", trials=0, model=M.DEFAULT_DIR, model_samples=2)
    assert decoded == ["matmul", "softmax"] and again["written"] == 0
    more = C.collect(files, "llvm", tmp_path / "d", trials=0, model=M.DEFAULT_DIR, model_samples=3)
    assert decoded == ["matmul", "softmax"] * 2 and more["written"] == 2  # the third sample of each
    assert len((tmp_path / "d" / "model-candidates.done").read_text().split()) == 4


def test_a_task_is_planned_beside_the_last_builds_and_never_beside_a_timing(tmp_path, monkeypatch):
    """collect draws the next task's candidates while the previous task's builds run (Harness.prepare), and
    times that batch (Harness.finish) before the next task's builds start: builds and planning overlap,
    builds and timing never. A fake harness records the order; its records are written all the same."""
    from tensorlang.bench import harness as H
    from tensorlang.data import collect as C
    events = []
    real = C.candidates_for
    monkeypatch.setattr(C, "candidates_for", lambda space, *a, **kw: (events.append(f"plan {space.op.name}"),
                                                                      real(space, *a, **kw))[1])
    monkeypatch.setattr(H, "Harness", recording_harness(events))
    files = [str(ROOT / "examples" / f) for f in ("matmul.tsched", "softmax.tsched", "dense_gelu.tsched")]
    summary = C.collect(files, "llvm", tmp_path / "d", trials=3, batch=2)
    assert events == ["prestart",
                      "plan matmul", "prepare matmul x2", "finish matmul", "prepare matmul x1",
                      "plan softmax", "finish matmul", "prepare softmax x2", "finish softmax", "prepare softmax x1",
                      "plan dense_gelu", "finish softmax", "prepare dense_gelu x2", "finish dense_gelu",
                      "prepare dense_gelu x1", "finish dense_gelu"]
    assert summary["written"] == 9 and len(list(dataset.read(tmp_path / "d"))) == 9
    # a failure while planning a task does not lose the previous task's batch, built already
    events.clear()

    def fails_on_softmax(space, *a, **kw):
        if space.op.name == "softmax":
            raise RuntimeError("planning failed")
        return real(space, *a, **kw)
    monkeypatch.setattr(C, "candidates_for", fails_on_softmax)
    with pytest.raises(RuntimeError, match="planning failed"):
        C.collect(files, "llvm", tmp_path / "e", trials=2, batch=2)
    assert events[-2:] == ["prepare matmul x2", "finish matmul"]
    assert len(list(dataset.read(tmp_path / "e"))) == 2


def test_collect_with_a_missing_model_is_an_error_not_a_crash(tmp_path):
    """--model naming no checkpoint: exit 2 before any task, with the path and the shipped model's, no TS900."""
    tasks, env = rowsum_tasks(tmp_path)
    r = subprocess.run([sys.executable, "-m", "tensorlang", "collect", str(tasks), "--target", "cpu", "--trials", "0",
                        "--model", "default", "-o", str(tmp_path / "measured")],
                       capture_output=True, text=True, env=env, timeout=120, cwd=ROOT)
    assert r.returncode == 2
    assert r.stderr.strip() == ("tensorlang collect: error: no model checkpoint at default "
                                "(the shipped model: --model tensorlang/lm/checkpoints/default)")
    assert not (tmp_path / "measured").exists()
