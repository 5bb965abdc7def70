"""What the cost model sees of a schedule: MetaSchedule's per-store features of the scheduled module.

`PerStoreFeature` (TVM's C++ feature extractor, the one MetaSchedule's XGBoost model reads) gives one 164-wide
vector per buffer store of the module after the schedule and the postprocessors: loop structure, arithmetic
counts, vectorisation/unroll/parallel annotations, memory access patterns and reuse, arithmetic intensity.
They describe the loop nest, not the operator's name or the sentence, so what the model learns about one
operator can carry to another it has never seen. A schedule's vector here is the sum and the maximum of its
stores' vectors, and the number of stores: a fixed width however many stages the operator has.

`record_features` replays measured records (their sketch and decisions) into scheduled modules and
featurizes them, one worker process per core (a task's Space is built once for all its records).
"""
from __future__ import annotations

import collections
from typing import Callable, Iterable

import numpy as np

FEATURES_VERSION = "perstore164-summax:1"  # bump when what `features` returns changes
WIDTH = 2 * 164 + 1


def features(space, mod) -> np.ndarray:
    """The feature vector of one scheduled module of `space`'s operator (the module a replay returns)."""
    import tvm
    from tvm.s_tir import meta_schedule as ms
    cand = ms.MeasureCandidate(tvm.s_tir.Schedule(mod), ms.arg_info.ArgInfo.from_prim_func(mod["main"]))
    per_store = _extractor().extract_from(space.ctx, [cand])[0].numpy()
    if per_store.size == 0:  # no store at all (cannot happen for an operator that writes its output)
        per_store = np.zeros((1, 164), dtype=np.float32)
    return np.concatenate([per_store.sum(0), per_store.max(0), [len(per_store)]]).astype(np.float32)


def featurize(space, mods) -> np.ndarray:
    """The feature rows of several scheduled modules of `space`'s operator (what a cost model predicts on)."""
    return np.stack([features(space, mod) for mod in mods])


_EXTRACTOR = None


def _extractor():
    global _EXTRACTOR
    if _EXTRACTOR is None:
        from tvm.s_tir import meta_schedule as ms
        _EXTRACTOR = ms.feature_extractor.PerStoreFeature(extract_workload=False)
    return _EXTRACTOR


def _decisions(stored: list) -> list:
    return [tuple(d) if isinstance(d, list) else d for d in stored]


def _task_features(item) -> list[tuple[str, np.ndarray | None, str]]:
    """(key, vector or None, why not) for each record of one task: its Space built once, each record replayed."""
    (file, op, target), records = item
    from tensorlang import api
    from tensorlang.space.space import Space
    try:
        doc = api.load(file)
        space = Space(doc.model.ops[op], doc.primfunc(op), api.resolve_target(doc, target))
    except Exception as e:  # noqa: BLE001 -- a task that no longer loads: its records are listed, not fatal
        return [(r["key"], None, f"space of {file}:{op}: {e}") for r in records]
    out = []
    for r in records:
        try:
            point = space.replay(r["sketch"], lambda _, made, d=_decisions(r["decisions"]): d[len(made)],
                                 convert=False)
            out.append((r["key"], features(space, point.mod), ""))
        except Exception as e:  # noqa: BLE001 -- a record the space no longer accepts
            out.append((r["key"], None, str(e).splitlines()[0][:200] if str(e) else type(e).__name__))
    return out


def record_features(records: Iterable[dict], workers: int = 2, progress: Callable[[str], None] | None = None):
    """Features of measured records: ({key: vector}, [(key, why it has none)]). Records of one task are
    featurized together (one Space); tasks are spread over `workers` processes (spawned: TVM is not fork-safe)."""
    by_task: dict = collections.defaultdict(list)
    for r in records:
        by_task[(r["task"]["file"], r["task"]["op"], r["target"])].append(r)
    items = sorted(by_task.items(), key=lambda kv: -len(kv[1]))  # the largest first: the pool ends together
    found: dict[str, np.ndarray] = {}
    failed: list[tuple[str, str]] = []

    def take(results):
        for key, vec, why in results:
            if vec is None:
                failed.append((key, why))
            else:
                found[key] = vec

    if workers <= 1:
        for n, item in enumerate(items, 1):
            take(_task_features(item))
            if progress:
                progress(f"{n}/{len(items)} tasks, {len(found)} records")
        return found, failed
    from multiprocessing import get_context
    with get_context("spawn").Pool(workers) as pool:
        for n, results in enumerate(pool.imap_unordered(_task_features, items), 1):
            take(results)
            if progress and (n % 10 == 0 or n == len(items)):
                progress(f"{n}/{len(items)} tasks, {len(found)} records featurized, {len(failed)} refused")
    return found, failed
