"""`metaschedule:N`: TVM MetaSchedule's evolutionary search with N measured trials, as a baseline.

The search is MetaSchedule's own (`tune_tasks`: evolutionary strategy, XGBoost cost model, local
runner) on the same design space as the Space Builder (space/metaschedule.py: the default rule set
of the target kind, and its postprocessors less RewriteLayout / RewriteTensorize, so that the best
schedule is expressible in .tsched). Three things differ from `ms.tune_tir`'s defaults, all for
cost, none for the result (see ../shared/notes/tvm-0.27.md):

- the TuneContext is built with `tvm.s_tir.tensor_intrin` stubbed (its ~22 s import is needed by
  none of the default CPU/GPU rules);
- the builder (MetaSchedule's LocalBuilder: worker processes, 30 s per build) builds with `_f_build`,
  MetaSchedule's default build minus that import -- which the default build function repeats in
  every fresh worker of every batch (the pool is restarted per batch) -- and exports into the work
  dir. Building in this process would save the workers' start-up (~3 s a batch) but could not stop
  a build that runs away: one schedule kept LLVM busy for minutes on attention_scores;
- the database lives in memory; the work dir (artifacts, log) is a temporary folder, removed after.

The best record's trace is converted to .tsched statements (space/convert.py); `Generated.mod` is
MetaSchedule's best module and `schedule_text` the statements, which reproduce it exactly.
"""
from __future__ import annotations

import os
import tempfile

from tensorlang.baselines import Generated
from tensorlang.diagnostics import error

DEFAULT_TRIALS = 64


def _f_build(mod, target, _params):
    """MetaSchedule's default_build without `import tvm.s_tir.tensor_intrin` (and with `tvm.tirx.build`,
    which the deprecated `tvm.driver.build` it calls forwards to)."""
    import tvm
    from tvm.s_tir.transform import RemoveWeightLayoutRewriteBlock
    mod = RemoveWeightLayoutRewriteBlock(skip_tensor_rewrite=True)(mod)
    return tvm.tirx.build(mod, target=target)


def _tune_context(mod, tvm_target, kind: str, seed: int, num_threads: int, logger=None):
    from tvm.s_tir import meta_schedule as ms

    from tensorlang.space import metaschedule as msx
    postprocs = [p for p in ms.Postproc.create(kind) if type(p).__name__ not in msx.SKIPPED_POSTPROCS]
    with msx._without_tensor_intrinsics():
        space = ms.space_generator.PostOrderApply(
            sch_rules=ms.ScheduleRule.create(kind), postprocs=postprocs, mutator_probs=ms.Mutator.create(kind))
        return ms.TuneContext(mod=mod, target=tvm_target, space_generator=space, search_strategy="evolutionary",
                              task_name="main", rand_state=seed, num_threads=num_threads, logger=logger)


def _f_export(artifact_dir: str, rt_mod) -> str:
    """MetaSchedule's default_export (a tar for the runner to link), into the work dir, not a fresh /tmp dir."""
    from tvm.support.tar import tar
    path = os.path.join(tempfile.mkdtemp(dir=artifact_dir), "mod." + tar.output_format)
    rt_mod.export_library(path, fcompile=tar)
    return path


def builder(artifact_dir: str, max_workers: int, timeout_s: float = 30.0):
    """MetaSchedule's LocalBuilder with `_f_build` / `_f_export`: builds in worker processes, each build with
    a time limit (a schedule can make LLVM take minutes: one that runs out is a failed trial)."""
    import functools

    from tvm.s_tir import meta_schedule as ms
    return ms.builder.LocalBuilder(max_workers=max_workers, timeout_sec=timeout_s, f_build=_f_build,
                                   f_export=functools.partial(_f_export, artifact_dir))


def tune(mod, tvm_target, kind: str, trials: int, seed: int = 0, num_threads: int | None = None,
         trials_per_iter: int = 64, build_timeout_s: float = 30, run_timeout_s: float = 30):
    """Run MetaSchedule; the best `tvm.s_tir.Schedule` found (None if no trial succeeded)."""
    best = tune_records(mod, tvm_target, kind, trials, 1, seed, num_threads, trials_per_iter, build_timeout_s,
                        run_timeout_s)
    return best[0][0] if best else None


def tune_records(mod, tvm_target, kind: str, trials: int, top: int, seed: int = 0, num_threads: int | None = None,
                 trials_per_iter: int = 64, build_timeout_s: float = 30, run_timeout_s: float = 30,
                 history: list | None = None) -> list:
    """Run MetaSchedule; its `top` fastest distinct schedules as [(tvm.s_tir.Schedule, mean run seconds)].
    `history`: a list to which each trial's mean run seconds are appended, in the order they were measured
    (None for a trial that failed) -- the search's time-to-quality curve.

    The work dir (artifacts, log) is a temporary folder, removed at the end; TENSORLANG_MS_LOG=PATH keeps
    the tuning log."""
    from tvm import s_tir
    from tvm.s_tir import meta_schedule as ms

    from tensorlang.lower.targets import host_cores
    if num_threads is None:
        num_threads = max(1, min(host_cores(), int(tvm_target.attrs.get("num-cores", 0) or host_cores())))
    with tempfile.TemporaryDirectory(prefix="tensorlang-ms-") as work_dir:
        logger, handler = _file_logger(work_dir)
        try:
            ctx = _tune_context(mod, tvm_target, kind, seed, num_threads, logger)
            database = ms.database.MemoryDatabase()
            ms.tune.tune_tasks(
                tasks=[ctx], task_weights=[1.0], work_dir=work_dir, max_trials_global=trials,
                num_trials_per_iter=min(trials_per_iter, trials),
                builder=builder(work_dir, num_threads, build_timeout_s),
                runner=ms.runner.LocalRunner(timeout_sec=run_timeout_s), database=database,
                cost_model=ms.CostModel.create("xgb", num_tuning_cores=num_threads), task_scheduler="gradient")
            if history is not None:
                for rec in database.get_all_tuning_records():
                    secs = [float(x) for x in rec.run_secs or []]
                    history.append(sum(secs) / len(secs) if secs and max(secs) < 1e9 else None)
            out = []
            for rec in database.get_top_k(database.commit_workload(ctx.mod), top):
                sch = s_tir.Schedule(ctx.mod)
                with tvm_target:
                    rec.trace.apply_to_schedule(sch, remove_postproc=False)
                secs = [float(x) for x in rec.run_secs or []]
                out.append((sch, sum(secs) / len(secs) if secs else None))
            return out
        finally:
            logger.removeHandler(handler)
            handler.close()


def _file_logger(work_dir: str):
    """A logger for the task that writes to a file only (MetaSchedule's own set-up also logs every
    XGBoost iteration to stdout, and reconfigures logging process-wide)."""
    import logging
    logger = logging.getLogger(f"tensorlang.metaschedule.{os.getpid()}.{id(work_dir)}")
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    handler = logging.FileHandler(os.environ.get("TENSORLANG_MS_LOG") or os.path.join(work_dir, "tune.log"))
    handler.setFormatter(logging.Formatter("%(asctime)s.%(msecs)03d [%(levelname)s] %(message)s", "%H:%M:%S"))
    logger.addHandler(handler)
    return logger, handler


def metaschedule_schedule(mod, op, target, trials: int | str = DEFAULT_TRIALS, seed: int = 0) -> Generated:
    """`mod`: the operator's unscheduled IRModule; `op`: its OpModel; `target`: a TargetModel;
    `trials`: the number of measured trials (the N of `metaschedule:N`, as an int or its text)."""
    from tensorlang.lower.targets import tvm_target
    from tensorlang.space import metaschedule as msx
    from tensorlang.space.convert import ConversionError, trace_to_statements

    label = f"metaschedule:{trials}"
    try:
        trials = int(trials)
        if trials < 1:
            raise ValueError
    except ValueError:
        return Generated(None, label, [error("TS302", f"policy {label}: the number of trials must be a positive "
                                                      f"integer (metaschedule:N)", op.ast.name_span)])
    try:
        sch = tune(mod, tvm_target(target), msx.rule_kind(target), trials, seed=seed)
    except Exception as e:  # TVM's errors: a diagnostic, never a traceback
        from tensorlang.lower.schedule import condense_tvm_error
        return Generated(None, label, [error("TS406", f"policy {label} failed on '{op.name}': "
                                                      f"{condense_tvm_error(str(e))}", op.ast.name_span)])
    if sch is None:
        return Generated(None, label, [error("TS406", f"policy {label} found no valid schedule for '{op.name}' "
                                                      f"in {trials} trials", op.ast.name_span)])
    try:
        stmts, _ = trace_to_statements(sch.trace, mod, op)
    except ConversionError as e:
        return Generated(sch.mod, label, [error("TS310", f"policy {label}: the best schedule for '{op.name}' has no "
                                                         f".tsched form: {e}", op.ast.name_span)])
    from tensorlang.space.render import statements_text
    text = statements_text(stmts)
    return Generated(sch.mod, label, [], text)


def parse_policy(policy: str) -> int | None:
    """The trial count of `metaschedule[:N]`, or None if `policy` is another policy."""
    name, _, arg = policy.partition(":")
    if name != "metaschedule":
        return None
    return int(arg) if arg else DEFAULT_TRIALS

