"""`tensorlang data verify`: replay stored schedules in full and report the ones the space refuses.

The pre-training corpus is sampled without the postprocessors or the conversion to statements (speed:
their limits are in the domains), and measured records were made by an older space, maybe: both
claims are checked here. For each task (one record key group: task hash and target) a seeded sample
of its records -- at least one per task, every task -- is replayed with its decisions through
`Space.replay(convert=True)`: every decision must be in its domain, the postprocessors must accept
the schedule, every output must be covered, and the trace must convert to .tsched statements.

A measured record is replayed from its stored sketch and decisions; a pre-training sentence from the
decisions its schedule part decodes to (its prompt names the host it was sampled on, which may not be
this one, so only the schedule part is read against this host's space).
"""
from __future__ import annotations

import random
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from tensorlang.data.dataset import read


@dataclass
class Report:
    tasks: int = 0
    replayed: int = 0
    rejected: list = field(default_factory=list)  # (file:op, target, sketch, reason)
    skipped: list = field(default_factory=list)  # tasks that could not be replayed at all, with the reason
    seconds: float = 0.0

    def as_dict(self) -> dict:
        return {"tasks": self.tasks, "replayed": self.replayed, "rejected": len(self.rejected),
                "skipped_tasks": len(self.skipped), "seconds": round(self.seconds, 1),
                "rejections": [list(r) for r in self.rejected], "skipped": [list(s) for s in self.skipped]}


class Rejected(Exception):
    pass


def decisions_of(space, rec: dict) -> tuple[int, tuple]:
    """(sketch, decisions) of a record: stored, or read off its sentence's schedule part."""
    if "sketch" in rec and "decisions" in rec:
        return rec["sketch"], tuple(tuple(d) if isinstance(d, list) else d for d in rec["decisions"])
    from tensorlang.space import sentence as S
    try:
        return S.decode_schedule(space, S.split(rec["sentence"].split())[1])
    except S.SentenceError as e:
        raise Rejected(str(e)) from None


def replay_in_full(space, sketch: int, decisions: tuple):
    """The point, replayed with the postprocessors and converted to statements; Rejected if it is not legal."""
    why = []  # TVM's trace replay re-raises what the decision provider raises as its own error

    def choose(point, made):
        if len(made) >= len(decisions):
            why.append(f"{len(decisions)} decisions stored, the sketch has more")
        elif decisions[len(made)] not in point.domain:
            why.append(f"decision {len(made)} ({decisions[len(made)]}) is outside its domain")
        if why:
            raise Rejected(why[0])
        return decisions[len(made)]
    try:
        point = space.replay(sketch, choose, convert=True)
    except Exception as e:  # Infeasible (postprocessors, coverage), a conversion error, or TVM's
        raise Rejected(why[0] if why else f"{type(e).__name__}: {e}") from None
    if len(point.decisions) != len(decisions):
        raise Rejected(f"{len(decisions)} decisions stored, the sketch has {len(point.decisions)}")
    if not point.stmts:
        raise Rejected("the trace converted to no statements")
    return point


def verify(dirs: list[str | Path], per_task: int = 1, seed: int = 0, log=print) -> Report:
    from tensorlang import api
    from tensorlang.space.space import Space
    start = time.time()
    groups: dict = defaultdict(list)
    for d in dirs:
        for rec in read(d):
            groups[(rec["task"]["hash"], rec["target"])].append(rec)
    rep = Report(tasks=len(groups))
    rng = random.Random(seed)
    for n, ((tkey, target), recs) in enumerate(sorted(groups.items())):
        sample = rng.sample(recs, min(per_task, len(recs)))
        task = sample[0]["task"]
        label = f"{task['file']}:{task['op']}"
        try:
            doc = api.load(task["file"])
            tgt = api.resolve_target(doc, target)
            space = Space(doc.model.ops[task["op"]], doc.primfunc(task["op"]), tgt)
        except Exception as e:  # a workload file moved or no longer checks: say so, go on
            rep.skipped.append((label, target, f"{type(e).__name__}: {str(e)[:200]}"))
            continue
        for rec in sample:
            try:
                sketch, decisions = decisions_of(space, rec)
                replay_in_full(space, sketch, decisions)
            except Rejected as e:
                rep.rejected.append((label, target, rec.get("sketch"), str(e)[:300]))
            rep.replayed += 1
        if (n + 1) % 25 == 0:
            log(f"  [{n + 1}/{len(groups)}] {rep.replayed} replayed, {len(rep.rejected)} rejected, "
                f"{time.time() - start:.0f} s")
    rep.seconds = time.time() - start
    return rep


def main_verify(args) -> int:
    import json
    import sys
    dirs = args.dirs or sorted(str(p) for root in ("data/measured", "data/heldout", "data/pretrain") for p in Path(root).glob("*")
                               if p.is_dir())
    rep = verify(dirs, per_task=args.per_task, seed=args.seed, log=lambda m: print(m, file=sys.stderr, flush=True))
    out = rep.as_dict() | {"dirs": dirs, "per_task": args.per_task}
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")
    print(f"data verify: {rep.tasks} tasks, {rep.replayed} schedules replayed in full, {len(rep.rejected)} rejected, "
          f"{len(rep.skipped)} tasks skipped ({rep.seconds:.0f} s)")
    for label, target, sketch, why in rep.rejected[:20]:
        print(f"  rejected: {label} on {target}, sketch {sketch}: {why}")
    for label, target, why in rep.skipped[:20]:
        print(f"  skipped: {label} on {target}: {why}")
    return 1 if rep.rejected else 0
