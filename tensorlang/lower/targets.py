"""Target models -> TVM targets, and what this host can run."""
from __future__ import annotations

import platform

from tensorlang.analysis.model import TargetModel
from tensorlang.analysis.targets import gpu_limits
from tensorlang.machine import host, missing_features, target_cpu, target_mattr, usable_cores


def host_mcpu() -> str:
    """This host's LLVM CPU name (TVM rejects mcpu=native)."""
    return host().name


def host_cores() -> int:
    return usable_cores()


def mcpu_of(t: TargetModel) -> str:
    return t.params.get("mcpu") or host_mcpu()


def vector_bits(t: TargetModel) -> int:
    return t.params.get("vector_bits") or target_cpu(t.params).vector_bits


def tvm_target(t: TargetModel):
    from tvm.target import Target
    if t.kind == "llvm":
        d = {"kind": "llvm", "mcpu": mcpu_of(t), "num-cores": t.params.get("cores") or host_cores()}
        if "mtriple" in t.params:
            d["mtriple"] = t.params["mtriple"]
        if target_mattr(t.params):
            d["mattr"] = list(target_mattr(t.params))
        return Target(d)
    return cuda_target(t.params)


def cuda_target(params: dict):
    from tvm.target import Target
    limits = gpu_limits(params)
    return Target({"kind": "cuda", "arch": params.get("arch", "sm_90"),
                   "max_threads_per_block": limits["max_threads_per_block"],
                   "max_shared_memory_per_block": limits["max_shared_memory_per_block"],
                   "thread_warp_size": limits["warp_size"]})


def missing_host_features(t: TargetModel) -> list[str]:
    """Instruction sets code built for a CPU target may use that this host lacks ([] if it can run the code):
    LLVM's features of the target's CPU (and `mattr`) against the host's."""
    if t.kind != "llvm":
        return []
    triple = t.params.get("mtriple")
    if triple and not triple.startswith(platform.machine()):
        return [f"code for {triple}"]
    try:
        return missing_features(mcpu_of(t), target_mattr(t.params))
    except ValueError as e:  # an mcpu LLVM does not know: nothing built for it can be run
        return [str(e)]


def cannot_run(t: TargetModel) -> str | None:
    """TS405's message if this host cannot run code built for `t`, else None."""
    missing = missing_host_features(t)
    if not missing:
        return None
    return (f"TS405 target '{t.name}' (mcpu={mcpu_of(t)}) needs {', '.join(missing)}, which this host "
            f"({host_mcpu()}) lacks; refusing to run it (`tensorlang lower` still builds for it)")
