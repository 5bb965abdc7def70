"""MetaSchedule's design-space generation, used as the Space Builder's sketch source.

`sketches(mod, target)` runs MetaSchedule's post-order-apply space generator with its default
rule set for the target kind -- LLVM: AutoInline, AddRFactor, MultiLevelTiling "SSRSRS",
ParallelizeVectorizeUnroll, RandomComputeLocation; CUDA: MultiLevelTiling "SSSRRSRS" with
shared/local caches and cooperative fetch, AutoInline, CrossThreadReduction,
ParallelizeVectorizeUnroll, AutoBind -- so our space contains the very space MetaSchedule
searches. The postprocessors are MetaSchedule's defaults for the kind, less `RewriteLayout`
and `RewriteTensorize`: layout rewriting changes the operator's signature (weights pre-packed),
which a .tsched schedule cannot express, and the default rules emit no tensorize.

TuneContext imports `tvm.s_tir.tensor_intrin` (~22 s, mostly CUDA tensor-core intrinsics) on
construction; the default LLVM and CUDA rule sets use none of them, so a context is built with
that import stubbed for its duration (see ../shared/notes/tvm-0.27.md).
"""
from __future__ import annotations

import contextlib
import sys
import types

SKIPPED_POSTPROCS = ("RewriteLayout", "RewriteTensorize")


@contextlib.contextmanager
def _without_tensor_intrinsics():
    name = "tvm.s_tir.tensor_intrin"
    if name in sys.modules:
        yield
        return
    stub = types.ModuleType(name)
    stub.__path__ = []
    sys.modules[name] = stub
    try:
        yield
    finally:
        if sys.modules.get(name) is stub:
            del sys.modules[name]


def rule_kind(target_model) -> str:
    return "cuda" if target_model.is_gpu else "llvm"


def tune_context(mod, tvm_target, kind: str, seed: int = 0):
    from tvm.s_tir import meta_schedule as ms
    postprocs = [p for p in ms.Postproc.create(kind) if type(p).__name__ not in SKIPPED_POSTPROCS]
    with _without_tensor_intrinsics():
        generator = ms.space_generator.PostOrderApply(
            sch_rules=ms.ScheduleRule.create(kind), postprocs=postprocs, mutator_probs=ms.Mutator.create(kind))
        return ms.TuneContext(mod=mod, target=tvm_target, space_generator=generator, task_name="main",
                              num_threads=1, rand_state=seed)


def postprocs_of(ctx) -> list:
    return list(ctx.space_generator.postprocs)
