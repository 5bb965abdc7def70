"""Scheduled module -> kernels: TVMScript, CUDA source, PTX (nvcc), LLVM IR, shared library."""
from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

EMITS = ("tir", "cuda", "ptx", "llvm", "so", "unroll")


class BuildError(Exception):
    pass


def compile_module(mod, target):
    import tvm
    try:
        return tvm.compile(mod, target=target)
    except Exception as e:  # TVM's codegen errors: report, never a traceback
        from tensorlang.lower.schedule import condense_tvm_error
        raise BuildError(condense_tvm_error(str(e))) from None


def cuda_source(lib) -> str:
    if not len(lib.mod.imports):
        raise BuildError("no device module was generated (is every block bound to blockIdx/threadIdx?)")
    return lib.mod.imports[0].inspect_source()


def nvcc_available() -> bool:
    return shutil.which("nvcc") is not None or Path("/usr/local/cuda/bin/nvcc").exists()


def ptx_from_cuda(source: str, target) -> str:
    if not nvcc_available():
        raise BuildError("nvcc was not found on PATH; PTX needs the CUDA toolkit")
    from tvm.support import nvcc  # noqa: F401 - imported for its compile_cuda
    import tvm.support.nvcc as nvcc_mod
    try:
        with target:
            ptx = nvcc_mod.compile_cuda(source, target_format="ptx", compiler="nvcc")
    except Exception as e:
        raise BuildError(f"nvcc failed: {str(e).strip().splitlines()[-1] if str(e).strip() else e}") from None
    return ptx.decode() if isinstance(ptx, (bytes, bytearray)) else str(ptx)


def llvm_ir(lib) -> str:
    return lib.mod.inspect_source("ll")


def write_shared_library(lib, path: str | Path) -> Path:
    """A built module as a shared library that `tvm.runtime.load_module` loads (link_shared links it)."""
    path = Path(path)
    lib.export_library(str(path), fcompile=link_shared)
    return path


def link_shared(output: str, objects: list[str], options=None, **kwargs) -> None:
    """export_library's link step: the kernel's object file(s) linked into a shared library by `ld` itself,
    with the C and math libraries it may call (memset, expf, erff, powf). TVM's default runs the C++ compiler
    driver, which starts `collect2` and then `ld`, and adds start-up files a kernel does not use (it has no
    constructors): 20-28 ms a link against 3-4 ms (znver4), a fifth of a small kernel's whole build and a
    cost paid by every candidate a collect builds. The machine code is the object's, as it was. Anything
    else (no `ld`, options TVM passes for C sources, a link that fails) goes the default way."""
    from tvm.support import cc
    objects = [objects] if isinstance(objects, str) else list(objects)
    ld = shutil.which("ld")
    if ld is None or options or kwargs or not all(o.endswith(".o") for o in objects):
        cc.create_shared(output, objects, options=options, **kwargs)
        return
    done = subprocess.run([ld, "-shared", "-o", output, *objects, "-lm", "-lc"], capture_output=True)
    if done.returncode != 0:
        cc.create_shared(output, objects)


def emit(sch_mod, target, kind: str, is_gpu: bool, out: str | None = None) -> str | bytes:
    """The requested artefact as text (or the path written, for `so`)."""
    if kind == "tir":
        return sch_mod.script()
    if kind == "unroll":  # what the build will unroll, without building (TVM's loop names)
        from tensorlang.space.unroll_loop import report_text, unroll_report
        return report_text(unroll_report(sch_mod["main"])) or "no unroll pragma"
    lib = compile_module(sch_mod, target)
    if kind == "cuda":
        if not is_gpu:
            raise BuildError("--emit cuda needs a cuda target")
        return cuda_source(lib)
    if kind == "ptx":
        if not is_gpu:
            raise BuildError("--emit ptx needs a cuda target")
        return ptx_from_cuda(cuda_source(lib), target)
    if kind == "llvm":
        if is_gpu:
            raise BuildError("--emit llvm is for CPU targets; use --emit cuda or ptx")
        return llvm_ir(lib)
    if kind == "so":
        if out is None:
            out = str(Path(tempfile.mkdtemp()) / "kernel.so")
        return str(write_shared_library(lib, out))
    raise BuildError(f"unknown emit kind '{kind}'; expected one of {', '.join(EMITS)}")
