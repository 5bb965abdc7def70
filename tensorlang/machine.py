"""The machine: what CPU this host is, what a CPU target describes, and which code this host can run.

One module answers it for the space, the sentences, the baselines and the harness:

    cpu = host()             # the host: LLVM's name for it, its features, usable cores, caches
    cpu.id                   # the machine id every measured record is keyed by
    missing_features("sapphirerapids")   # [] if this host can run code LLVM builds for that CPU

Names and features are LLVM's own (`znver3`, `avx512f`, `sse4.1`): the host's come from LLVM's
host detection (the same that `-mcpu=native` uses), a named CPU's from LLVM's processor table, so
"can this host run code built for X" is a set comparison, with no table of known CPUs to fall
behind. LLVM lists tuning flags for a CPU too (`fast-gather`, `prefer-256-bit`); only features the
host detection knows of (instruction sets) are compared. TVM (which carries LLVM) is imported on
first use, never at import time: the language server and `check --no-legality` do not pay for it.

`TENSORLANG_HOST_CPU=haswell` makes the host look like an older CPU: its LLVM name, and its features
(those of the named CPU this host really has), so an AVX-512 machine compiles and runs what an AVX2
one would. Timings made so would be labelled with a CPU that did not produce them: `collect` and
`bench --json` refuse to record under it (`recording_refused`).
"""
from __future__ import annotations

import functools
import hashlib
import os
import platform
import sys
from dataclasses import dataclass, replace
from pathlib import Path

HOST_ENV = "TENSORLANG_HOST_CPU"
# The instruction-set families that decide what a kernel can use and how wide its vectors are. The
# machine id is made of these (with the name and the cores), not of every flag: a VM's minor flags
# (`rdpid`, `waitpkg`, cache sizes of its host pool) vary between instances of one CPU model. AMX is
# left out too: LLVM never vectorises into its tile registers (only intrinsics the space does not
# hold reach them), and one Emerald Rapids VM pool exposes it on some instances and not on others --
# whose latencies agree within run-to-run noise (benchmarks/results/host_agreement.json).
SIMD_PREFIXES = ("sse", "ssse3", "avx", "fma", "f16c")
# Per-core caches assumed for a named CPU that is not this host (nothing to read them from).
DEFAULT_L1D, DEFAULT_L2 = 32 << 10, 1 << 20


@dataclass(frozen=True)
class CPU:
    """A CPU as the compiler and the schedules see it."""
    name: str  # LLVM's CPU name: znver3, sapphirerapids, haswell
    features: frozenset[str]  # LLVM feature names it has: avx2, avx512f, sse4.1, ...
    cores: int  # usable cores (threads for parallel loops)
    l1d_bytes: int = DEFAULT_L1D  # per core
    l2_bytes: int = DEFAULT_L2  # per core
    l3_bytes: int | None = None  # shared
    model: str = ""  # the vendor's model name (/proc/cpuinfo), for reports
    overridden_from: str | None = None  # the real host's name when TENSORLANG_HOST_CPU is set

    @property
    def vector_bits(self) -> int:
        """The widest SIMD registers its features give (LLVM may still prefer narrower ones)."""
        if "avx512f" in self.features:
            return 512
        if "avx" in self.features:
            return 256
        return 128

    @property
    def vector_registers(self) -> int:
        """The architectural vector registers: 32 with AVX-512 (zmm0-31) or on AArch64 (v0-31), else 16
        (x86-64's ymm/xmm0-15)."""
        if "avx512f" in self.features or "neon" in self.features or "sve" in self.features:
            return 32
        return 16

    @property
    def simd(self) -> list[str]:
        return sorted(f for f in self.features if f.startswith(SIMD_PREFIXES))

    @property
    def id(self) -> str:
        """Tells CPUs apart: a Zen 3 and a Zen 4 with the same core count get different ids."""
        return machine_id(self.name, self.simd, self.cores)


def machine_id(name: str, simd: list[str], cores: int) -> str:
    return hashlib.sha256(f"{name}|{','.join(sorted(simd))}|{cores}".encode()).hexdigest()[:12]


# ------------------------------------------------------------------------ LLVM
@functools.lru_cache(maxsize=1)
def _llvm_host() -> tuple[str, dict[str, bool]]:
    """LLVM's name for this CPU and its host feature map (every feature it can detect -> present)."""
    import tvm
    name = str(tvm.get_global_func("tvm.codegen.llvm.GetHostCPUName")())
    feats = tvm.get_global_func("tvm.codegen.llvm.GetHostCPUFeatures")()
    return name, {str(k): bool(v) for k, v in feats.items()}


@functools.lru_cache(maxsize=64)
def cpu_features(name: str, mattr: tuple[str, ...] = ()) -> frozenset[str]:
    """The features LLVM gives code built for CPU `name` with `mattr` (+feature / -feature)."""
    import tvm
    from tvm.target import Target
    if name not in known_cpus():
        raise ValueError(f"LLVM knows no CPU '{name}'")
    d = {"kind": "llvm", "mcpu": name}
    if mattr:
        d["mattr"] = list(mattr)
    feats = {str(f) for f in tvm.get_global_func("target.llvm_get_cpu_features")(Target(d))}
    for a in mattr:  # LLVM's list is of the CPU alone
        if a.startswith("+"):
            feats.add(a[1:])
        elif a.startswith("-"):
            feats.discard(a[1:])
    return frozenset(feats)


@functools.lru_cache(maxsize=1)
def known_cpus() -> frozenset[str]:
    import tvm
    from tvm.target import Target
    return frozenset(str(c) for c in tvm.get_global_func("target.llvm_get_cpu_archlist")(Target({"kind": "llvm"})))


def detectable_features() -> frozenset[str]:
    """The features host detection reports on (present or not): instruction sets, not tuning flags."""
    return frozenset(_llvm_host()[1])


# ------------------------------------------------------------------------ host
def _caches() -> dict[str, int]:
    """Per-core L1d and L2, and L3, from sysfs (Linux); what it cannot read is left out."""
    out = {}
    root = Path("/sys/devices/system/cpu/cpu0/cache")
    for d in sorted(root.glob("index*")) if root.exists() else ():
        try:
            level = int((d / "level").read_text())
            kind = (d / "type").read_text().strip()
            size = (d / "size").read_text().strip()
        except (OSError, ValueError):
            continue
        unit = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(size[-1:], 1)
        nbytes = int(size.rstrip("KMG")) * unit
        if kind in ("Data", "Unified") and level in (1, 2, 3):
            out[{1: "l1d_bytes", 2: "l2_bytes", 3: "l3_bytes"}[level]] = nbytes
    return out


def usable_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _model_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


@functools.lru_cache(maxsize=4)
def _host(override: str | None) -> CPU:
    name, feats = _llvm_host()
    have = frozenset(f for f, on in feats.items() if on)
    real = CPU(name, have, usable_cores(), model=_model_name(), **_caches())
    if not override:
        return real
    if override not in known_cpus():
        raise ValueError(f"{HOST_ENV}={override}: LLVM knows no such CPU (e.g. haswell, znver3, skylake-avx512)")
    # The named CPU's instruction sets, as far as this host has them: it can only pretend to be older.
    return replace(real, name=override, features=cpu_features(override) & have, overridden_from=name)


def host() -> CPU:
    """This machine's CPU (or the one TENSORLANG_HOST_CPU names). Read per call: tests change the variable."""
    return _host(os.environ.get(HOST_ENV) or None)


def recording_refused() -> str | None:
    """Why measurements must not be recorded now (None: they may)."""
    cpu = host()
    if cpu.overridden_from is None:
        return None
    return (f"{HOST_ENV}={cpu.name} is set: latencies measured now would be labelled '{cpu.name}' although "
            f"this {cpu.overridden_from} machine produced them; unset {HOST_ENV} to record measurements")


def host_line() -> str:
    """The CPU a table's figures were measured on, as LLVM names it (and what the override hides)."""
    cpu = host()
    real = f", set by {HOST_ENV} on a {cpu.overridden_from}" if cpu.overridden_from else ""
    return f"{cpu.name} ({cpu.model}, {cpu.cores} cores{real})"


def missing_features(name: str, mattr: tuple[str, ...] = ()) -> list[str]:
    """Instruction sets code built for CPU `name` (+ `mattr`) may use that the host lacks ([]: it can run it)."""
    need = cpu_features(name, tuple(mattr)) & detectable_features()
    return sorted(need - host().features)


# --------------------------------------------------------------- description
def _version(pkg: str) -> str | None:
    from importlib import metadata
    try:
        return metadata.version(pkg)
    except metadata.PackageNotFoundError:
        return None


def _mem_gib() -> float | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return round(int(line.split()[1]) / (1 << 20), 1)
    except OSError:
        pass
    return None


def describe(threads: int | None = None) -> dict:
    """The machine for every report that holds timings: CPU (LLVM's name beside the vendor's), its id,
    instruction sets, caches, cores, memory, OS, library versions, and the load (the noise to expect)."""
    cpu = host()
    try:
        load = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        load = None
    return {
        "cpu": cpu.model,
        "arch": platform.machine(),
        "llvm_mcpu": cpu.name,
        "machine_id": cpu.id,
        "host_cpu_override": cpu.overridden_from is not None,
        "vector_isa": cpu.simd,
        "caches": {"l1d": cpu.l1d_bytes, "l2": cpu.l2_bytes, "l3": cpu.l3_bytes},
        "logical_cpus": os.cpu_count(),
        "usable_cpus": cpu.cores,
        "threads": threads,
        "memory_gib": _mem_gib(),
        "os": platform.platform(),
        "python": sys.version.split()[0],
        "versions": {p: _version(p) for p in ("apache-tvm", "apache-tvm-ffi", "numpy", "torch", "xgboost")},
        "loadavg_1_5_15": load,
    }


# ------------------------------------------------------------------- targets
def parse_mattr(mattr: str | None) -> tuple[str, ...]:
    """`"+avx2, -avx512f"` -> ("+avx2", "-avx512f")."""
    return tuple(a.strip() for a in (mattr or "").split(",") if a.strip())


def target_mattr(params: dict) -> tuple[str, ...]:
    """The `mattr` to build an `llvm(...)` target with. For this host's own CPU name that starts with a
    `-feature` for each feature LLVM's model of the CPU has and the host lacks (a VM masks some, e.g.
    `waitpkg`), as `-march=native` does: code built for the host then never uses what it lacks."""
    h = host()
    user = parse_mattr(params.get("mattr"))
    if (params.get("mcpu") or h.name) != h.name:
        return user
    masked = (cpu_features(h.name) & detectable_features()) - h.features
    return tuple(f"-{f}" for f in sorted(masked)) + user


def target_cpu(params: dict) -> CPU:
    """The CPU an `llvm(...)` target's parameters describe: this host unless `mcpu` names another CPU.
    Features follow `mattr`; `cores`, `l1_kb`, `l2_kb` replace what is read from the host (or, for
    another CPU, assumed: nothing here can read its caches)."""
    h = host()
    name = params.get("mcpu") or h.name
    mattr = parse_mattr(params.get("mattr"))
    if name == h.name:
        feats = set(h.features)
        for a in mattr:
            (feats.add if a.startswith("+") else feats.discard)(a[1:])
        cpu = replace(h, features=frozenset(feats))
    else:
        cpu = CPU(name, cpu_features(name, mattr), h.cores)
    sizes = {k: params[p] * 1024 for p, k in (("l1_kb", "l1d_bytes"), ("l2_kb", "l2_bytes")) if p in params}
    return replace(cpu, cores=params.get("cores") or cpu.cores, **sizes)
