"""Target models -> TVM targets, and what this host can run."""
from __future__ import annotations

import functools
import platform

from tensorlang.analysis.model import TargetModel
from tensorlang.analysis.targets import CPU_F16_FLAGS, CPU_REQUIRED_FLAGS, CPU_VECTOR_BITS, gpu_limits


@functools.lru_cache(maxsize=1)
def host_cpu_flags() -> frozenset[str]:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


@functools.lru_cache(maxsize=1)
def host_mcpu() -> str:
    """This host's LLVM CPU name (TVM rejects mcpu=native), from LLVM if it answers, else from cpuinfo."""
    try:
        import tvm
        name = tvm.get_global_func("tvm.codegen.llvm.GetHostCPUName", allow_missing=True)
        if name is not None:
            cpu = str(name())
            if cpu and cpu != "generic":
                return cpu
    except Exception:  # an LLVM-less build: fall back to the flags
        pass
    flags = host_cpu_flags()
    for mcpu in ("sapphirerapids", "icelake-server", "skylake-avx512", "haswell"):
        if set(CPU_REQUIRED_FLAGS[mcpu]) <= flags:
            return mcpu
    return "x86-64" if platform.machine() in ("x86_64", "AMD64") else "generic"


def host_cores() -> int:
    import os
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def mcpu_of(t: TargetModel) -> str:
    return t.params.get("mcpu") or host_mcpu()


def vector_bits(t: TargetModel) -> int:
    return t.params.get("vector_bits") or CPU_VECTOR_BITS.get(mcpu_of(t), 128)


def tvm_target(t: TargetModel):
    from tvm.target import Target
    if t.kind == "llvm":
        d = {"kind": "llvm", "mcpu": mcpu_of(t), "num-cores": t.params.get("cores") or host_cores()}
        if "mtriple" in t.params:
            d["mtriple"] = t.params["mtriple"]
        if "mattr" in t.params:
            d["mattr"] = [a.strip() for a in t.params["mattr"].split(",") if a.strip()]
        return Target(d)
    limits = gpu_limits(t.params)
    return Target({"kind": "cuda", "arch": t.params.get("arch", "sm_90"),
                   "max_threads_per_block": limits["max_threads_per_block"],
                   "max_shared_memory_per_block": limits["max_shared_memory_per_block"],
                   "thread_warp_size": limits["warp_size"]})


def missing_host_features(t: TargetModel, dtypes=()) -> list[str]:
    """Instruction sets a CPU target needs that this host lacks ([] if it can run the code)."""
    if t.kind != "llvm":
        return []
    need = CPU_REQUIRED_FLAGS.get(mcpu_of(t), ())
    if "f16" in dtypes:
        need = need + CPU_F16_FLAGS.get(mcpu_of(t), ())
    have = host_cpu_flags()
    if not have:  # not Linux/x86: cannot tell, let LLVM decide
        return []
    missing = [f for f in need if f not in have]
    if "mattr" in t.params:
        for attr in t.params["mattr"].split(","):
            flag = attr.strip().lstrip("+").replace("-", "_")
            if attr.strip().startswith("+") and flag and flag not in have and flag.lower() not in have:
                missing.append(flag)
    return missing
