"""Model sizes side by side, trained with one recipe on a lent GPU: the size sweep the CPU cannot afford.

    python benchmarks/gpu_sweep.py --sizes 4x256 6x384 4x256/all 8x512 --out sweep --deadline-s 330  # on the GPU
    python benchmarks/gpu_sweep.py --report sweep/sweep.json                                    # here: the table

Each size is trained from scratch with the shipped checkpoint's recipe (its model card): pre-training on
7 M tokens of the sampled sentences (batch 16, lr 1e-3, one epoch), then fine-tuning on the 4 fastest
distinct schedules per training task and machine (`--best-only --best-top 4`, 8 epochs, lr 5e-4) -- by
`tensorlang.lm.train.train`, the code `tensorlang train` runs on a CPU. `SIZE/all` pre-trains on the whole
sampled corpus instead (~30 M tokens: what the CPU's 7 M-token cap leaves out). What is compared: the validation
loss of each stage (validation tasks are kept out of both stages; the held-out tasks never reach
fine-tuning), tokens/s, parameters. A loss is not a schedule's speed: the sizes worth it come back as
checkpoints (benchmarks/gpu_lease.sh's KEEP) and are measured on a CPU with `benchmarks/compare_models.py`.

The GPU machine has PyTorch and transformers but no TVM: the corpora are read from the committed data,
tokenised there (nothing in training needs TVM), and each size's corpus build is shared (memoised) by the
others. Results are written after every stage, so a run stopped by its deadline keeps what it finished.
"""
from __future__ import annotations

import argparse
import functools
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

RECIPE = {"pretrain": {"max_tokens": 7_000_000, "epochs": 1.0, "lr": 1e-3, "batch_size": 16},
          "finetune": {"best_only": True, "best_top": 4, "epochs": 8.0, "lr": 5e-4, "batch_size": 16}}


def _memoise_corpora() -> None:
    """One corpus build for every size: the records and the tokenised corpora do not depend on the size."""
    from tensorlang.lm import data as D
    for name in ("pretrain_records", "measured_records"):
        f = getattr(D, name)
        setattr(D, name, functools.lru_cache(maxsize=4)(lambda dirs=None, f=f: f(dirs) if dirs else f()))
    build = D.build
    cache: dict = {}

    def built(records, quality, heldout, **kw):
        key = (id(records), quality, tuple(sorted(kw.items())))
        if key not in cache:
            cache[key] = build(records, quality, heldout, **kw)
        return cache[key]
    D.build = built


def _stage_figures(entry: dict) -> dict:
    keep = ("steps", "tokens_seen", "train_seconds", "tokens_per_s", "train_loss", "validation_loss",
            "validation_loss_pretrain_sentences", "train_examples", "train_tasks", "validation_examples",
            "validation_tasks", "stopped_by_time", "device", "train_tokens")
    return {k: entry.get(k) for k in keep}


def variant(entry: str) -> tuple[str, int | None]:
    """'6x384' -> the recipe at that size; '4x256/all' or '4x256/20M' -> with that many pre-training tokens
    (all: the whole sampled corpus, which a GPU affords and the CPU's 7 M-token cap left out)."""
    size, _, tokens = entry.partition("/")
    if not tokens:
        return size, RECIPE["pretrain"]["max_tokens"]
    if tokens == "all":
        return size, None
    return size, int(float(tokens.rstrip("M")) * 1e6)


def sweep(sizes: list[str], out: Path, deadline_s: float, seed: int = 0,
          stages: tuple[str, ...] = ("pretrain", "finetune")) -> dict:
    import torch

    from tensorlang.lm import model as M
    from tensorlang.lm.train import train
    _memoise_corpora()
    t0 = time.time()
    out.mkdir(parents=True, exist_ok=True)
    result = {"command": " ".join([Path(sys.argv[0]).name] + sys.argv[1:]), "recipe": RECIPE, "seed": seed,
              "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
              "torch": torch.__version__, "transformers": __import__("transformers").__version__, "sizes": {}}

    def save() -> None:
        (out / "sweep.json").write_text(json.dumps(result, indent=1) + "\n")
    quiet = lambda *a, **k: print(*a, **{**k, "file": sys.stderr}, flush=True)  # noqa: E731
    for name in sizes:
        size, pretrain_tokens = variant(name)
        name = name.replace("/", "-")
        done = result["sizes"].setdefault(name, {"size": size, "pretrain_tokens_cap": pretrain_tokens})
        for stage in stages:
            left = deadline_s - (time.time() - t0)
            if left < 20:
                done[stage] = {"skipped": f"deadline ({deadline_s:.0f} s) reached"}
                save()
                break
            opts = dict(RECIPE[stage])
            epochs, lr, batch = opts.pop("epochs"), opts.pop("lr"), opts.pop("batch_size")
            if stage == "pretrain":
                opts["max_tokens"] = pretrain_tokens
            init = out / name / "pretrain" if stage == "finetune" else None
            entry = train(stage, out / name / stage, size=size, init=init, seed=seed, epochs=epochs, lr=lr,
                          batch_size=batch, minutes=left / 60, lock=False, save_steps=10 ** 9, log=quiet, **opts)
            done[stage] = _stage_figures(entry)
            done["parameters"] = M.read_card(out / name / stage)["parameters"]  # what save() counted
            save()
            if entry.get("stopped_by_time"):
                break
    result["seconds"] = round(time.time() - t0, 1)
    save()
    return result


def report(path: Path) -> str:
    r = json.loads(path.read_text())
    lines = [f"{r['device']} (torch {r['torch']}, transformers {r['transformers']}); recipe: the shipped card's",
             f"{'size':>9} {'params':>10} {'pre tokens':>11} {'pretrain val':>13} {'finetune val':>13} "
             f"{'tok/s pre':>10} {'tok/s ft':>9} {'seconds':>8}"]
    for size, d in r["sizes"].items():
        pre, ft = d.get("pretrain", {}), d.get("finetune", {})
        secs = (pre.get("train_seconds") or 0) + (ft.get("train_seconds") or 0)
        lines.append(f"{size:>9} {d.get('parameters', 0):>10,} {pre.get('tokens_seen') or 0:>11,} "
                     f"{pre.get('validation_loss') or '-':>13} "
                     f"{ft.get('validation_loss') or '-':>13} {pre.get('tokens_per_s') or '-':>10} "
                     f"{ft.get('tokens_per_s') or '-':>9} {secs:>8.0f}")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", nargs="+", default=["4x256", "6x384", "8x512"])
    ap.add_argument("--out", type=Path, default=Path("sweep"))
    ap.add_argument("--deadline-s", type=float, default=330.0, help="stop starting stages after this long")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--pretrain-tokens", type=int, default=RECIPE["pretrain"]["max_tokens"],
                    help="a smaller recipe, for a smoke run on a CPU")
    ap.add_argument("--finetune-epochs", type=float, default=RECIPE["finetune"]["epochs"])
    ap.add_argument("--stages", nargs="+", choices=("pretrain", "finetune"), default=["pretrain", "finetune"],
                    help="pretrain alone: a pre-trained model for a CPU to fine-tune")
    ap.add_argument("--report", type=Path, help="print the table of a sweep.json and stop")
    args = ap.parse_args()
    if args.report:
        print(report(args.report))
        return 0
    RECIPE["pretrain"]["max_tokens"], RECIPE["finetune"]["epochs"] = args.pretrain_tokens, args.finetune_epochs
    sweep(args.sizes, args.out, args.deadline_s, args.seed, tuple(args.stages))
    print(report(args.out / "sweep.json"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
