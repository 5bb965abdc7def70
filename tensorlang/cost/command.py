"""`tensorlang cost-model`: train the cost model (cost/model.py) on the measured corpus.

    tensorlang cost-model [--measured DIR ...] [--cache .cache/cost-features.npz] [-o tensorlang/cost/default]

Every correct CPU record of a training task is replayed and featurized (~5 min for 22,000 records on 2
cores; the features are cached by record key, so a rerun after `collect` featurizes only the new records),
then XGBoost is fitted (~30 s). The validation tasks' records (lm/data.is_validation) are kept out and the
card reports how well the model picks within them; the benchmark's held-out tasks are refused by key as in
`train`. Holds the measurement lock throughout: nothing is timed beside it.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

DEFAULT_CACHE = ".cache/cost-features.npz"


def add_arguments(p) -> None:
    p.add_argument("--measured", action="append", help="measured dataset dirs (default data/measured/llvm, cpu)")
    p.add_argument("--cache", default=DEFAULT_CACHE, help="feature cache (record key -> vector)")
    p.add_argument("--rounds", type=int, default=None, help="boosting rounds (default 300)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workers", type=int, default=2, help="featurizing processes")
    p.add_argument("-o", "--output", default=None, help="model directory (default: the shipped tensorlang/cost/default)")


def load_cache(path: Path) -> dict:
    import numpy as np

    from tensorlang.cost.features import FEATURES_VERSION
    if not path.exists():
        return {}
    z = np.load(path)
    if str(z["version"]) != FEATURES_VERSION:
        return {}
    return dict(zip(z["keys"].tolist(), z["X"]))


def save_cache(path: Path, feats: dict) -> None:
    import numpy as np

    from tensorlang.cost.features import FEATURES_VERSION
    path.parent.mkdir(parents=True, exist_ok=True)
    keys = sorted(feats)
    tmp = path.with_suffix(".tmp.npz")
    np.savez_compressed(tmp, keys=np.array(keys), X=np.stack([feats[k] for k in keys]), version=FEATURES_VERSION)
    tmp.replace(path)  # never a half-written cache


def cpu_records(dirs) -> list[dict]:
    """Correct, timed records of CPU targets (the cost model's data)."""
    from tensorlang.data.dataset import read
    return [r for d in dirs for r in read(d)
            if r.get("status") == "ok" and r.get("median_s") and r.get("target") in ("llvm", "cpu")
            and "decisions" in r and "sketch" in r]


def main(args) -> int:
    from tensorlang.bench.lock import measure_lock
    from tensorlang.cost import model as C
    from tensorlang.cost.features import record_features
    from tensorlang.lm.data import DEFAULT_MEASURED, HeldOut, is_validation
    say = lambda m: print(f"cost-model: {m}", file=sys.stderr, flush=True)  # noqa: E731
    started = time.time()
    dirs = args.measured or list(DEFAULT_MEASURED)
    heldout = HeldOut.load()
    records = [r for r in cpu_records(dirs) if r["task"] not in heldout]
    train = [r for r in records if not is_validation(r["task"]["hash"])]
    validation = [r for r in records if is_validation(r["task"]["hash"])]
    say(f"{len(train)} training records, {len(validation)} validation records ({', '.join(dirs)})")
    cache = Path(args.cache)
    with measure_lock() as held:
        if held.wait_s > 1:
            say(f"waited {held.wait_s:.0f} s for the measurement lock")
        feats = load_cache(cache)
        todo = [r for r in records if r["key"] not in feats]
        if todo:
            say(f"featurizing {len(todo)} records ({len(feats)} cached)")
            new, failed = record_features(todo, workers=args.workers, progress=say)
            feats.update(new)
            save_cache(cache, feats)
            for key, why in failed[:10]:
                say(f"not featurized: {key[:12]}: {why}")
            if failed:
                say(f"{len(failed)} records not featurized (listed above, first 10)")
        if not any(r["key"] in feats for r in train):
            say(f"error: no featurized record of a training task in {', '.join(dirs)}: nothing to train on")
            return 1
        model = C.train(train, feats, validation, seed=args.seed, rounds=args.rounds or C.ROUNDS)
    out = model.save(args.output or C.DEFAULT_DIR)
    v = model.card.get("validation", {})
    say(f"{model.card['records']} records of {model.card['tasks']} tasks, {time.time() - started:.0f} s -> {out}")
    if v.get("tasks"):
        say(f"validation ({v['tasks']} tasks): the top-predicted record runs at {v['picked_over_best']} of the "
            f"task's best (a random pick: {v['random_over_best']})")
    return 0
