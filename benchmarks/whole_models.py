"""Whole models on this CPU: tlm against TVM's own MetaSchedule, roller, default and PyTorch, end to end.

    .venv/bin/python benchmarks/whole_models.py [--models bert-base resnet50] [--policy P ...] [--repeats R]
                                                [--small] [--out benchmarks/results/whole_models.json]

For each model -- BERT-base (seq 128) and ResNet-50 (batch 1), the configs of `tensorlang extract` -- one
`tensorlang bench-model` run (tensorlang/network/bench.py), in its own process, one model after the other
(each needs several GB; `--reuse MODEL` combines the JSON a separate run of that model wrote): every policy's executable built (tlm, roller, default: compile-model; metaschedule:N:
TVM's tune_relax with N trials per task, its records applied to the module it tuned), its outputs checked against PyTorch eager, then all
of them and PyTorch eager (and torch.compile where it works) timed in interleaved rounds under the
machine-wide measurement lock (the real one: this script never sets TENSORLANG_MEASURE_LOCK). Each model's
run writes its own JSON (benchmarks/results/whole_models_<model>.json) as soon as it ends, so a model that
finishes is kept when a later one does not; this script then combines them into --out with the command,
the host CPU and the ratios: end-to-end latency of tlm against each other runner, and schedule time
(generation or tuning + checks + compile) of tlm against each other policy, and plots both (PNG next to
--out, when matplotlib is installed).
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "benchmarks" / "results" / "whole_models.json"
MODELS = {"bert-base": ["--seq", "128"], "resnet50": ["--batch", "1"]}
POLICIES = ("tlm", "metaschedule:64", "roller", "default")


def run_model(model: str, policies, repeats: int, small: bool, out_json: Path, workdir: Path, log,
              reuse: bool = False) -> dict | None:
    cmd = [sys.executable, "-m", "tensorlang", "bench-model", "--model", model, "--target", "llvm",
           *(["--small"] if small else MODELS[model]), *sum([["--policy", p] for p in policies], []),
           "--repeats", str(repeats), "--workdir", str(workdir / model), "--json", str(out_json),
           *(["--reuse-builds"] if reuse else [])]
    log(f"$ {shlex.join(cmd)}")
    t0 = time.time()
    with open(workdir / f"{model}.log", "w") as f:
        r = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=f, text=True)
    print(r.stdout, flush=True)
    if r.returncode not in (0, 1) or not out_json.exists():
        log(f"{model}: bench-model failed (exit {r.returncode}); see {workdir / (model + '.log')}")
        return None
    res = json.loads(out_json.read_text())
    res["command"] = shlex.join(cmd)
    res["wall_s"] = round(time.time() - t0, 1)
    out_json.write_text(json.dumps(res, indent=1) + "\n")
    return res


def ratios(res: dict, base: str = "tlm") -> dict:
    rows = {r["runner"]: r for r in res["rows"]}
    b = rows.get(base)
    if b is None:
        return {}
    out = {"latency_speedup_of_tlm_vs": {}, "schedule_time_ratio_tlm_over": {}}
    for name, r in rows.items():
        if name == base:
            continue
        if b["outputs_ok"] and r["outputs_ok"]:
            out["latency_speedup_of_tlm_vs"][name] = r["median_ms"] / b["median_ms"]
        if b["schedule_s"] and r.get("schedule_s"):
            out["schedule_time_ratio_tlm_over"][name] = b["schedule_s"] / r["schedule_s"]
    return out


def plot(results: dict, path: Path) -> str | None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed: no plot"
    models = [m for m in results if results[m]]
    names: list[str] = []  # every runner, in order of appearance: one colour and one slot each
    for m in models:
        names += [r["runner"] for r in results[m]["rows"] if r["runner"] not in names]
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for ax, key, title, unit in ((axes[0], "median_ms", "end-to-end latency (median)", "ms"),
                                 (axes[1], "schedule_s", "schedule time (generation/tuning + compile)", "s")):
        width = 0.8 / max(1, len(names))
        labelled = set()
        for i, m in enumerate(models):
            for r in results[m]["rows"]:
                v = r.get(key)
                if v is None:
                    continue
                j = names.index(r["runner"])
                ax.bar(i + j * width, v, width, color=f"C{j}",
                       label=r["runner"] if r["runner"] not in labelled else None)
                labelled.add(r["runner"])
                ax.text(i + j * width, v, f"{v:.3g}", ha="center", va="bottom", fontsize=7, rotation=90)
        ax.set_xticks([i + 0.4 - width / 2 for i in range(len(models))], models)
        ax.set_yscale("log")
        ax.set_ylabel(unit)
        ax.set_title(title)
    axes[0].legend(fontsize=8)
    host = next(iter(results.values()))["host"]
    fig.suptitle(f"whole models on {host}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return None


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    p.add_argument("--policy", action="append", help=f"policies (default: {' '.join(POLICIES)})")
    p.add_argument("--repeats", type=int, default=30)
    p.add_argument("--small", action="store_true", help="the small configs (a quick check of this script)")
    p.add_argument("--out", default=str(OUT))
    p.add_argument("--workdir", help="where the executables are built (default: a new folder under $TMPDIR); "
                                     "with --reuse-builds, a killed run's builds there are timed, not rebuilt")
    p.add_argument("--reuse-builds", action="store_true")
    p.add_argument("--reuse", action="append", default=[], choices=list(MODELS),
                   help="do not run MODEL: combine its JSON of an earlier run (whole_models_<model>.json)")
    args = p.parse_args(argv)
    if os.environ.get("TENSORLANG_MEASURE_LOCK"):
        print(f"benchmarks/whole_models.py: warning: TENSORLANG_MEASURE_LOCK={os.environ['TENSORLANG_MEASURE_LOCK']}: "
              f"timed under that lock, not the machine-wide one (the JSON says so); unset it for real figures",
              file=sys.stderr)
    policies = args.policy or list(POLICIES)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    workdir = Path(args.workdir or Path(os.environ.get("TMPDIR", "/tmp")) / f"whole_models-{os.getpid()}")
    workdir.mkdir(parents=True, exist_ok=True)

    def log(msg):
        print(f"[{_dt.datetime.now(_dt.timezone.utc):%H:%M:%S}] {msg}", file=sys.stderr, flush=True)
    started = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    results = {}
    for m in args.models:
        per = out.with_name(f"{out.stem}_{m}{'-small' if args.small else ''}.json")
        if m in args.reuse:
            results[m] = json.loads(per.read_text()) if per.exists() else None
            log(f"{m}: reused {per}" if results[m] else f"{m}: no {per} to reuse")
            continue
        results[m] = run_model(m, policies, args.repeats, args.small, per, workdir, log, args.reuse_builds)
    from tensorlang.machine import describe, host_line
    combined = {
        "command": shlex.join([sys.executable, *sys.argv]) if argv is None else shlex.join(argv),
        "started": started, "finished": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "host": host_line(), "machine": describe(), "policies": policies,
        "measure_lock": os.environ.get("TENSORLANG_MEASURE_LOCK") or "machine-wide (/tmp/tensorlang-measure.lock)", "repeats": args.repeats,
        "small": args.small, "reused": args.reuse, "models": {m: r for m, r in results.items()},
        "ratios": {m: ratios(r) for m, r in results.items() if r},
        "missing": [m for m, r in results.items() if not r],
    }
    png = out.with_suffix(".png")
    why = plot({m: r for m, r in results.items() if r}, png) if any(results.values()) else "no results"
    combined["plot"] = png.name if why is None else why
    out.write_text(json.dumps(combined, indent=1) + "\n")
    for m, r in combined["ratios"].items():
        if not r:
            continue
        print(f"{m}: tlm end-to-end speed-up vs " + ", ".join(f"{k} {v:.2f}x" for k, v in
                                                               r["latency_speedup_of_tlm_vs"].items()))
        print(f"{m}: tlm schedule time / " + ", ".join(f"{k} {v:.3g}" for k, v in
                                                       r["schedule_time_ratio_tlm_over"].items()))
    print(f"host: {combined['host']}; -> {out}" + (f", {png}" if why is None else f" ({why})"))
    return 0 if not combined["missing"] else 1


if __name__ == "__main__":
    sys.exit(main())
