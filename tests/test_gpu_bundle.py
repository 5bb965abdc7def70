"""GPU measurement without TVM on the GPU machine: the bundle built here holds, per candidate, a cubin
compiled by nvcc and the launch plan TVM's host code would run; the runner needs only NumPy and CuPy.
(The runner itself needs a GPU: it runs on the lent H200, not in this suite.)"""
import json
import shutil
import subprocess
import sys

import numpy as np
import pytest

from tensorlang.data import dataset

from conftest import ROOT

pytestmark = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    out = tmp_path_factory.mktemp("bundle")
    r = subprocess.run([sys.executable, "-m", "tensorlang", "gpu-bundle", str(ROOT / "examples" / "matmul.tsched"),
                        str(ROOT / "examples" / "softmax.tsched"), "--target", "cuda", "--per-task", "2", "--model",
                        str(ROOT / "tensorlang" / "lm" / "checkpoints" / "default"), "-o", str(out)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    return out, json.loads((out / "manifest.json").read_text())


def test_bundle_holds_cubins_and_the_launch_plans_of_tvm(bundle):
    from tensorlang import api
    from tensorlang.lower.gpu import kernel_usage
    from tensorlang.space.space import Space
    out, manifest = bundle
    assert [t["op"] for t in manifest["tasks"]] == ["matmul", "softmax"]
    for task in manifest["tasks"]:
        assert task["candidates"][0]["policy"] == "roller"
        # the model's one-pass schedule: a candidate of its own, or the point of another policy, measured once
        (tlm,) = [p for p in task["policies"] if p.startswith("tlm:")]
        by_key = {c["key"]: c for c in task["candidates"]}
        assert task["policies"][tlm] in by_key and len(by_key) == len(task["candidates"])
        assert len(task["candidates"]) == 2 + (by_key[task["policies"][tlm]]["policy"] == tlm)
        data = np.load(out / task["data"])
        for name in task["outputs"]:
            assert np.isfinite(data[f"ref:{name}"]).all()
        doc = api.load(task["file"])
        space = Space(doc.model.ops[task["op"]], doc.primfunc(task["op"]), api.resolve_target(doc, "cuda"))
        for cand in task["candidates"]:
            blob = (out / cand["cubin"]).read_bytes()
            assert blob[:4] == b"\x7fELF"
            point = space.replay(cand["sketch"], lambda _, made, d=cand["decisions"]: (
                tuple(d[len(made)]) if isinstance(d[len(made)], list) else d[len(made)]))
            threads = kernel_usage(point.mod["main"])["threads"]
            for launch in cand["launches"]:
                assert launch["kernel"].encode() in blob  # the cubin defines the kernel the plan launches
                assert set(launch["args"]) <= set(task["tensors"])
                assert 1 <= np.prod(launch["block"]) <= threads
            assert max(np.prod(l["block"]) for l in cand["launches"]) == threads
    softmax = manifest["tasks"][1]["candidates"][0]
    # the reduction's intermediates travel between kernels: the runner allocates them from "tensors"
    assert len(softmax["launches"]) > 1 and {"M", "S"} <= {a for l in softmax["launches"] for a in l["args"]}


def test_runner_starts_from_the_inputs_the_references_were_computed_from(bundle):
    """Seeded inputs are drawn by the runner (checked by checksum), the rest carried; a large output is
    checked at seeded positions, whose carried values are the NumPy reference's there."""
    from tensorlang import api, interp
    out, manifest = bundle
    for task in manifest["tasks"]:
        op = api.load(task["file"]).model.ops[task["op"]]
        data = np.load(out / task["data"])
        made = _runner()._inputs(task, data)
        inputs = interp.random_inputs(op, task["seed"])
        assert task["seeded"] and set(task["seeded"]) <= set(inputs)
        for name, x in inputs.items():
            assert made[name].dtype == x.dtype and np.array_equal(made[name], x)
            assert (f"in:{name}" in data) == (name not in task["seeded"])
        assert set(made) == set(task["tensors"])  # outputs and intermediates too, as zeros
        refs = interp.reference_outputs(op, inputs)
        for name in task["outputs"]:
            want = np.asarray(refs[name], dtype=data[f"ref:{name}"].dtype).reshape(-1)
            idx = data[f"idx:{name}"] if f"idx:{name}" in data else np.arange(want.size)
            assert want.size > 16384 or f"idx:{name}" not in data
            np.testing.assert_array_equal(data[f"ref:{name}"].reshape(-1), want[idx])
    tampered = dict(manifest["tasks"][0], seeded={k: "0" * 64 for k in manifest["tasks"][0]["seeded"]})
    with pytest.raises(ValueError, match="other numbers"):
        _runner()._inputs(tampered, np.load(out / tampered["data"]))


def _runner():
    import importlib.util
    spec = importlib.util.spec_from_file_location("gpu_runner", ROOT / "tensorlang" / "data" / "gpu_runner.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_runner_results_become_measured_records(bundle, tmp_path):
    out, manifest = bundle
    cands = [c for t in manifest["tasks"] for c in t["candidates"]]
    results = tmp_path / "results.jsonl"
    results.write_text(json.dumps({"key": cands[0]["key"], "machine": "NVIDIA H200 sm_90", "status": "ok",
                                   "median_s": 1e-5, "min_s": 9e-6, "max_s": 2e-5, "time": 0}) + "\n" +
                       json.dumps({"key": cands[1]["key"], "machine": "NVIDIA H200 sm_90", "status": "wrong",
                                   "message": "mismatch", "time": 0}) + "\n")
    r = subprocess.run([sys.executable, "-m", "tensorlang", "gpu-ingest", str(out), str(results), "-o",
                        str(tmp_path / "cuda")], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    records = list(dataset.read(tmp_path / "cuda"))
    assert [(x["key"], x["status"]) for x in records] == [(cands[0]["key"], "ok"), (cands[1]["key"], "wrong")]
    assert records[0]["sentence"] == cands[0]["sentence"] and records[0]["schedule"] == cands[0]["schedule"]


def test_runner_needs_only_numpy_and_cupy():
    src = (ROOT / "tensorlang" / "data" / "gpu_runner.py").read_text()
    imports = {line.split()[1].split(".")[0] for line in src.splitlines()
               if line.strip().startswith(("import ", "from ")) and not line.strip().startswith("from __future__")}
    assert imports <= {"argparse", "hashlib", "json", "os", "statistics", "sys", "time", "numpy", "cupy"}
    r = subprocess.run([sys.executable, str(ROOT / "tensorlang" / "data" / "gpu_runner.py"), "--help"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "BUNDLE" in r.stdout.upper()
