"""`tensorlang collect`: measure candidate schedules per task and append them to the measured dataset.

    tensorlang collect data/workloads --target cpu --trials 64 -o data/measured/cpu

A task is one operator of a .tsched file. Candidates per task: the `roller` point first, then
uniform samples of the Space Builder's space (`random`), in a fixed order per task (seeded by
the task's hash), so a rerun after a kill regenerates the same candidates and skips, by key,
every one already recorded: nothing finished is lost and nothing is measured twice.

Measurement goes through the bench harness (builds in worker processes, kernels in a runner pool
that survives crashes and hangs, timing under the machine-wide measurement lock). Before each
task and each batch the collector also waits for that lock, so it yields to benchmarks and timed
tests that hold it: its sampling and building never run under their timings.

A record: task (file, op, hash of its name-independent form), target, machine, the schedule as a
tensor sentence (with its version stamps) and as .tsched text, the sketch and decisions, status,
latency (median, min, max over the rounds), the machine's load during the measurement, time.
"""
from __future__ import annotations

import hashlib
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tensorlang.data.dataset import Writer, read

DEFAULT_DIR = Path("data/measured")
# A candidate this many times slower than its task's best after one timing round is recorded then. Twice the
# slowest quality bucket's bound (lm/data.py: Q3 is over 2x the best): no second figure could move it into
# another bucket, nor make it the best, so the two more rounds it would get only cost time (it was 10x).
SLOW_FACTOR = 4.0
# A candidate whose first two of three figures agree within 2 % is timed no more (Harness.finish: their range
# bounds the median of three), so its latency is within 2 % of the one a third figure gives -- finer than the
# quality buckets (5 % for Q0). Measured (benchmarks/timing_protocol.py, znver4, two runs): 9-16 % less timing
# per candidate; one pass's latencies about as close to another's as with every round (median deviation
# 1.2 % vs 1.9 % in one run, 0.6 % vs 0.5 % in the other).
SETTLED = 0.02


@dataclass
class Task:
    file: str
    op: str
    text: str  # the whole file
    key: str  # op_hash of the operator: the task's key in the datasets

    @property
    def label(self) -> str:
        return f"{Path(self.file).stem}:{self.op}"


def find_tasks(paths: list[str]) -> list[Task]:
    """Every operator of every .tsched file under `paths` (files or directories)."""
    from tensorlang import api
    files: list[Path] = []
    for p in map(Path, paths):
        files += sorted(p.rglob("*.tsched")) if p.is_dir() else [p]
    tasks = []
    for f in files:
        doc = api.load(f)
        for op in doc.model.ops:
            tasks.append(Task(str(f), op, doc.text, op_hash(doc.model.ops[op])))
    return tasks


def task_hash(space) -> str:
    return op_hash(space.op)


def op_hash(op) -> str:
    """The operator's name-independent form, hashed: the same workload in two models is one task. Its integers
    are spelled in digits alone (`digits_spelled`: as sentences v4 did), so keys outlive a change of spelling."""
    from tensorlang.space import sentence as S
    return hashlib.sha256(" ".join(S.digits_spelled(S.op_tokens(op))).encode()).hexdigest()[:16]


def record_key(tkey: str, target: str, machine: str, sketch: int, decisions) -> str:
    """What makes a measured record unique: the task, the target, the machine that timed it, the point."""
    decisions = tuple(tuple(d) if isinstance(d, (list, tuple)) else d for d in decisions)
    return hashlib.sha256(f"{tkey}|{target}|{machine}|{sketch}|{decisions}".encode()).hexdigest()


def host_record(cpu) -> dict:
    """The host that timed a record, as the record names it."""
    return {"id": cpu.id, "cpu": cpu.name, "cores": cpu.cores, "simd": cpu.simd, "model": cpu.model}


def yield_to_measurements() -> None:
    """Wait while another process (a benchmark, a timed test) holds the measurement lock, so that the
    collector's own sampling and building never load the CPU under someone else's timing."""
    from tensorlang.bench.lock import measure_lock
    with measure_lock():
        pass


def candidates_for(space, task_key: str, count: int, measured=None):
    """The task's candidate points in their fixed order: roller, then seeded random samples -- those of
    `space.sample(count, seed)`, drawn as decisions first (`sample_decisions`: no postprocessors, no
    conversion; the same draws where no postprocessor refuses, which on CPU none does) so that the ones
    `measured(sketch, decisions)` says are recorded already are never replayed: a rerun of a collect used
    to spend 80 % of its time re-sampling the points it had measured. -> (candidates, how many were left
    out as measured)."""
    from tensorlang.baselines.roller import roller_point
    from tensorlang.space.space import Infeasible
    out, known, taken = [], 0, set()
    if count <= 0:
        return out, known
    is_measured = measured or (lambda sketch, decisions: False)
    try:
        roller = roller_point(space)
        taken.add((roller.sketch, roller.decisions))
        if is_measured(roller.sketch, roller.decisions):
            known += 1
        else:
            out.append(("roller", roller))
    except Infeasible:
        pass
    seed = int(task_key, 16) % (1 << 31)
    for sketch, decisions, _ in space.sample_decisions(count, seed=seed):
        if len(out) + known >= count:
            break
        if (sketch, decisions) in taken:
            continue
        if is_measured(sketch, decisions):
            known += 1
            continue
        try:  # replayed in full: postprocessors and the statements the build workers apply
            out.append(("random", space.replay(sketch, lambda _, made, d=decisions: d[len(made)])))
        except Infeasible:
            continue
    return out, known


def metaschedule_candidates(space, trials: int, top: int, seed: int, log=print) -> list:
    """MetaSchedule's evolutionary search (`trials` measured trials, under the measurement lock: it
    times kernels) -> its `top` fastest schedules, each located in our space as a point. A schedule
    that membership's search (its replay budget) does not find in the space is reported and left out."""
    from tensorlang.baselines.metaschedule import tune_records
    from tensorlang.bench.lock import measure_lock
    from tensorlang.space import metaschedule as msx
    from tensorlang.space.convert import ConversionError, trace_to_statements
    from tensorlang.space.membership import locate
    with measure_lock():
        found = tune_records(space.mod, space.tvm_target, msx.rule_kind(space.target), trials, top, seed=seed)
    out, missing = [], 0
    for sch, _ in found:
        try:
            stmts, _ = trace_to_statements(sch.trace, space.mod, space.op)
        except ConversionError:
            stmts = None
        m = locate(space, sch.mod, sch.trace, stmts)
        if not m.inside:  # rare: a deeper search before giving up
            m = locate(space, sch.mod, sch.trace, stmts, budget=256)
        if m.inside:  # replayed again for its statements (locate's replays skip the conversion)
            point = space.replay(m.point.sketch, lambda _, made, d=m.point.decisions: d[len(made)])
            out.append((f"metaschedule:{trials}", point))
        else:
            missing += 1
    if missing:
        log(f"    {missing} of MetaSchedule's {len(found)} best schedules not located in the space; left out")
    return out


def model_run(generator, samples: int) -> str:
    """What a task's model candidates depend on besides the task, as one word for `model-candidates.done`: the
    model's name and version, its decoding (beams, the rules on), the sample count, temperature and sampler. A
    key of another decoding does not match, so its candidates are decoded again."""
    from tensorlang.lm.decoding_rules import RULES
    from tensorlang.lm.generate import SAMPLE_TEMPERATURE, SAMPLER
    rules = ",".join(r.attr for r in RULES if getattr(generator, r.attr, False))
    return (f"{generator.name}|beams={generator.num_beams}|{rules}|samples={samples}|T={SAMPLE_TEMPERATURE}"
            f"|sampler={SAMPLER}").replace(" ", "_")


def model_candidates(space, generator, samples: int, seed: int) -> list:
    """The tensor language model's candidates: its one-pass schedule (greedy or beam search, as its checkpoint
    says), then seeded samples -- up to `samples` distinct legal points (as many as the space holds). Same model,
    task and seed -> the same candidates, so a rerun skips them by key. Labelled with the model's name and
    version: `tlm:<name>` the one-pass one, `tlm:<name>:sample` the others."""
    outs = generator.sample(space, samples, seed=seed)
    return [(f"tlm:{generator.name}" + (":sample" if n else ""), out.point) for n, out in enumerate(outs)]


class RecordedPoints:
    """The points of another dataset's records, by task: `collect --points-from DIR` measures them here --
    another CPU's fastest schedules on this one (a new host starts from what was fast elsewhere), or
    exactly the candidates another collect measured (benchmarks/collect_speed.py: old code and new on the
    same candidates). `top` > 0: each machine's `top` fastest correct records per task (latencies of two
    CPUs are not ranked together), fastest first; 0: every record, in the dataset's order. Records made
    under sentences v1 are matched by their v1 task hash; their stored (sketch, decisions) are points of
    today's space as they were (data/reencode.py)."""

    def __init__(self, root: str | Path, top: int = 0):
        from collections import defaultdict
        self.top = top
        self.by_task: dict[str, list[dict]] = defaultdict(list)
        for rec in read(root):
            if top <= 0 or (rec["status"] == "ok" and rec.get("median_s")):
                self.by_task[rec["task"]["hash"]].append(rec)

    def records(self, space, task_key: str) -> list[dict]:
        from tensorlang.data.reencode import is_current, v1_hash
        recs = list(self.by_task.get(task_key, ()))
        recs += [r for r in self.by_task.get(v1_hash(space.op), ()) if not is_current(r)]
        if self.top <= 0:
            return recs
        per_machine: dict[str, list[dict]] = {}
        for r in sorted(recs, key=lambda r: r["median_s"]):
            per_machine.setdefault(r["machine"], []).append(r)
        return sorted((r for rs in per_machine.values() for r in rs[:self.top]), key=lambda r: r["median_s"])

    def candidates(self, space, task_key: str) -> tuple[list, list[str]]:
        """-> ([(policy, point)], [why a record's point was left out]); a point is replayed in full
        (postprocessors, statements) by `data verify`'s replay, which says why one is not legal."""
        from tensorlang.data.corpus_check import Rejected, decisions_of, replay_in_full
        out, refused, seen = [], [], set()
        for rec in self.records(space, task_key):
            sketch, decisions = decisions_of(space, rec)
            if (sketch, decisions) in seen:
                continue
            seen.add((sketch, decisions))
            try:
                out.append((rec["policy"], replay_in_full(space, sketch, decisions)))
            except Rejected as e:
                refused.append(f"{rec['key'][:12]} ({rec['policy']}, {rec['machine']}): {str(e)[:160]}")
        return out, refused


@dataclass
class _Batch:
    """Candidates of one task whose builds are under way (Harness.prepare), and what their records need."""
    task: Task
    label: str  # "[n/N] file:op", for the log
    tkey: str
    space: Any
    out: Any  # the Writer its records go to
    compiled_for: str
    chunk: list  # (record key, policy, point)
    load_before: float
    done: tuple  # (a _Done, a key): what is finished once this batch is recorded (its task's search, its
    # task's model candidates)
    prepared: Any


class CollectRefused(Exception):
    """Measurements must not be recorded now (see machine.recording_refused)."""


class _Done:
    """Task keys whose MetaSchedule search, or whose model candidates, are recorded: an append-only file next
    to the shards, so a rerun neither searches nor decodes again (`metaschedule-N.done`: the search's candidates
    are all recorded; `model-candidates.done`: a model's, under `model_run`)."""

    def __init__(self, path: Path):
        self.path = path
        self.keys = set(path.read_text().split()) if path.exists() else set()

    def add(self, key: str) -> None:
        with open(self.path, "a") as f:
            f.write(key + "\n")
            f.flush()
            os.fsync(f.fileno())
        self.keys.add(key)


def collect(paths: list[str], target: str, out_dir: str | Path = DEFAULT_DIR, trials: int | None = 32,
            budget_min: float | None = None, batch: int = 16, repeat: int = 3, timeout_s: float = 30.0,
            min_repeat_ms: float = 50, rpc=None, ms_trials: int = 0, ms_top: int = 8, split_path: str | Path | None = None,
            heldout_dir: str | Path | None = None, slow_factor: float | None = SLOW_FACTOR,
            settled: float | None = SETTLED, model: str | Path | None = None,
            model_samples: int = 8, skip_heldout: bool = False, order: str = "files", joint_builds: bool = False,
            points_from: str | Path | None = None, points_top: int = 0, log=print) -> dict:
    """Measure up to `trials` candidates per task (or until `budget_min` minutes pass). Resumable.
    Each batch is built, then checked and timed by the harness; a task's last batch is checked and timed only
    after the next task is planned (loaded, its space built, its candidates drawn), so that the planning runs
    beside the builds and nothing runs beside a timing.
    `rpc`: an RPCConfig -- kernels are timed on the tracker's servers (bench/rpc.py), and the records'
    machine is the servers' key; each record names the server that measured it.
    Tasks the split file holds out (data/split.py) are recorded in `heldout_dir` (default
    data/heldout/<name of out_dir>), never with the training data in `out_dir`.
    `slow_factor`: a candidate over that many times the task's best known latency after its first
    timing round is recorded after that round (`runs` says how many figures stand behind a latency;
    SLOW_FACTOR says why 4). `settled`: a candidate whose first figures agree within that fraction is timed
    no more (SETTLED says why 2 %).
    `model`: a tensor-language-model checkpoint whose `model_samples` candidates per task are measured too
    (after roller/random; `trials=0` for the model's alone) -- the iterate rounds of `tensorlang train`.
    `skip_heldout`: leave the held-out tasks out altogether.
    `order`: "files" (the files' order) or "fewest-records" (the tasks with the fewest records timed on this
    machine first, then the files' order): a budgeted run then widens the corpus -- or, for the model's
    rounds, moves on to other tasks -- instead of measuring the same first files again.
    `points_from`: a dataset whose records' points are measured too (RecordedPoints: with `points_top` K,
    each machine's K fastest per task; `trials=0` for them alone).
    `joint_builds`: a batch's candidates compiled together, a group per build worker (Harness.measure); each
    record's `build_group` says how many shared its build. Off by default: it halves the build time of 8 small
    kernels in one process, but on benchmarks/collect_speed.py's tasks the whole collect was no faster (0.87x
    against separate builds, same candidates: a group waits for its slowest kernel while the other worker
    idles)."""
    from tensorlang.bench.harness import Candidate, Harness

    # The workers start first: their imports (TVM, 1.5-2.5 s each) overlap this process's own (2-3 s) and
    # the loading of the tasks, instead of following them.
    harness = Harness(rpc=rpc)
    if paths:
        harness.prestart()
    with harness:
        from tensorlang import api
        from tensorlang.data import split
        from tensorlang.lower.targets import cannot_run, mcpu_of
        from tensorlang.machine import host, recording_refused
        from tensorlang.parser.printer import format_stmt
        from tensorlang.space import sentence as S
        from tensorlang.space.space import Space

        refusal = recording_refused()
        if refusal and rpc is None:
            raise CollectRefused(refusal)
        start = time.time()
        deadline = start + budget_min * 60 if budget_min else None
        trials = 1 << 30 if trials is None else trials
        generator = None
        if model is not None:
            from tensorlang.lm.generate import Generator
            generator = Generator(model)
            log(f"collect: {model_samples} candidates per task from {generator.name} ({model})")
        recorded = RecordedPoints(points_from, points_top) if points_from is not None else None
        writer = Writer(out_dir)
        heldout = split.heldout_keys(split_path or split.DEFAULT_PATH)
        heldout_dir = Path(heldout_dir or Path("data/heldout") / Path(out_dir).name)
        heldout_writer = None
        # RPC servers are other machines: their key names them (this host does not know their CPU).
        timed_on = {"id": f"rpc:{rpc.key}", "rpc": rpc.key} if rpc else host_record(host())
        machine = timed_on["id"]
        best_known = best_latencies([out_dir, heldout_dir], machine)
        tasks = find_tasks(paths)
        if skip_heldout:  # by the key find_tasks computed: no space is built for them (171 of 575 tasks)
            tasks = [t for t in tasks if t.key not in heldout]
        counts = record_counts([out_dir, heldout_dir], machine) if order == "fewest-records" or ms_trials else {}
        if order == "fewest-records":
            tasks = fewest_records_first(tasks, counts)
        elif order == "interleave":
            tasks = interleaved(tasks, paths)
        elif order != "files":
            raise ValueError(f"unknown task order {order!r}: files, fewest-records or interleave")
        ms_done = _Done(Path(out_dir) / f"metaschedule-{ms_trials}.done") if ms_trials else None
        model_done = _Done(Path(out_dir) / "model-candidates.done") if generator is not None else None
        run = model_run(generator, model_samples) if generator is not None else None
        written = skipped = nothing_new = 0
        log(f"collect: {len(tasks)} tasks, target {target}, {len(writer.keys)} records already in {out_dir}")
        def finish(batch: _Batch) -> None:
            """Check and time a batch whose builds `harness.prepare` started; write its records."""
            nonlocal written
            results = harness.finish(batch.prepared, repeat=repeat, timeout_s=timeout_s, min_repeat_ms=min_repeat_ms,
                                     slow_factor=slow_factor, best_known_s=best_known.get(batch.tkey),
                                     settled=settled)
            load_after = os.getloadavg()[0]
            for (key, policy, point), res in zip(batch.chunk, results):
                sentence = S.encode(batch.space, point)
                record = {
                    "key": key, "task": {"file": batch.task.file, "op": batch.task.op, "hash": batch.tkey},
                    "target": target, "compiled_for": batch.compiled_for, "machine": machine, "host": timed_on,
                    "policy": policy,
                    "sketch": point.sketch, "decisions": [list(d) if isinstance(d, tuple) else d
                                                           for d in point.decisions],
                    "sentence": " ".join(sentence), "versions": S.version_tokens(),
                    "schedule": "\n".join(format_stmt(s) for s in point.stmts),
                    "status": res.status, "message": res.message[:300],
                    "server": res.worker.get("server") or "local",
                    "median_s": res.median_s, "min_s": res.min_s, "max_s": res.max_s, "runs": len(res.times_s),
                    "min_repeat_ms": min_repeat_ms, "build_group": res.worker.get("build_group", 1),
                    "flops": res.flops, "load": [round(batch.load_before, 2), round(load_after, 2)],
                    "time": round(time.time(), 3),
                }
                written += batch.out.append(record)
            best = min((r.median_s for r in results if r.ok), default=None)
            if best is not None:
                best_known[batch.tkey] = min(best, best_known.get(batch.tkey, best))
            phases = results[0].run if results else {}
            log(f"  {batch.label}: +{len(batch.chunk)} records"
                + (f", best of batch {best * 1e3:.3f} ms" if best else "")
                + (f" (builds+reference {phases['prepare_s']:.1f} s (reference {phases['reference_s']:.1f} s), check "
                   f"{phases['check_s']:.1f} s, timing {phases['timing_s']:.1f} s)" if "timing_s" in phases else ""))
            for done_set, key in batch.done:  # every candidate of the search, or of the model, is recorded
                done_set.add(key)

        # The last batch of a task is checked and timed only after the next task is planned (loaded, its space
        # built, its candidates drawn): that work runs beside the batch's builds, on the cores a build worker
        # leaves idle, and never beside a timing.
        inflight: _Batch | None = None
        try:
            for n, task in enumerate(tasks):
                if deadline and time.time() > deadline:
                    break
                if inflight is not None and ms_done is not None:  # MetaSchedule times kernels: no build beside it
                    done, inflight = inflight, None
                    finish(done)
                doc = api.load_text(task.text, task.file)
                tgt = doc.model.targets.get(target)
                if tgt is None:
                    log(f"  {task.label}: no target '{target}' in the file; skipped")
                    continue
                refusal = None if rpc else cannot_run(tgt)
                if refusal:
                    log(f"  {task.label}: skipped: {refusal}")
                    continue
                compiled_for = tgt.params.get("arch", "sm_90") if tgt.is_gpu else mcpu_of(tgt)
                yield_to_measurements()
                space = Space(doc.model.ops[task.op], doc.primfunc(task.op), tgt)
                tkey = task.key  # = task_hash(space), computed once by find_tasks
                out = writer
                if tkey in heldout and Path(out_dir).resolve() != heldout_dir.resolve():
                    heldout_writer = heldout_writer or Writer(heldout_dir)
                    out = heldout_writer
                pending, pending_keys = [], set()
                cands, known = candidates_for(space, tkey, trials, lambda sketch, decisions: record_key(
                    tkey, target, machine, sketch, decisions) in out.keys)
                skipped += known
                finished = []  # (a _Done, a key) to mark once this task's candidates are all recorded
                model_key = f"{tkey}|{target}|{machine}|{run}"
                if generator is not None and model_key not in model_done.keys:  # else recorded by an earlier run
                    try:
                        cands += model_candidates(space, generator, model_samples, int(tkey, 16) % (1 << 31))
                        finished.append((model_done, model_key))
                    except Exception as e:  # one task the model cannot decode must not stop the collection
                        log(f"  {task.label}: the model's candidates failed: {type(e).__name__}: {str(e)[:200]}")
                if recorded is not None:
                    theirs, refused = recorded.candidates(space, tkey)
                    cands += theirs
                    for why in refused:
                        log(f"  {task.label}: a point of {points_from} left out: {why}")
                ms_key = f"{tkey}|{target}|{machine}"
                if ms_done is not None and ms_key not in ms_done.keys and measured_whole(space, counts.get(tkey, 0)):
                    log(f"  [{n + 1}/{len(tasks)}] {task.label}: every point of the space is measured; no MetaSchedule")
                    ms_done.add(ms_key)
                if ms_done is not None and ms_key not in ms_done.keys:
                    log(f"  [{n + 1}/{len(tasks)}] {task.label}: MetaSchedule, {ms_trials} trials")
                    try:
                        cands += metaschedule_candidates(space, ms_trials, ms_top, int(tkey, 16) % (1 << 31), log)
                        finished.append((ms_done, ms_key))
                    except Exception as e:  # TVM failing on one task must not stop the collection
                        log(f"    MetaSchedule failed: {type(e).__name__}: {str(e)[:200]}")
                for policy, point in cands:
                    key = record_key(tkey, target, machine, point.sketch, point.decisions)
                    if key in out.keys or key in pending_keys:
                        skipped += 1
                        continue
                    pending.append((key, policy, point))
                    pending_keys.add(key)
                if inflight is not None:  # this task is planned: the previous one's builds may be timed now
                    done, inflight = inflight, None
                    finish(done)
                if not pending:  # every candidate is recorded already
                    # the random draws are seeded by the task: a rerun with the same --trials draws the same
                    log(f"  [{n + 1}/{len(tasks)}] {task.label}: nothing new ({len(cands) + known} candidates "
                        "recorded already" + ("" if measured_whole(space, len(cands) + known) else
                                              "; a larger --trials draws new ones") + ")")
                    nothing_new += 1
                    for done_set, key in finished:
                        done_set.add(key)
                starts = range(0, len(pending), batch)
                for i in starts:
                    if deadline and time.time() > deadline:
                        break
                    yield_to_measurements()
                    chunk = pending[i:i + batch]
                    # The schedule travels as .tsched text: the build workers apply it like any written schedule.
                    measured = [Candidate(f"{policy}#{j}", task.text, target,
                                          "\n".join(format_stmt(s) for s in point.stmts), op_name=task.op)
                                for j, (_, policy, point) in enumerate(chunk)]
                    last = i == starts[-1]
                    current = _Batch(task, f"[{n + 1}/{len(tasks)}] {task.label}", tkey, space, out, compiled_for,
                                     chunk, os.getloadavg()[0], tuple(finished) if last else (),
                                     harness.prepare(measured, joint_builds=joint_builds))
                    if last:
                        inflight = current
                    else:
                        finish(current)
            if inflight is not None:
                done, inflight = inflight, None
                finish(done)
        except Exception:  # built already: a later task's failure does not lose its records
            if inflight is not None:
                finish(inflight)
            raise
        finally:  # a finish or a stop (SIGTERM, Ctrl-C) leaves only compressed shards, ready to commit
            for w in (writer, heldout_writer):
                if w is not None:
                    w.close(compress_open=True)
    return {"tasks": len(tasks), "written": written, "skipped": skipped, "nothing_new": nothing_new,
            "seconds": round(time.time() - start, 1)}


def record_counts(dirs: list[str | Path], machine: str) -> dict[str, int]:
    """Task key -> how many records timed on `machine` these datasets hold."""
    from collections import Counter
    return Counter(rec["task"]["hash"] for d in dirs for rec in read(d) if rec["machine"] == machine)


def fewest_records_first(tasks: list[Task], counts: dict[str, int]) -> list[Task]:
    """The tasks with the fewest records first; among equals, the given order (a stable sort)."""
    return sorted(tasks, key=lambda task: counts.get(task.key, 0))


def interleaved(tasks: list[Task], paths: list[str]) -> list[Task]:
    """One task of each given path in turn (each path's tasks in their order): a budgeted run reaches every
    model (directory) instead of the first ones' every task."""
    from collections import Counter
    roots = [Path(p).resolve() for p in paths]

    def source(task: Task) -> int:
        f = Path(task.file).resolve()
        return next((i for i, r in enumerate(roots) if f == r or r in f.parents), len(roots))
    rank: Counter = Counter()
    keyed = []
    for pos, task in enumerate(tasks):
        i = source(task)
        keyed.append((rank[i], i, pos, task))
        rank[i] += 1
    return [task for *_, task in sorted(keyed, key=lambda x: x[:3])]


def measured_whole(space, records: int) -> bool:
    """Whether `records` (the task's records on this machine) can cover every point of the space: then a
    search can find nothing new (a reshape's space holds a handful of points, all measured by the random
    samples; MetaSchedule spent 20 s on each such task to find only them). Counted exactly, so only small
    spaces are ever skipped."""
    if records <= 0:
        return False
    size, exact = space.count(limit=records)
    return exact and size <= records


def best_latencies(dirs: list[str | Path], machine: str) -> dict[str, float]:
    """Task key -> the best correct latency measured on `machine` in these datasets."""
    best: dict[str, float] = {}
    for d in dirs:
        for rec in read(d):
            if rec["status"] == "ok" and rec.get("median_s") and rec["machine"] == machine:
                k = rec["task"]["hash"]
                best[k] = min(rec["median_s"], best.get(k, rec["median_s"]))
    return best


def stats(dirs: list[str | Path], pretrain_dir: str | Path | None = None) -> dict:
    """Counts per model / op kind / target, and the best-known latency per task."""
    from collections import Counter, defaultdict
    per_target, per_model, per_status, per_host = Counter(), Counter(), Counter(), Counter()
    best: dict = defaultdict(lambda: None)
    tasks = set()
    n = 0
    for d in dirs:
        for rec in read(d):
            n += 1
            t = rec["task"]
            tasks.add((t["hash"], rec["target"]))
            per_target[rec["target"]] += 1
            per_model[Path(t["file"]).parent.name or "."] += 1
            per_status[rec["status"]] += 1
            timed_on = rec.get("host") or {}
            host_label = f"{timed_on.get('cpu') or timed_on.get('rpc') or '?'} ({rec['machine']})"
            per_host[host_label] += 1
            if rec["status"] == "ok" and rec.get("median_s"):
                k = f"{t['file']}:{t['op']}@{rec['target']} on {host_label}"  # latencies are per CPU
                cur = best[k]
                if cur is None or rec["median_s"] < cur["median_s"]:
                    best[k] = {"median_s": rec["median_s"], "policy": rec["policy"], "key": rec["key"]}
    sentences = 0
    if pretrain_dir is not None:
        for _ in read(pretrain_dir):
            sentences += 1
    return {"tasks": len(tasks), "measured_records": n, "pretrain_sentences": sentences,
            "per_target": dict(per_target), "per_host": dict(per_host), "per_model": dict(per_model),
            "per_status": dict(per_status),
            "best": dict(best)}


def best_k(dirs: list[str | Path], task: str, target: str, k: int = 5) -> list[dict]:
    """The k fastest correct records of one task (its `op_hash`: records made for the same workload
    in another model count too)."""
    recs = [r for d in dirs for r in read(d) if r["task"]["hash"] == task
            and r["target"] == target and r["status"] == "ok" and r.get("median_s")]
    return sorted(recs, key=lambda r: r["median_s"])[:k]


def main_collect(args) -> int:
    if args.model:
        from tensorlang.baselines.tlm import checkpoint_missing
        from tensorlang.lm.model import DEFAULT_DIR as SHIPPED
        missing = checkpoint_missing(args.model)
        if missing:  # said before any task is loaded, not as an internal error at the first one
            print(f"tensorlang collect: error: {missing} (the shipped model: --model "
                  f"{os.path.relpath(SHIPPED)})", file=sys.stderr)
            return 2
    else:  # only the model's candidates need PyTorch; tvm_ffi would import it anyway (1.3 s)
        from tensorlang.bench.worker import keep_torch_out
        keep_torch_out()
    rpc = None
    if args.rpc:
        from tensorlang.bench.rpc import RPCConfig
        rpc = RPCConfig.parse(args.rpc, sessions=args.rpc_sessions)
    try:
        # the target's own dataset by default: a run into another directory would find none of its records,
        # so it would measure them again (a --target llvm run into the old default data/measured/cpu did)
        out = args.output or str(DEFAULT_DIR / args.target)
        summary = collect(args.tasks, args.target, out, trials=args.trials, budget_min=args.budget,
                          batch=args.batch, repeat=args.repeat, min_repeat_ms=args.min_repeat_ms, rpc=rpc,
                          ms_trials=args.metaschedule, model=args.model, model_samples=args.model_samples,
                          skip_heldout=args.skip_heldout, order=args.order, joint_builds=args.joint_builds,
                          split_path=args.split, heldout_dir=args.heldout_output, slow_factor=args.slow_factor or None,
                          settled=args.settled or None,
                          points_from=args.points_from, points_top=args.points_top,
                          log=lambda m: print(m, file=sys.stderr, flush=True))
    except CollectRefused as e:
        print(f"tensorlang collect: {e}", file=sys.stderr)
        return 2
    print(f"collect: {summary}")
    return 0


def pretrain(paths: list[str], target: str, out_dir: str | Path, per_task: int, seed: int = 0, log=print) -> dict:
    """Unmeasured sentences sampled from the space of each task: the pre-training corpus. Resumable:
    a task's sentences are drawn in a fixed order (seeded by the task), and a rerun skips, by key,
    those already written -- so rerunning with a larger `per_task` or another `seed` grows the corpus."""
    from tensorlang import api
    from tensorlang.space import sentence as S
    from tensorlang.space.space import Point, Space
    writer = Writer(out_dir, shard_records=20000)
    written = 0
    tasks = find_tasks(paths)
    start = time.time()
    for n, task in enumerate(tasks):
        doc = api.load_text(task.text, task.file)
        tgt = api.resolve_target(doc, target)
        if tgt is None:
            continue
        space = Space(doc.model.ops[task.op], doc.primfunc(task.op), tgt)
        tkey = task_hash(space)
        new = 0
        for sketch, decisions, kinds in space.sample_decisions(per_task, seed=seed + int(tkey, 16) % (1 << 31)):
            key = hashlib.sha256(f"{tkey}|{target}|{sketch}|{decisions}".encode()).hexdigest()
            if key in writer.keys:
                continue
            sentence = S.encode(space, Point(sketch, decisions), list(kinds))
            new += writer.append({"key": key, "task": {"file": task.file, "op": task.op, "hash": tkey},
                                  "target": target, "sentence": " ".join(sentence)})
        written += new
        rate = written / max(time.time() - start, 1e-9)
        log(f"  [{n + 1}/{len(tasks)}] {task.label}: +{new} sentences ({len(writer.keys)} in all, {rate:.0f}/s)")
    writer.close(compress_open=True)
    return {"written": written, "total": len(writer.keys)}
