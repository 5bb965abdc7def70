"""Measure candidates side by side: build in parallel, check against NumPy, time one at a time.

    results = measure_candidates([Candidate("roller", text, "cpu", schedule_text), ...], repeat=10, timeout_s=30)

1. build: every TVM candidate is lowered (from .tsched text, where it is text), compiled and exported
   to a shared library in a pool of worker processes (`spawn`; each imports TVM once), in parallel;
   the NumPy references are computed meanwhile;
2. check: under the machine-wide measurement lock (bench/lock.py), each kernel is loaded in a kernel
   runner process and run once on the standard-normal inputs of `interp.random_inputs`; its outputs
   are compared with the float64 reference (`interp.compare`); a wrong kernel is not timed; one whose
   reference cannot be computed here (too much memory or time, TS407 / TS408) is timed but `unchecked`;
3. time: still under the lock, R rounds; each round times every remaining candidate once, one at a
   time, in an order rotated by one each round (interleaved, so drift and noise spread evenly);
   one timing is the mean of a batch of calls that lasts at least `min_repeat_ms` (TVM's
   `time_evaluator`, the batch sized from the kernel's previous figure; a kernel slower than
   `min_repeat_ms` is one call, and its checking run is its first figure -- worker.py says why).
   A result has the median, min and max over the rounds.

`Harness.measure` does 1-3 in one call; `prepare` (1, returning while the builds run) and `finish` (the
rest) let a caller work beside the builds -- never beside a timing.

A kernel that crashes its runner (`crash`) or does not answer within `timeout_s` (`timeout`) is
recorded as such; its runner is replaced and the run continues with the next candidate.
"""
from __future__ import annotations

import os
import shutil
import statistics
import tempfile
import threading
import time
from concurrent.futures import TimeoutError as FutureTimeout
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from typing import Any, Callable

from tensorlang.bench import pool as P
from tensorlang.bench.lock import measure_lock

# Result.status values
OK, WRONG, SCHEDULE_ERROR, BUILD_ERROR, CRASH, TIMEOUT, ERROR, NO_SCHEDULE, UNCHECKED = (
    "ok", "wrong", "schedule-error", "build-error", "crash", "timeout", "error", "no-schedule", "unchecked")
STATUSES = (OK, WRONG, SCHEDULE_ERROR, BUILD_ERROR, CRASH, TIMEOUT, ERROR, NO_SCHEDULE, UNCHECKED)
TIMED = (OK, UNCHECKED)  # unchecked: timed, but its result could not be compared with the reference (`message`)


@dataclass
class PythonKernel:
    """A kernel in Python (PyTorch, NumPy...). `factory`: 'package.module:function' or
    '/path/file.py:function'; called in the runner as factory(inputs, outputs, **kwargs) with the input
    arrays (name -> ndarray, in the operator's order) and outputs as (name, shape, numpy dtype); it
    returns a function of no arguments that runs the kernel and returns name -> output array."""
    factory: str
    kwargs: dict = field(default_factory=dict)


@dataclass
class Library:
    """A kernel built elsewhere: a shared library (`lib.export_library(path)`) whose `main` takes the
    operator's inputs then outputs. The harness loads it as is (and leaves the file alone)."""
    path: str


@dataclass
class Candidate:
    """One thing to measure.

    op: an OpModel, or .tsched text holding the operator (`op_name` picks one if it holds several);
    target: a TargetModel, or the name of a target of that text (`llvm` = this host);
    schedule: a scheduled tvm.IRModule, .tsched schedule text (a `schedule` block or bare statements),
    a Library (built already), a PythonKernel, or None (the operator unscheduled); info: carried to the
    Result as is."""
    name: str
    op: Any
    target: Any
    schedule: Any = None
    op_name: str | None = None
    info: dict = field(default_factory=dict)


@dataclass
class Result:
    name: str
    op: str
    target: str
    status: str  # see STATUSES
    message: str = ""
    times_s: list = field(default_factory=list)  # one figure per round (seconds per call)
    max_abs: float | None = None
    max_rel: float | None = None
    flops: int = 0
    schedule_s: float | None = None  # applying the .tsched text (build worker)
    compile_s: float | None = None  # tvm.compile + export (build worker)
    load_s: float | None = None  # loading the kernel in the runner
    lock_wait_s: float = 0.0
    run: dict = field(default_factory=dict)  # about the whole run (the same dict for every result): run_stats()
    info: dict = field(default_factory=dict)
    worker: dict = field(default_factory=dict)  # what the worker processes report (pids, imports)

    @property
    def ok(self) -> bool:
        return self.status == OK

    @property
    def correct(self) -> bool | None:
        return None if self.max_abs is None or self.status == UNCHECKED else self.status != WRONG

    @property
    def median_s(self) -> float | None:
        return statistics.median(self.times_s) if self.times_s else None

    @property
    def min_s(self) -> float | None:
        return min(self.times_s) if self.times_s else None

    @property
    def max_s(self) -> float | None:
        return max(self.times_s) if self.times_s else None

    @property
    def gflops(self) -> float | None:
        m = self.median_s
        return self.flops / m / 1e9 if m else None


@dataclass
class _Item:
    cand: Candidate
    result: Result
    op: Any = None  # OpModel
    target: Any = None  # TargetModel
    slot: str = "tvm"
    key: str = ""
    spec: dict | None = None  # runner load spec, once built
    future: Any = None


@dataclass
class Prepared:
    """Candidates whose builds `Harness.prepare` submitted (their futures on the items), and their operators'
    inputs and references (by id of the operator), for `Harness.finish`."""
    items: list
    todo: list  # the items still to build, check and time
    inputs: dict
    refs: dict
    verify: bool
    t_start: float
    reference_s: float = 0.0


# A group build (8 kernels) takes seconds; one past this holds a candidate that LLVM takes minutes over
# (a batch of 16 conv2d candidates once took 667 s: its group ran into the 300 s build timeout, then every
# candidate of it was built again alone). Past it, the group's candidates are built one by one, each with
# the full build timeout.
GROUP_BUILD_TIMEOUT_S = 60.0


@dataclass
class _Share:
    """One candidate's part of a group build's future (a list of build_job dicts)."""
    future: Any
    index: int

    def result(self, timeout=None) -> dict:
        return self.future.result(timeout=timeout)[self.index]


def _resolve(c: Candidate, docs: dict):
    """(OpModel, TargetModel) of a candidate. `docs`: text -> Document, shared by the candidates of one
    measurement (candidates given the same text share the operator, its inputs and its reference)."""
    from tensorlang.analysis.model import OpModel, TargetModel
    if isinstance(c.op, OpModel):
        op = c.op
        if isinstance(c.target, TargetModel):
            return op, c.target
        from tensorlang import api
        doc = api.load_text("")
        if c.target not in doc.model.targets:
            raise ValueError(f"target '{c.target}': give a TargetModel (only llvm/cuda are known without a file)")
        return op, doc.model.targets[c.target]
    from tensorlang import api
    doc = docs.get(str(c.op))
    if doc is None:
        doc = docs[str(c.op)] = api.load_text(str(c.op), f"<{c.name}>")
    errors = [d for d in doc.diagnostics if d.severity == "error"]
    if errors:
        raise ValueError(f"the operator text has errors: {errors[0].code} {errors[0].message}")
    if not doc.model.ops:
        raise ValueError("the operator text holds no operator")
    name = c.op_name or next(iter(doc.model.ops))
    if name not in doc.model.ops:
        raise ValueError(f"no operator '{name}' in the text; operators: {', '.join(doc.model.ops)}")
    target = c.target if isinstance(c.target, TargetModel) else doc.model.targets.get(c.target)
    if target is None:
        raise ValueError(f"no target '{c.target}' in the text; targets: {', '.join(doc.model.targets)}")
    return doc.model.ops[name], target


WORKDIR_PREFIX = "tensorlang-bench-"


def _sweep_stale_workdirs() -> None:
    """Remove the work dirs of harnesses whose process is gone (killed before it could clean up)."""
    import glob
    for d in glob.glob(os.path.join(tempfile.gettempdir(), WORKDIR_PREFIX + "*")):
        try:
            with open(os.path.join(d, "owner")) as f:
                pid = int(f.read().strip())
        except (OSError, ValueError):
            continue  # not one of ours, or still being set up
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            shutil.rmtree(d, ignore_errors=True)
        except PermissionError:
            pass  # alive, someone else's


class Harness:
    """Build and runner pools that outlive one measurement (a data collector keeps one open).
    Its work dir (shared libraries, runner logs) is removed on close, or by the next harness on this
    machine if its process was killed first."""

    def __init__(self, jobs: int | None = None, threads: int | None = None, workdir: str | None = None,
                 rpc=None):
        """`rpc`: an RPCConfig to run and time the kernels on TVM RPC servers instead of here."""
        from tensorlang.lower.targets import host_cores
        self.rpc = rpc
        self.jobs = jobs or host_cores()
        self.threads = threads
        self._own_dir = workdir is None
        if workdir is None:
            _sweep_stale_workdirs()
            workdir = tempfile.mkdtemp(prefix=WORKDIR_PREFIX)
            with open(os.path.join(workdir, "owner"), "w") as f:
                f.write(f"{os.getpid()}\n")
        self.workdir = workdir
        self.kernels = P.KernelPool(self.workdir, threads)
        self._builds = None
        self._starting = None  # the thread that starts the workers (prestart)
        self._n = 0
        self._last_ref = None  # (key, inputs, reference): a collector measures one task in many batches

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self):
        self._started()
        self.kernels.close()
        if self._builds is not None:
            P.kill_pool(self._builds)
            self._builds = None
        if self._own_dir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def builds(self):
        self._started()
        if self._builds is None:
            self._builds = P.build_pool(self.jobs)
        return self._builds

    def prestart(self) -> None:
        """Start the build workers and the TVM kernels' runner now, not at the first measurement, in a
        thread: the workers' forkserver imports TVM (1.3-1.5 s; pool.tvm_context) while the caller does
        what it does first (a collector imports TVM itself, loads a task, builds its space and samples it)."""
        def start():
            pool = P.build_pool(self.jobs)
            for _ in range(self.jobs):  # a process pool starts a worker per job submitted, up to its size
                pool.submit(P.W.ready)
            self._builds = pool
            if self.rpc is None:
                self.kernels.prestart("tvm")
        if self._starting is None and self._builds is None:
            self._starting = threading.Thread(target=start, name="tensorlang-prestart", daemon=True)
            self._starting.start()

    def _started(self) -> None:
        """Wait for prestart's thread: the pools are this thread's again."""
        if self._starting is not None:
            self._starting.join()
            self._starting = None

    # --------------------------------------------------------------- measure
    def measure(self, candidates: list[Candidate], repeat: int = 10, timeout_s: float = 30.0, *,
                min_repeat_ms: float = 100, verify: bool = True, seed: int = 0, build_timeout_s: float = 300.0,
                lock: bool = True, lock_path: str | None = None, slow_factor: float | None = None,
                best_known_s: float | None = None, joint_builds: bool = False, settled: float | None = None,
                progress: Callable[[str], None] | None = None) -> list[Result]:
        """`slow_factor`: a candidate whose first round is over `slow_factor` times the best latency known
        (`best_known_s`, or the best first round of this run if lower) is not timed again: its one figure
        decides nothing a second would, and a slow random schedule would take most of the run.
        `joint_builds`: the candidates of one operator are compiled together, a group per build worker
        (worker.build_group_job: about half the build time of small kernels; each candidate's compile_s is
        then its share of its group's) -- `collect --joint-builds`; a benchmark that compares compile times
        keeps builds apart.
        The same as `finish(prepare(...))`: a caller with work of its own to do while the builds run (a
        collector drawing the next task's candidates) calls the two itself."""
        return self.finish(self.prepare(candidates, verify=verify, seed=seed, joint_builds=joint_builds),
                           repeat, timeout_s, min_repeat_ms=min_repeat_ms, build_timeout_s=build_timeout_s,
                           lock=lock, lock_path=lock_path, slow_factor=slow_factor, best_known_s=best_known_s,
                           settled=settled, progress=progress)

    def prepare(self, candidates: list[Candidate], *, verify: bool = True, seed: int = 0,
                joint_builds: bool = False) -> "Prepared":
        """Step 1: submit the candidates' builds to the build workers and compute the references; returns
        while the builds run. Nothing may be timed on this machine until `finish` has collected them."""
        t_start = time.monotonic()
        docs: dict = {}
        items = [self._item(c, docs) for c in candidates]
        todo = [it for it in items if it.result.status == OK]
        prepared = Prepared(items, todo, {}, {}, verify, t_start)
        if not todo:
            return prepared
        self._started()
        if any(it.slot == "tvm" for it in todo):
            self.kernels.prestart("tvm")
        # 1. builds, in parallel; references meanwhile
        to_build = []
        for it in todo:
            if isinstance(it.cand.schedule, Library):
                it.spec = {"kind": "tvm", "path": it.cand.schedule.path, "keep": True}
            elif it.slot == "tvm":
                to_build.append(it)
            else:
                it.spec = {"kind": "python", "factory": it.cand.schedule.factory, "kwargs": it.cand.schedule.kwargs}
        self._submit_builds(to_build, joint_builds and self.rpc is None)
        inputs, refs = prepared.inputs, prepared.refs
        from tensorlang import interp
        t_ref = time.monotonic()
        for it in todo:
            if id(it.op) not in inputs:
                try:
                    inputs[id(it.op)], refs[id(it.op)] = self._reference(it, seed, verify)
                except MemoryError:  # the inputs themselves do not fit
                    inputs[id(it.op)] = None
                    for other in todo:
                        if other.op is it.op:
                            other.result.status, other.result.message = ERROR, interp.io_memory_message(it.op)
        prepared.reference_s = time.monotonic() - t_ref
        return prepared

    def finish(self, prepared: "Prepared", repeat: int = 10, timeout_s: float = 30.0, *, min_repeat_ms: float = 100,
               build_timeout_s: float = 300.0, lock: bool = True, lock_path: str | None = None,
               slow_factor: float | None = None, best_known_s: float | None = None, settled: float | None = None,
               progress: Callable[[str], None] | None = None) -> list[Result]:
        """Steps 2 and 3 of what `prepare` began: wait for the builds, then check and time under the lock.
        `settled`: a candidate is timed no more once more than half of its `repeat` figures are in and they
        lie within this fraction of each other (max / min - 1). The median of all `repeat` figures would lie
        between those figures whatever the rest were (over half of them are known), so its median is
        within `settled` of that one's; `runs` in its result says how many it had."""
        say = progress or (lambda msg: None)
        items, todo, inputs, refs, verify = (prepared.items, prepared.todo, prepared.inputs, prepared.refs,
                                             prepared.verify)
        if not todo:
            return [it.result for it in items]
        reference_s = prepared.reference_s
        self._collect_builds([it for it in todo if it.future is not None], build_timeout_s, say)
        prepare_s = time.monotonic() - prepared.t_start
        from tensorlang.analysis import dtypes as D
        todo = [it for it in todo if it.result.status == OK]
        data_keys: dict = {}
        for it in todo:
            if id(it.op) not in data_keys:
                self._n += 1
                data_keys[id(it.op)] = f"d{self._n}"
            it.spec.update(inputs={t.name: inputs[id(it.op)][t.name] for t in it.op.inputs},
                           outputs=[(t.name, t.shape, str(D.numpy_dtype(t.dtype))) for t in it.op.outputs],
                           data=data_keys[id(it.op)])
        # 2 and 3, under the lock
        ctx = measure_lock(lock_path) if lock else _no_lock()
        run = {}
        with ctx as held:
            wait = held.wait_s if held else 0.0
            run.update(lock_path=held.path if held else None, lock_wait_s=wait, lock_acquired_at=time.time(),
                       runner=(f"rpc://{self.rpc.host}:{self.rpc.port}/{self.rpc.key}" if self.rpc else "local"))
            for it in items:
                it.result.lock_wait_s, it.result.run = wait, run
            if self.rpc is not None:  # TVM kernels run on the servers; Python ones (PyTorch) stay here
                self._run_remote([it for it in todo if it.slot == "tvm"], refs, repeat, min_repeat_ms, timeout_s,
                                 verify, say)
                todo = [it for it in todo if it.slot != "tvm"]
            before = _cpu_snapshot(self.kernels)
            t_check = time.monotonic()
            for it in todo:
                self._check(it, refs.get(id(it.op)), timeout_s, verify, say, min_repeat_ms)
            check_s = time.monotonic() - t_check
            timed = [it for it in todo if it.result.status in TIMED]
            for r in range(repeat):
                if r == 1 and slow_factor is not None:
                    firsts = [it.result.times_s[0] for it in timed if it.result.times_s]
                    best = min(firsts + ([best_known_s] if best_known_s else []), default=None)
                    if best is not None:
                        timed = [it for it in timed if it.result.times_s and it.result.times_s[0] <= slow_factor * best]
                if settled is not None and 2 * r > repeat:
                    timed = [it for it in timed if not _settled(it.result.times_s, settled)]
                if not timed:
                    break
                k = r % len(timed)
                for it in timed[k:] + timed[:k]:
                    if it.result.status not in TIMED or len(it.result.times_s) > r:
                        continue  # (its checking run was its first figure)
                    try:
                        it.result.times_s.append(self.kernels.request(it.slot, it.key, ("time", it.key, min_repeat_ms),
                                                                      timeout_s))
                    except P.WorkerDied as e:
                        it.result.status, it.result.message = e.status, e.message
                        say(f"{it.cand.name}: {e.status} while timing: {e.message}")
                    except P.RequestError as e:
                        it.result.status, it.result.message = ERROR, str(e)
                say(f"round {r + 1}/{repeat} done")
            run.update(_cpu_since(before, self.kernels))
            # Where the run's time went (seconds): builds and references before the lock (the reference
            # overlaps the builds), then the checking run and the timing rounds under it.
            run.update(prepare_s=round(prepare_s, 3), reference_s=round(reference_s, 3), check_s=round(check_s, 3),
                       timing_s=round(time.monotonic() - t_check - check_s, 3))
        for it in todo:
            try:
                self.kernels.unload(it.slot, it.key)
            except (P.WorkerDied, P.RequestError):
                pass
            if it.spec.get("path") and not it.spec.get("keep"):
                try:
                    os.unlink(it.spec["path"])
                except OSError:
                    pass
        for it in items:
            if it.result.status not in TIMED:
                it.result.times_s = []  # a kernel that failed a round has no valid figure
        return [it.result for it in items]

    def _reference(self, it: _Item, seed: int, verify: bool):
        """(inputs, reference outputs) of a candidate's operator; the reference is a ReferenceUnavailable when it
        cannot be computed here, None without `verify`. The last operator's are kept for the next measurement."""
        from tensorlang import interp
        key = (it.cand.op, it.op.name, seed, interp.memory_budget(), interp.time_limit()) \
            if isinstance(it.cand.op, str) else None
        if key is not None and self._last_ref is not None and self._last_ref[0] == key \
                and (self._last_ref[2] is not None or not verify):
            return self._last_ref[1], self._last_ref[2]
        self._last_ref = None  # let the previous operator's arrays go before making this one's
        inputs = interp.random_inputs(it.op, seed)
        ref = None
        if verify:
            try:
                ref = interp.reference_outputs(it.op, inputs)
            except interp.ReferenceUnavailable as e:
                ref = e
        if key is not None:
            self._last_ref = (key, inputs, ref)
        return inputs, ref

    def _item(self, c: Candidate, docs: dict) -> _Item:
        res = Result(c.name, getattr(c.op, "name", c.op_name or "?"), getattr(c.target, "name", str(c.target)),
                     OK, info=dict(c.info))
        it = _Item(c, res)
        try:
            it.op, it.target = _resolve(c, docs)
        except ValueError as e:
            res.status, res.message = ERROR, str(e)
            return it
        res.op, res.target, res.flops = it.op.name, it.target.name, it.op.flops
        if it.target.is_gpu:
            res.status, res.message = ERROR, "measuring needs a CPU target (GPU kernels cannot run here)"
        elif self.rpc is None and not isinstance(c.schedule, PythonKernel):
            from tensorlang.lower.targets import cannot_run
            refusal = cannot_run(it.target)  # built for a CPU this host lacks: it could only die of SIGILL
            if refusal:
                res.status, res.message = ERROR, refusal
        self._n += 1
        it.key = f"c{self._n}"
        it.slot = "python" if isinstance(c.schedule, PythonKernel) else "tvm"
        return it

    def _submit_builds(self, items: list[_Item], joint: bool) -> None:
        """Each item's build as a future: alone, or (`joint`) in groups of one operator and CPU target, as
        many groups as build workers (or of 8 at most: one slow candidate delays only its group)."""
        def job(it):
            self._n += 1
            safe = "".join(ch if ch.isalnum() else "_" for ch in it.cand.name)[:40]
            return {"op": it.op, "target": it.target, "schedule": it.cand.schedule,
                    "path": os.path.join(self.workdir, f"k{self._n}_{safe}.so")}
        groups: dict = {}
        for it in items:
            if joint and not it.target.is_gpu:
                groups.setdefault((id(it.op), it.target.name), []).append(it)
            else:
                it.future = self.builds().submit(P.W.build_job, job(it))
        for members in groups.values():
            n = max(min(self.jobs, len(members)), -(-len(members) // 8))
            for k in range(n):
                chunk = members[k::n]
                jobs = [job(it) for it in chunk]
                self._n += 1
                shared = self.builds().submit(P.W.build_group_job, jobs, os.path.join(self.workdir, f"g{self._n}.so"))
                for i, it in enumerate(chunk):
                    it.future = _Share(shared, i)

    def _collect_builds(self, items: list[_Item], timeout_s: float, say) -> None:
        retry = []
        deadline = time.monotonic() + timeout_s
        group_deadline = time.monotonic() + min(timeout_s, GROUP_BUILD_TIMEOUT_S)
        for it in items:
            try:
                if isinstance(it.future, _Share):
                    out = it.future.result(timeout=max(0.0, group_deadline - time.monotonic()))
                else:
                    out = it.future.result(timeout=max(1.0, deadline - time.monotonic()))
            except FutureTimeout:
                if isinstance(it.future, _Share):  # a group too slow: each of it alone, with its own time
                    retry.append(it)
                else:
                    it.result.status, it.result.message = BUILD_ERROR, f"the build took longer than {timeout_s:g} s"
                continue
            except BrokenProcessPool:
                retry.append(it)
                continue
            self._take_build(it, out, say)
        if any(it.result.status == BUILD_ERROR and "longer than" in it.result.message for it in items) or retry:
            P.kill_pool(self._builds)
            self._builds = None
        for it in retry:  # a worker died (or a group was too slow): rebuild each of the affected alone
            job = {"op": it.op, "target": it.target, "schedule": it.cand.schedule,
                   "path": os.path.join(self.workdir, f"{it.key}_retry.so")}
            pool = P.build_pool(1)
            try:
                self._take_build(it, pool.submit(P.W.build_job, job).result(timeout=timeout_s), say)
            except BrokenProcessPool:
                it.result.status, it.result.message = CRASH, "the compiler crashed while building this candidate"
            except FutureTimeout:
                it.result.status, it.result.message = BUILD_ERROR, f"the build took longer than {timeout_s:g} s"
            finally:
                P.kill_pool(pool)

    def _take_build(self, it: _Item, out: dict, say) -> None:
        r = it.result
        r.schedule_s, r.compile_s = out.get("schedule_s"), out.get("compile_s")
        r.worker["build_pid"] = out.get("pid")
        if "error" in out:
            r.status = SCHEDULE_ERROR if out["stage"] == "schedule" else BUILD_ERROR
            r.message = out["error"]
            say(f"{it.cand.name}: {r.status}: {r.message}")
            return
        r.worker["build_tensor_intrin"] = out.get("tensor_intrin")
        it.spec = {"kind": "tvm", "path": out["path"], "func": out.get("func", "main")}
        if out.get("group"):
            r.worker["build_group"] = out["group"]

    def _run_remote(self, todo: list[_Item], refs: dict, repeat: int, min_repeat_ms: float, timeout_s: float,
                    verify: bool, say) -> None:
        from tensorlang.bench.rpc import RemoteJob, RPCRunner
        jobs = [RemoteJob(it.spec["path"], it.spec["inputs"], it.spec["outputs"]) for it in todo]
        RPCRunner(self.rpc).run(jobs, repeat, min_repeat_ms, timeout_s, say)
        for it, job in zip(todo, jobs):
            r = it.result
            r.worker["server"] = job.server
            r.load_s = job.load_s
            if job.status != OK:
                r.status, r.message = (CRASH if job.status == "crash" else ERROR), job.message
                continue
            if verify:
                self._verify(it, job.outputs_got, refs.get(id(it.op)), say)
            if r.status in TIMED:
                r.times_s = job.times_s
            if it.spec.get("path") and not it.spec.get("keep"):
                try:
                    os.unlink(it.spec["path"])
                except OSError:
                    pass

    def _check(self, it: _Item, ref: dict | None, timeout_s: float, verify: bool, say,
               min_repeat_ms: float | None = None) -> None:
        """Load the kernel and run it once; its outputs against the reference. A TVM kernel's run that alone
        lasts `min_repeat_ms` is the first round's figure too (a batch of one call, as time_evaluator would
        time it; only its first call): with the slow-candidate rule, a random schedule 10x slower than the
        best known is then run once, not three times (a warm-up, a timed call, the check)."""
        r = it.result
        try:
            got = self.kernels.load(it.slot, it.key, dict(it.spec, return_outputs=verify, run=True), timeout_s)
        except P.WorkerDied as e:
            r.status, r.message = e.status, e.message
            say(f"{it.cand.name}: {e.status}: {e.message}")
            return
        except P.RequestError as e:
            from tensorlang import interp
            r.status = ERROR
            r.message = f"{interp.io_memory_message(it.op)} ({e})" if str(e).startswith("MemoryError") else str(e)
            say(f"{it.cand.name}: error: {r.message}")
            return
        r.load_s = got["load_s"]
        call_s = got.get("call_s")
        if min_repeat_ms is not None and call_s is not None and call_s >= min_repeat_ms / 1e3:
            r.times_s.append(call_s)
        runner = self.kernels.runners.get(it.slot)
        if runner is not None:
            r.worker["runner_pid"] = runner.info.get("pid")
            r.worker["runner_tensor_intrin"] = runner.info.get("tensor_intrin")
        if verify:
            self._verify(it, got["outputs"], ref, say)

    @staticmethod
    def _verify(it: _Item, outputs: dict, ref, say) -> None:
        """`ref`: the reference outputs, or the ReferenceUnavailable that says why there are none."""
        from tensorlang import interp
        r = it.result
        for t in it.op.outputs:
            out = outputs.get(t.name)
            if out is None or tuple(out.shape) != tuple(t.shape):
                r.status, r.message = WRONG, f"output {t.name} missing or of the wrong shape"
                return
        if isinstance(ref, interp.ReferenceUnavailable):
            r.status, r.message = UNCHECKED, f"timed, but not checked against the NumPy reference: {ref}"
            say(f"{it.cand.name}: unchecked: {ref}")
            return
        worst_abs, worst_rel, ok = 0.0, 0.0, True
        for t in it.op.outputs:
            c = interp.compare(outputs[t.name], ref[t.name], t.dtype)
            worst_abs, worst_rel, ok = max(worst_abs, c["max_abs"]), max(worst_rel, c["max_rel"]), ok and c["ok"]
        r.max_abs, r.max_rel = worst_abs, worst_rel
        if not ok:
            r.status, r.message = WRONG, "mismatch against the NumPy reference"
            say(f"{it.cand.name}: wrong result (max abs error {worst_abs:.3g})")


def _settled(times_s: list[float], tolerance: float) -> bool:
    return bool(times_s) and max(times_s) <= min(times_s) * (1 + tolerance)


def _cpu_snapshot(kernels) -> dict:
    """CPU time of the machine and of our processes (this one, the runners) now, in clock ticks."""
    snap = {"t": time.monotonic(), "busy": None, "ours": {}}
    try:
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
        snap["busy"] = sum(v) - v[3] - (v[4] if len(v) > 4 else 0)  # all but idle and iowait
    except (OSError, ValueError, IndexError):
        return snap
    pids = [os.getpid()] + [r.process.pid for r in kernels.runners.values()] + \
        [proc.pid for proc, _, _ in kernels.pending.values()]
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            snap["ours"][pid] = int(fields[11]) + int(fields[12])  # utime + stime
        except (OSError, ValueError, IndexError):
            pass
    return snap


def _cpu_since(before: dict, kernels) -> dict:
    """How long checking and timing took, the load average, and the share of the machine's CPU time that processes
    other than ours used meanwhile (`other_cpu_frac`: 0 on a quiet machine; noise to expect when high)."""
    after = _cpu_snapshot(kernels)
    out = {"locked_s": round(after["t"] - before["t"], 3), "loadavg_1min": None, "other_cpu_frac": None}
    try:
        out["loadavg_1min"] = round(os.getloadavg()[0], 2)
    except OSError:
        pass
    if before["busy"] is None or after["busy"] is None:
        return out
    ours = sum(t - before["ours"].get(pid, 0) for pid, t in after["ours"].items())
    hz = os.sysconf("SC_CLK_TCK")
    cpus = os.cpu_count() or 1
    capacity = (after["t"] - before["t"]) * hz * cpus
    if capacity > 0:
        out["other_cpu_frac"] = round(max(0.0, (after["busy"] - before["busy"] - ours) / capacity), 3)
    return out


class _no_lock:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


def measure_candidates(candidates: list[Candidate], repeat: int = 10, timeout_s: float = 30.0, *,
                       harness: Harness | None = None, jobs: int | None = None, threads: int | None = None,
                       **kwargs) -> list[Result]:
    """Build, check and time `candidates` side by side (see the module's docstring); one Result each, in order.
    kwargs: min_repeat_ms, verify, seed, build_timeout_s, lock, lock_path, progress (Harness.measure)."""
    if harness is not None:
        return harness.measure(candidates, repeat, timeout_s, **kwargs)
    with Harness(jobs=jobs, threads=threads) as h:
        return h.measure(candidates, repeat, timeout_s, **kwargs)
