"""`tensorlang bench-model`: whole-model latency of several schedule policies against PyTorch, on one CPU.

    tensorlang bench-model --model bert-base --seq 128 --target llvm --policy tlm --policy roller \\
        --policy default --policy metaschedule:64 --json bench.json

Per policy, one executable: `tlm`, `roller`, `default` are built by compile-model (network/compile.py);
`metaschedule:N` is TVM's own path -- `ms.relax_integration.tune_relax` with N trials per task on the
original PrimFuncs (MetaSchedule's evolutionary search, XGBoost cost model, local runner; the builder of
baselines/metaschedule.py, which skips a 22 s import per worker), then its records applied to the same module
(`MetaScheduleApplyDatabase`; apply_database says why not `compile_relax`) and the same build as the others.
Each policy's schedule time is what it took to make its executable from the extracted Relax module:
generation (or tuning) + checks + compile.

PyTorch eager (and `torch.compile`, where it works here; its first call -- the compilation -- is not
timed) run the same module with the same weights on the same inputs. Thread count: the same for all
(`TVM_NUM_THREADS` and `torch.set_num_threads`, the usable cores unless --threads). Every executable's
outputs are compared with PyTorch eager's (compile.TOLERANCE) before it is timed; a mismatch is
reported and its latency kept out of the speed-ups.

Timing: under the machine-wide measurement lock, `--repeats` rounds; in each round every runner is
called once after the others (interleaved, so drift hits all alike), each call after a 50 ms pause (so
that the previous runner's idle worker threads -- TVM's pool and PyTorch's OpenMP threads both spin
for a while after a parallel region -- have stopped competing for the cores); the median per runner is
the latency. Each executable is also profiled (network/profile.py) to give the share of its latency spent
in subgraphs that fell back to `default` -- never hidden.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path


def _set_threads(n: int) -> None:
    os.environ["TVM_NUM_THREADS"] = str(n)  # read when TVM's thread pool starts (first parallel kernel)
    import torch
    torch.set_num_threads(n)


def build_metaschedule(model: str, trials: int, out: Path, batch=1, seq=None, small=False, image=None,
                       log=None) -> dict:
    """TVM's own path: tune_relax (N trials per task), its records applied to the tuned module, the build of
    compile.relax_build; writes OUT like compile-model does
    (executable, manifest with one entry per subgraph, weights, inputs) so that profile and bench read it."""
    import numpy as np
    from tvm.s_tir import meta_schedule as ms

    from tensorlang.baselines.metaschedule import builder
    from tensorlang.machine import describe, host_line, usable_cores
    from tensorlang.network import compile as C
    log = log or (lambda m: print(m, file=sys.stderr, flush=True))
    t0 = time.time()
    prep = C.prepare(model, batch, seq, small, image, "llvm", log)
    subs, _ = C.subgraphs_of(prep)
    target = C.tvm_build_target("llvm")
    t_prep = time.time()
    work = Path(tempfile.mkdtemp(prefix="ms-relax-", dir=str(out.parent)))
    log(f"{model}: metaschedule:{trials}: tune_relax, {len(prep.tasks)} tasks x {trials} trials (work dir {work})")
    # TVM's own rules for this CPU may tensorize (VNNI dot products): the intrinsics must be registered here
    # (the ~22 s import is part of its tuning time); the builder's workers do not need them.
    import tvm.s_tir.tensor_intrin  # noqa: F401
    db = ms.relax_integration.tune_relax(
        mod=prep.mod, params={}, target=target, work_dir=str(work),
        max_trials_global=trials * len(prep.tasks), max_trials_per_task=trials,
        num_trials_per_iter=min(64, trials), builder=builder(str(work), usable_cores()),
        runner=ms.runner.LocalRunner(), seed=0)
    t_tune = time.time()
    mod, tuned_functions = apply_database(db, prep.mod, target)
    for s in subs:
        if all(name in tuned_functions for name in s.functions):
            s.source, s.policy = "metaschedule", f"metaschedule:{trials}"
        else:
            s.source, s.policy = "fallback", "default"
            s.fallback = "no tuning record for this subgraph: DLight's CPU rules on the original PrimFunc"
            for name in s.functions:
                mod.update_func(mod.get_global_var(name), C.default_schedule_original(mod[name], "llvm"))
    mod = C.lower_leftovers(mod, subs, "llvm")
    ex = C.relax_build(mod, "llvm")
    t_build = time.time()
    paths = C.paths_of(out)
    ex.export_library(str(paths["so"]))
    np.savez(paths["params"], *[p.numpy() for p in prep.params])
    np.savez(paths["inputs"], *prep.inputs)
    from dataclasses import asdict
    manifest = {"model": model, "small": small, "config": prep.spec_config, "target": "llvm",
                "target_detail": str(target), "policy": f"metaschedule:{trials}", "path": "tune_relax + MetaScheduleApplyDatabase",
                "host": host_line(), "machine": describe(),
                "seconds": {"extract": round(t_prep - t0, 2), "schedule": round(t_tune - t_prep, 2),
                            "build": round(t_build - t_tune, 2), "generation_and_compile": round(t_build - t_prep, 2)},
                "params": len(prep.params), "inputs": [list(x.shape) for x in prep.inputs],
                "subgraphs": [asdict(s) for s in subs], "fallbacks": sum(1 for s in subs if s.source == "fallback"),
                "edited": 0, "files": {"executable": paths["so"].name}}
    manifest["torch_check"] = C.compare_with_torch(ex, prep, model, batch, seq, small, image)
    paths["manifest"].write_text(json.dumps(manifest, indent=1, default=str) + "\n")
    import shutil
    shutil.rmtree(work, ignore_errors=True)
    log(f"{model}: metaschedule:{trials}: tuned {t_tune - t_prep:.0f} s, compiled {t_build - t_tune:.0f} s; "
        f"{manifest['fallbacks']} subgraphs without a record")
    return manifest


def apply_database(db, mod, target) -> tuple[object, set[str]]:
    """`mod` with every PrimFunc the database has a record for replaced by its best schedule
    (MetaSchedule's own `MetaScheduleApplyDatabase`), and the names of the functions replaced, read from the
    module it returns (the `tirx.is_scheduled` mark), so the manifest says what is built.

    Why not `compile_relax`: TVM 0.27's runs LegalizeOps, AnnotateTIROpPattern, FuseOps and FuseTIR again
    before it applies the database. On a module fused already (what `extract` gives and tune_relax tuned)
    AnnotateTIROpPattern adds an `op_pattern` attribute to every fused PrimFunc that lacked one, which
    changes its structural hash: no record matches it any more (measured on a small BERT: 7 of the 20 tuned
    functions found, none of the fused matmuls; BERT-base's metaschedule:64 row ran at `default`'s latency).
    Here the records go into the very module that was tuned, and the build is the other policies'
    (compile.relax_build)."""
    import tvm
    from tvm import relax, tirx
    with target, db, tvm.transform.PassContext(opt_level=3):
        mod = relax.transform.MetaScheduleApplyDatabase(enable_warning=False)(mod)
    tuned = {gv.name_hint for gv, f in mod.functions.items() if isinstance(f, tirx.PrimFunc)
             and f.attrs is not None and "tirx.is_scheduled" in f.attrs and bool(f.attrs["tirx.is_scheduled"])}
    return mod, tuned


def _call_seconds(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _reusable(out: Path, model: str, policy: str, small: bool) -> dict | None:
    """The manifest of an executable built before at OUT for this model, policy and machine (and, for tlm,
    the same checkpoint and decoding switches: compile.generator_of), else None."""
    from tensorlang.machine import describe
    from tensorlang.network.compile import generator_of, paths_of
    paths = paths_of(out)
    if not (out.exists() and paths["manifest"].exists() and paths["params"].exists() and paths["inputs"].exists()):
        return None
    try:
        m = json.loads(paths["manifest"].read_text())
    except ValueError:
        return None
    same = (m.get("model"), m.get("policy"), bool(m.get("small")), (m.get("machine") or {}).get("machine_id"),
            m.get("generator"))
    return m if same == (model, policy, small, describe().get("machine_id"), generator_of(policy)) else None


def build_policy(model: str, policy: str, out: Path, batch=1, seq=None, small=False, image=None) -> dict:
    from tensorlang.network import compile as C
    if policy.startswith("metaschedule"):
        return build_metaschedule(model, int(policy.partition(":")[2] or 64), out, batch, seq, small, image)
    return C.compile_model(model, out, "llvm", policy, batch, seq, small, image, progress=True).manifest


def _torch_runners(model: str, batch, seq, small, image, inputs) -> tuple[dict, dict]:
    """name -> zero-argument callable; name -> note (why torch.compile is missing, its compile time)."""
    import torch

    from tensorlang.data import models
    spec = models.build(model, batch=batch, seq=seq, small=small, image=image)
    module = spec.module
    args = [torch.from_numpy(x) for x in inputs]

    def eager():
        with torch.no_grad():
            return module(*args)
    runners, notes = {"pytorch-eager": eager}, {}
    try:
        t0 = time.time()
        compiled = torch.compile(module)
        with torch.no_grad():
            compiled(*args)  # compiles
        notes["pytorch-compile"] = f"torch.compile (inductor): first call (compilation) {time.time() - t0:.1f} s, not timed"

        def comp():
            with torch.no_grad():
                return compiled(*args)
        runners["pytorch-compile"] = comp
    except Exception as e:
        notes["pytorch-compile"] = f"torch.compile does not work here: {type(e).__name__}: {str(e).strip()[:200]}"
    return runners, notes


def bench_model(model: str, policies: list[str], batch=1, seq=None, small=False, image=None, repeats: int = 30,
                threads: int | None = None, workdir: str | Path | None = None, log=None, gap_s: float = 0.05,
                reuse_builds: bool = False, runner_budget_s: float = 60.0) -> dict:
    """`reuse_builds`: an executable already in `workdir` for the same model, policy and machine is timed
    again instead of rebuilt (MetaSchedule's tuning takes many minutes; the caller vouches that code and
    config are unchanged). `runner_budget_s`: a runner whose warm-up call takes long gets fewer rounds,
    budget / warm-up time but at least 5 (an untuned BERT-base takes 20-40 s a call: 30 rounds of it
    alone took 20 minutes); the rows say how many."""
    from tensorlang.bench.lock import measure_lock
    from tensorlang.machine import describe, host_line, usable_cores
    from tensorlang.network import profile as P
    log = log or (lambda m: print(m, file=sys.stderr, flush=True))
    threads = threads or usable_cores()
    _set_threads(threads)
    work = Path(workdir or tempfile.mkdtemp(prefix="bench-model-"))
    work.mkdir(parents=True, exist_ok=True)
    tag = f"{model}{'-small' if small else ''}"
    manifests = {}
    for pol in policies:
        out = work / f"{tag}-{pol.replace(':', '')}.so"
        old = _reusable(out, model, pol, small) if reuse_builds else None
        if old is not None:
            log(f"== {model}: policy {pol}: reusing {out} (--reuse-builds)")
            manifests[pol] = old
            continue
        log(f"== {model}: building with policy {pol}")
        manifests[pol] = build_policy(model, pol, out, batch, seq, small, image)
        import gc
        gc.collect()
    from tensorlang.network.compile import compare_outputs, flatten_tvm, load_built
    runners, checks, profiles = {}, {}, {}
    first = work / f"{tag}-{policies[0].replace(':', '')}.so"
    _, _, _, inputs = load_built(first)
    t_runners, notes = _torch_runners(model, batch, seq, small, image, inputs)
    ref = torch_outputs_from(t_runners["pytorch-eager"]())
    for name, fn in t_runners.items():
        checks[name] = compare_outputs(torch_outputs_from(fn()), ref)
    for pol in policies:
        out = work / f"{tag}-{pol.replace(':', '')}.so"
        ex, man, params, inp = load_built(out)
        vm, args = P.vm_args(ex, params, inp)
        main = vm["main"]
        checks[pol] = compare_outputs(flatten_tvm(main(*args)), ref)
        runners[pol] = (lambda m=main, a=args: m(*a))
    runners.update(t_runners)
    names = list(runners)
    times: dict[str, list[float]] = {n: [] for n in names}
    rounds: dict[str, int] = {}
    with measure_lock() as held:
        for n in names:  # warm-up; a first call pays one-time costs (thread pool, first touch of the weights)
            call_s = _call_seconds(runners[n])
            if call_s < runner_budget_s / 2:
                call_s = min(call_s, _call_seconds(runners[n]))
            rounds[n] = max(5, min(repeats, int(runner_budget_s / max(call_s, 1e-9))))
        log(f"{model}: measurement lock held (waited {held.wait_s:.0f} s); {repeats} interleaved rounds"
            + "".join(f", {n} {k}" for n, k in rounds.items() if k < repeats))
        for i in range(repeats):
            for n in names:
                if i >= rounds[n]:
                    continue
                time.sleep(gap_s)  # the last runner's worker threads stop spinning (TVM's pool, OpenMP's)
                t0 = time.perf_counter()
                runners[n]()
                times[n].append(time.perf_counter() - t0)
        for pol in policies:
            profiles[pol] = P.profile(work / f"{tag}-{pol.replace(':', '')}.so", runs=5, warmup=1, lock=False)
    rows = []
    for n in names:
        man = manifests.get(n)
        rows.append({
            "runner": n, "median_ms": statistics.median(times[n]) * 1e3, "times_ms": [t * 1e3 for t in times[n]],
            "rounds": len(times[n]),
            "outputs_ok": checks[n]["ok"], "max_rel_err": checks[n]["max_rel_err"],
            "schedule_s": man["seconds"]["generation_and_compile"] if man else None,
            "schedule_detail_s": man["seconds"] if man else None,
            "fallback_subgraphs": man["fallbacks"] if man else None,
            "fallback_share": profiles[n]["fallback_share"] if n in profiles else None,
            "subgraphs": len(man["subgraphs"]) if man else None,
            "note": notes.get(n)})
    for r in rows:
        r["speedup_vs"] = {o["runner"]: o["median_ms"] / r["median_ms"] for o in rows
                           if o is not r and r["outputs_ok"] and o["outputs_ok"]}
        r["schedule_time_ratio_vs"] = {o["runner"]: r["schedule_s"] / o["schedule_s"] for o in rows
                                       if o is not r and r["schedule_s"] and o["schedule_s"]}
    return {"model": model, "small": small, "batch": batch, "seq": seq, "image": image,
            "config": manifests[policies[0]]["config"], "host": host_line(), "machine": describe(threads),
            "threads": threads, "repeats": repeats, "lock_wait_s": held.wait_s,
            "tolerance": checks[policies[0]]["tolerance"], "rows": rows,
            "profiles": {p: {k: v for k, v in profiles[p].items() if k != "executable"} for p in profiles},
            "workdir": str(work)}


def torch_outputs_from(res) -> list:
    from torch.utils._pytree import tree_flatten
    if hasattr(res, "to_tuple"):
        res = res.to_tuple()
    leaves, _ = tree_flatten(res)
    return [t.detach().numpy() for t in leaves if hasattr(t, "detach")]


def format_table(r: dict) -> str:
    rows = r["rows"]
    names = [x["runner"] for x in rows]
    head = (f"{r['model']} ({r['config'].get('class')}, input {'x'.join(map(str, r['config']['input_shape']))}) on "
            f"{r['host']}, {r['threads']} threads; median of {r['repeats']} interleaved rounds under the measurement "
            f"lock; outputs checked against PyTorch eager ({r['tolerance']})")
    cols = f"{'runner':<18} {'latency ms':>11} " + " ".join(f"{'vs ' + n[:12]:>15}" for n in names) + \
           f" {'schedule s':>11} {'fallback':>9} {'outputs':>8}"
    lines = [head, cols]
    for x in rows:
        sp = " ".join(f"{(x['speedup_vs'].get(n, float('nan'))):>14.2f}x" if n != x["runner"] else f"{'-':>15}"
                      for n in names)
        sched = f"{x['schedule_s']:>11.1f}" if x["schedule_s"] is not None else f"{'-':>11}"
        fb = f"{100 * x['fallback_share']:>8.1f}%" if x["fallback_share"] is not None else f"{'-':>9}"
        ok = "ok" if x["outputs_ok"] else "MISMATCH"
        lines.append(f"{x['runner']:<18} {x['median_ms']:>11.3f} {sp} {sched} {fb} {ok:>8}")
    lines.append("vs X: X's latency / this runner's latency (> 1: this one is faster). schedule s: generation (or "
                 "tuning) + checks + compile of the executable. fallback: share of the latency in subgraphs built "
                 "with the default schedule.")
    fewer = [f"{x['runner']} {x['rounds']}" for x in rows if x.get("rounds", r["repeats"]) < r["repeats"]]
    if fewer:
        lines.append(f"rounds: {', '.join(fewer)} (slow runners: --runner-budget seconds of calls, at least 5)")
    for x in rows:
        if x.get("note"):
            lines.append(f"note: {x['runner']}: {x['note']}")
    return "\n".join(lines)


def add_arguments(p: argparse.ArgumentParser) -> None:
    from tensorlang.network.compile import add_model_arguments
    add_model_arguments(p)
    p.add_argument("--policy", action="append", required=True, help="tlm | roller | default | metaschedule:N (repeat)")
    p.add_argument("--repeats", type=int, default=30)
    p.add_argument("--threads", type=int, help="threads for TVM and PyTorch (default: the usable cores)")
    p.add_argument("--workdir", help="where the executables are built (default: a temporary directory)")
    p.add_argument("--json", help="write the results as JSON")
    p.add_argument("--reuse-builds", action="store_true",
                   help="time executables already in --workdir for the same model, policy and machine again "
                        "instead of rebuilding them")
    p.add_argument("--runner-budget", type=float, default=60.0, metavar="S",
                   help="a runner whose warm-up call is slow gets S / that time rounds (at least 5)")


def cmd_bench_model(args) -> int:
    from tensorlang.network.compile import BuildStopped, _policy_ok
    if args.target == "cuda":
        print("tensorlang bench-model: CUDA executables cannot run here (no GPU); use compile-model --target cuda",
              file=sys.stderr)
        return 2
    for pol in args.policy:
        problem = _policy_ok(pol)
        if problem:
            print(f"tensorlang bench-model: {problem}", file=sys.stderr)
            return 2
    try:
        r = bench_model(args.model, args.policy, args.batch, args.seq, args.small, args.image, args.repeats,
                        args.threads, args.workdir, reuse_builds=args.reuse_builds,
                        runner_budget_s=args.runner_budget)
    except BuildStopped as e:
        print(f"tensorlang bench-model: {e}", file=sys.stderr)
        return 1
    r["command"] = "tensorlang bench-model " + " ".join(sys.argv[2:] if len(sys.argv) > 2 else [])
    print(format_table(r))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(r, indent=1, default=str) + "\n")
    return 0 if all(x["outputs_ok"] for x in r["rows"]) else 1


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="tensorlang bench-model", description=__doc__.split("\n")[0])
    add_arguments(p)
    return cmd_bench_model(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
