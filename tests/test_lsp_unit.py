"""The language server's document analysis in-process: the incremental parser against the core parser,
the generated-schedule completion with a fake policy, positions, formatting, the handler guard, the
worker client, and random edit sequences (hypothesis) through every analysis function."""
from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from lsprotocol import types as T

from tensorlang import api, baselines
from tensorlang.lsp import features as F
from tensorlang.lsp import server as S
from tensorlang.lsp import tvm_worker as W
from tensorlang.lsp.analysis import Analysis
from tensorlang.lsp.incremental import IncrementalParser
from tensorlang.lsp.text import LineIndex
from tensorlang.lsp.worker_queue import Worker, WorkerError
from tensorlang.parser import format_module

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = {p.stem: p.read_text() for p in sorted((ROOT / "examples").glob("*.tsched"))}
MATMUL = EXAMPLES["matmul"]


def same_as_core(an: Analysis, text: str):
    ref = api.load_text(text, an.path)
    assert an.doc.diagnostics == ref.diagnostics
    assert an.ast == ref.ast
    assert [c.span for c in an.ast.comments] == [c.span for c in ref.ast.comments]
    assert an.ast.blank_lines == ref.ast.blank_lines and an.ast.unparsed == ref.ast.unparsed
    assert [(i.span, type(i)) for i in an.ast.items] == [(i.span, type(i)) for i in ref.ast.items]
    return ref


# ------------------------------------------------------------ incremental
def test_incremental_parse_equals_the_core_parse_across_edits():
    parser = IncrementalParser()
    text = MATMUL
    edits = [("    parallel(i0)", "    parallel(i0"), ("    parallel(i0", "    parallel(i0)"),
             ("# Reference", "\n\n# Reference"), ("op matmul", "@auto\nop matmul"), ("}\n\nschedule", "\nschedule"),
             ("target h200", "target  h200"), ("[16, 4, 8]", "[16, 4, 4]")]
    for old, new in edits:
        text = text.replace(old, new, 1)
        same_as_core(Analysis(text, "m.tsched", parser), text)


# ------------------------------------------------ generated schedules (fake policy)
FAKE = "i0, i1 = split(C.i, [None, 32])\nparallel(i0)\nj0, j1 = split(C.j, [None, 16])\nvectorize(j1)\n"
BASE = ("target cpu = llvm(cores = 2)\n\n@auto\nop matmul(A: f32[64, 64], B: f32[64, 64]) -> C: f32[64, 64] {\n"
        "    C[i, j] += A[i, k] * B[k, j]\n}\n")


@pytest.fixture
def fake_policy(monkeypatch):
    calls = []

    def generate(policy, mod, op, target, written=()):  # a policy that ignores what is written
        calls.append((policy, op.name, target.name, mod is not None))
        return baselines.Generated(mod, "fake", [], FAKE)

    monkeypatch.setattr(baselines, "generate", generate)
    return calls


class StubServer:
    """What the completion handlers need from the server, with the worker's functions run in-process."""

    def __init__(self):
        self.measurements = {}

    async def generation(self, an, op, target, timeout=None, written=()):
        if op not in an.model.ops or target not in an.model.targets:
            return None
        return W.generate_schedule(an.doc, op, target, written)

    async def schedule_state(self, an, op, stmts, upto_line, resolve=(), timeout=None):
        return None


def insertions(text: str, line0: int, col0: int):
    an = Analysis(text, "g.tsched", IncrementalParser())
    ctx = an.context(line0, col0)
    return an, ctx, asyncio.run(S._insertions(StubServer(), an, ctx))


def test_generated_schedule_in_an_empty_block(fake_policy):
    text = BASE + "\nschedule matmul on cpu {\n    \n}\n"
    n = text.split("\n").index("    ")
    an, ctx, found = insertions(text, n, 4)
    assert fake_policy == [("auto", "matmul", "cpu", True)]  # generate("auto", doc.primfunc(op), op, target)
    (insert, rng, gen, op, target), = found
    assert insert == "i0, i1 = split(C.i, [None, 32])\n    parallel(i0)\n    j0, j1 = split(C.j, [None, 16])\n" \
                     "    vectorize(j1)"
    assert rng == T.Range(T.Position(n, 4), T.Position(n, 4))
    item = F.generated_item(insert, rng, gen, op, target)
    assert item.detail == "generated schedule: policy 'fake', target 'cpu'"
    assert item.kind == T.CompletionItemKind.Snippet and item.text_edit.new_text == insert
    done = F.apply_edits(text, [item.text_edit])
    assert [d for d in api.check(api.load_text(done), legality=False) if d.severity == "error"] == []


def test_generated_schedule_continues_the_lines_already_written(fake_policy):
    text = BASE + "\nschedule matmul on cpu {\n    i0,i1 = split(C.i, [None, 32])\n    par\n}\n"
    n = text.split("\n").index("    par")
    _, ctx, found = insertions(text, n, 7)
    assert len(ctx.stmts_above) == 1
    (insert, rng, gen, _, _), = found
    assert insert.split("\n")[0] == "parallel(i0)" and insert.count("\n") == 2
    assert rng == T.Range(T.Position(n, 4), T.Position(n, 7))  # replaces the partial `par`


@pytest.mark.parametrize("body", [
    "    i0, i1 = split(C.i, [None, 64])\n    ",  # a written statement that differs from the policy's
    "    vec",  # a statement being typed that is not the next one
    "    \n    parallel(C.j)",  # statements after the cursor
])
def test_no_generated_schedule_when_inconsistent(fake_policy, body):
    text = BASE + "\nschedule matmul on cpu {\n" + body + "\n}\n"
    lines = text.split("\n")
    n = next(i for i, l in enumerate(lines) if l.strip() in ("", "vec") and i > 6)
    assert insertions(text, n, len(lines[n]))[2] == []


def test_no_generated_schedule_without_text(monkeypatch):
    monkeypatch.setattr(baselines, "generate", lambda p, m, o, t: baselines.Generated(m, "default", [], None))
    text = BASE + "\nschedule matmul on cpu {\n    \n}\n"
    assert insertions(text, text.split("\n").index("    "), 4)[2] == []


def test_generated_schedule_block_below_an_auto_op(fake_policy):
    text = BASE + "\n"
    n = len(text.split("\n")) - 1
    an, ctx, found = insertions(text, n, 0)
    (insert, rng, gen, op, target), = found
    assert insert.startswith("schedule matmul on cpu {\n    i0, i1 = split(C.i, [None, 32])\n") and insert.endswith("}")
    assert (op, target) == ("matmul", "cpu")
    # and as a code action on the operator
    actions = asyncio.run(S._generate_actions(StubServer(), "file:///g.tsched", an, 4, 3))
    assert [a.title for a in actions] == ["Generate schedule for matmul on cpu (policy 'fake')"]
    done = F.apply_edits(text, actions[0].edit.changes["file:///g.tsched"])
    assert "schedule matmul on cpu {\n    i0, i1 = split" in done and api.load_text(done).diagnostics == []


def test_generate_action_completes_a_schedule_block(fake_policy):
    text = BASE + "\nschedule matmul on cpu {\n    i0, i1 = split(C.i, [None, 32])\n  }\n"
    an = Analysis(text, "g.tsched", IncrementalParser())
    line0 = text.split("\n").index("schedule matmul on cpu {")
    actions = asyncio.run(S._generate_actions(StubServer(), "file:///g.tsched", an, line0, 0))
    assert [a.title for a in actions] == ["Generate schedule (3 statements from policy 'fake')"]
    done = F.apply_edits(text, actions[0].edit.changes["file:///g.tsched"])
    assert done.endswith("    i0, i1 = split(C.i, [None, 32])\n    parallel(i0)\n    j0, j1 = split(C.j, [None, 16])\n"
                         "    vectorize(j1)\n  }\n")
    one_line = BASE + "\nschedule matmul on cpu { parallel(C.i) }\n"  # not the policy's first statement
    an = Analysis(one_line, "g.tsched", IncrementalParser())
    assert asyncio.run(S._generate_actions(StubServer(), "file:///g.tsched", an, line0, 0)) == []


def labels_at(text: str, needle: str, offset: int):
    an = Analysis(text, "c.tsched", IncrementalParser())
    n = next(i for i, l in enumerate(text.split("\n")) if needle in l)
    ctx = an.context(n, text.split("\n")[n].index(needle) + offset)
    items, complete = F.completion_items(an, ctx, None, snippets=False)
    return ctx, [i.label for i in items], complete


def test_completion_while_a_line_is_being_typed():
    # an operator whose stage is half written: its tensors and the indices in use, from its lines above
    text = MATMUL.replace("    C[i, j] += A[i, k] * B[k, j]", "    C[i, j] += A[i, k] * ")
    ctx, labels, _ = labels_at(text, "A[i, k] * ", len("A[i, k] * "))
    assert ctx.where == "op_body" and {"A", "B", "C", "i", "j", "k", "exp"} <= set(labels)
    # a schedule whose statement is half written: static names (TVM's come from the worker), marked incomplete
    text = MATMUL.replace("    parallel(i0)", "    parallel(")
    ctx, labels, complete = labels_at(text, "    parallel(", len("    parallel("))
    assert (ctx.where, ctx.prim, ctx.param.name) == ("sched_arg", "parallel", "loop") and not complete
    assert {"i0", "i1", "i2", "j0", "k1"} <= set(labels) and "C.i" not in labels
    assert len(ctx.stmts_above) == 4 and ctx.upto_line == ctx.line0  # apply up to cursor line - 1 (1-based)
    # keyword arguments not given yet
    ctx, labels, _ = labels_at(MATMUL, "split(C.k, [128, 4])", len("split(C.k, [128, 4]"))
    assert labels == [] and ctx.in_list is False
    text = MATMUL.replace("split(C.k, [128, 4])", "split(C.k, [128, 4], )")
    ctx, labels, _ = labels_at(text, "split(C.k, [128, 4], )", len("split(C.k, [128, 4], "))
    assert "preserve_unit_iters=" in labels and "disable_predication=" in labels and "True" in labels


# -------------------------------------------------------------- positions
def test_utf16_positions():
    text = 'target cpu = llvm(mcpu = "\U0001F642", cores = x)\n'
    an = Analysis(text, "u.tsched", IncrementalParser(), "utf-16")
    d, = an.doc.diagnostics
    assert (d.code, d.span.col) == ("TS103", 39)  # `x`: the 39th character
    r = F.lsp_diagnostics(an, an.doc.diagnostics)[0].range
    assert r.start == T.Position(0, 39) and r.end == T.Position(0, 40)  # the emoji is two UTF-16 units
    idx = LineIndex(text, "utf-8")
    assert idx.to_units(0, 38) == 41 and idx.from_units(0, 41) == 38  # ... and four UTF-8 bytes
    assert LineIndex(text, "utf-32").to_units(0, 38) == 38


def test_formatting_edits_give_tensorlang_fmt():
    for text in EXAMPLES.values():
        messy = "\n".join(l if l.lstrip().startswith("#") else l.replace("    ", "  ").replace(", ", ",")
                          for l in text.split("\n")).replace("\n\n", "\n\n\n") + "\n\n"
        an = Analysis(messy, "f.tsched", IncrementalParser())
        assert F.apply_edits(messy, F.formatting_edits(an)) == format_module(an.ast) == text
        clean = Analysis(text, "f.tsched", IncrementalParser())
        assert F.formatting_edits(clean) == []
    no_newline = MATMUL.rstrip("\n") + "   "
    an = Analysis(no_newline, "f.tsched", IncrementalParser())
    assert F.apply_edits(no_newline, F.formatting_edits(an)) == MATMUL


# --------------------------------------------------------------- robustness
def test_guard_turns_an_exception_into_an_empty_result():
    reported = []
    ls = SimpleNamespace(report=lambda where, e: reported.append((where, str(e))))

    @S.guarded(lambda: [], "thing")
    def broken(ls, params):
        raise ValueError("boom")

    @S.guarded(lambda: None, "async thing")
    async def broken_async(ls, params):
        raise KeyError("bang")

    assert broken(ls, None) == [] and asyncio.run(broken_async(ls, None)) is None
    assert reported == [("thing", "boom"), ("async thing", "'bang'")]


def test_server_start_up_does_not_import_tvm():
    code = ("import sys; import tensorlang.lsp.server as s; s.create_server(); "
            "print('tvm' in sys.modules, 'pygls' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.split() == ["False", "True"], out.stderr


def test_core_modules_do_not_import_pygls():
    code = "import sys, tensorlang.api, tensorlang.cli, tensorlang.lsp.tvm_worker; print('pygls' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.split() == ["False"], out.stderr


def test_worker_client_drops_unwanted_jobs_and_survives_a_crash():
    async def scenario():
        w = Worker("test")
        job = w.submit("crash")  # nobody waits for it: dropped before it starts
        with pytest.raises(asyncio.CancelledError):
            await job.future
        assert w.started == 0
        with pytest.raises(WorkerError, match="stopped"):
            await w.call("crash")  # the worker dies mid-job
        result = await w.call("legality", MATMUL, "m.tsched", 0, timeout=120)
        assert result == [] and w.started == 2  # restarted for the next job
        with pytest.raises(WorkerError, match="no job"):
            await w.call("nonexistent")
        await w.close()
    asyncio.run(scenario())


def test_worker_schedule_state_names_after_a_line():
    doc = api.load_text(MATMUL)
    sched = doc.model.schedule_for("matmul", "h200")
    line = next(s.span.line for s in sched.stmts if s.prim == "compute_at" and s.args[0].text == "AS")
    state = W.schedule_state(doc.model.ops["matmul"], sched, line, ("AS.ax0", "tx", "nope"))
    names = [r["name"] for r in state["loops"]]
    assert {"AS.ax0", "AS.ax1", "k0", "tx"} <= set(names) and "BS.ax0" not in names
    assert state["resolved"]["AS.ax0"]["loop"]["extent"] == 64
    assert state["resolved"]["tx"]["loop"]["binding"] == "threadIdx.x"
    assert "unknown loop 'nope'" in state["resolved"]["nope"]["error"]



UNROLLED = BASE.replace("@auto\n", "") + """schedule matmul on cpu {
    i0, i1 = split(C.i, [None, 4])
    j0, j1 = split(C.j, [None, 16])
    k0, k1 = split(C.k, [None, 4])
    reorder(i0, j0, k0, k1, i1, j1)
    parallel(i0)
    vectorize(j1)
    annotate(j0, "pragma_auto_unroll_max_step", STEP)
    C_init = decompose_reduction(C, k0)
}
"""


@pytest.mark.parametrize("step, unrolled, statements, left", [
    # the init nest: 4 rows of one 16-wide vector store; k1 x i1: 4 x 4 vector steps fit 16, k0 x 16 do not
    (16, [("C_init.i_1_init", 4), ("i1", 4), ("k1", 4)], 4 + 16,
     [("k0", 16, "16 x 16 steps > 16"), ("j0", 4, "a loop inside it stays a loop")]),
    # at 512 k0 unrolls too (16 x 16 = 256); j0 would make 4 x 260
    (512, [("C_init.i_1_init", 4), ("i1", 4), ("k1", 4), ("k0", 16)], 4 + 256, [("j0", 4, "4 x 260 steps > 512")]),
])
def test_worker_unroll_report_names_what_the_build_unrolls(step, unrolled, statements, left):
    doc = api.load_text(UNROLLED.replace("STEP", str(step)))
    assert not doc.diagnostics
    report = W.unroll_report(doc.model.ops["matmul"], doc.model.schedule_for("matmul", "cpu"))
    assert report == [{"step": step, "unrolled": unrolled, "statements": statements, "left": left}]
    text = F.unroll_text(report)
    assert text.startswith(f"at build, step {step} unrolls `C_init.i_1_init` (4), ") and f": {statements} statements" in text

# -------------------------------------------------------------------- fuzz
PIECES = ["(", ")", "[", "]", "{", "}", ",", "=", ".", ":", "+=", "split", "fuse", "bind", "C.i", "AS.", "i0",
          "threadIdx.x", "\n", "    ", "# c", '"', "@auto", "op ", "schedule ", "target ", "on", "3", "None",
          "[16, 4]", "f32[4]", "\U0001F642"]


@st.composite
def edit_sequences(draw):
    name = draw(st.sampled_from(sorted(EXAMPLES)))
    edits = draw(st.lists(st.tuples(st.floats(0, 1), st.sampled_from(["insert", "delete", "replace", "line"]),
                                    st.sampled_from(PIECES), st.integers(1, 12)), min_size=1, max_size=6))
    probes = draw(st.lists(st.tuples(st.floats(0, 1), st.floats(0, 1)), min_size=1, max_size=4))
    return name, edits, probes


def _apply(text: str, edit) -> str:
    where, kind, piece, n = edit
    i = int(where * len(text))
    if kind == "insert":
        return text[:i] + piece + text[i:]
    if kind == "delete":
        return text[:i] + text[i + n:]
    if kind == "replace":
        return text[:i] + piece + text[i + n:]
    lines = text.split("\n")
    k = int(where * (len(lines) - 1))
    return "\n".join(lines[:k] + lines[k + 1:])


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(edit_sequences())
def test_random_edit_sequences_through_every_analysis_function(seq):
    name, edits, probes = seq
    parser = IncrementalParser()
    text = EXAMPLES[name]
    stub = StubServer()
    for edit in edits:
        text = _apply(text, edit)
        started = time.perf_counter()
        an = Analysis(text, "fuzz.tsched", parser)
        ref = same_as_core(an, text)
        diags = F.lsp_diagnostics(an, an.doc.diagnostics)
        assert len(diags) == len(set((d.code, d.message, d.range.start.line, d.range.start.character) for d in diags))
        assert len(F.semantic_tokens(an)) % 5 == 0
        F.folding_ranges(an)
        F.document_symbols(an)
        edits_ = F.formatting_edits(an)
        if not an.has_syntax_errors():
            assert F.apply_edits(text, edits_) == format_module(ref.ast)
        lines = text.split("\n")
        for fl, fc in probes:
            line0 = int(fl * (len(lines) - 1))
            col0 = int(fc * len(lines[line0]))
            ctx = an.context(line0, col0)
            snippets = fc < 0.5
            items, _ = F.completion_items(an, ctx, None, snippets=snippets)
            for item in items:
                r = item.text_edit.range
                assert r.start.line == r.end.line == line0 and r.start.character <= r.end.character
                assert snippets or item.insert_text_format != T.InsertTextFormat.Snippet
            occ = an.occurrence_at(line0 + 1, col0 + 1)
            if occ is not None:
                an.definition_of(occ)
                an.references_of(occ)
            asyncio.run(S._hover_text(stub, "file:///fuzz.tsched", an, line0, col0))
            F.quick_fixes(an, "file:///fuzz.tsched", diags)
        assert time.perf_counter() - started < 10, "an edit took more than 10 s: a hang"


def test_measurement_text_shows_an_unchecked_timing_with_its_reason():
    from tensorlang.lsp.features import measurement_text
    r = {"status": "ok", "ok": True, "median_ms": 1.5, "gflops": 2.0, "max_rel": 1e-7}
    assert "**1.500 ms** median, 2.00 GFLOP/s, max rel err 1.0e-07, ok" in measurement_text({"ok": True, "result": r})
    u = dict(r, status="unchecked", ok=False)
    text = measurement_text({"ok": False, "result": u, "error": "unchecked: TS408 the NumPy reference would take ..."})
    assert "**1.500 ms** median" in text and text.endswith("unchecked: TS408 the NumPy reference would take ...")
    assert "failed: crash: the runner died" in measurement_text({"ok": False, "result": None,
                                                                "error": "crash: the runner died"})
