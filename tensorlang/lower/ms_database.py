"""Schedules as a MetaSchedule JSON database: what TVM's own `compile_tir` / `compile_relax` read.

    write_database("out/db", [Entry(mod, sch, target, run_s)])   # database_workload.json, database_tuning_record.json

Each entry is one workload (the operator's unscheduled IRModule, as `tensorlang lower` builds it) and one
tuning record: the trace of the schedule as the .tsched statements apply it, the target, the arguments'
shapes, and the measured latency. MetaSchedule only returns records that carry a latency (`get_top_k` skips
the rest), so every record has one that was measured; a schedule that could not be timed here (a GPU
target on a machine without one) is not written. `compile_tir(database, mod, target)` then applies the
record's trace to the workload: the same TensorIR as `tensorlang lower` (tested).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass
class Entry:
    mod: object  # the unscheduled tvm.IRModule ("main")
    sch: object  # the tvm.s_tir.Schedule the statements made (its trace is recorded)
    target: object  # tvm.target.Target
    run_s: float  # the measured latency, seconds


def write_database(directory: str | Path, entries: list[Entry]) -> Path:
    """Add the entries to the JSON database in `directory` (created, or appended to)."""
    import tvm
    from tvm.s_tir import meta_schedule as ms
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    db = ms.database.JSONDatabase(work_dir=str(directory))
    for e in entries:
        workload = db.commit_workload(e.mod)
        db.commit_tuning_record(ms.database.TuningRecord(
            e.sch.trace, workload, [tvm.tirx.FloatImm("float32", float(e.run_s))], e.target,
            ms.arg_info.ArgInfo.from_prim_func(e.mod["main"])))
    return directory
