"""Where an rfactor's strided partial sums are fast: the measurement behind space/partial_sums.py's constants,
re-run on this host. Prints a table, writes JSON.

    .venv/bin/python benchmarks/partial_sums.py [--json benchmarks/results/partial_sums_<cpu>.json]

EfficientNet's 32x112x112 mean (data/workloads/efficientnet-b0/mean.tsched) under one schedule form -- the
reduction split r x b, the partial sums of the inner part (`rfactor`) computed at the consumer's channel loop,
which TVM regenerates partial sums outermost, so the r-long loop reads with a stride of b -- for each (r, b,
unroll step) of VARIANTS, beside the same split with the partial sums at the root (vectorised along memory).
All are timed side by side in one `tensorlang bench` run (the harness: interleaved rounds, checked against
NumPy). Each row says whether partial_sums.unrolled predicts the strided form fast (its loop unrolls) and
whether it was (within FAST_WITHIN of the root form): the rule's constants hold on this host where they
agree. The constants were measured on znver4; an AVX2-only host may draw the line elsewhere.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tensorlang.machine import describe, host  # noqa: E402
from tensorlang.space.partial_sums import LLVM_UNROLLS, LONGEST_UNROLLED, unrolled  # noqa: E402

MEAN = ROOT / "data" / "workloads" / "efficientnet-b0" / "mean.tsched"
# (r, b, unroll step): both sides of each boundary (TVM's step, LLVM's own unroll, what LLVM still vectorises)
VARIANTS = [(196, 64, 64), (196, 64, 512), (196, 64, 256), (128, 98, 128), (98, 128, 128), (224, 56, 512),
            (256, 49, 256), (256, 49, 512), (392, 32, 512), (49, 256, 0), (56, 224, 0), (64, 196, 0),
            (64, 196, 16), (64, 196, 64), (98, 128, 16), (112, 112, 0)]
FAST_WITHIN = 1.5  # a strided form within 1.5x of the root form counts as fast (the slow ones are 4-9x)


def schedule(r: int, b: int, step: int, at_channel: bool) -> str:
    """The schedule form the shipped model wrote for the mean (at_channel), or its partial sums at the root."""
    lines = ["k23 = fuse(lv10_red.k2, lv10_red.k3)", f"k23_0, k23_1 = split(k23, [{r}, {b}])",
             "lv10_red_rf = rfactor(k23_1, 4)", "compute_at(lv10_red, T_divide.ax1, preserve_unit_loops=True)",
             "ax0, ax1, ax0_2, ax1_2, ax2, ax3, ax4 = get_loops(lv10_red)"]
    if at_channel:
        lines += ["compute_at(lv10_red_rf, ax1, preserve_unit_loops=True)",
                  "ax0_3, ax1_3, ax0_4, ax1_4, ax2_2, ax3_2, ax4_2, ax5 = get_loops(lv10_red_rf)",
                  "outer = fuse(ax0_3, ax1_3)", "parallel(outer)"]
        unrolled_at = ["outer"]
        init = "lv10_red_rf_init = decompose_reduction(lv10_red_rf, ax5)"
    else:
        lines += ["outer = fuse(lv10_red_rf.ax0, lv10_red_rf.ax1, lv10_red_rf.ax2, lv10_red_rf.ax3)", "parallel(outer)",
                  "vectorize(lv10_red_rf.k2_k3_fused_1)", "outer_2 = fuse(ax0, ax1)", "parallel(outer_2)"]
        unrolled_at = ["outer", "outer_2"]
        init = "lv10_red_rf_init = decompose_reduction(lv10_red_rf, lv10_red_rf.k2_k3_fused_0)"
    if step:
        for loop in unrolled_at:
            lines += [f'annotate({loop}, "pragma_auto_unroll_max_step", {step})',
                      f'annotate({loop}, "pragma_unroll_explicit", 1)']
    return "\n".join(lines + [init, "lv10_red_init = decompose_reduction(lv10_red, ax0_2)"])


def variants_file() -> tuple[str, dict]:
    """One .tsched with an operator per variant (the mean renamed), and {operator: (r, b, step, form)}."""
    src = MEAN.read_text()
    parts, names = ["target cpu = llvm()\n"], {}
    forms = [(r, b, s, "strided") for r, b, s in VARIANTS]
    forms += sorted({(r, b, 64, "root") for r, b, _ in VARIANTS})
    for r, b, step, form in forms:
        name = f"{form}_r{r}_b{b}_u{step}"
        names[name] = (r, b, step, form)
        body = "".join(f"    {line}\n" for line in schedule(r, b, step, form == "strided").splitlines())
        parts.append(src.replace("op mean(", f"op {name}("))
        parts.append(f"schedule {name} on cpu {{\n{body}}}\n")
    return "\n".join(parts), names


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", default=None, help="default: benchmarks/results/partial_sums_<host cpu>.json")
    ap.add_argument("--repeat", type=int, default=10)
    args = ap.parse_args(argv)
    cpu = host().name
    out_path = Path(args.json or ROOT / "benchmarks" / "results" / f"partial_sums_{cpu}.json")
    text, names = variants_file()
    with tempfile.TemporaryDirectory() as tmp:
        file, report = Path(tmp) / "mean_variants.tsched", Path(tmp) / "bench.json"
        file.write_text(text)
        cmd = [sys.executable, "-m", "tensorlang", "bench", str(file), "--target", "cpu", "--policy", "schedule",
               "--repeat", str(args.repeat), "--json", str(report)]
        subprocess.run(cmd, check=True, cwd=ROOT)
        bench = json.loads(report.read_text())
    ms = {row["op"]: row["median_ms"] for row in bench["results"]
          if row["status"] == "ok" and row["correct"]}
    rows = []
    for name, (r, b, step, form) in names.items():
        if form != "strided":
            continue
        root = ms.get(f"root_r{r}_b{b}_u64")
        got = ms.get(name)
        fast = None if got is None or root is None else got <= FAST_WITHIN * root
        rows.append({"r": r, "b": b, "unroll_step": step, "strided_ms": got, "root_ms": root,
                     "predicted_fast": unrolled(r, step), "fast": fast})
    agree = sum(x["fast"] == x["predicted_fast"] for x in rows if x["fast"] is not None)
    print(f"{'r':>5}{'b':>5}{'step':>6}{'strided ms':>12}{'root ms':>10}{'predicted':>11}{'measured':>10}")
    for x in rows:
        print(f"{x['r']:>5}{x['b']:>5}{x['unroll_step']:>6}{x['strided_ms'] or float('nan'):>12.4f}"
              f"{x['root_ms'] or float('nan'):>10.4f}{'fast' if x['predicted_fast'] else 'slow':>11}"
              f"{'-' if x['fast'] is None else 'fast' if x['fast'] else 'slow':>10}")
    print(f"the rule (LONGEST_UNROLLED {LONGEST_UNROLLED}, LLVM_UNROLLS {LLVM_UNROLLS}) agrees on {agree} of "
          f"{len(rows)} forms on {cpu}")
    out = {"command": " ".join(["python"] + sys.argv), "bench_command": " ".join(cmd[1:]).replace(str(file), "FILE"),
           "machine": describe(), "fast_within_root": FAST_WITHIN, "constants": {"LONGEST_UNROLLED": LONGEST_UNROLLED,
           "LLVM_UNROLLS": LLVM_UNROLLS}, "agree": agree, "rows": rows, "all_ms": ms}
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {out_path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
