"""`tensorlang generate FILE --target T [--op OP] [--samples K [--ranked]] [--beams N] [--seed S] [--model DIR] [--write]`

Schedules from the tensor language model for the file's `@auto` operators (or OP), as ordinary, editable
`schedule` blocks, each after a one-line comment naming the model, its version and the target. `--samples K`:
up to K distinct legal candidates, measured with the bench harness (CPU targets), the fastest kept; with `--ranked`,
ranked by the cost model instead (cost/: none measured; a sample replaces the one-pass schedule only where it is
predicted clearly faster), the policy `tlm-ranked:K`. `--beams N`:
beam search with N beams (1: greedy; default: the checkpoint's generation_config.json).
`--write` appends the blocks to the file. Where a `schedule` block for T is already partly written, it is
completed: the model keeps the written decisions (space/constraints.py) and the generated statements after
them go in before the block's `}`, the written lines left as they are.
`--ms-database DIR` also writes them as a MetaSchedule JSON database (lower/ms_database.py) with each
schedule's measured latency, which TVM's `compile_tir` accepts; CPU targets only (a record needs a latency).
"""
from __future__ import annotations

import sys
from pathlib import Path

from tensorlang.span import line_starts, offset_in


def add_arguments(p) -> None:
    p.add_argument("file")
    p.add_argument("--target", required=True)
    p.add_argument("--op", help="this operator (default: every @auto operator without a schedule for the target)")
    p.add_argument("--samples", type=int, default=1, help="K distinct legal candidates, measured; the fastest kept")
    p.add_argument("--ranked", action="store_true",
                   help="with --samples K: keep the candidate the cost model ranks first, none measured (tlm-ranked:K)")
    p.add_argument("--beams", type=int, default=None, metavar="N",
                   help="beam search with N beams, 1 = greedy (default: as the checkpoint's generation_config.json says)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--model", help="checkpoint directory (default: the shipped one)")
    p.add_argument("--write", action="store_true", help="append the schedule blocks to FILE")
    p.add_argument("--ms-database", metavar="DIR",
                   help="also write the schedules, measured, as a MetaSchedule JSON database (workloads + records)")


def _written_block(doc, op: str, target: str):
    """The file's `schedule OP on TARGET` block (complete or partly written), or None."""
    return next((s for s in doc.ast.schedules if s.op == op and s.target == target), None)


def continuation(written, stmts) -> list | None:
    """The generated statements after the written ones when the written lines are, statement for statement,
    the start of the generated schedule (names as the renderer gives them); else None."""
    from tensorlang.parser.printer import format_stmt
    from tensorlang.space.render import humanize
    gen = humanize(stmts)
    k = len(written)
    if [format_stmt(s) for s in gen[:k]] != [format_stmt(s) for s in written]:
        return None
    return gen[k:]


def main_generate(args) -> int:
    from tensorlang import diagnostics as Dg
    from tensorlang.cli import _load, _stop_on_errors, _target  # the CLI's own messages and exit codes
    from tensorlang.space.convert import render_schedule
    doc = _load(args.file)
    _stop_on_errors(doc)
    target = _target(doc, args.target)
    if args.op is not None:
        if args.op not in doc.model.ops:
            print(f"{doc.path}: error: TS104 unknown operator '{args.op}'; operators: "
                  f"{Dg.one_of(list(doc.model.ops))}", file=sys.stderr)
            return 2
        names = [args.op]
    else:  # every @auto operator: a new block, or its partly written one completed
        names = [n for n, op in doc.model.ops.items() if op.ast.is_auto]
        if not names:
            print(f"{doc.path}: no @auto operator (name one with --op)", file=sys.stderr)
            return 1
    from tensorlang.baselines.tlm import checkpoint_missing
    missing = checkpoint_missing(args.model)
    if missing:
        print(f"tensorlang generate: error: {missing} (tensorlang train ... -o DIR, then --model DIR)", file=sys.stderr)
        return 2
    if args.ms_database and target.is_gpu:
        print(f"tensorlang generate: error: --ms-database needs each schedule's measured latency; no GPU here to "
              f"time '{args.target}' on", file=sys.stderr)
        return 2
    from tensorlang.lm.generate import Generator, default_generator, fastest
    from tensorlang.machine import target_cpu
    from tensorlang.parser.printer import format_stmt
    from tensorlang.space.constraints import constraints
    from tensorlang.space.space import Space
    gen = Generator(args.model) if args.model else default_generator()
    beams = gen.num_beams if args.beams is None else args.beams
    if beams < 1:
        print("tensorlang generate: error: --beams is 1 (greedy) or more", file=sys.stderr)
        return 2
    blocks, status, entries = [], 0, []
    edits = []  # (offset in the file, text inserted there): continuations of written blocks
    src = Path(args.file).read_text()
    from tensorlang.baselines.tlm import untuned_cpu_note
    for name in names:
        op = doc.model.ops[name]
        for note in untuned_cpu_note(gen.card, target, op):  # TS410, once per process and CPU
            print(note.format(str(doc.path)), file=sys.stderr)
        space = Space(op, doc.primfunc(name), target)
        written = _written_block(doc, name, args.target)
        cons = None
        if written is not None and written.stmts:
            cons = constraints(space, written.stmts)
            if cons.outside is not None:
                print(f"{doc.path}:{cons.outside}; the other written statements' decisions are kept",
                      file=sys.stderr)
            if not cons.sketches:
                print(f"{doc.path}: error: {name}: no schedule of the space keeps the written statements",
                      file=sys.stderr)
                status = 1
                continue
        how = f", beam search with {beams} beams" if beams > 1 else ""
        if args.samples > 1 and args.ranked:
            from tensorlang.baselines.tlm import candidates, cost_model, rank_candidates
            outs = candidates(gen, space, args.samples, seed=args.seed, constraints=cons, per_sketch=True,
                              num_beams=beams)
            kept, why = rank_candidates(outs, space, target)
            best = outs[kept]
            if why:
                print(f"{doc.path}: warning: TS411 {name}: {why}", file=sys.stderr)
                how = f", the one-pass one of {len(outs)} candidates (not ranked)"
            else:
                how = (f", candidate {kept} of {len(outs)} as ranked by the cost model {cost_model().name} "
                       f"(seed {args.seed}; 0 = the one-pass one)")
        elif args.samples > 1:
            outs = gen.sample(space, args.samples, seed=args.seed, constraints=cons, num_beams=beams)
            if target.is_gpu:
                best, how = outs[0], f", the one-pass one of {len(outs)} candidates (no GPU here to time them)"
            else:
                best, results = fastest(outs, op, target)
                if best is None:
                    print(f"{doc.path}: error: TS406 {name}: none of {len(outs)} candidates ran correctly",
                          file=sys.stderr)
                    status = 1
                    continue
                ms = min(r.median_s for r in results if r.median_s) * 1e3
                how = f", fastest of {len(outs)} measured candidates ({ms:.4f} ms, seed {args.seed})"
        else:
            best = gen.generate(space, cons, num_beams=beams)
        if args.ms_database:
            entry = _database_entry(doc, name, target, best)
            if isinstance(entry, str):
                print(f"{doc.path}: error: TS406 {name}: {entry}; not in the database", file=sys.stderr)
                status = 1
            else:
                entries.append(entry)
        where = "GPU " + target.params.get("arch", "sm_90") if target.is_gpu else target_cpu(target.params).name
        comment = f"# generated by {gen.name} for target {args.target} ({where}){how}\n"
        if written is None:
            blocks.append(comment + render_schedule(name, args.target, best.point.stmts))
            continue
        rest = continuation(written.stmts, best.point.stmts)
        if rest is None:  # the model's schedule orders or names the written statements otherwise
            print(f"{doc.path}:{written.span.line}: {name}: the completed schedule keeps the written decisions but "
                  f"not their lines as written; in full (not written into the file):", file=sys.stderr)
            sys.stdout.write(comment + render_schedule(name, args.target, best.point.stmts))
            continue
        if not rest:
            print(f"{doc.path}:{written.span.line}: {name}: the schedule is complete; nothing to add", file=sys.stderr)
            continue
        lines = "".join(f"    {format_stmt(s)}\n" for s in rest)
        note = f"    # completed by {gen.name} for target {args.target} ({where}){how}\n"
        close = offset_in(line_starts(src), src, written.span.end_line - 1, written.span.end_col - 1) - 1  # the block's closing `}`
        line_start = src.rfind("\n", 0, close) + 1
        if src[line_start:close].strip():  # `}` after code on its line
            edits.append((close, "\n" + note + lines))
        else:
            edits.append((line_start, note + lines))
        blocks.append(f"# {name}: {len(rest)} statements after the {len(written.stmts)} written\n" + note + lines)
    text = "\n".join(blocks)
    if args.write and (blocks or edits):
        new = src
        for at, ins in sorted(edits, reverse=True):
            new = new[:at] + ins + new[at:]
        appended = [b for b in blocks if b.startswith("# generated")]
        if appended:
            new += ("" if new.endswith("\n") else "\n") + "\n" + "\n".join(appended)
        Path(args.file).write_text(new)
        print(f"{args.file}: wrote {len(appended)} schedule{'s' if len(appended) != 1 else ''} and completed "
              f"{len(edits)} for {args.target}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    if entries:
        from tensorlang.lower.ms_database import write_database
        write_database(args.ms_database, entries)
        print(f"{args.ms_database}: {len(entries)} tuning record{'s' if len(entries) != 1 else ''} (MetaSchedule JSON "
              f"database)", file=sys.stderr)
    return status


def _database_entry(doc, name: str, target, out):
    """The schedule applied to the operator (its trace) and timed with the bench harness -> Entry, or why not."""
    from tensorlang.bench.harness import OK, Candidate, measure_candidates
    from tensorlang.lower.ms_database import Entry
    from tensorlang.lower.schedule import apply_schedule
    from tensorlang.lower.targets import tvm_target
    from tensorlang.parser import ast as A
    from tensorlang.space.render import humanize
    op = doc.model.ops[name]
    applied = apply_schedule(doc.primfunc(name), op, A.Schedule(name, target.name, tuple(humanize(out.point.stmts))))
    if not applied.ok:
        return "the schedule did not apply: " + "; ".join(d.message for d in applied.diags)[:300]
    (res,) = measure_candidates([Candidate("tlm", op, target, out.schedule_text)], repeat=3)
    if res.status != OK or not res.median_s:
        return f"not timed ({res.status}: {res.message[:200]})"
    return Entry(doc.primfunc(name), applied.sch, tvm_target(target), res.median_s)
