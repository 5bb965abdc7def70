"""Collection speed, old code against new, side by side on one host: `tensorlang collect` on the same task
list with the same candidates, from a git worktree of an older commit and from this checkout.

    .venv/bin/python benchmarks/collect_speed.py [--old COMMIT] [--trials 8] [--new-args '...'] [--json benchmarks/results/collect_speed.json]

The same candidates: the old code samples its own (roller, then seeded random samples); the new code
measures exactly those (`collect --trials 0 --points-from`, which replays each given point in full), and
the time its own sampler takes to draw as many candidates for the same tasks (`candidates_for`, timed in a
process of its own) less the time of its final replays of the random points it drew (what --points-from
did already, in full, for the old code's points) is added to its wall time -- so both sides pay for
sampling, and the new one pays at least once per candidate for a replay, as its own collect does. (Before
2026-12-06 the whole of `candidates_for` was added: most candidates' replay paid twice.)
Order: an untimed old collect first names the candidates (the old sampler is seeded per task, so its
timed run draws them again); then old and new on the first half of the tasks, new and old on the second,
so drift spreads evenly.

Figures: wall time per `ok` record for each, their ratio (the speed-up), and for the candidates both
measured how far their latencies agree (new / old; also over those the new code timed in full, its slow
candidates having one figure). The new run's log says where a batch's time went (builds + reference,
check, timing).

`--own-candidates`: each side samples its own candidates (the protocol before the new code could measure
given points; forced with `--new`, whose code may not have --points-from: `--new` equal to `--old`
measures the noise floor). `--warm-trials N` (with --own-candidates): a corpus grows by reruns with more
trials, and a rerun skips what is measured. Each side's dataset first gets an untimed collect of N trials
per task (by its own code), then the timed collect of --trials: only the candidates past the first N are
measured, and the time a rerun spends on the ones it skips counts.
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tensorlang.data.dataset import read  # noqa: E402
from tensorlang.machine import describe  # noqa: E402

TASKS = ["data/workloads/resnet50/fused_conv2d10_subtract4_divide4_expand_dims2_multiply4_expand_dims2_add8_relu4.tsched",
         "data/workloads/mobilenetv2/fused_conv2d11_subtract8_divide8_expand_dims5_multiply8_expand_dims5_add15_tir_clip5.tsched",
         "data/workloads/bert-base/fused_matmul_add2.tsched",
         "data/workloads/bert-base/layer_norm.tsched",
         "data/workloads/bert-base/fused_softmax_broadcast_to5.tsched",
         "data/workloads/gpt2/fused_matmul3_add4.tsched",
         "data/workloads/bert-base/fused_reshape10_gelu_reshape11.tsched",
         "data/workloads/resnet50/fused_conv2d12_subtract7_divide7_expand_dims1_multiply7_expand_dims1_add13_relu7.tsched"]


def _env(code: Path) -> dict:
    env = dict(os.environ, PYTHONPATH=str(code))  # this code's tensorlang package, the same venv
    env.pop("TENSORLANG_HOST_CPU", None)
    return env


def run_collect(code: Path, tasks: list[str], out: Path, trials: int, log: Path, points_from: Path | None = None,
                extra: list[str] = ()) -> float:
    env = _env(code)
    cmd = [sys.executable, "-m", "tensorlang", "collect", *tasks, "--target", "llvm", "--trials", str(trials),
           "-o", str(out)] + (["--points-from", str(points_from)] if points_from else []) + list(extra)
    t0 = time.monotonic()
    with open(log, "a") as f:
        r = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, cwd=code)
    if r.returncode != 0:
        raise SystemExit(f"collect failed in {code} (see {log})")
    return time.monotonic() - t0


SAMPLING = """
import json, sys, time
from tensorlang import api
from tensorlang.data.collect import candidates_for, find_tasks
from tensorlang.space.space import Space
trials, out = int(sys.argv[1]), {}
for task in find_tasks(sys.argv[2:]):
    doc = api.load_text(task.text, task.file)
    space = Space(doc.model.ops[task.op], doc.primfunc(task.op), doc.model.targets["llvm"])
    replay, replays = space.replay, []

    def timed(*args, **kwargs):  # the final replays: in full, converted to statements, and legal
        t = time.perf_counter()
        point = replay(*args, **kwargs)
        if kwargs.get("convert", True):
            replays.append(time.perf_counter() - t)
        return point
    space.replay = timed
    t0 = time.perf_counter()
    cands, _ = candidates_for(space, task.key, trials)
    assert len(replays) == len(cands), (len(replays), len(cands))  # one each, in the candidates' order
    out[task.label] = {"seconds": time.perf_counter() - t0, "candidates": len(cands),
                       "replay_s": sum(t for (policy, _), t in zip(cands, replays) if policy == "random")}
print(json.dumps(out))
"""


def sampling_seconds(code: Path, tasks: list[str], trials: int) -> dict:
    """What `code`'s collect spends drawing `trials` candidates per task (the Space built beforehand, as a
    collect builds it for given points too): task label -> seconds (candidates_for), replay_s (of that,
    its final replays of the random points it drew), candidates. The new side's charge is seconds -
    replay_s: a collect that samples replays each candidate once, in candidates_for; the timed
    `--points-from` collect has replayed each of the old code's points in full already, as candidates_for
    replays its own. The roller point's replay stays charged (its choices are made during it)."""
    r = subprocess.run([sys.executable, "-c", SAMPLING, str(trials), *tasks], env=_env(code), cwd=code,
                       capture_output=True, text=True, check=True)
    return json.loads(r.stdout.strip().splitlines()[-1])


def sampling_charge(sampling: dict) -> float:
    return sum(max(0.0, v["seconds"] - v["replay_s"]) for v in sampling.values())


def _sha(rev: str) -> str:
    return subprocess.run(["git", "rev-parse", "--short", rev], cwd=ROOT, capture_output=True, text=True).stdout.strip()


def point_of(rec: dict) -> tuple:
    t = rec["task"]
    return (t["file"], t["op"], rec["sketch"], json.dumps(rec["decisions"]))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--old", default="4d771e4", help="the commit to compare with")
    ap.add_argument("--new", default=None, help="a commit as the new code (default: this checkout); "
                                                "--new equal to --old measures the noise floor")
    ap.add_argument("--trials", type=int, default=8)
    ap.add_argument("--warm-trials", type=int, default=0,
                    help="with --own-candidates: an untimed collect of N trials per task first, on each side (a rerun's case)")
    ap.add_argument("--own-candidates", action="store_true",
                    help="each side samples its own candidates (forced with --new)")
    ap.add_argument("--new-args", default="", help="more options for the new side's timed collects, e.g. "
                                                  "'--min-repeat-ms 25' (a protocol to compare)")
    ap.add_argument("--json", default=str(ROOT / "benchmarks" / "results" / "collect_speed.json"))
    args = ap.parse_args()
    same = not (args.own_candidates or args.new)
    new_args = shlex.split(args.new_args)
    if same and args.warm_trials:
        raise SystemExit("--warm-trials needs --own-candidates")
    work = Path(tempfile.mkdtemp(prefix="collect-speed-"))
    old = work / "old"
    subprocess.run(["git", "worktree", "add", "--detach", str(old), args.old], cwd=ROOT, check=True,
                   capture_output=True)
    new = ROOT
    if args.new:
        new = work / "new"
        subprocess.run(["git", "worktree", "add", "--detach", str(new), args.new], cwd=ROOT, check=True,
                       capture_output=True)
    try:
        for t in TASKS:  # the old checkout has the workloads too, at the same paths
            assert (old / t).exists(), t
        halves = [TASKS[: len(TASKS) // 2], TASKS[len(TASKS) // 2:]]
        warm, sampling = {}, {}
        named = work / "candidates"  # same candidates: the old code's, named by an untimed old collect
        if same:
            run_collect(old, TASKS, named, args.trials, work / "candidates.log")
        if args.warm_trials:
            for who, code in (("old", old), ("new", new)):
                run_collect(code, TASKS, work / f"{who}-data", args.warm_trials, work / f"{who}-warm.log")
                warm[who] = {point_of(r) for r in read(work / f"{who}-data")}
        wall = {"old": 0.0, "new": 0.0}
        for i, part in enumerate(halves):
            order = ("old", "new") if i == 0 else ("new", "old")
            for who in order:
                if who == "old":
                    wall[who] += run_collect(old, part, work / "old-data", args.trials, work / "old.log")
                elif same:
                    wall[who] += run_collect(new, part, work / "new-data", 0, work / "new.log", points_from=named,
                                             extra=new_args)
                else:
                    wall[who] += run_collect(new, part, work / "new-data", args.trials, work / "new.log",
                                             extra=new_args)
        if same:
            sampling = sampling_seconds(new, TASKS, args.trials)
            wall["new"] += sampling_charge(sampling)
        recs = {who: [r for r in read(work / f"{who}-data") if point_of(r) not in warm.get(who, ())]
                for who in ("old", "new")}  # the timed run's records
        ok = {who: {point_of(r): r for r in rs if r["status"] == "ok"} for who, rs in recs.items()}
        shared = sorted(set(ok["old"]) & set(ok["new"]))
        ratios = [ok["new"][p]["median_s"] / ok["old"][p]["median_s"] for p in shared]
        full = [ok["new"][p]["median_s"] / ok["old"][p]["median_s"] for p in shared if ok["new"][p].get("runs", 0) > 1]
        agreement = {name: {"candidates": len(rs),
                            "median": round(statistics.median(rs), 3) if rs else None,
                            "within_5pct": round(sum(abs(r - 1) <= 0.05 for r in rs) / len(rs), 3) if rs else None,
                            "p10": round(sorted(rs)[len(rs) // 10], 3) if rs else None,
                            "p90": round(sorted(rs)[len(rs) * 9 // 10], 3) if rs else None}
                     for name, rs in (("all", ratios), ("timed_in_full", full))}
        per_record = {who: wall[who] / max(len(ok[who]), 1) for who in wall}
        runs = [r.get("runs") for r in recs["new"] if r["status"] == "ok"]
        report = {
            "command": " ".join([Path(sys.executable).name] + sys.argv), "machine": describe(),
            "old_commit": _sha(args.old), "new_commit": _sha(args.new) if args.new else "this checkout", "trials": args.trials,
            "same_candidates": same, "new_args": args.new_args,
            "new_sampling_s": round(sampling_charge(sampling), 2) if same else None,
            "new_sampling_detail": ({"candidates_for_s": round(sum(v["seconds"] for v in sampling.values()), 2),
                                     "final_replays_s": round(sum(v["replay_s"] for v in sampling.values()), 2)}
                                    if same else None),
            "warm_trials": args.warm_trials, "warm_records": {k: len(v) for k, v in warm.items()}, "tasks": TASKS,
            "wall_s": {k: round(v, 1) for k, v in wall.items()},
            "records": {who: len(rs) for who, rs in recs.items()}, "ok_records": {who: len(v) for who, v in ok.items()},
            "s_per_ok_record": {k: round(v, 2) for k, v in per_record.items()},
            "speedup": round(per_record["old"] / per_record["new"], 2),
            "shared_candidates": len(shared),
            "latency_ratio_new_over_old": agreement,
            "new_runs_per_record": {str(k): runs.count(k) for k in sorted(set(runs), key=str)},
            "new_log": (work / "new.log").read_text().splitlines()[-40:],
        }
    finally:
        for tree in {old, new} - {ROOT}:
            subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT, capture_output=True)
    print(f"{'':8} {'wall s':>8} {'ok records':>11} {'s / ok record':>14}")
    for who in ("old", "new"):
        print(f"{who:8} {report['wall_s'][who]:>8} {report['ok_records'][who]:>11} {report['s_per_ok_record'][who]:>14}")
    print(f"speed-up {report['speedup']}x (host {report['machine']['llvm_mcpu']}"
          + (f"; the new side's wall includes {report['new_sampling_s']} s of its own sampling)" if same else ")"))
    for name, lr in report["latency_ratio_new_over_old"].items():
        print(f"  latency new/old, {lr['candidates']} candidates ({name}): median {lr['median']}, p10 {lr['p10']}, "
              f"p90 {lr['p90']}, {lr['within_5pct']} within 5 %")
    Path(args.json).write_text(json.dumps(report, indent=1) + "\n")
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
