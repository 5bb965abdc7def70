"""Target declarations: the parameters each kind takes, their types and defaults.

`target cpu = llvm()` (this host) or `target spr = llvm(mcpu = "sapphirerapids", cores = 2)` and `target h200 = cuda(arch = "sm_90")`.
The hardware description here (vector width, caches, SMs, shared memory, registers) is what
the Roller-style policy and the GPU limit checks read; TVM only sees the kind, mcpu/arch and cores.
"""
from __future__ import annotations

# kind -> parameter -> (python type, description)
PARAMS = {
    "llvm": {
        "mcpu": (str, "LLVM CPU name, e.g. znver3, sapphirerapids, skylake-avx512 (default: this host's)"),
        "mtriple": (str, "LLVM target triple"),
        "mattr": (str, "comma-separated LLVM features, e.g. +avx2,+fma"),
        "cores": (int, "worker threads for parallel loops"),
        "vector_bits": (int, "SIMD register width in bits (default: the widest the CPU's features give)"),
        "l1_kb": (int, "L1 data cache per core, KiB (default: this host's, read from the machine)"),
        "l2_kb": (int, "L2 cache per core, KiB (default: this host's)"),
    },
    "cuda": {
        "arch": (str, "compute capability, e.g. sm_90"),
        "sms": (int, "streaming multiprocessors"),
        "max_threads_per_block": (int, "threads per block limit"),
        "max_shared_memory_per_block": (int, "static shared memory per block, bytes"),
        "registers_per_block": (int, "32-bit registers per block"),
        "max_vthread": (int, "virtual threads per block"),
        "warp_size": (int, "threads per warp"),
    },
}

# CPU names offered by completion and given a token of their own in tensor sentences (others read
# `cpu:generic`). What a CPU can run and how wide its vectors are comes from LLVM (tensorlang/machine.py).
KNOWN_CPUS = ("alderlake", "cascadelake", "haswell", "icelake-server", "sapphirerapids", "skylake", "skylake-avx512",
              "x86-64", "x86-64-v2", "x86-64-v3", "x86-64-v4", "znver2", "znver3", "znver4")
# Hardware description defaults by GPU architecture.
GPU_DEFAULTS = {
    # sm_90: H100/H200. Static shared memory per block is 48 KiB (more needs the dynamic opt-in).
    "sm_90": dict(sms=132, max_threads_per_block=1024, max_shared_memory_per_block=49152,
                  registers_per_block=65536, max_vthread=8, warp_size=32),
    "sm_80": dict(sms=108, max_threads_per_block=1024, max_shared_memory_per_block=49152,
                  registers_per_block=65536, max_vthread=8, warp_size=32),
    "sm_86": dict(sms=84, max_threads_per_block=1024, max_shared_memory_per_block=49152,
                  registers_per_block=65536, max_vthread=8, warp_size=32),
    "sm_89": dict(sms=128, max_threads_per_block=1024, max_shared_memory_per_block=49152,
                  registers_per_block=65536, max_vthread=8, warp_size=32),
    "sm_70": dict(sms=80, max_threads_per_block=1024, max_shared_memory_per_block=49152,
                  registers_per_block=65536, max_vthread=8, warp_size=32),
}
BUILTIN_TARGETS = {
    "llvm": ("llvm", {}),  # this host's CPU (tensorlang/machine.py)
    "cuda": ("cuda", {"arch": "sm_90"}),
}


def gpu_limits(params: dict) -> dict:
    arch = params.get("arch", "sm_90")
    limits = dict(GPU_DEFAULTS.get(arch, GPU_DEFAULTS["sm_90"]))
    limits.update({k: v for k, v in params.items() if k in limits})
    return limits
