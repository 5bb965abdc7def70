"""`default`: TVM without search -- DLight's rules (GPU: matmul, GEMV, reductions, fallback; CPU: GEMV and
reductions, the only CPU rules DLight has). Stages no rule matches stay unscheduled on CPU; on GPU the
fallback rule binds them to threads."""
from __future__ import annotations

from tensorlang.baselines import Generated
from tensorlang.diagnostics import error


def default_schedule(mod, op, target) -> Generated:
    import tvm
    from tvm.s_tir import dlight as dl

    from tensorlang.lower.targets import tvm_target

    tvm_t = tvm_target(target)
    if target.is_gpu:
        rules = [dl.gpu.Matmul(), dl.gpu.GEMV(), dl.gpu.Reduction(), dl.gpu.GeneralReduction(), dl.gpu.Fallback()]
    else:
        rules = [dl.cpu.GEMV(), dl.cpu.Reduction()]
    # ApplyDefaultSchedule changes its input in place: give it a copy.
    scheduled = tvm.IRModule({"main": mod["main"]})
    try:
        with tvm_t:
            scheduled = dl.ApplyDefaultSchedule(*rules)(scheduled)
    except Exception as e:
        return Generated(None, "default", [error("TS406", f"DLight failed on '{op.name}': {e}", op.ast.name_span)])
    return Generated(scheduled, "default", [])
