"""Time a GPU bundle (gpu_bundle.py) on a machine with CuPy and no TVM. Standalone: NumPy and CuPy only.

    python tensorlang/data/gpu_runner.py BUNDLE OUT_DIR [--repeat 20] [--budget-s 480]

For each task: its inputs go to the GPU once; for each candidate, its cubin is loaded
(cupy.RawModule), its kernels are launched in the bundle's order with the bundle's grid and block
sizes on the task's buffers, the outputs are compared with the NumPy reference (the candidate is
`wrong` if not), then the whole launch sequence is timed with CUDA events: `repeat` rounds after a
warm-up, each round long enough (at least 1 ms of launches), median per call. A candidate that
fails to load or launch is recorded as `error`. Results go to OUT_DIR/results.jsonl, one line per
candidate, flushed as they come, so a run cut short by its time limit keeps what it measured; a rerun
skips the candidates OUT_DIR/results.jsonl holds already. A kernel that faults (an illegal address) leaves
the CUDA context unusable: the runner records it and exits with status 3, and the rerun goes on after it
(`until python gpu_runner.py B OUT; [ $? -ne 3 ]; do :; done`).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import sys
import time


def _machine() -> str:
    import cupy as cp
    props = cp.cuda.runtime.getDeviceProperties(0)
    name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
    return f"{name} sm_{props['major']}{props['minor']}"


def run(bundle: str, out_dir: str, repeat: int = 20, budget_s: float = 480.0) -> dict:
    import cupy as cp
    import numpy as np
    start = time.time()
    manifest = json.load(open(os.path.join(bundle, "manifest.json")))
    os.makedirs(out_dir, exist_ok=True)
    machine = _machine()
    done = {"ok": 0, "wrong": 0, "error": 0}
    path = os.path.join(out_dir, "results.jsonl")
    finished = {json.loads(line)["key"] for line in open(path)} if os.path.exists(path) else set()
    with open(path, "a") as results:
        for task in manifest["tasks"]:
            todo = [c for c in task["candidates"] if c["key"] not in finished]
            if not todo:
                continue
            try:
                data = np.load(os.path.join(bundle, task["data"]))
                buffers = {name: cp.asarray(np.ascontiguousarray(host.reshape(task["tensors"][name]["shape"])))
                           for name, host in _inputs(task, data).items()}
            except Exception as e:  # a task whose inputs cannot be made: each candidate says why
                for cand in todo:
                    results.write(json.dumps({"key": cand["key"], "machine": machine, "time": round(time.time(), 3),
                                              "status": "error", "message": f"inputs: {type(e).__name__}: {e}"[:300]})
                                  + "\n")
                    done["error"] += 1
                results.flush()
                continue
            for cand in todo:
                if time.time() - start > budget_s:
                    return {**done, "stopped": "budget"}
                rec = {"key": cand["key"], "machine": machine, "time": round(time.time(), 3)}
                try:
                    module = cp.RawModule(path=os.path.join(bundle, cand["cubin"]))
                    launches = [(_kernel(module, k), tuple(k["grid"]), tuple(k["block"]),
                                 tuple(buffers[a] for a in k["args"]), k.get("dynamic_shared", 0))
                                for k in cand["launches"]]

                    def call():
                        for fn, grid, block, args, shared in launches:
                            fn(grid, block, args, shared_mem=shared)

                    for name in task["outputs"]:
                        buffers[name].fill(np.nan if buffers[name].dtype.kind == "f" else 0x5A)
                    call()
                    cp.cuda.Device().synchronize()
                    wrong = []
                    for name in task["outputs"]:
                        got = cp.asnumpy(buffers[name]).astype(np.float64)
                        if f"idx:{name}" in data:  # a large output is checked at the bundle's positions
                            got = got.reshape(-1)[data[f"idx:{name}"]]
                        ref = data[f"ref:{name}"].astype(np.float64)
                        rtol, atol = task["tolerance"][name]
                        same = np.isnan(ref) & np.isnan(got)
                        err = np.where(same, 0.0, np.abs(got - ref))
                        if not np.all(err <= rtol * np.nanmax(np.abs(ref)) + atol):
                            wrong.append(name)
                    if wrong:
                        rec.update(status="wrong", message=f"mismatch against the NumPy reference: {wrong}")
                    else:
                        rec.update(status="ok", **_time(call, repeat))
                except Exception as e:  # a bad candidate: recorded, and the next one runs
                    rec.update(status="error", message=f"{type(e).__name__}: {str(e)[:300]}")
                done[rec["status"]] += 1
                results.write(json.dumps(rec) + "\n")
                results.flush()
                if rec["status"] == "error" and not _context_usable():
                    print(json.dumps({**done, "stopped": "a kernel fault left the CUDA context unusable"}))
                    sys.stdout.flush()
                    os._exit(3)
    return {**done, "seconds": round(time.time() - start, 1)}


def _kernel(module, launch: dict):
    fn = module.get_function(launch["kernel"])
    if launch.get("dynamic_shared", 0) > 48 * 1024:  # over 48 KB a kernel must ask for it (as TVM's runtime does)
        fn.max_dynamic_shared_size_bytes = launch["dynamic_shared"]
    return fn


def _inputs(task: dict, data) -> dict:
    """Every tensor's starting contents: the carried inputs, the seeded ones drawn here (in the bundle's
    order, checked against their checksums), zeros for outputs and intermediates."""
    import numpy as np
    rng = np.random.default_rng(task.get("seed", 0))
    out = {}
    for name in task["inputs"]:
        t = task["tensors"][name]
        drawn = rng.standard_normal(t["shape"])  # drawn for every input: the stream stays in step
        if name in task.get("seeded", {}):
            x = np.ascontiguousarray(drawn.astype(t["dtype"]))
            if hashlib.sha256(x.tobytes()).hexdigest() != task["seeded"][name]:
                raise ValueError(f"input {name}: this NumPy draws other numbers than the bundle's")
            out[name] = x
        else:
            out[name] = data[f"in:{name}"]
    for name, t in task["tensors"].items():
        if name not in out:
            out[name] = np.zeros(t["shape"], dtype=t["dtype"])
    return out


def _context_usable() -> bool:
    import cupy as cp
    try:
        cp.cuda.Device().synchronize()
        cp.zeros(1).sum().item()
        return True
    except Exception:
        return False


def _time(call, repeat: int) -> dict:
    import cupy as cp
    begin, end = cp.cuda.Event(), cp.cuda.Event()
    call()
    number = 1
    while True:  # grow the calls per round until a round takes at least 1 ms
        begin.record()
        for _ in range(number):
            call()
        end.record()
        end.synchronize()
        if cp.cuda.get_elapsed_time(begin, end) >= 1.0 or number >= 1 << 16:
            break
        number *= 4
    times = []
    for _ in range(repeat):
        begin.record()
        for _ in range(number):
            call()
        end.record()
        end.synchronize()
        times.append(cp.cuda.get_elapsed_time(begin, end) / 1e3 / number)
    return {"median_s": statistics.median(times), "min_s": min(times), "max_s": max(times), "number": number}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("bundle")
    ap.add_argument("out_dir")
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--budget-s", type=float, default=480.0, help="stop starting candidates after this long")
    args = ap.parse_args(argv)
    print(json.dumps(run(args.bundle, args.out_dir, args.repeat, args.budget_s)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
