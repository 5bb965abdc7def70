"""Checkpoints side by side: each model's one-pass (constrained) schedule of every task of a set, and
roller's, measured together in one harness run -- the figure that decides which checkpoint ships.

    .venv/bin/python benchmarks/compare_models.py CKPT [CKPT ...] [--set heldout|indist|train] [--repeat 5]
                                                 [--beams 1,4] [--guard on,off] [--vector-tile on,off] ...
                                                 [--only-differing] [--json benchmarks/results/compare_models.json]

The tasks and the measurement are benchmarks/tlm.py's (phase 1 per policy, then every candidate of the set in
one interleaved run under the measurement lock), so a ratio between two checkpoints compares figures of one
run on one host. Schedules are generated afresh (a temporary cache): a checkpoint directory can be rewritten
between runs. Prints each task's latencies and, per checkpoint, the geomean throughput over roller and over
every other checkpoint, and its loss on the validation tasks' best records (the decision tokens of the
fastest measured schedule of every task kept out of training -- the same examples for every model; a
quality-conditioned one gets its generation token in front): a cheap figure beside the measured one.
Choose on `--set indist` (validation tasks); the held-out set is the benchmark's, not a selection set.
`--beams 1,4` decodes with each model both ways (greedy, and beam search with 4 beams): `NAME@greedy`,
`NAME@beams4`, the plain `NAME` for the checkpoint's own decoding (its generation_config.json's num_beams).
Each decoding rule likewise (lm/decoding_rules.py: `--guard`, `--vector-tile`, `--register-tile`,
`--single-accumulator`, `--parallel-tile`, `--partial-sums`): `--register-tile on,off` decodes with and without
the register tile within the register file (space/register_tile.py), named `NAME@registers` and
`NAME@noregisters` where that differs from the checkpoint's own (the rule's tags). `--set train`: the
training tasks (what fine-tuning learned from: where a decoding rule that overrides the model can only tie or
lose). `--only-differing`: after phase 1, measure only the tasks whose schedules differ between the models (the
rest would tie but for noise; the report counts both).
`--keep-schedules FILE` keeps phase 1's schedules; `--schedules-from FILE` re-times the models' schedules such a
file holds beside this run's, without their checkpoints: how a checkpoint of an earlier sentence version, which
this code no longer decodes with, is compared with a new one in one run (its schedules written by the code of its
version, e.g. a `git worktree` of the commit before the bump).
Writes the rows and summary as JSON.
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import tlm as bench  # noqa: E402  (benchmarks/tlm.py: tasks, phase 1, phase 2, summary)
from tensorlang.lm.decoding_rules import RULES  # noqa: E402


def validation_loss(model_dir) -> dict:
    """Mean loss over the decision tokens of the validation tasks' best records (lm.data.is_validation)."""
    import torch

    from tensorlang.lm import data as D
    from tensorlang.lm import model as M
    model, card = M.load(model_dir)
    records = [dict(r, quality="Q0") for r in D.best_records(D.measured_records())]
    val = D.build(records, bool(card.get("generation_quality_token")), D.HeldOut.load(), validation_cap=None).validation
    total = tokens = 0
    with torch.inference_mode():
        for i in range(0, len(val), 16):
            b = D.collate(val[i:i + 16])
            out = model(input_ids=b["input_ids"], attention_mask=b["attention_mask"], labels=b["labels"])
            n = int((b["labels"][:, 1:] != -100).sum())
            total, tokens = total + float(out.loss) * n, tokens + n
    return {"loss": round(total / tokens, 4), "records": len(val), "decision_tokens": tokens}


class Beams:
    """A Generator decoding with `num_beams` beams, 1 = greedy, and its decoding switches (SWITCHES: the
    decoding rules of lm/decoding_rules.py) on or off (phase 1 calls `.generate(space)`)."""

    def __init__(self, gen, num_beams: int, switches: dict):
        self.gen, self.num_beams, self.switches = gen, num_beams, switches

    def generate(self, space):
        for k, v in self.switches.items():  # one Generator per checkpoint: its decoding switches are set per call
            setattr(self.gen, k, v)
        return self.gen.generate(space, num_beams=self.num_beams)


# decoding switches: Generator attribute -> (option, tag when on, tag when off)
SWITCHES = {r.attr: (r.attr, *r.tags) for r in RULES}


def schedules_differ(task, models: list[str], cache) -> bool:
    """Whether `models` wrote different one-pass schedules for some operator of a task (an error counts as one)."""
    from tensorlang import api
    file = task[0]
    for name in api.load(ROOT / file).model.ops:
        texts = set()
        for m in models:
            e = cache.get(f"{file}:{name}|{m}") or {}
            texts.add(e.get("schedule_text", e.get("error")))
        if len(texts) > 1:
            return True
    return False


def cached_policies(data: dict, tasks) -> dict:
    """{policy: {`file:op|policy`: entry}} of the models' schedules in a kept phase-1 file (roller's is this
    run's own), for every operator of `tasks`; a model missing an operator of them is refused."""
    from tensorlang import api
    by: dict = {}
    for key, entry in data.items():
        where, _, pol = key.rpartition("|")
        if where and "=" in pol:  # a model's name is DIR=NAME VERSION
            by.setdefault(pol, {})[key] = entry
    for pol, entries in by.items():
        for file, _ in tasks:
            for name in api.load(ROOT / file).model.ops:
                if f"{file}:{name}|{pol}" not in entries:
                    raise SystemExit(f"compare: {pol} has no kept schedule of {file}:{name} (kept for other tasks?)")
    return by


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("models", nargs="*", help="checkpoint directories")
    ap.add_argument("--set", default="heldout", choices=("heldout", "indist", "train"),
                    help="heldout, indist (validation tasks: kept out of training) or train (training tasks)")
    ap.add_argument("--indist", type=int, default=10, help="in-distribution tasks (--set indist or train)")
    ap.add_argument("--min-flops", type=float, default=1e6,
                    help="--set indist or train: only operators of more FLOPs (0: all, down to a squeeze-excite "
                         "conv's few thousand)")
    ap.add_argument("--only-differing", action="store_true",
                    help="measure only the tasks whose one-pass schedules differ between the models (the others "
                         "would tie but for noise); the report counts both")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--beams", default=None,
                    help="comma-separated beam counts to decode with (1: greedy; default: each checkpoint's own)")
    for r in RULES:
        ap.add_argument(f"--{r.attr.replace('_', '-')}", default=None,
                        help=f"on,off: decode with the {r.words} both ways (space/{r.module}.py; default: each "
                             "checkpoint's own)")
    ap.add_argument("--keep-schedules", metavar="FILE", help="write phase 1's schedules to FILE (default: a "
                    "temporary file), for a later run's --schedules-from")
    ap.add_argument("--schedules-from", metavar="FILE", action="append", default=[],
                    help="re-time the models' schedules an earlier run kept (--keep-schedules) beside this run's; "
                         "their tasks must be this run's (repeatable)")
    ap.add_argument("--limit", type=int, help="only the first N tasks (a quick check)")
    ap.add_argument("--json", default=str(bench.RESULTS / "compare_models.json"))
    args = ap.parse_args(argv)
    os.chdir(ROOT)  # the datasets' and the split's default paths are the repository's
    say = lambda m: print(f"compare: {m}", file=sys.stderr, flush=True)  # noqa: E731
    started = time.time()

    from tensorlang.lm.generate import Generator

    gens, dirs = {}, {}
    for d in args.models:
        g = Generator(d)
        # the checkpoint's own decoding (generation_config.json) keeps the plain name
        own = {k: getattr(g, k) for k in SWITCHES}
        ways = {k: [v == "on" for v in getattr(args, opt).split(",")] if getattr(args, opt) else [own[k]]
                for k, (opt, _, _) in SWITCHES.items()}
        for nb in ([int(b) for b in args.beams.split(",")] if args.beams else [g.num_beams]):
            for values in itertools.product(*ways.values()):
                switches = dict(zip(ways, values))
                tag = "" if nb == g.num_beams else "@greedy" if nb == 1 else f"@beams{nb}"
                tag += "".join("" if v == own[k] else SWITCHES[k][1] if v else SWITCHES[k][2]
                               for k, v in switches.items())
                name = f"{Path(d).name}{tag}={g.name}"
                if name in gens:
                    raise SystemExit(f"compare: {d} is given twice")
                gens[name], dirs[name] = Beams(g, nb, switches), d
    tasks = (bench.HELDOUT if args.set == "heldout"
             else bench.indist_tasks(args.indist, validation=args.set == "indist", min_flops=args.min_flops))[:args.limit]
    kept = {}  # policy -> {key: entry}: schedules of earlier runs, re-timed
    for f in args.schedules_from:
        kept_cache = bench.Cache(Path(f))  # refuses another machine's file
        kept_cache.data.pop("host|")
        for pol, entries in cached_policies(kept_cache.data, tasks).items():
            if pol in gens or pol in kept:
                raise SystemExit(f"compare: {pol} is given twice")
            kept[pol] = entries
    if not gens and not kept:
        raise SystemExit("compare: no model (a checkpoint directory or --schedules-from)")
    policies = list(gens) + list(kept) + ["roller"]
    losses = {d: validation_loss(d) for d in args.models}
    val = {n: losses[d] for n, d in dirs.items()} | {p: None for p in kept}
    generated = len(tasks)
    if args.keep_schedules:
        Path(args.keep_schedules).unlink(missing_ok=True)  # this run's schedules only: a checkpoint can change
    with tempfile.TemporaryDirectory() as tmp:
        cache = bench.Cache(Path(args.keep_schedules or Path(tmp) / "schedules.json"))
        for entries in kept.values():
            for k, v in entries.items():
                cache.data[k] = v
        say(f"{len(tasks)} {args.set} tasks, {len(gens)} models: phase 1 (one-pass schedules)")
        bench.generate_all(tasks, policies, cache, gens, say)
        if args.only_differing:
            tasks = [t for t in tasks if schedules_differ(t, list(gens), cache)]
            say(f"{len(tasks)} of {generated} tasks have schedules that differ between the models: measuring those")
        rows, results = bench.measure_set(tasks, policies, cache, args.repeat, say)
    from tensorlang.bench.command import conditions
    summary = bench.summarize(rows, policies)
    report = {**bench.run_stamp("compare_models.py", argv, started), "set": args.set, "tasks": len(tasks),
              "tasks_generated": generated, "policies": policies,
              "models": {n: str(d) for n, d in dirs.items()} | {p: "schedules re-timed from " + ", ".join(
                  args.schedules_from) for p in kept}, "validation_loss": val,
              "rows": rows, "summary": summary,
              "conditions": conditions(results), "duration_s": round(time.time() - started, 1)}
    Path(args.json).write_text(json.dumps(report, indent=1) + "\n")
    print(format_report(report))
    return 0


def format_report(report: dict) -> str:
    pols = report["policies"]
    short = {p: (p.split("=")[0] if "=" in p else p)[:14] for p in pols}
    lines = [f"compare_models on {report['machine'].get('llvm_mcpu')} ({report['machine'].get('cpu')}): "
             f"{report['set']}, {report['tasks']} tasks"
             + (f" (of {report['tasks_generated']}: those whose schedules differ)"
                if report.get("tasks_generated", report["tasks"]) != report["tasks"] else "")
             + f"; {report['command']}",
             "models: " + ", ".join(f"{short[p]} = {p.split('=', 1)[1]}" for p in pols if "=" in p),
             f"{'task (median ms; x = not correct)':46s} " + " ".join(f"{short[p]:>14s}" for p in pols)]
    by: dict = {}
    for r in report["rows"]:
        by.setdefault(r["task"], {})[r["policy"]] = r
    for t, ps in by.items():
        cells = [f"{ps[p]['median_s'] * 1e3:14.4f}" if p in ps and ps[p].get("status") == "ok" and ps[p].get("median_s")
                 else f"{'x ' + str(ps.get(p, {}).get('status'))[:12]:>14s}" for p in pols]
        lines.append(f"{Path(t.split(':')[0]).stem[:46]:46s} " + " ".join(cells))
    ratios = report["summary"]["throughput_ratio"]
    for p in pols:
        if p == "roller":
            continue
        v = report["validation_loss"][p]
        loss = f"validation loss {v['loss']:.4f} ({v['records']} best records)" if v else "schedules re-timed"
        lines.append(f"{short[p]}: {loss}; geomean throughput over " + ", ".join(
            f"{short[q]} {x['geomean']:.3f}x ({x['wins']}/{x['tasks']} wins)" for q, x in ratios.get(p, {}).items()))
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
