"""The machine module: the host's CPU as LLVM names it, which code it can run, the host override, machine
ids that tell CPUs apart, and what runs (or refuses to) where the host lacks a target's instruction sets."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tensorlang import api, machine
from tensorlang.machine import HOST_ENV

from conftest import ROOT, TENSORLANG

OLD_CPU = "haswell"  # AVX2 + FMA: every host this project meets has at least that


@pytest.fixture
def as_haswell(monkeypatch):
    monkeypatch.setenv(HOST_ENV, OLD_CPU)
    return machine.host()


def _real_host(monkeypatch):
    monkeypatch.delenv(HOST_ENV, raising=False)
    return machine.host()


def test_host_is_what_llvm_detects(monkeypatch):
    import tvm
    cpu = _real_host(monkeypatch)
    assert cpu.name == str(tvm.get_global_func("tvm.codegen.llvm.GetHostCPUName")())
    assert {"sse2", "avx2", "fma"} <= cpu.features  # every host here
    assert cpu.overridden_from is None and machine.recording_refused() is None
    assert cpu.cores == len(os.sched_getaffinity(0))
    # Code built for its own name runs, once the features a VM masks are turned off as -march=native would.
    assert machine.missing_features(cpu.name, machine.target_mattr({})) == []
    assert all(a.startswith("-") and a[1:] not in cpu.features for a in machine.target_mattr({}))
    assert machine.missing_features(OLD_CPU) == []


def test_caches_are_read_from_sysfs(monkeypatch):
    index0 = Path("/sys/devices/system/cpu/cpu0/cache/index0")
    if not index0.exists():
        pytest.skip("no sysfs cache description on this host")
    sizes = {}
    for d in index0.parent.glob("index*"):
        if (d / "type").read_text().strip() in ("Data", "Unified"):
            sizes[int((d / "level").read_text())] = int((d / "size").read_text().strip().rstrip("K")) * 1024
    cpu = _real_host(monkeypatch)
    assert (cpu.l1d_bytes, cpu.l2_bytes) == (sizes[1], sizes[2])


def test_machine_ids_tell_cpus_apart():
    zen3 = machine.machine_id("znver3", sorted(machine.cpu_features("znver3")), 2)
    zen4 = machine.machine_id("znver4", sorted(machine.cpu_features("znver4")), 2)
    assert len({zen3, zen4, machine.machine_id("znver4", sorted(machine.cpu_features("znver4")), 4)}) == 3
    assert zen4 == machine.machine_id("znver4", sorted(machine.cpu_features("znver4")), 2)  # stable


def test_an_emerald_rapids_vm_with_or_without_amx_is_one_machine():
    """AMX decides nothing in the kernels LLVM writes for the space's schedules; a VM pool that shows it
    on some instances and not on others must not split one CPU's measurements in two ids."""
    with_amx = machine.CPU("emeraldrapids", machine.cpu_features("emeraldrapids"), 2)
    assert {"amx-tile", "amx-bf16", "amx-int8"} <= with_amx.features
    without = machine.CPU("emeraldrapids", frozenset(f for f in with_amx.features if not f.startswith("amx")), 2)
    assert with_amx.id == without.id and with_amx.simd == without.simd
    no_avx512 = machine.CPU("emeraldrapids", frozenset(f for f in with_amx.features if not f.startswith("avx512")), 2)
    assert no_avx512.id != with_amx.id


def test_override_makes_the_host_an_older_cpu(monkeypatch, as_haswell):
    real = machine._host(None)
    assert as_haswell.name == OLD_CPU and as_haswell.overridden_from == real.name
    assert "avx512f" not in as_haswell.features and "avx2" in as_haswell.features
    assert as_haswell.features <= real.features  # it can only pretend to be older
    assert as_haswell.vector_bits == 256 and as_haswell.id != real.id
    assert "avx512f" in machine.missing_features("skylake-avx512")
    assert HOST_ENV in machine.recording_refused()
    monkeypatch.setenv(HOST_ENV, "pentium9000")
    with pytest.raises(ValueError, match="LLVM knows no such CPU"):
        machine.host()


def test_a_host_target_compiles_for_the_host(as_haswell):
    from tensorlang.lower.targets import tvm_target
    doc = api.load(ROOT / "examples" / "matmul.tsched")
    t = tvm_target(doc.model.targets["cpu"])
    assert str(t.attrs["mcpu"]) == OLD_CPU and int(t.attrs["num-cores"]) == as_haswell.cores


SPR = 'target spr = llvm(mcpu = "sapphirerapids", cores = 2)\nop f(A: f32[64]) -> B: f32[64] {\n    B[i] = A[i] * 2.0\n}\n'


def test_a_target_the_host_lacks_lowers_but_never_runs(as_haswell, tmp_path):
    from tensorlang.lower.targets import cannot_run
    doc = api.load_text(SPR)
    msg = cannot_run(doc.model.targets["spr"])
    assert msg.startswith("TS405 target 'spr' (mcpu=sapphirerapids) needs ") and "avx512f" in msg
    assert f"this host ({OLD_CPU}) lacks" in msg
    low = api.lower_op(doc, "f", "spr")
    assert low.ok
    r = api.run_lowered(low)  # refused before anything is compiled or run in this process
    assert not r.ok and r.message == msg
    f = tmp_path / "spr.tsched"
    f.write_text(SPR)
    env = dict(os.environ, **{HOST_ENV: OLD_CPU})
    out = subprocess.run(TENSORLANG + ["lower", str(f), "--target", "spr", "--emit", "so", "-o", str(tmp_path / "f.so")],
                         capture_output=True, text=True, env=env, cwd=ROOT)
    assert out.returncode == 0, out.stderr  # cross-compilation is a feature
    assert (tmp_path / "f.so").stat().st_size > 0
    out = subprocess.run(TENSORLANG + ["run", str(f), "--target", "spr"], capture_output=True, text=True, env=env, cwd=ROOT)
    assert out.returncode == 1 and f"{f}:1:1: error: TS405 target 'spr'" in out.stderr


def test_an_mcpu_llvm_does_not_know_is_never_run():
    from tensorlang.lower.targets import cannot_run
    doc = api.load_text(SPR.replace("sapphirerapids", "znver99"))
    assert "LLVM knows no CPU 'znver99'" in cannot_run(doc.model.targets["spr"])


def test_the_harness_refuses_a_target_the_host_lacks(as_haswell):
    from tensorlang.bench.harness import Candidate, measure_candidates
    [r] = measure_candidates([Candidate("spr", SPR, "spr", None, op_name="f")], repeat=1, lock=False)
    assert r.status == "error" and r.message.startswith("TS405")


TRAP_OP = "op f(A: f32[4]) -> B: f32[4] {\n    B[i] = A[i]\n}\n"


def test_an_illegal_instruction_in_a_measured_kernel_is_a_crash(tmp_path):
    """`llvm.trap` compiles to ud2 (SIGILL on every x86 host): the kernel runner dies of it, the candidate
    is a `crash`, and the next candidate is still measured."""
    import tvm
    from tvm.script import tirx as T
    from tensorlang.bench.harness import Candidate, Library, measure_candidates
    from tensorlang.lower.targets import tvm_target

    @T.prim_func
    def main(A: T.Buffer((4,), "float32"), B: T.Buffer((4,), "float32")):
        T.evaluate(T.call_llvm_intrin("void", "llvm.trap"))
        for i in range(4):
            B[i] = A[i]

    target = tvm_target(api.load_text(TRAP_OP).model.targets["llvm"])
    path = tmp_path / "trap.so"
    tvm.compile(tvm.IRModule({"main": main}), target=target).export_library(str(path))
    trap, fine = measure_candidates([Candidate("trap", TRAP_OP, "llvm", Library(str(path))),
                                     Candidate("fine", TRAP_OP, "llvm", None)], repeat=1, timeout_s=60, lock=False)
    assert trap.status == "crash" and "SIGILL" in trap.message
    assert fine.status == "ok" and fine.median_s > 0


def test_collect_refuses_to_record_under_the_override(tmp_path):
    env = dict(os.environ, **{HOST_ENV: OLD_CPU})
    out = subprocess.run(TENSORLANG + ["collect", str(ROOT / "examples" / "softmax.tsched"), "--target", "cpu",
                                       "--trials", "1", "-o", str(tmp_path / "m")], capture_output=True, text=True,
                         env=env, cwd=ROOT)
    assert out.returncode == 2 and f"{HOST_ENV}={OLD_CPU} is set" in out.stderr
    assert not list((tmp_path / "m").glob("shard-*"))
    out = subprocess.run(TENSORLANG + ["bench", str(ROOT / "examples" / "softmax.tsched"), "--target", "cpu",
                                       "--json", str(tmp_path / "b.json")], capture_output=True, text=True,
                         env=env, cwd=ROOT)
    assert out.returncode == 2 and "not writing" in out.stderr and not (tmp_path / "b.json").exists()


def test_sentences_and_roller_read_the_machine(as_haswell):
    from tensorlang.baselines.roller import Hardware
    from tensorlang.space.sentence import target_tokens
    doc = api.load(ROOT / "examples" / "matmul.tsched")
    cpu = doc.model.targets["cpu"]
    toks = target_tokens(cpu)
    assert toks[:3] == ["TARGET", "llvm", f"cpu:{OLD_CPU}"]
    assert toks[toks.index("vector_bits") + 1] == "256"
    assert toks[toks.index("l1_kb") + 1] == str(as_haswell.l1d_bytes // 1024)
    hw = Hardware.of(cpu)
    assert (hw.vector_bytes, hw.l1_bytes, hw.cores) == (32, as_haswell.l1d_bytes, as_haswell.cores)
    named = api.load_text(SPR).model.targets["spr"]  # another CPU: LLVM's features, caches assumed
    hw = Hardware.of(named)
    assert (hw.vector_bytes, hw.cores, hw.l1_bytes) == (64, 2, machine.DEFAULT_L1D)


def test_tables_name_the_host_cpu(as_haswell):
    from tensorlang.cli import format_run_table
    last = format_run_table([]).splitlines()[-1]
    assert last == f"host: {OLD_CPU} ({as_haswell.model}, {as_haswell.cores} cores, set by {HOST_ENV} on a " \
                   f"{as_haswell.overridden_from})"
