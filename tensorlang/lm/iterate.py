"""`tensorlang train --iterate R`: rounds of generate -> measure -> fine-tune, near the good schedules.

    tensorlang train --iterate 2 --init runs/r2/finetune -o runs/r2/iterate --collect-minutes 20 --minutes 8 \
        [--best-only --best-top 4 --epochs 3 --lr 3e-4]

Per round r (1..R), starting from the model `--init`:
1. collect: the current model's `--samples` distinct candidates per training task (its one-pass one first), measured
   with the bench harness into the measured dataset (data/measured/llvm by default), the tasks with the
   fewest records on this machine first (so that a budgeted round moves on to the tasks the last ones did
   not reach). Held-out tasks are left out altogether; records already there are skipped by key.
2. fine-tune the current model on the measured records, as `--stage finetune` with the same options would
   (quality-conditioned on every correct record; with `--best-only --best-top K`, the shipped recipe, on the
   K fastest of each task, which the round's candidates join where they are among them) -> OUT/round-<r>, the
   next round's model.
3. log the round: the validation loss, and how good the round's measured candidates were -- the geometric
   mean over tasks of (the one-pass candidate's latency / best known latency for the task before the round;
   `greedy_over_best_known`, named when the one pass was always greedy) and the same for the best of the
   round's candidates. OUT/iterate.json holds every round; a round whose model exists is
   not run again.
"""
from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path

DEFAULT_TASKS = ("data/workloads", "data/workloads-variants", "examples")


def _geomean(xs: list[float]) -> float | None:
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else None


def round_quality(records: list[dict], model_name: str, best_before: dict[str, float]) -> dict:
    """How the model's measured candidates compare with the best known before the round, per task."""
    greedy, best_of = {}, {}
    for r in records:
        if r.get("status") != "ok" or not r.get("median_s") or not str(r.get("policy", "")).startswith(f"tlm:{model_name}"):
            continue
        k = r["task"]["hash"]
        if k not in best_before:
            continue
        ratio = r["median_s"] / best_before[k]
        if r["policy"] == f"tlm:{model_name}":
            greedy[k] = ratio
        best_of[k] = min(ratio, best_of.get(k, ratio))
    return {"tasks": len(best_of), "greedy_over_best_known": _round(_geomean(list(greedy.values()))),
            "best_of_samples_over_best_known": _round(_geomean(list(best_of.values()))),
            "tasks_improved": sum(v < 1.0 for v in best_of.values())}


def _round(x):
    return None if x is None else round(x, 4)


def iterate(rounds: int, init: str | Path, out: str | Path, *, tasks=DEFAULT_TASKS, target: str = "llvm",
            measured_out: str | Path = "data/measured/llvm", samples: int = 8, collect_minutes: float | None = None,
            minutes: float | None = None, epochs: float = 2.0, seed: int = 0, measured_dirs=None,
            log=print, **train_options) -> list[dict]:
    """Run the rounds not yet done; returns every round's entry (also in OUT/iterate.json).
    `train_options`: passed on to each round's `train("finetune", ...)` (batch size, split, pretrain dirs)."""
    from tensorlang.data.collect import best_latencies, collect, host_record
    from tensorlang.data.dataset import read
    from tensorlang.lm import data as D
    from tensorlang.lm import model as M
    from tensorlang.lm.train import train
    from tensorlang.machine import host
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    log_path = out / "iterate.json"
    history = json.loads(log_path.read_text()) if log_path.exists() else []
    current = Path(init)
    machine = host_record(host())["id"]
    for r in range(1, rounds + 1):
        here = out / f"round-{r}"
        if (here / "model.safetensors").exists() and any(h["round"] == r for h in history):
            log(f"iterate: round {r} done before ({here}); next", file=sys.stderr)
            current = here
            continue
        name = M.version(M.read_card(current))
        log(f"iterate: round {r}/{rounds}: {samples} candidates per training task from {name}", file=sys.stderr)
        best_before = best_latencies([measured_out], machine)
        t0 = time.time()
        summary = collect(list(tasks), target, measured_out, trials=0, budget_min=collect_minutes, model=current,
                          model_samples=samples, skip_heldout=True, order="fewest-records",
                          log=lambda m: log(m, file=sys.stderr))
        collect_s = time.time() - t0
        quality = round_quality(list(read(measured_out)), name, best_before)
        entry = train("finetune", here, init=current, minutes=minutes, epochs=epochs, seed=seed,
                      measured_dirs=measured_dirs or D.DEFAULT_MEASURED, log=log, **train_options)
        history = [h for h in history if h["round"] != r] + [{
            "round": r, "model": name, "output": str(here), "collect": summary, "collect_seconds": round(collect_s, 1),
            "candidates": quality, "validation_loss": entry["validation_loss"], "records": entry["records"],
            "train_tasks": entry["train_tasks"], "host": host().name}]
        log_path.write_text(json.dumps(history, indent=1) + "\n")
        log(f"iterate: round {r}: {summary['written']} records; candidates over best known (geomean) greedy "
            f"{quality['greedy_over_best_known']}, best of {samples} {quality['best_of_samples_over_best_known']} "
            f"on {quality['tasks']} tasks ({quality['tasks_improved']} improved); validation loss "
            f"{entry['validation_loss']}", file=sys.stderr)
        current = here
    return history
