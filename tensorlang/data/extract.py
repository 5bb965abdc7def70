"""Workload extraction: a real model -> one .tsched operator per unique subgraph, and a manifest.

    tensorlang extract --model resnet50 -o data/workloads/resnet50
    python -m tensorlang.data.extract --model gpt2 --small -o /tmp/gpt2

The route (../shared/notes/tvm-0.27.md, "Workload extraction that worked"):
`torch.export.export` -> `relax.frontend.torch.from_exported_program(ep, keep_params_as_input=True)`
-> `DecomposeOpsForInference` + `CanonicalizeBindings` -> `relax.get_pipeline("zero")` (legalization and
fusion) -> `meta_schedule.relax_integration.extract_tasks(mod, target)`. Each task's PrimFunc
(`task.dispatched[0]["main"]`) is translated into an `op` (tensorlang.data.translate), checked by the
language's checker, and compared numerically with the original PrimFunc (tensorlang.data.verify).

Output directory: `<task>.tsched` per translated task (a header comment, then the op in canonical
format) and `manifest.json`: the model, its config, the pipeline and versions, and one entry per
task -- its name, op, occurrence count (task weight), FLOPs, and either its file and the result of
the numerical check, or the reason it could not be translated. No task is dropped silently.

This module imports only the standard library at load time, so the CLI's start-up stays fast.
"""
from __future__ import annotations

import argparse
import gc
import json
import resource
import sys
import time
from pathlib import Path

TARGET = {"kind": "llvm", "mcpu": "sapphirerapids", "num-cores": 2}
PIPELINE = ("torch.export.export -> relax.frontend.torch.from_exported_program(keep_params_as_input=True) -> "
            "DecomposeOpsForInference -> CanonicalizeBindings -> relax.get_pipeline('zero') -> "
            "meta_schedule.relax_integration.extract_tasks")


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def relax_module(spec):
    """The fused, legalized Relax module of a model (weights are function parameters, not constants)."""
    import torch
    from tvm import relax
    from tvm.relax.frontend.torch import from_exported_program

    with torch.no_grad():
        ep = torch.export.export(spec.module, spec.inputs)
        mod = from_exported_program(ep, keep_params_as_input=True)
    del ep
    mod = relax.transform.DecomposeOpsForInference()(mod)
    mod = relax.transform.CanonicalizeBindings()(mod)
    return relax.get_pipeline("zero")(mod)


def extract_tasks(mod, target: dict = TARGET):
    import tvm
    from tvm.s_tir import meta_schedule as ms

    from tensorlang.space.metaschedule import _without_tensor_intrinsics
    with _without_tensor_intrinsics():
        return list(ms.relax_integration.extract_tasks(mod, tvm.target.Target(target)))


def tvm_flops(mod) -> int | None:
    try:
        from tvm.s_tir.analysis import estimate_tir_flops
        return int(estimate_tir_flops(mod))
    except Exception:
        return None


def render(op, header: list[str]) -> str:
    """Header comment lines, a blank line, then the op in the canonical format."""
    from tensorlang.parser import ast as A
    from tensorlang.parser import format_module
    body = format_module(A.Module((op,)))
    return "".join(f"# {line}\n" if line else "#\n" for line in header) + "\n" + body


def _round_trip_ok(text: str) -> str | None:
    """None if `tensorlang fmt --check` and `tensorlang check` would pass on `text`, else the problem."""
    from tensorlang import api
    from tensorlang.parser import format_module
    doc = api.load_text(text, "<translation>")
    errors = [d for d in api.check(doc, legality=False) if d.severity in ("error", "warning")]
    if errors:
        d = errors[0]
        return f"the translation does not pass `tensorlang check`: {d.code} {d.message}"
    if format_module(doc.ast) != text:
        return "the translation is not in canonical format"
    return None


def translate_task(task, model: str, index: int, total: int, config_line: str,
                   verify: bool = True) -> tuple[dict, str | None]:
    """One task -> (manifest entry, file text or None)."""
    from tensorlang import api
    from tensorlang.data.translate import Untranslatable, translate
    from tensorlang.data.verify import verify as check_numerically

    mod = task.dispatched[0]
    entry = {"task": str(task.task_name), "weight": int(task.weight), "flops": tvm_flops(mod)}
    t0 = time.time()
    try:
        tr = translate(mod["main"], str(task.task_name))
    except Untranslatable as e:
        entry.update(file=None, reason=f"untranslatable: {e}")
        return entry, None
    except Exception as e:  # a bug of the translator: still listed, with what went wrong
        entry.update(file=None, reason=f"translator error: {type(e).__name__}: {e}")
        return entry, None
    entry["op"] = tr.op.name
    header = [f"{model} ({config_line}): task {entry['task']} ({index} of {total})",
              f"occurrences: {entry['weight']} (MetaSchedule task weight); "
              f"FLOPs: {entry['flops']} per occurrence (TVM's estimate)"]
    header += [f"note: {n}" for n in tr.notes]
    text = render(tr.op, header)
    problem = _round_trip_ok(text)
    if problem:
        entry.update(file=None, reason=problem)
        return entry, None
    doc = api.load_text(text, f"{tr.op.name}.tsched")
    entry["op_flops"] = doc.model.ops[tr.op.name].flops
    entry["notes"] = tr.notes
    if verify:
        try:
            check = check_numerically(mod, tr, doc)
        except Exception as e:
            entry.update(file=None, reason=f"numerical check crashed: {type(e).__name__}: {e}")
            return entry, None
        entry["check"] = check.as_dict()
        if not check.ok:
            entry.update(file=None, reason=f"numerical check against the original PrimFunc failed: {check.message}")
            return entry, None
    entry["seconds"] = round(time.time() - t0, 2)
    return entry, text


def sample_indices(total: int, k: int) -> set[int]:
    """k task positions spread evenly over 0..total-1 (all of them when k >= total)."""
    if k >= total:
        return set(range(total))
    if k <= 0:
        return set()
    if k == 1:
        return {0}
    return {round(j * (total - 1) / (k - 1)) for j in range(k)}


def extract(model: str, out_dir: str | Path, batch: int = 1, seq: int | None = None, small: bool = False,
            image: int | None = None, verify: bool | int = True, log=None) -> dict:
    """Extract `model` into `out_dir`; returns the manifest (also written as manifest.json).

    `verify`: True compares every translation numerically with its original PrimFunc, False none, an
    integer k a sample of k tasks spread over the task list (a translation that is not compared has no
    "check" in its manifest entry)."""
    log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
    from tensorlang.data import models

    t_start = time.time()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    spec = models.build(model, batch=batch, seq=seq, small=small, image=image)
    config = spec.config
    log(f"{model}: {spec.description}; exporting")
    mod = relax_module(spec)
    del spec
    gc.collect()
    t_relax = time.time()
    log(f"{model}: relax pipeline done in {t_relax - t_start:.1f} s (peak RSS {peak_rss_mb():.0f} MB); extracting tasks")
    tasks = extract_tasks(mod)
    del mod
    gc.collect()
    total = len(tasks)
    log(f"{model}: {total} unique tasks, {sum(int(t.weight) for t in tasks)} calls")
    shape = "x".join(str(d) for d in config["input_shape"])
    config_line = f"{config['class']}{', small' if small else ''}, input {shape}, f32"
    checked = sample_indices(total, total if verify is True else 0 if verify is False else int(verify))
    entries, used_names = [], set()
    for n, task in enumerate(tasks, 1):
        entry, text = translate_task(task, model, n, total, config_line, (n - 1) in checked)
        if text is not None:
            stem = entry["op"]
            k = 1
            while stem in used_names:
                stem, k = f"{entry['op']}_{k}", k + 1
            used_names.add(stem)
            (out / f"{stem}.tsched").write_text(text)
            entry["file"] = f"{stem}.tsched"
            status = "ok" if "check" not in entry else f"ok (max rel err {entry['check']['max_rel_err']:.1e})"
        else:
            status = entry["reason"]
        log(f"  [{n}/{total}] {entry['task']} x{entry['weight']}: {status}")
        entries.append(entry)
    # Remove files of an earlier run that this run did not write (keeps the directory = the manifest).
    for old in out.glob("*.tsched"):
        if old.name not in {e["file"] for e in entries if e.get("file")}:
            old.unlink()
    translated = [e for e in entries if e.get("file")]
    manifest = {
        "model": model,
        "description": config_line,
        "config": config,
        "small": small,
        "target": TARGET,
        "pipeline": PIPELINE,
        "versions": _versions(),
        "unique_tasks": total,
        "calls": sum(e["weight"] for e in entries),
        "translated": len(translated),
        "untranslated": total - len(translated),
        "checked": sum(1 for e in entries if "check" in e),
        "seconds": round(time.time() - t_start, 1),
        "peak_rss_mb": round(peak_rss_mb()),
        "tasks": entries,
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    log(f"{model}: {len(translated)} of {total} tasks translated, in {manifest['seconds']} s, "
        f"peak RSS {manifest['peak_rss_mb']} MB -> {out}")
    return manifest


def _versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version
    out = {}
    for pkg in ("apache-tvm", "torch", "transformers"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            out[pkg] = None
    return out


# ------------------------------------------------------------------ command line
def add_arguments(p: argparse.ArgumentParser) -> None:
    from tensorlang.data.models import MODELS
    p.add_argument("--model", required=True, choices=MODELS)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--seq", type=int, help="sequence length of the text models (default 128; 16 with --small)")
    p.add_argument("--image", type=int, help="image size of the vision models (default 224; 32 with --small)")
    p.add_argument("--small", action="store_true", help="a tiny config of the model (fast; for tests)")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--no-verify", action="store_true",
                   help="skip the numerical comparison of each translation with its original PrimFunc")
    g.add_argument("--verify-sample", type=int, metavar="K",
                   help="compare only K translations, spread over the task list")
    p.add_argument("-o", "--output", required=True, help="output directory")


def cmd_extract(args) -> int:
    """0 on success (tasks that could not be translated are listed in the manifest with the reason)."""
    if args.batch < 1 or (args.seq is not None and args.seq < 1) or (args.image is not None and args.image < 8):
        print("tensorlang extract: --batch and --seq must be positive, --image at least 8", file=sys.stderr)
        return 2
    manifest = extract(args.model, args.output, batch=args.batch, seq=args.seq, small=args.small, image=args.image,
                       verify=False if args.no_verify else args.verify_sample if args.verify_sample is not None
                       else True)
    return 0 if manifest["unique_tasks"] else 1


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="tensorlang extract", description=__doc__.split("\n")[0])
    add_arguments(p)
    return cmd_extract(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
