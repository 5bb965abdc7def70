"""The held-out split, fixed before collecting: which tasks the model must never be trained on.

    tensorlang data split            # writes data/split.json from data/workloads and data/workloads-variants

A task (an operator, by its name-independent key `collect.op_hash`) is held out when it occurs in a
held-out model (EfficientNet-B0 and the LLaMA-7B layer, their shape variants included) and in none of
the training models the split was fixed against: the benchmark then asks a model for schedules of
operators it has never seen. A key that one of those training models shares is in distribution,
whatever else it occurs in. A training model added later (the TinyLlama and Qwen2 layers, RegNetY) cannot move a
held-out task into training: its copies of held-out operators are held out with them. The model a workload file
belongs to is its directory's manifest's `model`.

Held-out tasks are measured into their own dataset (`collect` routes them to `data/heldout/<target>`),
never into the training data.
"""
from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

HELDOUT_MODELS = ("efficientnet-b0", "llama7b-layer")
FIXED_TRAINING_MODELS = ("resnet50", "mobilenetv2", "bert-base", "gpt2")  # the split's training models (2026-11-30)
WORKLOAD_ROOTS = ("data/workloads", "data/workloads-variants")
DEFAULT_PATH = Path("data/split.json")
RULE = ("a task is held out when a model of heldout_models (their shape variants included) contains its key and "
        "no model of fixed_training_models does; a key one of those shares is in distribution; a training model "
        "added later holds its copies of held-out keys out")


def _model_of(tsched: Path) -> str:
    manifest = tsched.parent / "manifest.json"
    if manifest.exists():
        return json.loads(manifest.read_text())["model"]
    return tsched.parent.name


def compute(roots=WORKLOAD_ROOTS) -> dict:
    """The split over every operator of every .tsched file under `roots`."""
    from tensorlang import api
    from tensorlang.data.collect import op_hash
    models: dict[str, set] = defaultdict(set)
    files: dict[str, list] = defaultdict(list)
    for root in map(Path, roots):
        for f in sorted(root.rglob("*.tsched")):
            doc = api.load(f)
            for op in doc.model.ops.values():
                key = op_hash(op)
                models[key].add(_model_of(f))
                files[key].append(f"{f}:{op.name}")
    held, fixed = set(HELDOUT_MODELS), set(FIXED_TRAINING_MODELS)
    heldout = {k: sorted(files[k]) for k in sorted(models) if models[k] & held and not models[k] & fixed}
    shared = {k: sorted(models[k]) for k in sorted(models) if models[k] & held and models[k] & fixed}
    return {"rule": RULE, "heldout_models": list(HELDOUT_MODELS), "fixed_training_models": list(FIXED_TRAINING_MODELS),
            "roots": list(roots),
            "tasks": len(models), "heldout": heldout, "shared_with_training": shared}


def write(path: str | Path = DEFAULT_PATH, roots=WORKLOAD_ROOTS) -> dict:
    split = compute(roots)
    Path(path).write_text(json.dumps(split, indent=1, sort_keys=True) + "\n")
    return split


def heldout_keys(path: str | Path = DEFAULT_PATH) -> frozenset[str]:
    """The held-out task keys ({} where no split file exists, e.g. outside a checkout)."""
    p = Path(path)
    return frozenset(json.loads(p.read_text())["heldout"]) if p.exists() else frozenset()


def move_heldout(measured: str | Path, heldout: str | Path, path: str | Path = DEFAULT_PATH) -> dict:
    """Move the records of held-out tasks out of a training dataset into the held-out one (records measured
    before the split existed). The training dataset is rewritten beside itself and swapped in."""
    import shutil
    from tensorlang.data.dataset import SHARD_RECORDS, Writer, read
    keys = heldout_keys(path)
    files = {f for fs in json.loads(Path(path).read_text())["heldout"].values() for f in fs}
    measured = Path(measured)
    rest = measured.with_name(measured.name + ".split")
    shutil.rmtree(rest, ignore_errors=True)
    moved = kept = 0
    with Writer(heldout) as out, Writer(rest, shard_records=SHARD_RECORDS) as train:
        for rec in read(measured):
            task = rec["task"]
            # by key, or by file for a record still keyed as an older sentence version made it
            if task["hash"] in keys or f"{task.get('file')}:{task.get('op')}" in files:
                out.append(rec)  # a record already there is not written twice
                moved += 1
            else:
                train.append(rec)
                kept += 1
        out.close(compress_open=True)
        train.close(compress_open=True)
    for done in measured.glob("*.done"):
        shutil.copy(done, rest / done.name)
    old = measured.with_name(measured.name + ".presplit")
    measured.rename(old)
    rest.rename(measured)
    shutil.rmtree(old)
    return {"moved": moved, "kept": kept}


def main_split(args) -> int:
    s = write(args.output)
    print(f"{args.output}: {len(s['heldout'])} of {s['tasks']} tasks held out "
          f"({', '.join(s['heldout_models'])}); {len(s['shared_with_training'])} of their tasks are shared with "
          f"training models and stay in distribution")
    for d in args.move or []:  # measured before the split: move their held-out records out
        print(f"{d}: {move_heldout(d, Path('data/heldout') / Path(d).name, args.output)}")
    return 0
