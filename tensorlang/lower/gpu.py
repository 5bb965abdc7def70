"""Checks TVM skips for CUDA schedules (see ../shared/notes/tvm-0.27.md).

TVM compiles a schedule with unbound loops silently as host code with no kernel, and
compiles a 2048-thread block without complaint. So, on the scheduled IR:
- every block must sit under a `blockIdx.*` and a `threadIdx.*` loop (TS401);
- thread, vthread and shared-memory use must fit the target's limits (TS402), computed
  here for the message and confirmed with TVM's `verify_gpu_code` on the lowered function.
"""
from __future__ import annotations

import math

from tensorlang.analysis.targets import gpu_limits
from tensorlang.diagnostics import Diagnostic, error
from tensorlang.lower import tir
from tensorlang.lower.schedule import stage_name_of


def check_gpu_schedule(sch, env, target_params: dict, span) -> list[Diagnostic]:
    func = sch.mod["main"]
    unbound: dict[str, list[str]] = {}  # what is missing -> stages
    outside: dict[str, str] = {}  # stage -> a host loop above its blockIdx loop
    for realize, loops in tir.block_realizes(func.body):
        tags = [tir.thread_tag(l) or "" for l in loops]
        missing = " and ".join(k for k, ok in (("blockIdx.*", any(t.startswith("blockIdx") for t in tags)),
                                               ("threadIdx.*", any(t.startswith("threadIdx") for t in tags)))
                               if not ok)
        if missing:
            unbound.setdefault(missing, []).append(stage_name_of(sch, env, realize.block))
            continue
        # A serial loop above the kernel's blockIdx loop runs on the host: the kernel is launched once per
        # iteration, each launch redoing the same work or racing on the outputs.
        first = next(n for n, t in enumerate(tags) if t.startswith("blockIdx"))
        host = [l for l in loops[:first] if not tags[loops.index(l)] and (tir.as_int(l.extent) or 2) > 1]
        if host:
            outside.setdefault(stage_name_of(sch, env, realize.block), host[0].loop_var.name)
    diags = [error("TS401", f"{'stage' if len(names) == 1 else 'stages'} {', '.join(names)} "
                            f"{'is' if len(names) == 1 else 'are'} not under a {missing} loop: TVM would compile "
                            f"{'it' if len(names) == 1 else 'them'} as host code with no GPU kernel; bind the outer "
                            f"loops, e.g. bind(l, blockIdx.x)", span)
             for missing, names in unbound.items()]
    diags += [error("TS401", f"stage {name} has the serial loop {loop} outside its blockIdx.* loop: the kernel would "
                             f"be launched once per iteration from the host; move it inside the kernel or bind it",
                    span) for name, loop in outside.items()]
    if diags:
        return diags
    return check_gpu_limits(func, target_params, span, env)


def _lowered(func):
    import tvm
    from tvm import s_tir, tirx
    passes = [
        s_tir.transform.LowerCrossThreadReduction(), s_tir.transform.LowerInitBlock(),
        s_tir.transform.PlanAndUpdateBufferAllocationLocation(), s_tir.transform.ConvertBlocksToOpaque(),
        s_tir.transform.ManifestSharedMemoryLocalStage(), s_tir.transform.CompactBufferAllocation(),
        s_tir.transform.LowerMatchBuffer(), s_tir.transform.LowerOpaqueBlock(), tirx.transform.FlattenBuffer(),
        tirx.transform.NarrowDataType(32), tirx.transform.StmtSimplify(),
        tirx.transform.VectorizeLoop(True), s_tir.transform.InjectVirtualThread(),
        tirx.transform.StorageRewrite(), s_tir.transform.MergeSharedMemoryAllocations(),
    ]
    mod = tvm.ir.transform.Sequential(passes)(tvm.IRModule({"main": func}))
    return mod["main"]


def kernel_usage(func) -> dict:
    """Threads per block, vthreads and shared bytes of a scheduled function."""
    extents: dict[str, int] = {}
    for node, _ in tir.walk(func.body):
        tag = tir.thread_tag(node) if hasattr(node, "loop_var") else None
        if tag:
            extents[tag] = max(extents.get(tag, 1), tir.as_int(node.extent) or 1)
    threads = math.prod(v for k, v in extents.items() if k.startswith("threadIdx"))
    vthreads = math.prod(v for k, v in extents.items() if k.startswith("vthread"))
    shared = 0
    try:
        lowered = _lowered(func)
        for node, _ in tir.walk(lowered.body):
            buf = getattr(node, "buffer", None)
            if buf is not None and type(node).__name__ in ("AllocBuffer", "Allocate", "DeclBuffer"):
                if str(buf.scope()).startswith("shared") and type(node).__name__ != "DeclBuffer":
                    n = math.prod(tir.as_int(d) or 0 for d in buf.shape)
                    shared += n * _dtype_bytes(buf.dtype)
    except Exception:
        lowered = None
    return {"threads": threads, "vthreads": vthreads, "shared_bytes": shared, "extents": extents,
            "lowered": lowered}


def _factor_fixes(func, env, family: str, used: int, limit: int, what: str) -> list[Diagnostic]:
    """For each split statement one of whose outputs is bound to a `family` axis: an error at its
    factors naming the largest value that axis can take there, with the nearest factor lists that
    keep the block within the limit (the other factors unchanged where a None factor absorbs it)."""
    if env is None:
        return []
    out, seen = [], set()
    for node, _ in tir.walk(func.body):
        tag = tir.thread_tag(node) if hasattr(node, "loop_var") else None
        if not tag or not tag.startswith(family):
            continue
        for name in env.components(node.loop_var.name):
            origin = env.split_origins.get(name)
            if origin is None or origin[0] in seen:
                continue
            fspan, factors, extent, i = origin
            value = _factor_value(factors, extent, i)
            allowed = limit * value // used  # the most this factor can be with the rest unchanged
            if allowed < 1 or allowed >= value:
                continue
            seen.add(fspan)
            out.append(error("TS402", f"this split's factor {i} ({value}) is bound to {tag}: with the other "
                                      f"loops unchanged it can be at most {allowed} for the block's {what} to fit "
                                      f"in {limit}", fspan, _split_fixes(factors, extent, i, allowed)))
    return out


MAX_VECTOR_BYTES = 16  # a CUDA vector load or store moves at most 16 bytes (TVM's max_vector_bytes)


def _vector_width(func, env, span) -> list[Diagnostic]:
    """Vectorized loops wider than a CUDA vector access, with the split factor to change where known."""
    out = []
    for node, _ in tir.walk(func.body):
        if not hasattr(node, "loop_var") or tir.loop_kind(node) != "vectorized":
            continue
        lanes = tir.as_int(node.extent) or 1
        width = max((_dtype_bytes(w.source.dtype) for r, _ in tir.block_realizes(node) for w in r.block.writes),
                    default=4)
        if lanes * width <= MAX_VECTOR_BYTES:
            continue
        allowed = max(1, MAX_VECTOR_BYTES // width)
        names = env.components(node.loop_var.name) if env is not None else []
        origin = env.split_origins.get(names[-1]) if names else None
        where, fixes = span, []
        if origin is not None:  # the innermost part of the vectorized loop comes from this split
            fspan, factors, extent, i = origin
            if _factor_value(factors, extent, i) == lanes:
                where, fixes = fspan, _split_fixes(factors, extent, i, allowed)
        out.append(error("TS402", f"loop {node.loop_var.name} is vectorized over {lanes} lanes of {width} bytes: a "
                                  f"CUDA vector access is at most {MAX_VECTOR_BYTES} bytes, so at most {allowed} "
                                  f"lanes", where, fixes))
    return out


def _factor_value(factors: list, extent: int, i: int) -> int:
    known = math.prod(f for f in factors if f is not None)
    return factors[i] if factors[i] is not None else -(-extent // known)


def _split_fixes(factors: list, extent: int, i: int, allowed: int) -> list[str]:
    """Factor lists for the split with factor i at most `allowed`, nearest first: the others kept
    where a None factor absorbs the change, else the nearest perfect factorizations."""
    from tensorlang.lower.schedule import _list, divisors, factorizations_by_distance
    value = _factor_value(factors, extent, i)
    if None in factors and factors[i] is not None:
        others = math.prod(f for f in factors if f is not None) // value
        values = sorted((d for d in divisors(max(1, extent // others)) if d <= allowed),
                        key=lambda d: abs(math.log(d) - math.log(value)))[:3] or [allowed]
        return [_list(factors[:i] + [d] + factors[i + 1:]) for d in values]
    if None not in factors:
        return [_list(c) for c in factorizations_by_distance(extent, factors, lambda c: c[i] <= allowed)[:3]]
    return []


def _dtype_bytes(dtype) -> int:
    s = str(dtype)
    bits = int("".join(c for c in s if c.isdigit()) or 32)
    lanes = 1
    if "x" in s:
        lanes = int(s.split("x")[-1])
        bits = int("".join(c for c in s.split("x")[0] if c.isdigit()) or 32)
    return max(bits // 8, 1) * lanes


def check_gpu_limits(func, target_params: dict, span, env=None) -> list[Diagnostic]:
    limits = gpu_limits(target_params)
    arch = target_params.get("arch", "sm_90")
    use = kernel_usage(func)
    diags = []
    if use["threads"] > limits["max_threads_per_block"]:
        diags.append(error("TS402", f"a block uses {use['threads']} threads; {arch} allows at most "
                                    f"{limits['max_threads_per_block']} per block "
                                    f"({', '.join(f'{k}={v}' for k, v in use['extents'].items() if 'thread' in k)})",
                           span))
        diags += _factor_fixes(func, env, "threadIdx", use["threads"], limits["max_threads_per_block"], "threads")
    if use["vthreads"] > limits["max_vthread"]:
        diags.append(error("TS402", f"{use['vthreads']} virtual threads; the limit is {limits['max_vthread']}", span))
        diags += _factor_fixes(func, env, "vthread", use["vthreads"], limits["max_vthread"], "virtual threads")
    if use["shared_bytes"] > limits["max_shared_memory_per_block"]:
        diags.append(error("TS402", f"a block uses {use['shared_bytes']} bytes of shared memory; {arch} allows "
                                    f"{limits['max_shared_memory_per_block']} bytes of static shared memory per "
                                    f"block", span))
    diags += _vector_width(func, env, span)
    if diags:
        return diags
    from tvm.s_tir.analysis import verify_gpu_code
    constraints = {"max_threads_per_block": limits["max_threads_per_block"],
                   "max_shared_memory_per_block": limits["max_shared_memory_per_block"],
                   "max_vthread": limits["max_vthread"], "max_vector_bytes": 16,
                   "max_thread_x": 1024, "max_thread_y": 1024, "max_thread_z": 64}
    if use["lowered"] is not None:
        if not verify_gpu_code(use["lowered"], constraints):
            diags.append(error("TS402", f"TVM's VerifyGPUCode rejects the kernel under the {arch} limits "
                                        f"{constraints} (threads per block {use['threads']}, shared bytes "
                                        f"{use['shared_bytes']})", span))
        return diags
    # Our lowering passes could not run (the shared bytes above are then unknown): a check that cannot
    # run must not pass, so compile as `tvm.compile` would and verify the kernels it produced.
    try:
        kernels = compiled_kernels(func, target_params)
    except Exception as e:
        from tensorlang.lower.schedule import condense_tvm_error
        return [error("TS406", f"TVM could not compile this schedule for {arch}: {condense_tvm_error(str(e))}", span)]
    for name, kernel in kernels:
        if not verify_gpu_code(kernel, constraints):
            diags.append(error("TS402", f"TVM's VerifyGPUCode rejects the compiled kernel {name} under the {arch} "
                                        f"limits {constraints}", span))
    return diags


def host_and_device(sch_mod, tvm_target):
    """TVM's default TIR pipeline on a scheduled module, as tvm.compile runs it: (the host module, and
    the device modules by target) -- the kernels it launches and the calls that launch them."""
    import tvm
    from tvm.target import Target
    from tvm.tirx.build import split_host_device_mods
    mod = tvm.tirx.transform.BindTarget(tvm_target.with_host(Target({"kind": "llvm"})))(sch_mod)
    pipeline, _, _ = tvm.tirx.get_default_tir_pipeline(tvm_target)
    return split_host_device_mods(pipeline(mod))


def compiled_kernels(func, target_params: dict) -> list[tuple[str, object]]:
    """The device functions (name, PrimFunc) tvm.compile would hand to CUDA codegen."""
    import tvm
    from tensorlang.lower.targets import cuda_target
    _, devices = host_and_device(tvm.IRModule({"main": func}), cuda_target(target_params))
    return [(gv.name_hint, f) for m in devices.values() for gv, f in m.functions.items()]
