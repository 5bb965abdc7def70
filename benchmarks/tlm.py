"""The tensor language model against search, heuristics and PyTorch, on held-out and in-distribution tasks.

    .venv/bin/python benchmarks/tlm.py [--set heldout] [--set indist] [--model DIR] [--ablation DIR]
                                       [--ablation-cached tlm-quality] [--trials 64] [--repeat 5] [--passes 1] [--skip-ms]
    .venv/bin/python benchmarks/tlm.py --cold-cli-only 3 --out REPORT   # only the cold CLI figure, refreshed in REPORT

Tasks (all on this CPU, target llvm = the host):
- heldout: 22 tasks of the two held-out models (data/split.json: EfficientNet-B0, the LLaMA-7B layer) --
  conv2d with batch-norm epilogues, depthwise conv2d, the SE block's convs, global mean, dense matmul,
  softmax, RMS norm, SiLU gating, the rotary embedding, a residual add. No measured record of any of them
  reached fine-tuning (`train` refuses them).
- indist: validation tasks of the training models and their shape variants (lm/data.is_validation: kept out
  of both training stages, but from the training distribution), one of each kind first (`--indist N` of them).

Policies per task:
- `tlm`: the model's constrained schedule in one pass, decoded as its checkpoint says (generation_config.json:
  greedy, or beam search with `num_beams`); `tlm:8`: its 8 distinct candidates (that one + seeded samples at
  lm/generate.py's SAMPLE_TEMPERATURE) measured with the harness, the fastest kept (its schedule time includes that);
  `tlm-ranked:16`: 16 such candidates and the model's greedy schedule in each sketch they miss, ranked by the
  cost model (cost/), none measured;
- the ablation (`--ablation DIR`), the other fine-tuning recipe from the same pre-training: `tlm-best-only`
  (the best record per task alone, OSDI'24) or `tlm-quality` (every record, prefixed by its quality token),
  named from its model card; `--ablation-cached tlm-quality` re-times the ablation's schedules cached by an
  earlier run (the cache names its model) when its checkpoint is not at hand -- its schedules do not depend
  on the model benchmarked;
- `tlm-untrained`: a randomly initialised model of the same size with the same decoder -- the floor a
  trained model must clear;
- `random` (a uniform sample of the space), `roller`, `default` (TVM without search);
- `metaschedule:N`: MetaSchedule's evolutionary search, N measured trials (its tuning time recorded, and
  its best-so-far latency after each trial, for the time-to-quality curve);
- `torch`: PyTorch eager where the task is a plain matmul or softmax.

Phase 1 (schedules) is cached per host in benchmarks/results/tlm_schedules.<cpu>-<machine id>.json, per task
and policy, written after each one: a killed run resumes, and MetaSchedule is not run twice. Every policy's
schedule depends on the host (the model's prompt names the CPU, MetaSchedule tuned on it, the space's vector
width), so another host's schedules are never re-timed here as this one's. Phase 2 measures every candidate of a
task set side by side in one harness run (interleaved rounds, under the measurement lock), so every ratio
compares figures of one run; `--passes N` times them in N such runs one after another and takes each figure's
median over them (a task's figure moves by up to 20 % between runs on this shared machine), each run's headline
ratios reported beside it. Writes benchmarks/results/tlm.json (+ tlm.png) and prints the tables.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import os
import resource
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"


def cache_path() -> Path:
    """This host's schedule cache (module docstring): another CPU's schedules are another file."""
    from tensorlang.machine import host
    cpu = host()
    return RESULTS / f"tlm_schedules.{cpu.name}-{cpu.id}.json"

E, L = "data/workloads/efficientnet-b0", "data/workloads/llama7b-layer"
HELDOUT = [  # (file, kind)
    (f"{E}/fused_conv2d_subtract_divide_expand_dims_multiply_expand_dims_add1_tir_sigmoid_multiply1.tsched", "conv2d"),
    (f"{E}/fused_conv2d14_subtract4_divide4_expand_dims3_multiply9_expand_dims3_add12_add17.tsched", "conv2d"),
    (f"{E}/fused_conv2d16_subtract7_divide7_expand_dims5_multiply15_expand_dims5_add20.tsched", "conv2d"),
    (f"{E}/fused_conv2d23_subtract10_divide10_expand_dims7_multiply21_expand_dims7_add28.tsched", "conv2d"),
    (f"{E}/fused_conv2d30_subtract12_divide12_expand_dims9_multiply25_expand_dims9_add35.tsched", "conv2d"),
    (f"{E}/fused_conv2d12_add15_tir_sigmoid8_multiply12.tsched", "conv2d-se"),
    (f"{E}/fused_conv2d13_add16_tir_sigmoid9_multiply13.tsched", "conv2d-se"),
    (f"{E}/fused_conv2d1_subtract_divide_expand_dims_multiply_expand_dims_add1_tir_sigmoid_multiply1.tsched",
     "depthwise"),
    (f"{E}/fused_conv2d11_subtract5_divide5_expand_dims4_multiply10_expand_dims4_add14_tir_sigmoid7_multiply11.tsched",
     "depthwise"),
    (f"{E}/fused_conv2d18_subtract8_divide8_expand_dims6_multiply16_expand_dims6_add22_tir_sigmoid11_multiply17.tsched",
     "depthwise"),
    (f"{E}/fused_conv2d25_subtract11_divide11_expand_dims8_multiply22_expand_dims8_add30_tir_sigmoid15_multiply23.tsched",
     "depthwise"),
    (f"{E}/fused_conv2d39_subtract16_divide16_expand_dims12_multiply32_expand_dims12_add45_tir_sigmoid22_multiply33.tsched",
     "depthwise"),
    (f"{E}/mean.tsched", "reduction"),
    (f"{L}/matmul.tsched", "matmul"),
    (f"{L}/matmul1.tsched", "matmul"),
    (f"{L}/matmul2.tsched", "matmul"),
    (f"{L}/matmul3.tsched", "matmul"),
    (f"{L}/fused_softmax_broadcast_to2.tsched", "softmax"),
    (f"{L}/fused_mean_add1_tir_rsqrt_multiply2_multiply3.tsched", "norm"),
    (f"{L}/fused_reshape7_tir_sigmoid_multiply6_reshape7_multiply6_reshape8.tsched", "elementwise"),
    (f"{L}/fused_reshape1_reshape3_transpose1_multiply4_strided_slice3_strided_slice4_tir_negative_concatenate2_"
     f"multiply4_add2_broadcast_to2_reshape4.tsched", "elementwise"),
    (f"{L}/fused_reshape1_add4.tsched", "elementwise"),
]
TRAINING_MODELS = ("resnet50", "mobilenetv2", "bert-base", "gpt2", "tinyllama-layer", "qwen2-0.5b-layer")


# ------------------------------------------------------------------ PyTorch (run in the runner)
def torch_kernel(inputs, outputs, kind: str, threads: int | None = None):
    import torch
    if threads:
        torch.set_num_threads(threads)
    xs = [torch.from_numpy(v) for v in inputs.values()]
    name = outputs[0][0]
    if kind == "matmul":
        f = lambda: torch.matmul(xs[0], xs[1])  # noqa: E731
    elif kind == "softmax":
        f = lambda: torch.softmax(xs[0], dim=-1)  # noqa: E731
    else:
        raise ValueError(f"no PyTorch equivalent for {kind}")

    def run():
        with torch.inference_mode():
            return {name: f().numpy()}
    return run


def torch_kind(op) -> str | None:
    """'matmul' / 'softmax' when the operator is exactly that (checked against the reference anyway)."""
    stages = op.ast.stages
    if len(stages) == 1 and stages[0].op == "+=" and len(op.ast.inputs) == 2 and "*" in str(stages[0].rhs):
        return "matmul"
    if op.name.startswith("fused_softmax"):
        return "softmax"
    return None


# ------------------------------------------------------------------ tasks
def indist_tasks(limit: int, validation: bool = True, min_flops: float = 1e6) -> list[tuple[str, str]]:
    """Validation tasks of the training models (their shape variants after them) of more than `min_flops`, one
    per kind of operator name first, up to `limit`; a key met again in another file is one task. `validation`
    False: the training tasks instead (those fine-tuning learned from)."""
    from tensorlang import api
    from tensorlang.data import split
    from tensorlang.data.collect import op_hash
    from tensorlang.lm.data import is_validation
    heldout = split.heldout_keys(split.DEFAULT_PATH)
    dirs = [ROOT / "data" / "workloads" / m for m in TRAINING_MODELS]
    dirs += sorted(d for root in split.WORKLOAD_ROOTS for d in (ROOT / root).iterdir()
                   if d.is_dir() and d not in dirs and not d.name.startswith(split.HELDOUT_MODELS))
    found, seen = [], set()
    for d in dirs:
        for f in sorted(d.glob("*.tsched")):
            doc = api.load(f)
            for op in doc.model.ops.values():
                key = op_hash(op)
                if key not in seen and key not in heldout and is_validation(key) == validation and op.flops \
                        and op.flops > min_flops:
                    seen.add(key)
                    found.append((str(f.relative_to(ROOT)), _kind(op.name)))
    out, kinds = [], set()
    for f, k in found:  # one of each kind first, then the rest
        if k not in kinds:
            kinds.add(k)
            out.append((f, k))
    out += [x for x in found if x not in out]
    return out[:limit]


def _kind(name: str) -> str:
    for k in ("conv2d", "matmul", "softmax", "layer_norm", "mean", "pool", "gelu", "add"):
        if k in name:
            return k
    return "other"


# ------------------------------------------------------------------ phase 1: schedules
RANKED = "tlm-ranked:16"


def cost_model_name() -> str:
    from tensorlang.cost.model import CostModel
    try:
        return CostModel.load().name
    except (FileNotFoundError, ValueError) as e:
        return f"no cost model ({e})"


def run_stamp(script: str, argv, started: float) -> dict:
    """What every benchmark report starts with: the command that reproduces it, when it started, the machine."""
    from tensorlang.machine import describe, host
    return {"command": shlex.join([".venv/bin/python", f"benchmarks/{script}"]
                                  + (argv if argv is not None else sys.argv[1:])),
            "started": _dt.datetime.fromtimestamp(started, _dt.timezone.utc).isoformat(timespec="seconds"),
            "machine": describe(host().cores)}


def decoding(gen, sampled: bool = False) -> str:
    """A model and how it decodes (`sampled`: and the temperature and sampler of its samples; the decoding rules
    it has on, each by its RULE, lm/decoding_rules.py): what a cached schedule of it depends on."""
    from tensorlang.lm.decoding_rules import RULES
    from tensorlang.lm.generate import SAMPLE_TEMPERATURE, SAMPLER
    name = gen.name if gen.num_beams == 1 else f"{gen.name} beams={gen.num_beams}"
    name += "".join(f" {r.cache_name}" for r in RULES if getattr(gen, r.attr, False))
    return f"{name} T={SAMPLE_TEMPERATURE} sampler={SAMPLER}" if sampled else name


class Cache:
    """Phase 1's schedules, `file:op|policy` -> entry, and `host|` the machine that made them: a file made on
    another machine (an explicit --cache) is refused, neither re-timed as this host's nor overwritten."""

    def __init__(self, path: Path):
        from tensorlang.machine import host
        self.path = path
        self.data = json.loads(path.read_text()) if path.exists() else {}
        here = host().id
        if self.data.get("host|", here) != here:
            raise SystemExit(f"tlm-bench: {path} holds schedules made on machine {self.data['host|']}, not on this "
                             f"one ({here}); leave out --cache for this host's own")
        self.data["host|"] = here

    def get(self, key):
        return self.data.get(key)

    def put(self, key, value):
        self.data[key] = value
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data, indent=1) + "\n")
        os.replace(tmp, self.path)


def _text(stmts) -> str:
    from tensorlang.space.render import statements_text
    return statements_text(stmts)


def ms_schedule(space, trials: int, seed: int = 0) -> dict:
    """MetaSchedule with `trials` trials: its best schedule's statements, tuning time, best-so-far curve."""
    from tensorlang.baselines.metaschedule import tune_records
    from tensorlang.bench.lock import measure_lock
    from tensorlang.space import metaschedule as msx
    from tensorlang.space.convert import trace_to_statements
    history: list = []
    t0 = time.perf_counter()
    with measure_lock():  # it times kernels
        found = tune_records(space.mod, space.tvm_target, msx.rule_kind(space.target), trials, 1, seed=seed,
                             history=history)
    tune_s = time.perf_counter() - t0
    if not found:
        return {"error": f"no valid schedule in {trials} trials", "generation_s": tune_s}
    sch, run_s = found[0]
    stmts, _ = trace_to_statements(sch.trace, space.mod, space.op)
    best, curve = math.inf, []
    for x in history:
        best = min(best, x) if x is not None else best
        curve.append(None if best == math.inf else best)
    return {"schedule_text": _text(stmts), "generation_s": tune_s, "ms_run_s": run_s, "ms_curve_s": curve}


def spread(tasks: list, n: int | None) -> list:
    """n tasks taken round-robin over their kinds (in the list's order): each kind before a second of any."""
    if n is None:
        return list(tasks)
    by_kind: dict = {}
    for t in tasks:
        by_kind.setdefault(t[1], []).append(t)
    out = []
    while len(out) < min(n, len(tasks)):
        for kind in list(by_kind):
            if by_kind[kind] and len(out) < n:
                out.append(by_kind[kind].pop(0))
    return out


def generate_all(tasks, policies, cache: Cache, gens: dict, say, ms_tasks=frozenset()) -> None:
    """Phase 1: every policy's schedule of every task (MetaSchedule on `ms_tasks` only), cached."""
    from tensorlang import api
    from tensorlang.lm.generate import fastest
    from tensorlang.space.space import Space
    for file, kind in tasks:
        doc = api.load(ROOT / file)
        for name, op in doc.model.ops.items():
            space = None
            for pol in policies:
                key = f"{file}:{name}|{pol}"
                if cache.get(key) is not None or pol in ("default", "torch"):
                    continue
                if pol.startswith("metaschedule") and (file, kind) not in ms_tasks:
                    continue
                space = space or Space(op, doc.primfunc(name), doc.model.targets["llvm"])
                say(f"{Path(file).stem[:48]}: {pol}")
                try:
                    t0 = time.perf_counter()
                    if pol in gens:  # a model, one pass
                        out = gens[pol].generate(space)
                        entry = {"schedule_text": out.schedule_text, "generation_s": time.perf_counter() - t0,
                                 "decode_s": out.seconds.get("decode"), "finish_s": out.seconds.get("finish")}
                    elif pol == "tlm:8":
                        outs = gens["tlm"].sample(space, 8, seed=0)
                        best, results = fastest(outs, op, doc.model.targets["llvm"], repeat=2)
                        entry = ({"error": "no candidate ran correctly"} if best is None else
                                 {"schedule_text": best.schedule_text, "candidates": len(outs),
                                  "candidates_ok": sum(r.status == "ok" for r in results)})
                        entry["generation_s"] = time.perf_counter() - t0
                    elif pol == RANKED:
                        from tensorlang.baselines.tlm import RANKED_SAMPLES, candidates, rank_candidates
                        outs = candidates(gens["tlm"], space, RANKED_SAMPLES, seed=0, per_sketch=True)
                        kept, why = rank_candidates(outs, space, doc.model.targets["llvm"])
                        entry = {"schedule_text": outs[kept].schedule_text, "candidates": len(outs), "kept": kept,
                                 "generation_s": time.perf_counter() - t0}
                        if why:
                            entry["note"] = why
                    elif pol == "roller":
                        from tensorlang.baselines.roller import roller_point
                        entry = {"schedule_text": _text(roller_point(space).stmts)}
                        entry["generation_s"] = time.perf_counter() - t0
                    elif pol == "random":
                        points, _ = space.sample(1, seed=0)
                        entry = {"schedule_text": _text(points[0].stmts), "generation_s": time.perf_counter() - t0}
                    elif pol.startswith("metaschedule:"):
                        entry = ms_schedule(space, int(pol.split(":")[1]))
                    else:
                        raise ValueError(f"unknown policy {pol}")
                except Exception as e:  # a row of the table, never the end of the run
                    entry = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
                entry["load"] = round(os.getloadavg()[0], 2)
                cache.put(key, entry)


# ------------------------------------------------------------------ phase 2: measurement
def measure_set(tasks, policies, cache: Cache, repeat: int, say, passes: int = 1) -> list[dict]:
    """Phase 2: every policy's schedule of every task timed side by side, in `passes` harness runs one after
    another. A row's figure is the median of its passes' medians (`pass_median_s`: each pass's own): on this
    shared machine a task's figure moves by up to 20 % from one run to the next, which is the gap being judged."""
    from tensorlang import api
    from tensorlang.bench import Candidate, PythonKernel, measure_candidates
    from tensorlang.bench.command import generate_candidate
    from tensorlang.lower.targets import host_cores
    threads = host_cores()
    cands, meta = [], []
    for file, kind in tasks:
        doc = api.load(ROOT / file)
        target = doc.model.targets["llvm"]
        for name, op in doc.model.ops.items():
            for pol in policies:
                row = {"task": f"{file}:{name}", "kind": kind, "policy": pol, "flops": op.flops}
                if pol == "torch":
                    tk = torch_kind(op)
                    if tk is None:
                        continue
                    c = Candidate(f"{name}/torch", op, target, PythonKernel(f"{Path(__file__).resolve()}:torch_kernel",
                                                                             {"kind": tk, "threads": threads}))
                elif pol == "default":
                    t0 = time.perf_counter()
                    c, _, _, msgs = generate_candidate(doc, name, "llvm", "default")
                    row["generation_s"] = time.perf_counter() - t0
                    if c is None:
                        row.update(status="no-schedule", message="; ".join(msgs)[:200])
                        meta.append((None, row))
                        continue
                else:
                    entry = cache.get(f"{file}:{name}|{pol}") or {"error": "not generated"}
                    row.update({k: v for k, v in entry.items() if k != "schedule_text"})
                    row["schedule_text"] = entry.get("schedule_text")
                    if entry.get("schedule_text") is None:
                        row.update(status="no-schedule", message=entry.get("error"))
                        meta.append((None, row))
                        continue
                    c = Candidate(f"{name}/{pol}", op, target, entry["schedule_text"])
                cands.append(c)
                meta.append((c, row))
    every = []
    for n in range(passes):
        say(f"measuring {len(cands)} candidates side by side, {repeat} rounds, {threads} threads"
            + (f" (pass {n + 1} of {passes})" if passes > 1 else ""))
        every.append(measure_candidates(cands, repeat=repeat, timeout_s=60, threads=threads, min_repeat_ms=50,
                                        progress=say))
    by = {id(c): [results[i] for results in every] for i, c in enumerate(cands)}
    rows = []
    for c, row in meta:
        if c is not None:
            rs = by[id(c)]
            bad = next((r for r in rs if r.status != "ok"), None)  # a pass that failed says why
            r = bad or rs[0]
            ok = [x.median_s for x in rs if x.status == "ok" and x.median_s]
            row.update(status=r.status, message=r.message[:200] if r.message else "",
                       median_s=statistics.median(ok) if bad is None and ok else r.median_s,
                       min_s=min((x.min_s for x in rs if x.min_s), default=None), correct=bad is None)
            if passes > 1:
                row["pass_median_s"] = [x.median_s for x in rs]
        rows.append(row)
    return rows, [r for results in every for r in results]


PASS_RATIOS = (("tlm", "metaschedule:64"), ("tlm", "metaschedule:256"), ("tlm", "roller"),
               (RANKED, "metaschedule:64"), (RANKED, "metaschedule:256"), ("tlm:8", "metaschedule:256"))


def per_pass(rows: list[dict], policies: list[str]) -> list[dict]:
    """Each pass's geomean ratios of PASS_RATIOS, as summarize computes them from that pass's figures alone:
    how far the headline figures move from one harness run to the next."""
    passes = max((len(r.get("pass_median_s") or []) for r in rows), default=0)
    out = []
    for n in range(passes):
        alone = [{**r, "median_s": r["pass_median_s"][n]} for r in rows if r.get("pass_median_s")]
        tr = summarize(alone, policies)["throughput_ratio"]
        out.append({f"{p} over {q}": tr[p][q]["geomean"] for p, q in PASS_RATIOS if q in tr.get(p, {})})
    return out


# ------------------------------------------------------------------ report
def geomean(xs):
    xs = [x for x in xs if x and x > 0 and math.isfinite(x)]
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else None


def summarize(rows: list[dict], policies: list[str], base: str = "tlm") -> dict:
    by_task: dict = {}
    for r in rows:
        if r.get("status") == "ok" and r.get("median_s"):
            by_task.setdefault(r["task"], {})[r["policy"]] = r["median_s"]
    out = {}
    for p in policies:
        for q in policies:
            if p == q:
                continue
            ratios = [t[q] / t[p] for t in by_task.values() if p in t and q in t]  # throughput p / q
            if ratios:
                out.setdefault(p, {})[q] = {"geomean": round(geomean(ratios), 3), "tasks": len(ratios),
                                            "wins": sum(x > 1 for x in ratios)}
    gen = {}
    for p in policies:
        xs = sorted(r["generation_s"] for r in rows if r["policy"] == p and r.get("generation_s") is not None)
        if xs:
            gen[p] = {"median_s": round(xs[len(xs) // 2], 4), "p95_s": round(xs[min(len(xs) - 1, int(0.95 * len(xs)))], 4),
                      "total_s": round(sum(xs), 1)}
    legal = {p: {"schedules": sum(1 for r in rows if r["policy"] == p and r.get("status") != "no-schedule"),
                 "tasks": sum(1 for r in rows if r["policy"] == p),
                 "correct": sum(1 for r in rows if r["policy"] == p and r.get("status") == "ok")} for p in policies}
    return {"throughput_ratio": out, "schedule_time": gen, "legal_correct": legal}


def ms_trials_to_match(rows: list[dict], trials_pol: str) -> list[dict]:
    """Per task: MetaSchedule's best-so-far curve (its own runner's figures), scaled to this run's figure for
    MetaSchedule's final schedule, against one-pass tlm's figure: the first trial count that matches it."""
    out = []
    by_task: dict = {}
    for r in rows:
        by_task.setdefault(r["task"], {})[r["policy"]] = r
    for task, pols in by_task.items():
        ms, tlm = pols.get(trials_pol), pols.get("tlm")
        if not ms or not tlm or ms.get("status") != "ok" or tlm.get("status") != "ok":
            continue
        curve, ms_run = ms.get("ms_curve_s"), ms.get("ms_run_s")
        if not curve or not ms_run:
            continue
        scale = ms["median_s"] / ms_run
        match = next((n + 1 for n, x in enumerate(curve) if x is not None and x * scale <= tlm["median_s"]), None)
        out.append({"task": task, "trials_to_match_tlm": match, "trials": len(curve)})
    return out


def plot(report: dict, path: Path) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:  # said, not skipped in silence: a PNG left from an earlier run would disagree
        print(f"tlm-bench: no plot ({path} not written): matplotlib is missing: pip install -e '.[bench]'",
              file=sys.stderr)
        return
    sets = [s for s in report["sets"] if report["sets"][s]["rows"]]
    fig, axes = plt.subplots(1, len(sets) + 1, figsize=(6 * (len(sets) + 1), 4.5))
    axes = list(axes) if hasattr(axes, "__len__") else [axes]
    for ax, s in zip(axes, sets):
        ratios = report["sets"][s]["summary"]["throughput_ratio"].get("tlm", {})
        names = sorted(ratios)
        ax.barh(names, [1 / ratios[n]["geomean"] for n in names])
        ax.axvline(1.0, color="k", lw=0.8)
        ax.set_xlabel("geomean throughput / tlm's (one pass)")
        ax.set_title(f"{s}: {report['sets'][s]['tasks']} tasks")
    ax = axes[-1]
    for s in sets:
        for m in report["sets"][s].get("time_to_quality", []):
            if m["trials_to_match_tlm"]:
                ax.scatter([m["trials_to_match_tlm"]], [s], color="C1")
        n_none = sum(1 for m in report["sets"][s].get("time_to_quality", []) if not m["trials_to_match_tlm"])
        if n_none:
            ax.annotate(f"{n_none} never matched", (1, s))
    ax.set_xlabel("MetaSchedule trials to match one-pass tlm")
    fig.suptitle(f"tensorlang TLM vs baselines on {report['machine'].get('llvm_mcpu', '?')}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def cold_cli(file: str, op: str, policy: str) -> dict:
    """`tensorlang lower --emit so` of one @auto op in a fresh process: wall time and peak memory."""
    with tempfile.TemporaryDirectory() as d:
        f = Path(d) / "op.tsched"
        f.write_text((ROOT / file).read_text())
        t0 = time.perf_counter()
        p = subprocess.run([str(ROOT / ".venv/bin/tensorlang"), "lower", str(f), "--target", "llvm", "--op", op,
                            "--emit", "so", "-o", str(Path(d) / "op.so"), "--policy", policy],
                           capture_output=True, text=True, cwd=ROOT)
        wall = time.perf_counter() - t0
    return {"policy": policy, "task": f"{file}:{op}", "seconds": round(wall, 2), "rc": p.returncode,
            "stderr": p.stderr[-300:], "peak_rss_mb_children": round(
                resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024, 1)}


def cold_cli_runs(runs: int) -> dict:
    """cold_cli for policies tlm and roller, `runs` times each, interleaved (tlm, roller, tlm, ...) so that both
    see the same host; the medians are the figures."""
    file, op = HELDOUT[13][0], "matmul"
    every = [cold_cli(file, op, p) for _ in range(runs) for p in ("tlm", "roller")]
    medians = []
    for p in ("tlm", "roller"):
        mine = [r for r in every if r["policy"] == p]
        medians.append({**mine[-1], "seconds": round(statistics.median(r["seconds"] for r in mine), 2),
                        "runs": [r["seconds"] for r in mine], "rc": max(r["rc"] for r in mine)})
    return {"cold_cli": medians}


def refresh_cold_cli(out: Path, runs: int, argv) -> dict:
    """--cold-cli-only: re-measure the cold CLI figure of an existing report in place (the rest of the report is
    another run's and says so by its own command and date; this part carries its own)."""
    report = json.loads(out.read_text())
    fresh = cold_cli_runs(runs)
    fresh["cold_cli_measured"] = run_stamp("tlm.py", argv, time.time())
    report.update(fresh)
    out.write_text(json.dumps(report, indent=1) + "\n")
    return report


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--set", action="append", choices=("heldout", "indist"))
    ap.add_argument("--model", help="the model (default: the shipped checkpoint)")
    ap.add_argument("--ablation", help="a model of the same pre-training fine-tuned by the other recipe")
    ap.add_argument("--ablation-cached", choices=("tlm-quality", "tlm-best-only"),
                    help="measure this ablation from its schedules in the cache (its checkpoint is not here; the "
                         "cache's model|POLICY entry names the model): re-timed side by side, not generated again")
    ap.add_argument("--trials", type=int, action="append", help="MetaSchedule trials (default 64)")
    ap.add_argument("--skip-ms", action="store_true", help="no MetaSchedule (e.g. a quick run)")
    ap.add_argument("--ms-sets", default="heldout", help="the task sets MetaSchedule runs on (comma-separated; "
                    "default heldout: 64 trials take 1-2 min a task on 2 cores)")
    ap.add_argument("--indist", type=int, default=10, help="in-distribution tasks")
    ap.add_argument("--ms-tasks", type=int, default=None,
                    help="MetaSchedule on this many tasks of a set only, round-robin over the kinds (its cost on a busy "
                         "2-core machine: 3-5 min a task)")
    ap.add_argument("--ms-skip", action="append", default=[], metavar="FILE_STEM",
                    help="no MetaSchedule on this task (its file's stem, e.g. matmul3; repeatable): a search whose "
                         "trials each time a 100 ms kernel takes an hour on 2 cores; the report names the tasks")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--passes", type=int, default=1,
                    help="time every candidate in this many harness runs, one after another; each figure is the "
                         "median of its runs' medians, and each run's headline ratios are reported beside it")
    ap.add_argument("--limit", type=int, help="only the first N tasks of each set (a quick check)")
    ap.add_argument("--cache", default=None, help="schedule cache (default: this host's, cache_path())")
    ap.add_argument("--out", default=str(RESULTS / "tlm.json"))
    ap.add_argument("--cold-cli-only", type=int, metavar="RUNS", default=None,
                    help="only re-measure the cold CLI figure of --out (RUNS fresh processes per policy, "
                         "interleaved; the median kept), leaving the rest of that report as it is")
    args = ap.parse_args(argv)
    if args.cold_cli_only:
        report = refresh_cold_cli(Path(args.out), args.cold_cli_only, argv)
        print("\n".join(cold_cli_lines(report)))
        return 0
    sets = args.set or ["heldout", "indist"]
    say = lambda m: print(f"tlm-bench: {m}", file=sys.stderr, flush=True)  # noqa: E731
    started = time.time()

    t0 = time.perf_counter()
    import torch  # noqa: F401
    import_torch_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    import transformers  # noqa: F401
    import_transformers_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    import tvm  # noqa: F401
    import_tvm_s = time.perf_counter() - t0
    from tensorlang.lm import model as M
    from tensorlang.lm.generate import Generator

    gens = {"tlm": Generator(args.model)}
    load = {"tlm": gens["tlm"].load_s, "tlm_again": Generator(args.model).load_s}
    model_dir = Path(args.model or M.DEFAULT_DIR)
    size = gens["tlm"].card.get("size")
    untrained = Path(tempfile.mkdtemp(prefix="tlm-untrained-"))
    M.save(M.build(size, seed=0), untrained, {"size": size, "stages": [], "note": "random initialisation"})
    gens["tlm-untrained"] = Generator(untrained)
    ablation = None
    if args.ablation:
        g = Generator(args.ablation)
        best_only = any(st.get("best_only") for st in g.card.get("stages", []) if st.get("stage") == "finetune")
        ablation = "tlm-best-only" if best_only else "tlm-quality"
        gens[ablation] = g
    for g in gens.values():  # every model decodes as the one benchmarked does: the ratios compare weights
        g.num_beams = gens["tlm"].num_beams
    cached_only = set()
    if args.ablation_cached and not ablation:
        ablation = args.ablation_cached
        cached_only.add(ablation)
    trials = args.trials or [64]
    policies = (["tlm", RANKED, "tlm:8"] + [p for p in (ablation, "tlm-untrained") if p in gens or p in cached_only]
                + ["random", "roller", "default"] + ([] if args.skip_ms else [f"metaschedule:{n}" for n in trials])
                + ["torch"])
    args.cache = args.cache or str(cache_path())
    cache = Cache(Path(args.cache))
    # model identity in the cache keys: another model's schedules are not reused
    # (the untrained floor too: it is of the benchmarked model's size, and another size's schedules are not it)
    for p, g in (("tlm", gens["tlm"]), ("tlm:8", gens["tlm"]), (RANKED, gens["tlm"]), (ablation, gens.get(ablation)),
                 ("tlm-untrained", gens["tlm-untrained"])):
        made_by = decoding(g, sampled=p in ("tlm:8", RANKED)) if g is not None else None
        if p == RANKED:
            made_by += f" + other sketches, ranked by {cost_model_name()}"
        if made_by is not None and cache.get(f"model|{p}") != made_by:
            cache.data = {k: v for k, v in cache.data.items() if not k.endswith(f"|{p}")}
            cache.put(f"model|{p}", made_by)
    report = {**run_stamp("tlm.py", argv, started), "model": decoding(gens["tlm"]), "model_dir": str(model_dir),
              "ablation": ({ablation: f"{cache.get(f'model|{ablation}')} (its schedules cached in an earlier run, "
                                       f"re-timed here)"} if ablation in cached_only else
                           {ablation: gens[ablation].name} if ablation else None),
              "imports_s": {"torch": round(import_torch_s, 2), "transformers": round(import_transformers_s, 2),
                            "tvm": round(import_tvm_s, 2)},
              "model_load_s": {k: round(v, 3) for k, v in load.items()}, "policies": policies,
              "ms_skipped": args.ms_skip, "passes": args.passes, "sets": {}}
    for s in sets:
        tasks = (HELDOUT if s == "heldout" else indist_tasks(args.indist))[:args.limit]
        say(f"{s}: {len(tasks)} tasks; phase 1 (schedules, cached in {os.path.relpath(args.cache, ROOT)})")
        searched = [t for t in tasks if Path(t[0]).stem not in args.ms_skip]
        ms_tasks = set(map(tuple, spread(searched, args.ms_tasks))) if s in args.ms_sets.split(",") else set()
        generate_all(tasks, [p for p in policies if p != "torch" and p not in cached_only], cache, gens, say,
                     ms_tasks=ms_tasks)
    for s in sets:
        tasks = (HELDOUT if s == "heldout" else indist_tasks(args.indist))[:args.limit]
        rows, results = measure_set(tasks, policies, cache, args.repeat, say, passes=args.passes)
        from tensorlang.bench.command import conditions
        report["sets"][s] = {"tasks": len(tasks), "rows": rows, "summary": summarize(rows, policies),
                             "passes": per_pass(rows, policies),
                             # the longest search's curve: it says how many trials match tlm up to its end
                             "time_to_quality": ms_trials_to_match(rows, f"metaschedule:{max(trials)}")
                             if not args.skip_ms else [], "conditions": conditions(results)}
    report.update(cold_cli_runs(3))
    report["peak_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    report["duration_s"] = round(time.time() - started, 1)
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    plot(report, Path(args.out).with_suffix(".png"))
    print(format_report(report))
    return 0


def cold_cli_lines(report: dict) -> list[str]:
    lines = []
    for c in report.get("cold_cli", []):
        runs = f", runs {c['runs']}" if c.get("runs") else ""
        lines.append(f"cold CLI lower --emit so ({c['policy']}, {Path(c['task'].split(':')[0]).stem}): {c['seconds']} s "
                     f"(rc {c['rc']}{runs})")
    when = report.get("cold_cli_measured")
    if when:
        lines.append(f"  (measured apart: {when['command']}, {when['started']}, {when['machine'].get('llvm_mcpu')})")
    return lines


def format_report(report: dict) -> str:
    lines = [f"tlm benchmark: model {report['model']} on {report['machine'].get('llvm_mcpu')} "
             f"({report['machine'].get('usable_cpus', '?')} cores); {report['command']}"]
    if report.get("ms_skipped"):
        lines.append(f"MetaSchedule not run on: {', '.join(report['ms_skipped'])} (--ms-skip)")
    for s, v in report["sets"].items():
        lines.append(f"\n== {s}: {v['tasks']} tasks (median latency, ms; x = no schedule / not correct)")
        pols = [p for p in report["policies"] if any(r["policy"] == p for r in v["rows"])]
        lines.append(f"{'task':46s} " + " ".join(f"{p[:13]:>13s}" for p in pols))
        by: dict = {}
        for r in v["rows"]:
            by.setdefault(r["task"], {})[r["policy"]] = r
        for t, ps in by.items():
            cells = []
            for p in pols:
                r = ps.get(p)
                cells.append(f"{'':>13s}" if r is None else f"{r['median_s'] * 1e3:13.4f}" if r.get("status") == "ok"
                             and r.get("median_s") else f"{'x ' + str(r.get('status'))[:11]:>13s}")
            lines.append(f"{Path(t.split(':')[0]).stem[:46]:46s} " + " ".join(cells))
        tr = v["summary"]["throughput_ratio"].get("tlm", {})
        lines.append("geomean throughput of tlm over: " + ", ".join(
            f"{q} {x['geomean']:.2f}x ({x['wins']}/{x['tasks']} wins)" for q, x in tr.items()))
        for p in (RANKED, "tlm:8"):
            tp = v["summary"]["throughput_ratio"].get(p, {})
            lines.append(f"geomean throughput of {p} over: " + ", ".join(
                f"{q} {x['geomean']:.2f}x ({x['wins']}/{x['tasks']} wins)" for q, x in tp.items()))
        if v.get("passes"):
            lines.append("per pass (each harness run's figures alone): " + "; ".join(
                f"{k} " + " / ".join(f"{x[k]:.2f}x" for x in v["passes"] if k in x) for k in v["passes"][0]))
        lines.append("schedule time per task (median / p95 / total s): " + ", ".join(
            f"{p} {x['median_s']:.3f}/{x['p95_s']:.3f}/{x['total_s']:.0f}" for p, x in v["summary"]["schedule_time"].items()))
        lines.append("legal / correct: " + ", ".join(
            f"{p} {x['schedules']}/{x['tasks']} legal, {x['correct']} correct"
            for p, x in v["summary"]["legal_correct"].items()))
        ttq = v.get("time_to_quality") or []
        if ttq:
            m = sorted(x["trials_to_match_tlm"] or 10 ** 9 for x in ttq)
            lines.append(f"MetaSchedule trials to match one-pass tlm: median "
                         f"{m[len(m) // 2] if m[len(m) // 2] < 10 ** 9 else 'never'}, never in "
                         f"{sum(1 for x in ttq if not x['trials_to_match_tlm'])} of {len(ttq)} tasks "
                         f"(searches of {max(x['trials'] for x in ttq)} trials)")
    lines.append(f"\nimports (s): {report['imports_s']}; model load (s): {report['model_load_s']}; "
                 f"peak RSS {report['peak_rss_mb']} MB")
    lines += cold_cli_lines(report)
    lines.append(f"host: {report['machine'].get('llvm_mcpu')} ({report['machine'].get('cpu')})")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
