"""GPU measurement without TVM on the GPU machine: build here, time there, record here.

    tensorlang gpu-bundle data/workloads --target cuda --per-task 8 --max-io-mb 4 -o gpu_bundle   # here
    python tensorlang/data/gpu_runner.py gpu_bundle $OUT                                          # on the GPU
    tensorlang gpu-ingest gpu_bundle $OUT/results.jsonl -o data/measured/cuda                     # here

The GPU machine (an H200 lent for minutes) has PyTorch and CuPy but no TVM. So each candidate is
built here: the schedule (roller first, then uniform samples of the space) is lowered by TVM, its
CUDA source compiled by nvcc to a cubin for the target's arch, and its launch plan read off TVM's
host code after the TIR pipeline -- which kernels, in which order, on which buffers (inputs,
outputs and the intermediates the host allocates), with which grid and block sizes. The bundle
also holds each task's NumPy reference outputs (at up to 16,384 seeded positions of each) and the inputs
they were computed from (the harness's own random inputs; the plain standard-normal ones as a seed and a
checksum, the runner draws them), so that the runner checks every result before timing it.
`gpu_runner.py` needs only NumPy and CuPy.
"""
from __future__ import annotations

import hashlib
import json
import re
import subprocess
import tempfile
import time
from pathlib import Path

_CALL = re.compile(r'T\.call_ffi_kernel\("([^"]+)", (.*?), launch_params=\[([^\]]*)\]')


def launch_plan(sch_mod, tvm_target) -> list[dict]:
    """[{kernel, args: [buffer names], grid: [x, y, z], block: [x, y, z], dynamic_shared: bytes}] in launch
    order, read off the host function after TVM's default TIR pipeline (what tvm.compile launches)."""
    from tensorlang.lower.gpu import host_and_device
    host, _ = host_and_device(sch_mod, tvm_target)
    plan = []
    for name, args, params in _CALL.findall(host.script()):
        parts = [a.strip() for a in args.split(",")]
        tags = [t.strip().strip('"') for t in params.split(",") if t.strip()]
        values = parts[len(parts) - len(tags):] if tags else []
        buffers = parts[:len(parts) - len(tags)]
        if any(not v.isdigit() for v in values) or any(not b.endswith(".data") for b in buffers):
            raise ValueError(f"kernel {name}: a launch the bundle cannot describe ({args})")
        grid, block, shared = [1, 1, 1], [1, 1, 1], 0
        for tag, v in zip(tags, values):
            if tag.startswith("blockIdx."):
                grid["xyz".index(tag[-1])] = int(v)
            elif tag.startswith("threadIdx."):
                block["xyz".index(tag[-1])] = int(v)
            elif tag == "tirx.use_dyn_shared_memory":
                shared = int(v)
        plan.append({"kernel": name, "args": [b[:-len(".data")] for b in buffers], "grid": grid, "block": block,
                     "dynamic_shared": shared})
    return plan


def _tensor_of(printed: str, tensors: dict) -> str:
    """The op tensor a buffer printed by TVMScript names (the printer adds _1, _2 to clashing names)."""
    if printed in tensors:
        return printed
    stripped = re.sub(r"_\d+$", "", printed)
    if stripped in tensors:
        return stripped
    raise ValueError(f"buffer {printed} is no tensor of the operator")


def seeded_inputs(op, inputs: dict, seed: int) -> dict[str, str]:
    """The inputs the runner can draw itself instead of carrying them: those equal to plain standard normals
    of `numpy.random.default_rng(seed)`, drawn for every input in order (as `interp.random_inputs` draws
    them), cast to the input's dtype -> {name: sha256 of the array's bytes}, which the runner checks. Weights
    are most of a task's data, and the bundle travels in a size-capped working tree."""
    import numpy as np
    rng = np.random.default_rng(seed)
    out = {}
    for t in op.inputs:
        x = rng.standard_normal(t.shape).astype(inputs[t.name].dtype)
        if np.array_equal(x, inputs[t.name]):
            out[t.name] = hashlib.sha256(np.ascontiguousarray(x).tobytes()).hexdigest()
    return out


CHECKED_ELEMENTS = 16384


def checked_outputs(name: str, ref, seed: int) -> dict:
    """The reference of output `name` as the bundle carries it: whole up to CHECKED_ELEMENTS elements, else
    that many elements at seeded positions (`idx:` flat indices, `ref:` their values). A wrong kernel
    -- a missed tail tile, a wrong reduction -- is wrong at far more than one in 16,384 elements, and the
    references were most of a bundle's bytes."""
    import numpy as np
    flat = ref.reshape(-1)
    if flat.size <= CHECKED_ELEMENTS:
        return {f"ref:{name}": ref}
    idx = np.sort(np.random.default_rng(seed + 1).choice(flat.size, CHECKED_ELEMENTS, replace=False))
    return {f"idx:{name}": idx.astype(np.int64), f"ref:{name}": flat[idx]}


def cubin(source: str, arch: str) -> bytes:
    with tempfile.TemporaryDirectory() as d:
        src, out = Path(d) / "k.cu", Path(d) / "k.cubin"
        src.write_text(source)
        r = subprocess.run(["nvcc", "--cubin", f"-arch={arch}", "-O3", "-o", str(out), str(src)],
                           capture_output=True, text=True, timeout=300)
        if r.returncode:
            raise RuntimeError(f"nvcc: {r.stderr.strip()[-400:]}")
        return out.read_bytes()


def prepare(paths: list[str], target: str, out_dir: str | Path, per_task: int, max_io_mb: float = 4.0,
            seed: int = 0, max_tasks: int | None = None, max_bundle_mb: float | None = None,
            split_path: str | Path | None = None, model: str | Path | None = None, model_samples: int = 1,
            log=print) -> dict:
    """Write the bundle: manifest.json, one .npz of inputs and references per task, one cubin per candidate.

    Tasks come one of each given path in turn (`collect --order interleave`: a capped bundle reaches every
    model), each workload once (the same operator in two models is one task), and never a held-out task
    (data/split.json): GPU records are training data, and `train` refuses a held-out task's records.
    `max_tasks` / `max_bundle_mb` stop the bundle there -- it travels to the GPU machine with the working
    tree, whose size is capped. The manifest is rewritten after each task, so an interrupted build leaves a
    bundle the runner can use. `model`: a tensor-language-model checkpoint whose `model_samples` candidates
    per task (its one-pass schedule first) join roller's and the random ones; where one is a point already in
    the bundle, the task's `policies` says so (what the model wrote is measured once, under both names)."""
    import numpy as np

    from tensorlang import api, interp
    from tensorlang.analysis import dtypes as D
    from tensorlang.data import split
    from tensorlang.data.collect import candidates_for, find_tasks, interleaved, model_candidates, task_hash
    from tensorlang.lower.build import compile_module, cuda_source
    from tensorlang.parser.printer import format_stmt
    from tensorlang.space import sentence as S
    from tensorlang.space.space import Space
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    manifest = {"target": target, "made": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "versions": S.version_tokens(),
                "tasks": []}
    skipped = []
    generator = None
    if model is not None:
        from tensorlang.lm.generate import Generator
        generator = Generator(model)
        manifest["model"] = generator.name
    heldout = split.heldout_keys(split_path or split.DEFAULT_PATH)
    seen: set[str] = set()

    def size_mb() -> float:
        return sum(f.stat().st_size for f in out.iterdir()) / 2 ** 20

    def write_manifest() -> None:
        manifest["skipped"] = skipped
        (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")

    for task in interleaved(find_tasks(paths), paths):
        if task.key in heldout or task.key in seen:
            continue
        if max_tasks is not None and len(manifest["tasks"]) >= max_tasks:
            break
        if max_bundle_mb is not None and size_mb() >= max_bundle_mb:
            log(f"  the bundle holds {size_mb():.1f} MB: stopping at {len(manifest['tasks'])} tasks")
            break
        seen.add(task.key)
        doc = api.load_text(task.text, task.file)
        tgt = api.resolve_target(doc, target)
        op = doc.model.ops[task.op]
        if tgt is None or not tgt.is_gpu:
            continue
        io_bytes = sum(np.prod(t.shape, dtype=np.int64) * D.numpy_dtype(t.dtype).itemsize
                       for t in list(op.inputs) + list(op.outputs))
        if io_bytes > max_io_mb * 2 ** 20:
            skipped.append(f"{task.label}: {io_bytes / 2 ** 20:.1f} MB of inputs and outputs")
            continue
        space = Space(op, doc.primfunc(task.op), tgt)
        tkey = task_hash(space)
        inputs = interp.random_inputs(op, seed)
        try:
            refs = interp.reference_outputs(op, inputs)
        except interp.ReferenceUnavailable as e:  # a bundle's candidates are checked against these: none, no task
            skipped.append(f"{task.label}: {e}")
            continue
        data = f"t{len(manifest['tasks'])}.npz"
        seeded = seeded_inputs(op, inputs, seed)
        checked = {}
        for k, v in refs.items():
            checked.update(checked_outputs(k, np.asarray(v, dtype=D.numpy_dtype(op.tensors[k].dtype)), seed))
        np.savez_compressed(out / data, **{f"in:{k}": v for k, v in inputs.items() if k not in seeded}, **checked)
        tensors = {t.name: {"shape": list(t.shape), "dtype": str(D.numpy_dtype(t.dtype))}
                   for t in op.tensors.values()}
        entry = {"file": task.file, "op": task.op, "hash": tkey, "data": data, "flops": op.flops, "seed": seed,
                 "seeded": seeded,
                 "inputs": [t.name for t in op.inputs], "outputs": [t.name for t in op.outputs],
                 "tensors": tensors, "tolerance": {t.name: list(D.TOLERANCE.get(t.dtype, (0, 0)))
                                                   for t in op.outputs}, "candidates": [], "policies": {}}
        cands = candidates_for(space, tkey, per_task)[0]
        if generator is not None:
            try:
                cands += model_candidates(space, generator, model_samples, int(tkey, 16) % (1 << 31))
            except Exception as e:  # a task the model cannot decode keeps its other candidates
                log(f"  {task.label}: the model's candidates failed: {type(e).__name__}: {str(e)[:200]}")
        tried, built = set(), set()
        for policy, point in cands:
            key = hashlib.sha256(f"{tkey}|{target}|gpu|{point.sketch}|{point.decisions}".encode()).hexdigest()
            if key in tried:  # the same point under another policy: measured once, named under both
                if key in built:
                    entry["policies"].setdefault(policy, key)
                continue
            tried.add(key)
            try:
                lib = compile_module(point.mod, space.tvm_target)
                blob = cubin(cuda_source(lib), tgt.params.get("arch", "sm_90"))
                plan = launch_plan(point.mod, space.tvm_target)
                for launch in plan:
                    launch["args"] = [_tensor_of(a, tensors) for a in launch["args"]]
            except Exception as e:  # one candidate that cannot be bundled must not stop the others
                log(f"  {task.label}: {policy} candidate left out: {type(e).__name__}: {str(e)[:200]}")
                continue
            name = f"t{len(manifest['tasks'])}c{len(entry['candidates'])}.cubin"
            (out / name).write_bytes(blob)
            built.add(key)
            entry["policies"].setdefault(policy, key)  # {policy: its (first) candidate's key}
            entry["candidates"].append({
                "key": key, "policy": policy, "sketch": point.sketch,
                "decisions": [list(d) if isinstance(d, tuple) else d for d in point.decisions],
                "sentence": " ".join(S.encode(space, point)),
                "schedule": "\n".join(format_stmt(s) for s in point.stmts), "cubin": name, "launches": plan})
        manifest["tasks"].append(entry)
        write_manifest()
        log(f"  {task.label}: {len(entry['candidates'])} candidates")
    write_manifest()
    return {"tasks": len(manifest["tasks"]), "candidates": sum(len(t["candidates"]) for t in manifest["tasks"]),
            "skipped": len(skipped)}


def ingest(bundle: str | Path, results: str | Path, out_dir: str | Path) -> dict:
    """Append the runner's results to the measured dataset, as records of the same form as `collect`'s."""
    from tensorlang.data.dataset import Writer
    manifest = json.loads((Path(bundle) / "manifest.json").read_text())
    by_key = {c["key"]: (t, c) for t in manifest["tasks"] for c in t["candidates"]}
    writer = Writer(out_dir)
    written = 0
    for line in Path(results).read_text().splitlines():
        r = json.loads(line)
        if r["key"] not in by_key:
            continue
        t, c = by_key[r["key"]]
        written += writer.append({
            "key": r["key"], "task": {"file": t["file"], "op": t["op"], "hash": t["hash"]},
            "target": manifest["target"], "machine": r.get("machine", "gpu"), "policy": c["policy"],
            "sketch": c["sketch"], "decisions": c["decisions"], "sentence": c["sentence"],
            "versions": manifest["versions"], "schedule": c["schedule"], "status": r["status"],
            "message": r.get("message", "")[:300], "server": r.get("machine", "gpu"),
            "median_s": r.get("median_s"), "min_s": r.get("min_s"), "max_s": r.get("max_s"),
            "flops": t["flops"], "load": None, "time": r.get("time")})
    writer.close(compress_open=True)
    return {"written": written}
