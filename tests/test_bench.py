"""The measurement harness: policies are built, checked and timed side by side; a crashing and a hanging
kernel (a real segfault, a real infinite loop) are recorded as such and the runner pool recovers; the
metaschedule:N policy's .tsched text reproduces MetaSchedule's best module; the JSON report has its
documented keys; the measurement lock serializes two timers in two processes."""
import json
import os
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from tensorlang import api
from tensorlang.bench import Candidate, Harness, Library, PythonKernel, measure_candidates
from tensorlang.bench import command as C

from conftest import ROOT

# Small operators: fast to build, to check and to tune.
MM = """
target cpu = llvm(cores = 2)

op mm(A: f32[64, 64], B: f32[64, 64]) -> C: f32[64, 64] {
    C[i, j] += A[i, k] * B[k, j]
}

schedule mm on cpu {
    i0, i1 = split(C.i, [8, 8])
    j0, j1 = split(C.j, [4, 16])
    reorder(i0, j0, C.k, i1, j1)
    parallel(i0)
    vectorize(j1)
}
"""

COPY = """
target cpu = llvm(cores = 2)

op copy(A: f32[16]) -> C: f32[16] {
    C[i] = A[i]
}
"""

FAST = dict(min_repeat_ms=5, timeout_s=20)


@pytest.fixture(scope="module", autouse=True)
def private_lock(tmp_path_factory):
    """The tests time toy kernels: they take a lock of their own, so that they neither wait for a real
    benchmark holding the machine's lock (minutes) nor disturb one."""
    old = os.environ.get("TENSORLANG_MEASURE_LOCK")
    os.environ["TENSORLANG_MEASURE_LOCK"] = str(tmp_path_factory.mktemp("lock") / "measure.lock")
    yield
    if old is None:
        del os.environ["TENSORLANG_MEASURE_LOCK"]
    else:
        os.environ["TENSORLANG_MEASURE_LOCK"] = old


@pytest.fixture(scope="module")
def harness():
    with Harness(jobs=2, threads=2) as h:
        yield h


def bad_kernels():
    """A kernel that writes far out of bounds (SIGSEGV) and one that never returns."""
    import tvm
    from tvm.script import tirx as T

    @T.prim_func
    def segfault(A: T.Buffer((16,), "float32"), C: T.Buffer((16,), "float32")):
        T.func_attr({"global_symbol": "main", "tirx.noalias": True})
        for i in range(16):
            C[i * 100000000 + 50000000] = A[i]

    @T.prim_func
    def forever(A: T.Buffer((16,), "float32"), C: T.Buffer((16,), "float32")):
        T.func_attr({"global_symbol": "main", "tirx.noalias": True})
        while True:
            C[0] = C[0] + A[0]

    return tvm.IRModule({"main": segfault}), tvm.IRModule({"main": forever})


def test_policies_are_correct_and_timed(harness):
    doc = api.load_text(MM)
    cands = []
    for pol in ("schedule", "roller", "random:3"):
        cand, label, gen_s, msgs = C.generate_candidate(doc, "mm", "cpu", pol)
        assert cand is not None, msgs
        assert isinstance(cand.schedule, str)  # the .tsched text is what gets built and timed
        cands.append(cand)
    cands.append(Candidate("mm/unscheduled", MM, "cpu", None, info={"policy": "unscheduled"}))
    cands.append(Candidate("mm/bad", MM, "cpu", "split(C.i, [3, 5])"))
    results = harness.measure(cands, repeat=3, **FAST)
    assert [r.status for r in results] == ["ok"] * 4 + ["schedule-error"], [(r.status, r.message) for r in results]
    assert "TS306" in results[-1].message and not results[-1].times_s
    for r in results[:4]:
        assert r.correct and r.max_abs < 1e-3
        assert len(r.times_s) == 3 and 0 < r.min_s <= r.median_s <= r.max_s
        assert r.gflops > 0 and r.compile_s > 0
        assert r.worker["build_tensor_intrin"] is False and r.worker["runner_tensor_intrin"] is False
    assert results[0].schedule_s is not None and results[3].schedule_s is None  # text vs. bare operator
    # builds ran in the worker pool, kernels in the runner: neither in this process
    assert {r.worker["build_pid"] for r in results[:4]}.isdisjoint({os.getpid()})
    assert len({r.worker["runner_pid"] for r in results[:4]}) == 1


def test_builders_and_tvm_runners_start_without_pytorch(harness):
    """tvm_ffi imports PyTorch wherever it is installed (1.2-2.2 s and ~200 MB a process); the processes that
    build and time TVM kernels never use it, and start without it."""
    from tensorlang.bench import worker as W
    harness.prestart()
    assert harness.builds().submit(W.ready).result(timeout=180)["torch"] is False
    assert harness.kernels.info("tvm")["torch"] is False


def test_crash_and_hang_are_isolated_and_the_pool_recovers(harness, tmp_path):
    import tvm
    segfault, forever = bad_kernels()
    # the segfaulting kernel comes as a library built here (kernel library + operator), the hanging one as a module
    lib = str(tmp_path / "segfault.so")
    tvm.compile(segfault, target=tvm.target.Target({"kind": "llvm"})).export_library(lib)
    cands = [Candidate("good", COPY, "cpu", None), Candidate("segfault", COPY, "cpu", Library(lib)),
             Candidate("hang", COPY, "cpu", forever), Candidate("after", COPY, "cpu", None)]
    t0 = time.monotonic()
    results = harness.measure(cands, repeat=2, min_repeat_ms=5, timeout_s=3)
    assert [r.status for r in results] == ["ok", "crash", "timeout", "ok"], [(r.status, r.message) for r in results]
    assert "SIGSEGV" in results[1].message
    assert "3 s" in results[2].message
    assert len(results[0].times_s) == 2 and len(results[3].times_s) == 2
    assert not results[1].times_s and not results[2].times_s
    assert time.monotonic() - t0 < 60
    # the pool still works: a fresh runner, the same harness
    again = harness.measure([Candidate("again", COPY, "cpu", None)], repeat=1, **FAST)
    assert again[0].status == "ok" and again[0].times_s
    assert again[0].worker["runner_pid"] != results[0].worker["runner_pid"]


def test_a_crash_while_timing_spares_the_kernels_next_to_it(harness):
    """Two Python kernels share a runner; one segfaults on its second call (the first timing). The other
    is loaded again in the fresh runner and timed in every round."""
    cands = [Candidate("steady", COPY, "cpu", PythonKernel(f"{__file__}:numpy_copy")),
             Candidate("flaky", COPY, "cpu", PythonKernel(f"{__file__}:numpy_copy", {"crash_after": 1}))]
    results = harness.measure(cands, repeat=3, **FAST)
    assert [r.status for r in results] == ["ok", "crash"], [(r.status, r.message) for r in results]
    assert results[1].correct is True and "SIGSEGV" in results[1].message  # checked fine, crashed timing
    assert len(results[0].times_s) == 3 and not results[1].times_s


def _thread_bound_copy():
    """A copy whose loop is bound to threadIdx.x: it schedules, but an LLVM (CPU) build refuses it."""
    import tvm
    from tvm.script import tirx as T

    @T.prim_func
    def bound(A: T.Buffer((16,), "float32"), C: T.Buffer((16,), "float32")):
        T.func_attr({"global_symbol": "main", "tirx.noalias": True})
        for i in T.thread_binding(16, thread="threadIdx.x"):
            C[i] = A[i]

    return tvm.IRModule({"main": bound})


def test_joint_builds_give_what_separate_builds_give(harness):
    """`joint_builds`: one operator's candidates compiled in groups, a library per build worker with a
    function each -- the same statuses, checks and figures as builds one by one; a schedule that does not
    apply fails alone; a candidate whose build fails sends its group back to builds one by one, and the
    others of that group are built and timed."""
    doc = api.load_text(MM)
    cands = [C.generate_candidate(doc, "mm", "cpu", p)[0] for p in ("schedule", "roller", "random:1", "random:2",
                                                                     "random:3")]
    cands.append(Candidate("mm/bad", MM, "cpu", "split(C.i, [3, 5])"))
    cands += [Candidate("copy", COPY, "cpu", None), Candidate("copy/bound", COPY, "cpu", _thread_bound_copy()),
              Candidate("copy2", COPY, "cpu", None), Candidate("copy3", COPY, "cpu", None)]
    joint = harness.measure(cands, repeat=2, joint_builds=True, **FAST)
    alone = harness.measure(cands, repeat=2, **FAST)
    want = ["ok"] * 5 + ["schedule-error", "ok", "build-error", "ok", "ok"]
    assert [r.status for r in joint] == [r.status for r in alone] == want, [(r.status, r.message) for r in joint]
    # 6 mm candidates, 2 build workers: two groups, taken alternately (the bad schedule is in the second);
    # the copies' second group holds the unbuildable one, so copy3 was built again by itself
    assert [r.worker.get("build_group") for r in joint] == [3, 2, 3, 2, 3, None, 2, None, 2, 1]
    assert all("build_group" not in r.worker for r in alone)
    for j, a in zip(joint, alone):
        if j.status == "ok":
            assert j.correct and a.correct and len(j.times_s) == len(a.times_s) == 2 and j.compile_s > 0
    assert "not implemented" in joint[7].message


def test_a_joint_build_past_its_time_is_built_again_one_by_one(harness, monkeypatch):
    """A group that outlasts GROUP_BUILD_TIMEOUT_S (a candidate LLVM takes minutes over) is not a build error:
    its candidates are built again alone, each with the full build timeout."""
    from tensorlang.bench import harness as H
    monkeypatch.setattr(H, "GROUP_BUILD_TIMEOUT_S", 0.0)  # every group is too slow
    doc = api.load_text(MM)
    cands = [C.generate_candidate(doc, "mm", "cpu", p)[0] for p in ("schedule", "roller", "random:1", "random:2")]
    results = harness.measure(cands, repeat=1, joint_builds=True, **FAST)
    assert [r.status for r in results] == ["ok"] * 4, [(r.status, r.message) for r in results]
    assert all("build_group" not in r.worker and r.correct for r in results)


def test_metaschedule_text_reproduces_the_best_module(harness):
    import tvm_ffi

    from tensorlang.baselines.metaschedule import metaschedule_schedule
    from tensorlang.bench.worker import lower_text
    doc = api.load_text(MM)
    op, target = doc.model.ops["mm"], doc.model.targets["cpu"]
    gen = metaschedule_schedule(doc.primfunc("mm"), op, target, 8)
    assert not gen.diagnostics, gen.diagnostics
    assert gen.policy == "metaschedule:8" and gen.schedule_text
    mod, msg = lower_text(op, gen.schedule_text, "cpu")
    assert msg is None, msg
    assert tvm_ffi.structural_equal(mod, gen.mod)
    # and the harness builds, checks and times that text
    r = harness.measure([Candidate("mm/ms", op, target, gen.schedule_text)], repeat=2, **FAST)[0]
    assert r.status == "ok" and r.correct and len(r.times_s) == 2


def test_metaschedule_rejects_a_bad_trial_count():
    from tensorlang.baselines.metaschedule import metaschedule_schedule
    doc = api.load_text(MM)
    gen = metaschedule_schedule(doc.primfunc("mm"), doc.model.ops["mm"], doc.model.targets["cpu"], "many")
    assert gen.mod is None and gen.diagnostics[0].code == "TS302"


def test_json_report_has_the_documented_keys(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("TENSORLANG_HOST_CPU", raising=False)  # a report is recorded: the real host (test_machine.py)
    src = tmp_path / "mm.tsched"
    src.write_text(MM)
    out = tmp_path / "report.json"
    status = C.main([str(src), "--target", "cpu", "--policy", "roller,default", "--policy", "nonsense",
                     "--repeat", "2", "--min-repeat-ms", "5", "--json", str(out), "-q"])
    assert status == 1  # the unknown policy is a failed row
    stdout = capsys.readouterr().out
    report = json.loads(out.read_text())
    assert set(report) == set(C.TOP_KEYS)
    assert set(report["settings"]) == set(C.SETTINGS_KEYS)
    assert report["settings"]["lock_path"] == os.environ["TENSORLANG_MEASURE_LOCK"]
    assert set(report["conditions"]) == set(C.CONDITION_KEYS) and report["conditions"]["locked_s"] > 0
    assert {"cpu", "usable_cpus", "threads", "versions"} <= set(report["machine"])
    assert report["command"].startswith("tensorlang bench ") and "--policy roller" in report["command"]
    rows = {r["policy"]: r for r in report["results"]}
    assert set(rows) == {"schedule", "roller", "default", "nonsense"}
    for r in report["results"]:
        assert set(r) == set(C.ROW_KEYS)
    assert rows["nonsense"]["status"] == "no-schedule" and "TS302" in rows["nonsense"]["message"]
    for pol in ("schedule", "roller", "default"):
        r = rows[pol]
        assert r["status"] == "ok" and r["correct"] is True and len(r["times_ms"]) == 2
        assert r["min_ms"] <= r["median_ms"] <= r["max_ms"] and r["gflops"] > 0
        assert set(r["speedup"]) == {"schedule", "roller", "default"} - {pol}
    assert rows["schedule"]["generation_s"] is None and rows["roller"]["generation_s"] > 0
    assert rows["roller"]["schedule_text"].startswith("schedule mm on cpu {")
    s = report["speedup"]["mm"]
    assert s["roller"]["schedule"] == pytest.approx(rows["schedule"]["median_ms"] / rows["roller"]["median_ms"],
                                                    rel=1e-3)
    assert "speed-up of mm" in stdout and "conditions:" in stdout


# Takes the lock once GO exists, holds it until RELEASE exists (or for HOLD seconds), prints times.
HOLDER = textwrap.dedent("""
    import os, sys, time
    from tensorlang.bench.lock import measure_lock
    go, release, hold = sys.argv[1], sys.argv[2], float(sys.argv[3])
    print("started", flush=True)
    while not os.path.exists(go):
        time.sleep(0.005)
    with measure_lock() as held:
        t0 = time.time()
        print("acquired", flush=True)
        while not os.path.exists(release) and time.time() - t0 < hold:
            time.sleep(0.005)
        t1 = time.time()
    print(t0, t1, held.wait_s, flush=True)
""")


def holder(tmp_path, lock, hold):
    env = {**os.environ, "TENSORLANG_MEASURE_LOCK": str(lock)}
    p = subprocess.Popen([sys.executable, "-c", HOLDER, str(tmp_path / "go"), str(tmp_path / "release"), str(hold)],
                         stdout=subprocess.PIPE, text=True, env=env, cwd=ROOT)
    assert p.stdout.readline().strip() == "started"
    return p


def spans_of(p):
    out, _ = p.communicate(timeout=60)
    assert p.returncode == 0
    return tuple(map(float, out.split()[-3:]))


def test_lock_serializes_two_timers(tmp_path):
    lock = tmp_path / "measure.lock"
    procs = [holder(tmp_path, lock, 0.8) for _ in range(2)]
    (tmp_path / "go").touch()  # both ready: let them race for the lock
    (a0, a1, wa), (b0, b1, wb) = sorted(spans_of(p) for p in procs)
    assert a1 <= b0, "the two timers overlapped"
    assert wb >= 0.3  # the second waited for the first


def test_the_harness_waits_for_the_lock(tmp_path):
    lock = tmp_path / "measure.lock"
    p = holder(tmp_path, lock, 60)
    (tmp_path / "go").touch()
    try:
        assert p.stdout.readline().strip() == "acquired"
        release = threading.Timer(1.5, (tmp_path / "release").touch)
        release.start()
        cand = Candidate("numpy-copy", COPY, "cpu", PythonKernel(f"{__file__}:numpy_copy"))
        r = measure_candidates([cand], repeat=2, lock_path=str(lock), **FAST)[0]
    finally:
        t0, t1, _ = spans_of(p)
    assert r.status == "ok" and r.correct and len(r.times_s) == 2
    assert r.run["lock_acquired_at"] >= t1  # timing began only once the other timer let go
    assert r.run["lock_path"] == str(lock) and r.run["locked_s"] > 0


def numpy_copy(inputs, outputs, crash_after=None, sleep_ms=0.0):
    """A PythonKernel factory (runs in the runner process); `crash_after` calls, it dereferences NULL;
    each call lasts at least `sleep_ms`."""
    import ctypes

    import numpy as np
    a = inputs["A"]
    out = np.empty_like(a)
    calls = [0]

    def run():
        calls[0] += 1
        if crash_after is not None and calls[0] > crash_after:
            ctypes.string_at(0)  # a real SIGSEGV
        if sleep_ms:
            time.sleep(sleep_ms / 1e3)
        np.copyto(out, a)
        return {"C": out}
    return run


def test_a_candidate_over_the_slow_factor_is_recorded_after_one_round(harness):
    """Past its first round, a candidate over slow_factor times the best (this run's, or the best known if
    lower) gets no more rounds; one under it gets all of them."""
    def cand(name, ms):
        return Candidate(name, COPY, "cpu", PythonKernel(f"{__file__}:numpy_copy", {"sleep_ms": ms}))
    cands = [cand("best", 2), cand("near", 5), cand("slow", 20)]
    results = harness.measure(cands, repeat=3, min_repeat_ms=1, timeout_s=20, slow_factor=4.0)
    assert [len(r.times_s) for r in results] == [3, 3, 1]
    assert results[2].median_s > 4 * results[0].median_s
    results = harness.measure(cands[1:], repeat=3, min_repeat_ms=1, timeout_s=20, slow_factor=4.0,
                              best_known_s=1e-3)  # a best known of 1 ms: 5 ms is over 4x it too
    assert [len(r.times_s) for r in results] == [1, 1]
    results = harness.measure(cands, repeat=3, min_repeat_ms=1, timeout_s=20)
    assert [len(r.times_s) for r in results] == [3, 3, 3]


def test_a_candidate_whose_first_figures_agree_is_timed_no_more(harness, monkeypatch):
    """With `settled`, a candidate stops once over half of its `repeat` figures are in and agree within the
    tolerance (their range bounds the median of all of them); one whose figures disagree gets every round.
    The runner's figures are scripted here (real ones jitter by more than the test's margins)."""
    figures = {"steady": [1.000e-3, 1.010e-3, 1.000e-3, 1.0e-3, 1.0e-3],
               "noisy": [1.000e-3, 1.200e-3, 1.100e-3, 1.0e-3, 1.0e-3]}
    request = harness.kernels.request
    names = {}

    def scripted(slot, key, msg, timeout_s):
        if msg[0] != "time":
            return request(slot, key, msg, timeout_s)
        return figures[names[key]].pop(0) if figures[names[key]] else 1e-3
    monkeypatch.setattr(harness.kernels, "request", scripted)
    original = harness._item

    def named(c, docs):
        it = original(c, docs)
        names[it.key] = c.name
        return it
    monkeypatch.setattr(harness, "_item", named)
    cands = [Candidate("steady", MM, "cpu", None), Candidate("noisy", MM, "cpu", None)]
    steady, noisy = harness.measure(cands, repeat=3, min_repeat_ms=5, timeout_s=20, settled=0.02)
    assert steady.times_s == [1.000e-3, 1.010e-3] and steady.median_s == pytest.approx(1.005e-3)
    assert noisy.times_s == [1.000e-3, 1.200e-3, 1.100e-3]
    # of 5 figures, 3 must be in (and agree) before the median is bounded
    figures.update(steady=[1.000e-3, 1.010e-3, 1.005e-3, 2e-3, 2e-3], noisy=[1e-3] * 5)
    steady, noisy = harness.measure(cands, repeat=5, min_repeat_ms=5, timeout_s=20, settled=0.02)
    assert steady.times_s == [1.000e-3, 1.010e-3, 1.005e-3] and len(noisy.times_s) == 3
    figures.update(steady=[1.000e-3, 1.010e-3, 1.000e-3], noisy=[1e-3] * 3)
    steady, _ = harness.measure(cands, repeat=3, min_repeat_ms=5, timeout_s=20)  # without: every round
    assert len(steady.times_s) == 3


def test_a_killed_harness_leaves_no_work_dir_behind():
    import tempfile
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    stale = tempfile.mkdtemp(prefix="tensorlang-bench-")
    with open(os.path.join(stale, "owner"), "w") as f:
        f.write(dead.stdout)
    with Harness() as h:  # starts no process until it measures
        assert os.path.isdir(h.workdir) and not os.path.exists(stale)
    assert not os.path.exists(h.workdir)


GATHERS = """
target cpu = llvm(cores = 1)

op take(X: f32[8, 4], I: i64[]) -> Y: f32[4] {
    Y[j] = X[I[], j]
}

op index_via_copy(W: f32[16, 4], I: i64[1, 3]) -> Y: f32[3, 4] {
    T: i64[3, 1]
    T[a, b] = I[b, a]
    Y[a, j] = W[T[a, 0], j]
}

op rms(X: f32[4, 8]) -> Y: f32[4, 8] {
    S: f32[4]
    S[i] += X[i, k]
    Y[i, j] = X[i, j] * rsqrt(S[i] / 8.0 - 0.8)
}
"""


def test_scalar_inputs_indirect_gathers_and_nan_references(harness):
    """Inputs the extracted models have: a 0-d index (it must reach the kernel as 0-d), an index
    tensor that reaches its subscript through a copy (its random values must stay in range), and
    a reference that is NaN where the random inputs make it so (the kernel's same NaN agrees)."""
    import numpy as np

    from tensorlang import interp
    doc = api.load_text(GATHERS, "g.tsched")
    ins = interp.random_inputs(doc.model.ops["index_via_copy"], 0)
    assert ins["I"].min() >= 0 and ins["I"].max() < 16
    assert ins["I"].max() > 0  # spread over the range, not all zero
    ref = interp.reference_outputs(doc.model.ops["rms"], interp.random_inputs(doc.model.ops["rms"], 0))["Y"]
    assert np.isnan(ref).any()  # the case under test: some rows have a negative argument (|X| is drawn, 0.8 taken off)
    results = harness.measure([Candidate(op, GATHERS, "cpu", None, op_name=op)
                               for op in ("take", "index_via_copy", "rms")], repeat=1, **FAST)
    assert [r.status for r in results] == ["ok"] * 3, [r.message for r in results]


def test_a_figure_is_sized_from_what_the_kernel_took_before():
    """time_evaluator sizing a batch alone throws a batch away and overshoots the next by 1.618x; the runner
    sizes it from the kernel's checking run or last figure instead (the TVM calls stood in for here)."""
    from tensorlang.bench import worker as W
    k = W._TvmKernel.__new__(W._TvmKernel)
    k.args, k.outs, calls = [], [], []
    k.func = lambda: (calls.append("call"), time.sleep(0.03))
    k._evaluate = lambda number, ms: (calls.append((number, ms)), 0.001)[1]
    k.call_s, k.figure_s = 0.2, None  # slower than the batch: one call, timed as it is
    assert k.time(20) >= 0.02 and calls == ["call"]
    calls.clear()
    k.call_s, k.figure_s = 0.001, None  # fast: a short batch says how fast, then one that fills 50 ms, 5 % spare
    assert k.time(50) == 0.001 and calls == [(1, 5.0), (53, 50)]
    calls.clear()
    assert k.time(50) == 0.001 and calls == [(53, 50)]  # later figures: sized from the last one alone
    calls.clear()
    k.call_s, k.figure_s = 0.2, None  # a slow first call, a warm call faster than the batch: sized from that
    k.time(50)
    assert calls == ["call", (2, 50)]


def test_a_checking_run_that_fills_the_batch_is_the_first_figure(harness, monkeypatch):
    """With min_repeat_ms below any kernel's time, every checking run is a whole figure: round 1 asks the
    runner for nothing, and `repeat` figures come from repeat - 1 timing requests per kernel."""
    asked = []
    request = harness.kernels.request
    monkeypatch.setattr(harness.kernels, "request",
                        lambda slot, key, msg, timeout_s: (asked.append(msg[0]), request(slot, key, msg, timeout_s))[1])
    cands = [Candidate("a", MM, "cpu", None), Candidate("b", MM, "cpu", None)]
    results = harness.measure(cands, repeat=3, min_repeat_ms=0.001, timeout_s=20)
    assert [(r.status, len(r.times_s)) for r in results] == [("ok", 3), ("ok", 3)]
    assert asked == ["time"] * 4
    asked.clear()
    results = harness.measure(cands, repeat=3, min_repeat_ms=5, timeout_s=20)  # a 64x64 matmul is far faster
    assert [(r.status, len(r.times_s)) for r in results] == [("ok", 3), ("ok", 3)] and asked == ["time"] * 6


def test_kernels_are_linked_by_ld_itself_and_compute_what_numpy_does(tmp_path, monkeypatch):
    """write_shared_library links with `ld` (no compiler driver): TVM's default way is made to fail here, yet
    a kernel that calls libm (softmax: expf) loads and computes what NumPy does; `ld` gone -> the default way."""
    import numpy as np
    import tvm
    from tvm.support import cc

    from tensorlang.lower import build as B
    from tensorlang.lower.targets import tvm_target
    doc = api.load_text("""
target cpu = llvm(cores = 2)

op softmax(X: f32[4, 32]) -> Y: f32[4, 32] {
    M[i] max= X[i, j]
    E[i, j] = exp(X[i, j] - M[i])
    S[i] += E[i, j]
    Y[i, j] = E[i, j] / S[i]
}
""", "softmax.tsched")
    lib = B.compile_module(doc.primfunc("softmax"), tvm_target(doc.model.targets["cpu"]))
    default_links = []

    def compiler_driver(*args, **kwargs):
        default_links.append(args)
        raise RuntimeError("the compiler driver was asked")
    monkeypatch.setattr(cc, "create_shared", compiler_driver)
    path = B.write_shared_library(lib, tmp_path / "softmax.so")
    assert default_links == []
    needed = subprocess.run(["readelf", "-d", str(path)], capture_output=True, text=True).stdout
    assert "libm.so" in needed  # expf resolves from the library it names, not from whatever is loaded
    stack = [ln for ln in subprocess.run(["readelf", "-lW", str(path)], capture_output=True, text=True).stdout
             .splitlines() if "GNU_STACK" in ln]
    assert stack and "RWE" not in stack[0]  # no executable stack (a glibc that refuses one would not load it)
    x = np.random.default_rng(0).standard_normal((4, 32)).astype("float32")
    y = tvm.runtime.tensor(np.zeros((4, 32), "float32"))
    tvm.runtime.load_module(str(path))["main"](tvm.runtime.tensor(x), y)
    e = np.exp(x - x.max(axis=1, keepdims=True))
    np.testing.assert_allclose(y.numpy(), e / e.sum(axis=1, keepdims=True), rtol=1e-5)
    monkeypatch.setattr(B.shutil, "which", lambda name: None)
    with pytest.raises(RuntimeError, match="compiler driver"):
        B.write_shared_library(lib, tmp_path / "again.so")
