"""A learned cost model: XGBoost over a schedule's per-store features (cost/features.py), predicting how close
to the fastest known schedule of its task it runs -- so the model's K samples can be ranked without building
or timing any of them (MetaSchedule ranks its evolutionary candidates the same way).

    model = CostModel.load()                      # the shipped one (cost/default), or a directory
    quality = model.predict(X)                    # per row: predicted best-known latency / this latency, <= ~1
    i = choose(model.predict(np.stack(vecs)))     # which of a one-pass schedule and its samples to keep

The target of a record is its task's best measured latency on that machine over its own (1 = the best known,
0.1 = ten times slower), the same normalisation as MetaSchedule's throughput-over-best. A plain regression on
it: in a comparison on the validation tasks' records (top-predicted record over the task's best, geomean) XGBoost's
rank:pairwise objective picked about as well (0.73 against 0.72 over all records, 0.67 both among the model's own
samples) and rank:ndcg worse (0.66), so the simpler objective stays.
Trained on the training tasks only: the TLM's validation tasks (lm/data.is_validation) and the benchmark's
held-out tasks never reach it, so both stay honest places to measure it.
"""
from __future__ import annotations

import datetime as _dt
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from tensorlang.cost.features import FEATURES_VERSION

DEFAULT_DIR = Path(__file__).resolve().parent / "default"
BOOSTER_FILE = "cost_model.ubj"
CARD_FILE = "cost_card.json"

# The one-pass schedule is replaced by another candidate only when the model predicts it clearly faster: 0.1 (of
# the best-known throughput) above it. benchmarks/cost_ranking.py, 28 validation tasks, 16 samples and the other
# sketches' greedy schedules, all measured in one run: this rule 1.13x the one-pass schedule's throughput (8 wins,
# 4 losses), always taking the top-ranked candidate 1.14x (13 wins, 8 losses); two earlier runs: 1.11x (8/4)
# against 1.115x (13/8), and 1.17x (12/2) against 1.13x (14/8). As fast, with half the losses. These runs chose
# the setting, so the benchmark's held-out figure is the honest one.
MARGIN = 0.1
PARAMS = {"objective": "reg:squarederror", "max_depth": 8, "eta": 0.1, "subsample": 0.8, "colsample_bytree": 0.8}
ROUNDS = 300


@dataclass
class CostModel:
    booster: object
    card: dict = field(default_factory=dict)

    def predict(self, X) -> np.ndarray:
        import xgboost as xgb
        X = np.asarray(X, dtype=np.float32)
        X = X.reshape(-1, self.card.get("width", X.shape[-1]))
        return self.booster.predict(xgb.DMatrix(X))

    def rank(self, space, mods) -> np.ndarray:
        """The predicted quality of scheduled modules of `space`'s operator (featurized here)."""
        from tensorlang.cost.features import featurize
        return self.predict(featurize(space, mods))

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        self.booster.save_model(str(path / BOOSTER_FILE))
        (path / CARD_FILE).write_text(json.dumps(self.card, indent=1, sort_keys=True) + "\n")
        return path

    @staticmethod
    def load(path: str | Path | None = None) -> "CostModel":
        import xgboost as xgb
        path = Path(path or DEFAULT_DIR)
        if not (path / BOOSTER_FILE).exists():
            raise FileNotFoundError(f"no cost model at {path} ({BOOSTER_FILE})")
        card = json.loads((path / CARD_FILE).read_text()) if (path / CARD_FILE).exists() else {}
        if card.get("features") not in (None, FEATURES_VERSION):
            raise ValueError(f"cost model at {path} reads features {card['features']}, this code makes "
                             f"{FEATURES_VERSION}: train it again (tensorlang cost-model)")
        booster = xgb.Booster()
        booster.load_model(str(path / BOOSTER_FILE))
        booster.set_param({"nthread": 1})  # a handful of rows per call: threads cost more than they give
        return CostModel(booster, card)

    @property
    def name(self) -> str:
        return f"cost-{self.card.get('features', '?').split(':')[0]} {self.card.get('digest', '')[:8]}"


def choose(quality, margin: float = MARGIN) -> int:
    """Which candidate to keep, given the predicted quality of each (index 0: the one-pass schedule): the
    top-ranked one if it is predicted more than `margin` above the one-pass schedule, else the one-pass one.
    Ties go to the lowest index, so the choice is the same every time."""
    q = [float(x) for x in quality]
    top = max(range(len(q)), key=lambda i: (q[i], -i))
    return top if q[top] > q[0] + margin else 0


def targets(records: list[dict]) -> dict[str, float]:
    """key -> the task's best latency on the record's machine over the record's own (in (0, 1])."""
    best: dict = {}
    for r in records:
        k = (r["task"]["hash"], r.get("machine"))
        best[k] = min(best.get(k, math.inf), r["median_s"])
    return {r["key"]: best[(r["task"]["hash"], r.get("machine"))] / r["median_s"] for r in records}


def pick_quality(records: list[dict], quality: dict[str, float], predicted: dict[str, float]) -> dict:
    """How well predictions pick within each task: geomean over tasks (with >= 2 records) of the task's best
    latency over the top-predicted record's, beside the same for a uniformly random pick (its expectation)."""
    by: dict = {}
    for r in records:
        by.setdefault((r["task"]["hash"], r.get("machine")), []).append(r["key"])
    picked, rand = [], []
    for keys in by.values():
        if len(keys) < 2:
            continue
        top = max(keys, key=lambda k: predicted[k])
        picked.append(math.log(quality[top]))
        rand.append(sum(math.log(quality[k]) for k in keys) / len(keys))
    if not picked:
        return {"tasks": 0}
    return {"tasks": len(picked), "picked_over_best": round(math.exp(sum(picked) / len(picked)), 3),
            "random_over_best": round(math.exp(sum(rand) / len(rand)), 3)}


def train(records: list[dict], feats: dict[str, np.ndarray], validation: list[dict] = (), seed: int = 0,
          rounds: int = ROUNDS) -> CostModel:
    """Fit on `records` (those with features), report the pick quality on `validation` in the card."""
    import xgboost as xgb
    rows = [r for r in records if r["key"] in feats]
    y = targets(rows)
    X = np.stack([feats[r["key"]] for r in rows])
    booster = xgb.train(dict(PARAMS, nthread=2, seed=seed), xgb.DMatrix(X, label=np.array([y[r["key"]] for r in rows])),
                        num_boost_round=rounds)
    model = CostModel(booster)
    cpus: dict = {}
    for r in rows:
        cpu = (r.get("host") or {}).get("cpu", "?")
        cpus[cpu] = cpus.get(cpu, 0) + 1
    val = [r for r in validation if r["key"] in feats]
    card = {"features": FEATURES_VERSION, "width": int(X.shape[1]), "params": PARAMS, "rounds": rounds, "seed": seed,
            "records": len(rows), "tasks": len({r["task"]["hash"] for r in rows}), "cpus": cpus,
            "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")}
    if val:
        pred = dict(zip([r["key"] for r in val], model.predict(np.stack([feats[r["key"]] for r in val])).tolist()))
        card["validation"] = dict(pick_quality(val, targets(val), pred), records=len(val))
    card["digest"] = _digest(booster)
    model.card = card
    return model


def _digest(booster) -> str:
    import hashlib
    return hashlib.sha256(bytes(booster.save_raw("ubj"))).hexdigest()
