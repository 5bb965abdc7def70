"""What runs in the harness's worker processes: building a candidate, and running kernels.

Workers are started with the `spawn` method; builders and TVM-kernel runners import TVM once, when
they start (never `tvm.s_tir.tensor_intrin`); runners of Python kernels do not import it at all.
This module imports neither TVM nor NumPy at the top, so that the environment a runner sets up
(thread counts) is in place before TVM's runtime starts.
"""
from __future__ import annotations

import math
import os
import sys
import time
import traceback


def keep_torch_out() -> None:
    """Mark PyTorch absent in this process, before TVM is imported. tvm_ffi imports PyTorch whenever it is
    installed (for DLPack interop): 1.2-2.2 s and ~200 MB of every builder's and runner's start, on a
    machine whose 2 cores the other workers are starting on too, and an OpenMP thread pool beside the TVM
    kernels a runner times. Builders and TVM-kernel runners never use it; tvm_ffi catches the ImportError."""
    if "torch" not in sys.modules:
        sys.modules["torch"] = None


# ------------------------------------------------------------------ builds


def build_init():
    """ProcessPoolExecutor initializer: pay the imports once per worker, not in the first build's time."""
    keep_torch_out()
    import tvm  # noqa: F401

    import tensorlang.lower.build  # noqa: F401
    import tensorlang.lower.schedule  # noqa: F401
    import tensorlang.lower.te_build  # noqa: F401


def schedule_block(text: str, op: str, target: str) -> str:
    """.tsched schedule text as a `schedule` block: a block as is, bare statements wrapped in one."""
    if text.lstrip().startswith("schedule ") or "\nschedule " in text:
        return text
    body = "".join(f"    {line}\n" for line in text.splitlines() if line.strip())
    return f"schedule {op} on {target} {{\n{body}}}\n"


def lower_text(op_model, text: str, target_name: str = "t"):
    """(scheduled IRModule, None) or (None, message): apply .tsched schedule text to the operator."""
    from tensorlang.lower.schedule import apply_schedule
    from tensorlang.lower.te_build import build_primfunc
    from tensorlang.parser import parse
    module, diags = parse(schedule_block(text, op_model.name, target_name))
    errors = [d for d in diags if d.severity == "error"]
    if errors:
        return None, f"{errors[0].code} {errors[0].message} (line {errors[0].span.line} of the schedule)"
    if len(module.schedules) != 1:
        return None, f"expected one schedule block, found {len(module.schedules)}"
    applied = apply_schedule(build_primfunc(op_model), op_model, module.schedules[0])
    errors = [d for d in applied.diags if d.severity == "error"]
    if errors:
        return None, f"{errors[0].code} {errors[0].message} (line {errors[0].span.line} of the schedule)"
    return applied.sch.mod, None


def _scheduled(job: dict, out: dict):
    """The candidate's scheduled IRModule, or None with out["error"] set (its schedule does not apply)."""
    from tensorlang.lower.te_build import build_primfunc
    op, sched = job["op"], job["schedule"]
    if isinstance(sched, str):
        t0 = time.perf_counter()
        mod, msg = lower_text(op, sched, job["target"].name)
        out["schedule_s"] = time.perf_counter() - t0
        if mod is None:
            out.update(error=msg, stage="schedule")
        return mod
    return build_primfunc(op) if sched is None else sched


def _compile(mod, target_model, path: str, out: dict) -> bool:
    """tvm.compile + export to `path`; compile_s, or the error, in `out`."""
    from tensorlang.lower.build import BuildError, compile_module, write_shared_library
    from tensorlang.lower.targets import tvm_target
    t1 = time.perf_counter()
    try:
        write_shared_library(compile_module(mod, tvm_target(target_model)), path)
    except BuildError as e:
        out.update(error=str(e), stage="build")
        return False
    except Exception as e:  # an internal error in one candidate must not stop the others
        out.update(error=f"{type(e).__name__}: {e}", stage="build", traceback=traceback.format_exc(limit=5))
        return False
    out["compile_s"] = time.perf_counter() - t1
    return True


def ready() -> dict:
    """A no-op job: submitted once per worker, it starts the pool's processes (and their imports) early."""
    return {"pid": os.getpid(), "torch": _has_torch()}


def _has_torch() -> bool:
    return sys.modules.get("torch") is not None  # keep_torch_out leaves a None there


def build_job(job: dict) -> dict:
    """One candidate: (.tsched text ->) scheduled module -> compiled -> exported shared library.

    job: {"op": OpModel, "target": TargetModel, "schedule": IRModule | str | None, "path": .so path}.
    Returns {"path", "schedule_s", "compile_s", "pid", "tensor_intrin"} or {"error", "stage", ...}."""
    out = {"pid": os.getpid(), "schedule_s": None, "compile_s": None}
    try:
        mod = _scheduled(job, out)
    except Exception as e:
        return {**out, "error": f"{type(e).__name__}: {e}", "stage": "build", "traceback": traceback.format_exc(limit=5)}
    if mod is None or not _compile(mod, job["target"], job["path"], out):
        return out
    out["path"] = job["path"]
    out["tensor_intrin"] = "tvm.s_tir.tensor_intrin" in sys.modules
    return out


def build_group_job(jobs: list[dict], path: str) -> list[dict]:
    """Candidates of one operator on one CPU target compiled together: one module, one LLVM run, one
    link, each candidate its own function (`k0`, `k1`, ...) of the library at `path`. A build's fixed
    cost (the compile pipeline, the object file, the linker) is about half of a small kernel's whole
    build: 8 softmax or matmul candidates built in 0.8-1.2 s together against 1.4-2.5 s apart (a conv2d's
    8 in the same time either way). A schedule that does not apply is reported alone; if the joint
    compile fails, each candidate is compiled alone, so that one bad candidate fails no other.
    Returns build_job's dicts, in order, with "func" naming each one's function; compile_s is the
    group's compile time shared out evenly (`group`: how many shared it)."""
    import tvm
    outs = [{"pid": os.getpid(), "schedule_s": None, "compile_s": None} for _ in jobs]
    funcs = {}
    for i, (job, out) in enumerate(zip(jobs, outs)):
        try:
            mod = _scheduled(job, out)
            if mod is not None:
                funcs[i] = mod["main"].with_attr("global_symbol", f"k{i}")
        except Exception as e:
            out.update(error=f"{type(e).__name__}: {e}", stage="build", traceback=traceback.format_exc(limit=5))
    if not funcs:
        return outs
    joint = {}
    if len(funcs) > 1 and _compile(tvm.IRModule({f"k{i}": f for i, f in funcs.items()}), jobs[0]["target"], path,
                                   joint):
        for i in funcs:
            outs[i].update(path=path, func=f"k{i}", compile_s=joint["compile_s"] / len(funcs), group=len(funcs))
    else:  # one alone, or the joint compile failed: each compiled by itself
        for i, func in funcs.items():
            own = f"{path.removesuffix('.so')}_{i}.so"
            if _compile(tvm.IRModule({f"k{i}": func}), jobs[i]["target"], own, outs[i]):
                outs[i].update(path=own, func=f"k{i}", group=1)
    intrin = "tvm.s_tir.tensor_intrin" in sys.modules
    for out in outs:
        if "path" in out:
            out["tensor_intrin"] = intrin
    return outs


# ------------------------------------------------------------------ runner


def _load_factory(spec: str):
    """'package.module:function' or '/path/to/file.py:function' -> the function."""
    import importlib
    import importlib.util
    where, _, name = spec.rpartition(":")
    if where.endswith(".py"):
        mod_name = "_tensorlang_kernels_" + str(abs(hash(os.path.abspath(where))))
        module = sys.modules.get(mod_name)
        if module is None:
            s = importlib.util.spec_from_file_location(mod_name, where)
            module = importlib.util.module_from_spec(s)
            sys.modules[mod_name] = module
            s.loader.exec_module(module)
    else:
        module = importlib.import_module(where)
    return getattr(module, name)


_TENSORS: dict = {}  # data key -> (input tensors, output tensors), shared by the kernels of one operator


def _tensors(spec: dict):
    """The operator's input and output tensors. Kernels of the same operator (the same `data` key) share
    them, so that each runs on the very same memory (placement and alignment effects are the same for
    all) -- outputs are read right after the run that checks them, so sharing them is safe."""
    import numpy as np
    import tvm
    key = spec.get("data")
    if key is not None and key in _TENSORS:
        return _TENSORS[key]
    dev = tvm.cpu(0)
    # np.asarray, not np.ascontiguousarray: that one turns a 0-d (scalar) input into a 1-d array
    args = [tvm.runtime.tensor(np.asarray(a, order="C"), dev) for a in spec["inputs"].values()]
    outs = [tvm.runtime.tensor(np.zeros(shape, dtype=dtype), dev) for _, shape, dtype in spec["outputs"]]
    if key is not None:
        _TENSORS[key] = (args, outs)
    return args, outs


class _TvmKernel:
    def __init__(self, spec: dict):
        import tvm
        self.dev = tvm.cpu(0)
        self.module = tvm.runtime.load_module(spec["path"])
        self.entry = spec.get("func", "main")  # a library of several candidates names each one's function
        self.func = self.module[self.entry]
        self.args, self.outs = _tensors(spec)
        self.data = spec.get("data")
        self.names = [n for n, _, _ in spec["outputs"]]
        self.call_s = None  # the checking run's time (its first call)
        self.figure_s = None  # the last figure (seconds per call): sizes the next batch

    def run(self) -> dict:
        import numpy as np
        for o in self.outs:  # no stale result of another kernel can pass the check
            poison = np.nan if np.dtype(o.dtype).kind == "f" else 0x5A
            o.copyfrom(np.full(o.shape, poison, dtype=o.dtype))
        t0 = time.perf_counter()
        self.func(*self.args, *self.outs)  # a CPU kernel returns when it is done
        self.call_s = time.perf_counter() - t0
        return {n: o.numpy() for n, o in zip(self.names, self.outs)}

    def time(self, min_repeat_ms: float) -> float:
        """One figure: the mean time of a batch of calls that lasts at least min_repeat_ms (time_evaluator's
        rule), the batch sized from what this kernel took before. time_evaluator sizing it alone -- a warm-up
        call, one call, then the calls that one says fill the batch, and 1.618x as many again when they fall
        short, which they do about half the time -- spends up to 1.6x min_repeat_ms on a figure of a fast
        kernel, and two calls on one of a kernel slower than the batch. Sized here: one batch of min_repeat_ms
        and 5 % (a batch of a tenth of it first, for the first figure), and one call for a kernel slower than
        the batch (warm: the checking run ran it)."""
        need = min_repeat_ms / 1e3
        known = self.figure_s or self.call_s
        if known is not None and known >= need:  # one call fills the batch
            t0 = time.perf_counter()
            self.func(*self.args, *self.outs)
            self.figure_s = time.perf_counter() - t0
            if self.figure_s >= need:
                return self.figure_s
        if not self.figure_s:  # a short batch first says how long a warm call takes
            self.figure_s = self._evaluate(1, min_repeat_ms / 10)
        self.figure_s = self._evaluate(max(1, math.ceil(need * 1.05 / self.figure_s)), min_repeat_ms)
        return self.figure_s

    def _evaluate(self, number: int, min_repeat_ms: float) -> float:
        timer = self.module.time_evaluator(self.entry, self.dev, number=number, repeat=1,
                                           min_repeat_ms=int(max(1, min_repeat_ms)))
        return float(timer(*self.args, *self.outs).results[0])


class _PythonKernel:
    """A kernel written in Python (PyTorch, NumPy): `factory(inputs, outputs, **kwargs)` returns a
    function of no arguments that runs the kernel and returns its outputs as a name -> array dict."""

    def __init__(self, factory: str, kwargs: dict, inputs: dict, outputs: list):
        self.fn = _load_factory(factory)(inputs, outputs, **(kwargs or {}))

    def run(self) -> dict:
        import numpy as np
        return {k: np.asarray(v) for k, v in self.fn().items()}

    def time(self, min_repeat_ms: float) -> float:
        """time_evaluator's rule: one warm-up call, then `number` calls, `number` grown until they
        take at least min_repeat_ms; the mean of the last batch."""
        fn = self.fn
        fn()
        number = 1
        while True:
            t0 = time.perf_counter()
            for _ in range(number):
                fn()
            elapsed = time.perf_counter() - t0
            if elapsed * 1e3 >= min_repeat_ms or number >= 1 << 24:
                return elapsed / number
            number = max(number * 2, int(number * min_repeat_ms / max(elapsed * 1e3, 1e-3) * 1.2))


def runner_main(conn, threads: int | None, log_path: str | None, preload: tuple = ("tvm",)):
    """A kernel-runner process: serve requests on `conn` until it closes.

    Requests (tuples) and answers:
    ("load", key, spec)     -> ("ok", {"outputs": {...} | None, "load_s"})   spec: {"kind": "tvm", "path", "func"?} or
                               {"kind": "python", "factory", "kwargs"}, plus "inputs", "outputs", "return_outputs"
    ("time", key, min_ms)   -> ("ok", seconds per call)
    ("unload", key)         -> ("ok", None)
    ("info",)               -> ("ok", {"pid", "tensor_intrin", "loaded", "torch"})
    Any Python error answers ("error", message); a crash or hang is for the parent to see.
    `preload`: modules imported before the runner says it is ready (TVM for TVM kernels), so that
    no request's time or timeout includes them."""
    if log_path:  # TVM's crash banner and anything a kernel prints go here, not to the user's terminal
        fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
    if threads:
        for var in ("TVM_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
            os.environ[var] = str(threads)
    import importlib
    if "tvm" in preload:  # a TVM kernels' runner: PyTorch's kernels have a runner of their own
        keep_torch_out()
    for name in ("numpy",) + tuple(preload):
        importlib.import_module(name)
    kernels: dict = {}
    conn.send(("ready", {"pid": os.getpid(), "tensor_intrin": "tvm.s_tir.tensor_intrin" in sys.modules}))
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return
        try:
            kind = msg[0]
            if kind == "load":
                _, key, spec = msg
                t0 = time.perf_counter()
                if spec["kind"] == "tvm":
                    k = _TvmKernel(spec)
                else:
                    k = _PythonKernel(spec["factory"], spec.get("kwargs"), spec["inputs"], spec["outputs"])
                    if threads and _has_torch():  # the same thread count as the TVM kernels
                        sys.modules["torch"].set_num_threads(threads)
                load_s = time.perf_counter() - t0
                outputs = k.run() if spec.get("run", True) else None
                kernels[key] = k
                conn.send(("ok", {"outputs": outputs if spec.get("return_outputs") else None, "load_s": load_s,
                                  "call_s": getattr(k, "call_s", None)}))
            elif kind == "time":
                _, key, min_ms = msg
                conn.send(("ok", kernels[key].time(min_ms)))
            elif kind == "unload":
                gone = kernels.pop(msg[1], None)
                data = getattr(gone, "data", None)
                if data is not None and not any(getattr(k, "data", None) == data for k in kernels.values()):
                    _TENSORS.pop(data, None)
                conn.send(("ok", None))
            elif kind == "info":
                conn.send(("ok", {"pid": os.getpid(), "tensor_intrin": "tvm.s_tir.tensor_intrin" in sys.modules,
                                  "loaded": sorted(kernels), "torch": _has_torch()}))
            else:
                conn.send(("error", f"unknown request {kind!r}"))
        except Exception as e:
            try:
                conn.send(("error", f"{type(e).__name__}: {e}"))
            except Exception:
                return
