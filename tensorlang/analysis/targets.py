"""Target declarations: the parameters each kind takes, their types and defaults.

`target cpu = llvm(mcpu = "sapphirerapids", cores = 2)` and `target h200 = cuda(arch = "sm_90")`.
The hardware description here (vector width, caches, SMs, shared memory, registers) is what
the Roller-style policy and the GPU limit checks read; TVM only sees the kind, mcpu/arch and cores.
"""
from __future__ import annotations

# kind -> parameter -> (python type, description)
PARAMS = {
    "llvm": {
        "mcpu": (str, "LLVM CPU name, e.g. sapphirerapids, icelake-server, znver4, skylake-avx512"),
        "mtriple": (str, "LLVM target triple"),
        "mattr": (str, "comma-separated LLVM features, e.g. +avx2,+fma"),
        "cores": (int, "worker threads for parallel loops"),
        "vector_bits": (int, "SIMD register width in bits (default from mcpu)"),
        "l1_kb": (int, "L1 data cache per core, KiB"),
        "l2_kb": (int, "L2 cache per core, KiB"),
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

# Defaults for the hardware description, by CPU name / GPU architecture.
CPU_VECTOR_BITS = {
    "sapphirerapids": 512, "icelake-server": 512, "cascadelake": 512, "skylake-avx512": 512,
    "znver4": 512, "znver3": 256, "znver2": 256, "haswell": 256, "skylake": 256, "alderlake": 256,
    "x86-64": 128, "x86-64-v2": 128, "x86-64-v3": 256, "x86-64-v4": 512,
}
# Instruction sets (as /proc/cpuinfo flags) a host must have to run code LLVM builds for an mcpu:
# what its auto-vectorizer may emit for ordinary code. AMX is not here: LLVM emits it only for
# explicit tile intrinsics, which tensorlang's schedules do not use (no tensorize).
CPU_REQUIRED_FLAGS = {
    "sapphirerapids": ("avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512cd", "avx512_vnni", "avx512_bf16"),
    "icelake-server": ("avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni"),
    "cascadelake": ("avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni"),
    "skylake-avx512": ("avx512f", "avx512bw", "avx512vl", "avx512dq"),
    "x86-64-v4": ("avx512f", "avx512bw", "avx512vl", "avx512dq"),
    "znver4": ("avx512f", "avx512bw", "avx512vl", "avx2", "fma"),
    "znver3": ("avx2", "fma"), "znver2": ("avx2", "fma"),
    "haswell": ("avx2", "fma"), "skylake": ("avx2", "fma"), "alderlake": ("avx2", "fma"),
    "x86-64-v3": ("avx2", "fma"),
}
# Extra instruction sets when the operator computes in f16 (native half-precision arithmetic).
CPU_F16_FLAGS = {"sapphirerapids": ("avx512_fp16",)}
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
    "llvm": ("llvm", {}),  # this host's CPU (lower/targets.py detects its mcpu)
    "cuda": ("cuda", {"arch": "sm_90"}),
}


def gpu_limits(params: dict) -> dict:
    arch = params.get("arch", "sm_90")
    limits = dict(GPU_DEFAULTS.get(arch, GPU_DEFAULTS["sm_90"]))
    limits.update({k: v for k, v in params.items() if k in limits})
    return limits
