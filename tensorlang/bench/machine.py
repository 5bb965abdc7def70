"""A description of this machine, for every report that holds timings."""
from __future__ import annotations

import os
import platform
import sys


def _cpuinfo() -> dict:
    out = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key in ("model name", "flags", "cpu MHz") and key not in out:
                    out[key] = value.strip()
                if len(out) == 3:
                    break
    except OSError:
        pass
    return out


def _mem_gib() -> float | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return round(int(line.split()[1]) / (1 << 20), 1)
    except OSError:
        pass
    return None


def _version(pkg: str) -> str | None:
    from importlib import metadata
    try:
        return metadata.version(pkg)
    except metadata.PackageNotFoundError:
        return None


def describe(threads: int | None = None) -> dict:
    """CPU, cores, memory, OS, library versions, and the load when asked (the noise to expect)."""
    info = _cpuinfo()
    flags = set(info.get("flags", "").split())
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    try:
        from tensorlang.lower.targets import host_mcpu
        mcpu = host_mcpu()
    except Exception:  # no TVM: not fatal for a description
        mcpu = None
    try:
        load = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        load = None
    return {
        "cpu": info.get("model name") or platform.processor() or platform.machine(),
        "arch": platform.machine(),
        "llvm_mcpu": mcpu,
        "vector_isa": sorted(f for f in flags if f in ("avx2", "avx512f", "avx512_bf16", "avx512_fp16", "amx_tile",
                                                      "amx_bf16", "amx_int8", "fma", "neon", "asimd")),
        "logical_cpus": os.cpu_count(),
        "usable_cpus": usable,
        "threads": threads,
        "memory_gib": _mem_gib(),
        "os": platform.platform(),
        "python": sys.version.split()[0],
        "versions": {p: _version(p) for p in ("apache-tvm", "apache-tvm-ffi", "numpy", "torch", "xgboost")},
        "loadavg_1_5_15": load,
    }
