"""The tensorlang language server: `tensorlang lsp` (stdio), built on pygls 2.

The main loop parses and checks (`incremental` + `check_module`, the same as `api.check(doc,
legality=False)`) and answers from that; it never imports TVM. Everything that needs TVM runs in
worker processes (`worker_queue.Worker`): legality (`api.check_schedule` per schedule), the loop and stage
names after the statements above a cursor (`apply_schedule(..., upto_line)`), generated schedules
(`baselines.generate`), and -- in a second worker, so that they do not hold up the editor -- lowering
(`api.lower_op` + `lower.build.emit`) and measuring (`api.lower_op` + `api.run_lowered`).

Diagnostics are debounced; the syntax and semantic ones are published first (with the legality
diagnostics of schedules that did not change, reused), then again with the legality of the changed
schedules once the worker has them. Every handler is guarded: an exception is logged (stderr and
`window/logMessage`) and the request gets an empty result. Requests awaiting the worker are
cancellable; a cancelled measurement stops its worker process.
"""
from __future__ import annotations

import asyncio
import atexit
import functools
import logging
import os
import sys
import tempfile
import time
import traceback
import uuid
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path

from lsprotocol import types as T
from pygls.lsp.server import LanguageServer
from pygls.protocol import LanguageServerProtocol
from pygls.uris import from_fs_path, to_fs_path

from tensorlang import __version__
from tensorlang.analysis.primitives import LOOP, LOOPS, STAGE, STAGE_OR_LOOP
from tensorlang.diagnostics import error, sort_diagnostics
from tensorlang.lsp import features as F
from tensorlang.lsp.analysis import Analysis, Occ
from tensorlang.lsp.incremental import IncrementalParser, shift
from tensorlang.lsp.worker_queue import BACKGROUND, GENERATE, INTERACTIVE, LEGALITY, Worker, WorkerError
from tensorlang.parser import ast as A
from tensorlang.parser.printer import format_stmt

log = logging.getLogger("tensorlang.lsp")

DEBOUNCE_S = float(os.environ.get("TENSORLANG_LSP_DEBOUNCE_MS", "25")) / 1000
STATE_WAIT_S = 4.0  # how long a completion or hover waits for loop names from the worker
GENERATE_WAIT_S = 8.0  # ... and for a generated schedule
TESTING = os.environ.get("TENSORLANG_LSP_TESTING") == "1"

# where a space typed is a cue for names: `schedule `, `schedule OP on `, `target t = `, `split(C.i, `
SPACE_TRIGGERED = ("sched_op", "sched_on", "sched_target", "target_kind", "sched_arg", "sched_head")

CMD_LOWER = "tensorlang.lower"
CMD_MEASURE = "tensorlang.measure"


class LRU(OrderedDict):
    def __init__(self, size: int):
        super().__init__()
        self.size = size

    def get(self, key, default=None):
        if key in self:
            self.move_to_end(key)
            return self[key]
        return default

    def put(self, key, value):
        self[key] = value
        self.move_to_end(key)
        while len(self) > self.size:
            self.popitem(last=False)


@dataclass
class DocState:
    uri: str
    version: int | None = None
    analysis: Analysis | None = None
    task: asyncio.Task | None = None
    published_version: int | None = None
    legality_done_version: int | None = None
    space_done_version: int | None = None  # the in-space hints (TS314) are published for this version
    legality: list = field(default_factory=list)


def _target_key(t) -> tuple:
    return (t.name, t.kind, tuple(sorted((k, str(v)) for k, v in t.params.items())))


class TensorlangProtocol(LanguageServerProtocol):
    """pygls, except that a request whose params do not fit its method still gets an answer
    (InvalidParams) instead of none, so a client never waits forever on a malformed request."""

    def structure_message(self, data):
        try:
            return super().structure_message(data)
        except Exception as exc:
            if isinstance(data, dict) and "id" in data and "method" in data:
                reason = exc.__cause__ or exc
                self._send_response(data["id"], error=T.ResponseError(
                    code=T.ErrorCodes.InvalidParams,
                    message=f"invalid params for {data['method']}: {type(reason).__name__}: {reason}"[:500]))
            raise


class TensorlangServer(LanguageServer):
    def __init__(self):
        super().__init__("tensorlang", __version__, text_document_sync_kind=T.TextDocumentSyncKind.Incremental,
                         protocol_cls=TensorlangProtocol)
        self.parser = IncrementalParser()
        self.docs: dict[str, DocState] = {}
        self.analysis_worker = Worker("analysis")
        self.jobs_worker = Worker("jobs")
        self.legality_cache = LRU(1024)  # (op ast, target, schedule text) -> (first line, diagnostics)
        self.space_cache = LRU(1024)  # the same key -> (first line, in-space hints, TS314)
        self.state_cache = LRU(256)  # (op ast, statements, resolve) -> schedule_state
        self.generation_cache = LRU(128)  # (op ast, target) -> generate result
        self.measurements: dict[tuple, dict] = {}  # (uri, op, target) -> measurement
        self.debounce_s = DEBOUNCE_S
        self.legality_enabled = True
        self.errors: list[str] = []  # guarded handler failures (for tensorlang/status)
        atexit.register(self._kill_workers)

    # ------------------------------------------------------------ helpers
    def _kill_workers(self):
        self.analysis_worker.close_now()
        self.jobs_worker.close_now()

    @property
    def encoding(self) -> str:
        try:
            enc = self.workspace.position_encoding
        except Exception:
            return "utf-16"
        return str(getattr(enc, "value", enc) or "utf-16")

    def capability(self, path: str, default=None):
        obj = self.client_capabilities
        for part in path.split("."):
            obj = getattr(obj, part, None) if obj is not None else None
        return default if obj is None else obj

    def state(self, uri: str) -> DocState:
        st = self.docs.get(uri)
        if st is None:
            st = self.docs[uri] = DocState(uri)
        return st

    def analysis(self, uri: str) -> Analysis:
        doc = self.workspace.get_text_document(uri)
        text = doc.source
        st = self.state(uri)
        an = st.analysis
        if an is None or an.text != text or an.index.encoding != self.encoding:
            path = to_fs_path(uri) or uri
            an = Analysis(text, path, self.parser, self.encoding, doc.version)
            st.analysis = an
        return an

    def report(self, where: str, exc: BaseException):
        msg = f"tensorlang: {where} failed: {type(exc).__name__}: {exc}"
        self.errors.append(msg)
        log.error("%s\n%s", msg, "".join(traceback.format_exception(exc)))
        try:
            self.window_log_message(T.LogMessageParams(T.MessageType.Error, msg))
        except Exception:
            pass

    def report_server_error(self, error, source):  # pygls: out-of-band errors go to the log, not a popup
        log.error("server error (%s): %s", getattr(source, "__name__", source), error)
        try:
            self.window_log_message(T.LogMessageParams(T.MessageType.Error, f"tensorlang: {error}"))
        except Exception:
            pass

    # -------------------------------------------------------- diagnostics
    def schedule_diagnostics(self, uri: str, delay: float):
        st = self.state(uri)
        if st.task is not None and not st.task.done():
            st.task.cancel()
        st.task = asyncio.get_running_loop().create_task(self._diagnose(uri, delay))

    def _current_text(self, uri: str) -> str | None:
        if uri not in self.docs:
            return None
        try:
            return self.workspace.get_text_document(uri).source
        except Exception:
            return None

    def legality_key(self, an: Analysis, sched: A.Schedule):
        op = an.model.ops[sched.op]
        return (op.ast, _target_key(an.model.targets[sched.target]), F.schedule_source(an, sched))

    def cached_legality(self, an: Analysis, cache=None) -> tuple[list, list[int]]:
        """Legality diagnostics (or, with `cache=self.space_cache`, in-space hints) of the schedules seen
        before, moved to where they are now, and the indices of the others."""
        cache = self.legality_cache if cache is None else cache
        known, missing = [], []
        for n, sched in enumerate(an.model.schedules):
            hit = cache.get(self.legality_key(an, sched))
            if hit is None:
                missing.append(n)
            else:
                line, diags = hit
                known += shift(list(diags), sched.span.line - line)
        return known, missing

    def publish(self, uri: str, an: Analysis, legality: list):
        st = self.state(uri)
        diags = F.lsp_diagnostics(an, sort_diagnostics(list(an.doc.diagnostics) + list(legality)))
        self.text_document_publish_diagnostics(T.PublishDiagnosticsParams(uri=uri, diagnostics=diags,
                                                                          version=an.version))
        st.published_version = an.version
        st.legality = list(legality)

    async def _diagnose(self, uri: str, delay: float):
        try:
            if delay > 0:
                await asyncio.sleep(delay)
            if uri not in self.docs:
                return
            an = self.analysis(uri)
            st = self.state(uri)
            known, missing = self.cached_legality(an) if self.legality_enabled else ([], [])
            hints, _ = self.cached_legality(an, self.space_cache) if self.legality_enabled else ([], [])
            self.publish(uri, an, known + hints)
            if not missing:
                st.legality_done_version = an.version
                await self._space_hints(uri, an, known + hints)
                return
            scheds = an.model.schedules
            keys = [self.legality_key(an, scheds[n]) for n in missing]
            calls = []
            for n, key in zip(missing, keys):
                line = scheds[n].span.line
                calls.append(self.analysis_worker.call(
                    "legality", an.text, an.path, n, priority=LEGALITY, key=("legality", key),
                    on_result=functools.partial(self._store_legality, key, line)))
            results = await asyncio.gather(*calls, return_exceptions=True)
            if self._current_text(uri) != an.text:
                return
            legality = list(known)
            for n, r in zip(missing, results):
                if isinstance(r, BaseException):
                    if isinstance(r, asyncio.CancelledError):
                        raise r
                    legality.append(error("TS900", f"internal error while applying the schedule: {r}",
                                          scheds[n].span))
                else:
                    legality += r
            self.publish(uri, an, legality + hints)
            st.legality_done_version = an.version
            await self._space_hints(uri, an, legality + hints)
        except asyncio.CancelledError:
            raise
        except Exception as e:
            self.report("diagnostics", e)

    async def _space_hints(self, uri: str, an: Analysis, published: list):
        """After legality: for each legal schedule not seen before, whether it is a point of the schedule
        space (hint TS314, as `tensorlang check --space`), at the lowest priority of the second worker so
        that completions and generated schedules never wait behind the search."""
        _, missing = self.cached_legality(an, self.space_cache)
        scheds = an.model.schedules
        erroneous = {d.span.line for d in published if d.severity == "error"}
        todo = [n for n in missing
                if not any(scheds[n].span.line <= line <= scheds[n].span.end_line for line in erroneous)]
        if not todo:
            self.state(uri).space_done_version = an.version
            return
        calls = []
        for n in todo:
            key = self.legality_key(an, scheds[n])
            # In the second worker (lowering, measuring): a search never holds up legality, names or
            # generated schedules in the analysis worker.
            calls.append(self.jobs_worker.call(
                "space_hint", an.text, an.path, n, priority=BACKGROUND, key=("space", key),
                on_result=functools.partial(self._store_space, key, scheds[n].span.line)))
        results = await asyncio.gather(*calls, return_exceptions=True)
        if self._current_text(uri) != an.text:
            return
        if any(isinstance(r, asyncio.CancelledError) for r in results):
            raise asyncio.CancelledError()
        hints, _ = self.cached_legality(an, self.space_cache)
        legality = [d for d in published if d.code != "TS314"]
        self.publish(uri, an, legality + hints)
        self.state(uri).space_done_version = an.version

    def _store_space(self, key, line, diags):
        self.space_cache.put(key, (line, tuple(diags)))

    def _store_legality(self, key, line, diags):
        self.legality_cache.put(key, (line, tuple(diags)))

    # ------------------------------------------------------- worker data
    async def schedule_state(self, an: Analysis, op: str, stmts: tuple, upto_line: int | None,
                             resolve: tuple = (), timeout: float = STATE_WAIT_S) -> dict | None:
        """The worker's `schedule_state` for the statements `stmts` of a schedule of `op`, or None."""
        op_model = an.model.ops.get(op or "")
        if op_model is None or stmts is None:
            return None
        key = ("state", op_model.ast, tuple(stmts), tuple(resolve))
        hit = self.state_cache.get(key)
        if hit is not None:
            return hit
        sched = A.Schedule(op, "", tuple(stmts))
        try:
            return await self.analysis_worker.call(
                "schedule_state", op_model, sched, upto_line, tuple(resolve), priority=INTERACTIVE, key=key,
                timeout=timeout, on_result=functools.partial(self.state_cache.put, key))
        except (asyncio.TimeoutError, WorkerError) as e:
            log.warning("schedule state unavailable: %s", e)
            return None

    async def unroll_report(self, an: Analysis, op: str, stmts: tuple,
                            timeout: float = STATE_WAIT_S) -> list | None:
        """The worker's `unroll_report` of a whole schedule of `op` (what the build unrolls), or None."""
        op_model = an.model.ops.get(op or "")
        if op_model is None:
            return None
        key = ("unroll", op_model.ast, tuple(stmts))
        hit = self.state_cache.get(key)
        if hit is not None:
            return hit
        try:
            return await self.analysis_worker.call(
                "unroll_report", op_model, A.Schedule(op, "", tuple(stmts)), priority=INTERACTIVE, key=key,
                timeout=timeout, on_result=functools.partial(self.state_cache.put, key))
        except (asyncio.TimeoutError, WorkerError) as e:
            log.warning("unroll report unavailable: %s", e)
            return None

    async def generation(self, an: Analysis, op: str, target: str, timeout: float = GENERATE_WAIT_S,
                         written: tuple = ()) -> dict | None:
        """`baselines.generate("auto", ...)` for an operator and target (worker), or None. `written`: the
        statements already in the schedule block, whose decisions the model keeps."""
        op_model = an.model.ops.get(op or "")
        tm = an.model.targets.get(target or "")
        if op_model is None or tm is None:
            return None
        written = tuple(written or ())
        key = ("generate", op_model.ast, _target_key(tm), tuple(format_stmt(s) for s in written))
        hit = self.generation_cache.get(key)
        if hit is not None:
            return hit
        try:
            return await self.analysis_worker.call(
                "generate", an.text, an.path, op, target, written, priority=GENERATE, key=key, timeout=timeout,
                on_result=functools.partial(self.generation_cache.put, key))
        except (asyncio.TimeoutError, WorkerError) as e:
            log.warning("schedule generation unavailable: %s", e)
            return None


# ======================================================================= handlers
def guarded(default=lambda: None, name: str | None = None):
    """An exception in a handler becomes a logged error and an empty result, never a dead server."""
    def deco(fn):
        where = name or fn.__name__
        if asyncio.iscoroutinefunction(fn):
            @functools.wraps(fn)
            async def wrapper(ls, *args):
                try:
                    return await fn(ls, *args)
                except asyncio.CancelledError:
                    raise
                except Exception as e:
                    ls.report(where, e)
                    return default()
        else:
            @functools.wraps(fn)
            def wrapper(ls, *args):
                try:
                    return fn(ls, *args)
                except Exception as e:
                    ls.report(where, e)
                    return default()
        return wrapper
    return deco


def create_server() -> TensorlangServer:
    server = TensorlangServer()

    @server.feature(T.INITIALIZE)
    @guarded()
    def initialize(ls: TensorlangServer, params: T.InitializeParams):
        opts = params.initialization_options if isinstance(params.initialization_options, dict) else {}
        if "debounceMs" in opts:
            ls.debounce_s = max(0.0, float(opts["debounceMs"]) / 1000)
        if "legality" in opts:
            ls.legality_enabled = bool(opts["legality"])

    @server.feature(T.INITIALIZED)
    @guarded()
    def initialized(ls: TensorlangServer, params):
        # Start the TVM worker now, off the start-up path: it imports TVM while the editor opens files.
        job = ls.analysis_worker.submit("warmup", priority=INTERACTIVE, keep=True)
        job.future.add_done_callback(
            lambda f: log.info("analysis worker ready: %s", f.result() if not f.cancelled() and not f.exception()
                               else f.exception() if not f.cancelled() else "cancelled"))
        # after the first legality checks: the first schedule generation's one-time costs
        ls.analysis_worker.submit("warmup_generation", priority=BACKGROUND, keep=True)

    @server.feature(T.SHUTDOWN)
    @guarded()
    async def shutdown(ls: TensorlangServer, params):
        for st in ls.docs.values():
            if st.task is not None:
                st.task.cancel()
        await ls.analysis_worker.close()
        await ls.jobs_worker.close()

    # ---------------------------------------------------------- documents
    @server.feature(T.TEXT_DOCUMENT_DID_OPEN)
    @guarded()
    def did_open(ls: TensorlangServer, params: T.DidOpenTextDocumentParams):
        st = ls.state(params.text_document.uri)
        st.version = params.text_document.version
        ls.schedule_diagnostics(params.text_document.uri, 0.0)

    @server.feature(T.TEXT_DOCUMENT_DID_CHANGE)
    @guarded()
    def did_change(ls: TensorlangServer, params: T.DidChangeTextDocumentParams):
        st = ls.state(params.text_document.uri)
        st.version = params.text_document.version
        ls.schedule_diagnostics(params.text_document.uri, ls.debounce_s)

    @server.feature(T.TEXT_DOCUMENT_DID_CLOSE)
    @guarded()
    def did_close(ls: TensorlangServer, params: T.DidCloseTextDocumentParams):
        uri = params.text_document.uri
        st = ls.docs.pop(uri, None)
        if st is not None and st.task is not None:
            st.task.cancel()
        ls.text_document_publish_diagnostics(T.PublishDiagnosticsParams(uri=uri, diagnostics=[]))

    # ---------------------------------------------------------- completion
    @server.feature(T.TEXT_DOCUMENT_COMPLETION,
                    T.CompletionOptions(trigger_characters=[".", "(", ",", " ", "@", "[", '"', "="]))
    @guarded(lambda: T.CompletionList(is_incomplete=False, items=[]), "completion")
    async def completion(ls: TensorlangServer, params: T.CompletionParams):
        an = ls.analysis(params.text_document.uri)
        line0, col0 = F.from_position(an, params.position)
        ctx = an.context(line0, col0)
        trigger = params.context.trigger_character if params.context else None
        if trigger == " " and ctx.where not in SPACE_TRIGGERED:  # a space is typed everywhere: not a prompt
            return T.CompletionList(is_incomplete=True, items=[])
        state = None
        if ctx.where == "sched_arg" and ctx.param is not None and ctx.param.kind in (LOOP, LOOPS, STAGE,
                                                                                      STAGE_OR_LOOP):
            state = await ls.schedule_state(an, ctx.op, ctx.stmts_above, ctx.upto_line)
        snippets = bool(ls.capability("text_document.completion.completion_item.snippet_support", False))
        items, complete = F.completion_items(an, ctx, state, snippets)
        generated, gen_complete = await _generated_items(ls, an, ctx)
        return T.CompletionList(is_incomplete=not (complete and gen_complete), items=generated + items)

    @server.feature(T.TEXT_DOCUMENT_INLINE_COMPLETION, T.InlineCompletionOptions())
    @guarded(lambda: None, "inline completion")
    async def inline_completion(ls: TensorlangServer, params: T.InlineCompletionParams):
        an = ls.analysis(params.text_document.uri)
        line0, col0 = F.from_position(an, params.position)
        ctx = an.context(line0, col0)
        found = await _insertions(ls, an, ctx)
        if not found:
            return None
        return T.InlineCompletionList(items=[T.InlineCompletionItem(insert_text=text, range=rng)
                                             for text, rng, _, _, _ in found])

    # --------------------------------------------------------------- hover
    @server.feature(T.TEXT_DOCUMENT_HOVER)
    @guarded(lambda: None, "hover")
    async def hover(ls: TensorlangServer, params: T.HoverParams):
        an = ls.analysis(params.text_document.uri)
        line0, col0 = F.from_position(an, params.position)
        text = await _hover_text(ls, params.text_document.uri, an, line0, col0)
        if not text:
            return None
        return T.Hover(contents=T.MarkupContent(T.MarkupKind.Markdown, text))

    # ---------------------------------------------------------- navigation
    @server.feature(T.TEXT_DOCUMENT_DEFINITION)
    @guarded(lambda: None, "definition")
    def definition(ls: TensorlangServer, params: T.DefinitionParams):
        an = ls.analysis(params.text_document.uri)
        occ = _occurrence(an, params.position)
        d = an.definition_of(occ) if occ else None
        return F.location(an, params.text_document.uri, d.span) if d else None

    @server.feature(T.TEXT_DOCUMENT_REFERENCES)
    @guarded(lambda: [], "references")
    def references(ls: TensorlangServer, params: T.ReferenceParams):
        an = ls.analysis(params.text_document.uri)
        occ = _occurrence(an, params.position)
        if occ is None:
            return []
        refs = an.references_of(occ, params.context.include_declaration if params.context else True)
        return [F.location(an, params.text_document.uri, o.span) for o in refs]

    @server.feature(T.TEXT_DOCUMENT_DOCUMENT_SYMBOL)
    @guarded(lambda: [], "document symbols")
    def document_symbol(ls: TensorlangServer, params: T.DocumentSymbolParams):
        return F.document_symbols(ls.analysis(params.text_document.uri))

    @server.feature(T.TEXT_DOCUMENT_SEMANTIC_TOKENS_FULL, F.LEGEND)
    @guarded(lambda: T.SemanticTokens(data=[]), "semantic tokens")
    def semantic_tokens(ls: TensorlangServer, params: T.SemanticTokensParams):
        return T.SemanticTokens(data=F.semantic_tokens(ls.analysis(params.text_document.uri)))

    @server.feature(T.TEXT_DOCUMENT_FOLDING_RANGE)
    @guarded(lambda: [], "folding ranges")
    def folding_range(ls: TensorlangServer, params: T.FoldingRangeParams):
        return F.folding_ranges(ls.analysis(params.text_document.uri))

    @server.feature(T.TEXT_DOCUMENT_FORMATTING)
    @guarded(lambda: [], "formatting")
    def formatting(ls: TensorlangServer, params: T.DocumentFormattingParams):
        return F.formatting_edits(ls.analysis(params.text_document.uri))

    # --------------------------------------------------------- code actions
    @server.feature(T.TEXT_DOCUMENT_CODE_ACTION, T.CodeActionOptions(
        code_action_kinds=[T.CodeActionKind.QuickFix, T.CodeActionKind.Refactor, T.CodeActionKind.Source]))
    @guarded(lambda: [], "code actions")
    async def code_action(ls: TensorlangServer, params: T.CodeActionParams):
        uri = params.text_document.uri
        an = ls.analysis(uri)
        actions = F.quick_fixes(an, uri, list(params.context.diagnostics or []))
        line0, col0 = F.from_position(an, params.range.start)
        actions += await _generate_actions(ls, uri, an, line0, col0)
        actions += _command_actions(ls, uri, an, line0 + 1)
        return actions

    @server.feature(T.TEXT_DOCUMENT_CODE_LENS)
    @guarded(lambda: [], "code lens")
    def code_lens(ls: TensorlangServer, params: T.CodeLensParams):
        uri = params.text_document.uri
        an = ls.analysis(uri)
        lenses = []
        for sched in an.model.schedules:
            tm = an.model.targets[sched.target]
            rng = F.to_range(an, A.Span(sched.span.line, sched.span.col, sched.span.line, sched.span.col + 8))
            args = [uri, sched.op, sched.target]
            if not tm.is_gpu:
                m = ls.measurements.get((uri, sched.op, sched.target))
                title = "▷ measure this schedule"
                if m is not None:
                    r = m.get("result")
                    title = (f"⏱ {r['median_ms']:.3f} ms · {r['gflops']:.2f} GFLOP/s · {'ok' if r['ok'] else 'MISMATCH'}"
                             if m.get("ok") and r else f"⏱ measurement failed: {m.get('error')}")
                    if m.get("text") != F.schedule_source(an, sched):
                        title += " (before the last edit)"
                lenses.append(T.CodeLens(range=rng, command=T.Command(title, CMD_MEASURE, arguments=args)))
            lenses.append(T.CodeLens(range=rng, command=T.Command("show TIR", CMD_LOWER, arguments=args + ["tir"])))
            if tm.is_gpu:
                lenses.append(T.CodeLens(range=rng, command=T.Command("show CUDA", CMD_LOWER, arguments=args + ["cuda"])))
        return lenses

    # ------------------------------------------------------------ commands
    @server.command(CMD_LOWER)
    @guarded(lambda: None, "lower")
    async def lower_command(ls: TensorlangServer, *args):
        uri, op, target, emit = (list(args) + ["tir"])[:4]
        an = ls.analysis(uri)
        token = await _begin_progress(ls, f"Lowering {op} on {target} ({emit})", cancellable=False)
        try:
            res = await ls.jobs_worker.call("lower", an.text, an.path, op, target, emit, priority=INTERACTIVE)
        except WorkerError as e:
            res = {"ok": False, "error": str(e)}
        finally:
            _end_progress(ls, token, "done")
        if not res.get("ok"):
            ls.window_show_message(T.ShowMessageParams(T.MessageType.Error,
                                                       f"tensorlang: cannot lower {op} on {target}: {res.get('error')}"))
            return {"ok": False, "error": res.get("error")}
        ext = {"tir": ".py", "cuda": ".cu", "llvm": ".ll", "ptx": ".ptx"}.get(emit, ".txt")
        # one directory per user, each operator and target one file, rewritten by the next lowering
        out_dir = Path(tempfile.gettempdir()) / f"tensorlang-lsp-{os.getuid() if hasattr(os, 'getuid') else 'user'}"
        out_dir.mkdir(parents=True, exist_ok=True)
        out = out_dir / f"{op}-{target}{'' if emit != 'tir' else '.tir'}{ext}"
        header = "#" if emit == "tir" else ";" if emit == "llvm" else "//"
        out.write_text(f"{header} {op} on {target} ({res.get('policy')}), lowered by tensorlang\n{res['text']}")
        doc_uri = from_fs_path(str(out))
        shown = False
        if ls.capability("window.show_document.support", False):
            try:
                r = await asyncio.wait_for(ls.window_show_document_async(
                    T.ShowDocumentParams(uri=doc_uri, take_focus=True)), 10)
                shown = bool(getattr(r, "success", False))
            except Exception as e:
                log.warning("showDocument failed: %s", e)
        return {"ok": True, "uri": doc_uri, "path": str(out), "shown": shown, "policy": res.get("policy"),
                "text": res["text"]}

    @server.command(CMD_MEASURE)
    @guarded(lambda: None, "measure")
    async def measure_command(ls: TensorlangServer, *args):
        uri, op, target = list(args)[:3]
        an = ls.analysis(uri)
        sched = an.model.schedule_for(op, target)
        token = await _begin_progress(ls, f"Measuring {op} on {target}", cancellable=True)
        cancelled = False

        def on_cancel(f):
            nonlocal cancelled
            if f.cancelled():
                cancelled = True
                ls.jobs_worker.kill()

        if token is not None and token in ls.work_done_progress.tokens:
            ls.work_done_progress.tokens[token].add_done_callback(on_cancel)

        def on_progress(message, pct=None):
            if token is not None:
                ls.work_done_progress.report(token, T.WorkDoneProgressReport(message=message, percentage=pct))

        try:
            res = await ls.jobs_worker.call("measure", an.text, an.path, op, target, 5, priority=INTERACTIVE,
                                            on_progress=on_progress)
        except WorkerError as e:
            res = {"ok": False, "error": "cancelled" if cancelled else str(e)}
        m = dict(res, when=time.time(), text=F.schedule_source(an, sched) if sched else None)
        ls.measurements[(uri, op, target)] = m
        _end_progress(ls, token, F.measurement_text(m))
        if ls.capability("workspace.code_lens.refresh_support", False):
            try:
                ls.workspace_code_lens_refresh(None)
            except Exception:
                pass
        return res

    # ------------------------------------------------ status and test hooks
    @server.feature("tensorlang/status")
    @guarded(lambda: None, "status")
    def status(ls: TensorlangServer, params=None):
        return {
            "tvm_loaded": "tvm" in sys.modules,
            "workers": {w.name: {"pid": w.pid, "started": w.started, "jobs_done": w.done}
                        for w in (ls.analysis_worker, ls.jobs_worker)},
            "documents": [{"uri": uri, "version": st.version, "published": st.published_version,
                           "legality_done": st.legality_done_version,
                           "space_done": st.space_done_version} for uri, st in ls.docs.items()],
            "errors": list(ls.errors),
        }

    if TESTING:
        @server.feature("tensorlang/_raise")
        @guarded(lambda: None, "test hook")
        def raise_for_tests(ls: TensorlangServer, params=None):
            raise RuntimeError("raised on purpose by tensorlang/_raise")

        @server.feature("tensorlang/_sleep")
        @guarded(lambda: None, "test hook")
        async def sleep_for_tests(ls: TensorlangServer, params=None):
            await asyncio.sleep(30)
            return "slept"

    return server


# ------------------------------------------------------------- handler helpers
def _occurrence(an: Analysis, position: T.Position) -> Occ | None:
    line0, col0 = F.from_position(an, position)
    return an.occurrence_at(line0 + 1, col0 + 1)


async def _insertions(ls: TensorlangServer, an: Analysis, ctx) -> list:
    """(text, range, gen, op, target) for each generated schedule that fits the cursor."""
    out = []
    if ctx.where == "sched_head" and ctx.stmts_above is not None and not ctx.stmts_below and ctx.op and ctx.target:
        gen = await ls.generation(an, ctx.op, ctx.target, written=ctx.stmts_above)
        found = F.schedule_insertion(an, ctx, gen, ctx.target) if gen else None
        if found:
            out.append((*found, gen, ctx.op, ctx.target))
    elif ctx.where == "top":
        for op in F.auto_ops_before(an, ctx.line0):
            for target in F.targets_for_generation(an, op.name):
                gen = await ls.generation(an, op.name, target)
                found = F.block_insertion(an, ctx, op.name, gen, target) if gen else None
                if found:
                    out.append((*found, gen, op.name, target))
    return out


async def _generated_items(ls: TensorlangServer, an: Analysis, ctx) -> tuple[list, bool]:
    found = await _insertions(ls, an, ctx)
    return [F.generated_item(text, rng, gen, op, target) for text, rng, gen, op, target in found], True


async def _generate_actions(ls: TensorlangServer, uri: str, an: Analysis, line0: int, col0: int) -> list:
    """'Generate schedule': for an @auto operator under the cursor (a new block below it, per target
    without a schedule), or for the schedule block under the cursor (the statements still missing)."""
    item = an.item_at(line0 + 1)
    actions = []
    if isinstance(item, A.Op) and item.is_auto and item.name in an.model.ops:
        end = T.Position(item.span.end_line - 1, an.index.to_units(item.span.end_line - 1, item.span.end_col - 1))
        for target in F.targets_for_generation(an, item.name):
            gen = await ls.generation(an, item.name, target)
            parsed = F.generated_statements(item.name, target, gen["schedule_text"]) \
                if gen and gen.get("schedule_text") else None
            if parsed is None:
                continue
            block = f"\n\nschedule {item.name} on {target} {{\n" + "".join(f"    {l}\n" for l in parsed[0]) + "}"
            actions.append(T.CodeAction(
                title=f"Generate schedule for {item.name} on {target} (policy '{gen['policy']}')",
                kind=T.CodeActionKind.Refactor,
                edit=T.WorkspaceEdit(changes={uri: [T.TextEdit(T.Range(end, end), block)]})))
    elif isinstance(item, A.Schedule) and item.op in an.model.ops and item.target in an.model.targets:
        gen = await ls.generation(an, item.op, item.target, written=item.stmts)
        parsed = F.generated_statements(item.op, item.target, gen["schedule_text"]) \
            if gen and gen.get("schedule_text") else None
        k = len(item.stmts)
        if parsed is not None and k < len(parsed[1]) and tuple(parsed[1][:k]) == tuple(item.stmts):
            line0, col0 = item.span.end_line - 1, item.span.end_col - 2  # the closing `}`
            text = "".join(f"    {l}\n" for l in parsed[0][k:])
            if an.index.line(line0)[:col0].strip():
                text = "\n" + text  # `}` after code on its line: start a new line
            else:
                col0 = 0  # `}` alone on its line: insert whole lines above it
            close = T.Position(line0, an.index.to_units(line0, col0))
            actions.append(T.CodeAction(
                title=f"Generate schedule ({len(parsed[0]) - k} statements from policy '{gen['policy']}')",
                kind=T.CodeActionKind.Refactor,
                edit=T.WorkspaceEdit(changes={uri: [T.TextEdit(T.Range(close, close), text)]})))
    return actions


def _command_actions(ls: TensorlangServer, uri: str, an: Analysis, line1: int) -> list:
    item = an.item_at(line1)
    out = []
    if not isinstance(item, A.Schedule) or item not in an.model.schedules:
        return out
    tm = an.model.targets[item.target]
    args = [uri, item.op, item.target]
    out.append(T.CodeAction(title=f"Lower and show TIR ({item.op} on {item.target})", kind=T.CodeActionKind.Source,
                            command=T.Command("Lower and show TIR", CMD_LOWER, arguments=args + ["tir"])))
    if tm.is_gpu:
        out.append(T.CodeAction(title=f"Lower and show CUDA ({item.op} on {item.target})",
                                kind=T.CodeActionKind.Source, command=T.Command("Lower and show CUDA", CMD_LOWER,
                                                                                arguments=args + ["cuda"])))
    else:
        out.append(T.CodeAction(title=f"Measure this schedule ({item.op} on {item.target})",
                                kind=T.CodeActionKind.Source, command=T.Command("Measure", CMD_MEASURE, arguments=args)))
    return out


async def _begin_progress(ls: TensorlangServer, title: str, cancellable: bool):
    if not ls.capability("window.work_done_progress", False):
        return None
    token = f"tensorlang-{uuid.uuid4()}"
    try:
        await asyncio.wait_for(ls.work_done_progress.create_async(token), 5)
        ls.work_done_progress.begin(token, T.WorkDoneProgressBegin(title=title, cancellable=cancellable,
                                                                   percentage=0))
        return token
    except Exception as e:
        log.warning("work done progress unavailable: %s", e)
        return None


def _end_progress(ls: TensorlangServer, token, message: str | None):
    if token is None:
        return
    try:
        ls.work_done_progress.end(token, T.WorkDoneProgressEnd(message=message))
    except Exception:
        pass
    ls.work_done_progress.tokens.pop(token, None)


async def _hover_text(ls: TensorlangServer, uri: str, an: Analysis, line0: int, col0: int) -> str | None:
    occ = an.occurrence_at(line0 + 1, col0 + 1)
    parts = []
    sched = next((s for s in an.ast.schedules if s.span.line == line0 + 1), None)
    if sched is not None and (occ is None or occ.kind not in ("op", "target")):
        parts.append(_schedule_hover(ls, uri, an, sched))
    if occ is None:
        return "\n\n---\n\n".join(p for p in parts if p) or None
    key = occ.key
    text = None
    if occ.kind == "op":
        text = F.op_hover(an, occ.key[1])
        if sched is not None:
            parts.append(_schedule_hover(ls, uri, an, sched))
    elif occ.kind == "target":
        text = F.target_hover(an, occ.key[1])
        if sched is not None:
            parts.append(_schedule_hover(ls, uri, an, sched))
    elif occ.kind == "index" and key:
        text = F.index_hover(an, key)
    elif occ.kind in ("tensor", "stage") and key and key[0] == "tensor" and occ.sched is None:
        text = F.stage_hover(an, key[1], key[2]) if occ.role == "stagedef" else F.tensor_hover(an, key[1], key[2])
    elif occ.sched is not None and occ.kind in ("loop", "stage", "tensor", "prim"):
        text = await _schedule_ref_hover(ls, an, occ)
    elif occ.kind == "thread":
        text = "thread axis: " + ", ".join(f"`{a}`" for a in ("blockIdx", "threadIdx", "vthread")) + \
               " with `.x`, `.y`, `.z`"
    elif occ.kind == "scope":
        text = "storage scope: `global`, `shared`, `shared.dyn`, `local`, `warp`"
    elif occ.kind in ("dtype", "cast"):
        from tensorlang.analysis.dtypes import TVM_DTYPE
        word = an.index.line(line0)[occ.span.col - 1:occ.span.end_col - 1]
        what = "cast to" if occ.kind == "cast" else "dtype"
        text = f"{what} `{word}`" + (f": {TVM_DTYPE[word]}" if word in TVM_DTYPE else "")
    elif occ.kind == "func":
        from tensorlang.analysis.model import FUNCTIONS
        word = an.index.line(line0)[occ.span.col - 1:occ.span.end_col - 1]
        if word in FUNCTIONS:
            text = f"function `{word}` ({FUNCTIONS[word]} argument{'s' if FUNCTIONS[word] > 1 else ''})"
    if text:
        parts.insert(0, text)
    return "\n\n---\n\n".join(p for p in parts if p) or None


def _schedule_hover(ls: TensorlangServer, uri: str, an: Analysis, sched: A.Schedule) -> str:
    lines = [f"**schedule `{sched.op}` on `{sched.target}`**: {len(sched.stmts)} statements"]
    m = ls.measurements.get((uri, sched.op, sched.target))
    text = F.measurement_text(m, F.schedule_source(an, sched))
    if text:
        lines.append(text)
    elif sched.target in an.model.targets and not an.model.targets[sched.target].is_gpu:
        lines.append("not measured yet (code action or lens: *Measure this schedule*)")
    return "\n\n".join(lines)


async def _schedule_ref_hover(ls: TensorlangServer, an: Analysis, occ: Occ) -> str | None:
    sched = an.ast.schedules[occ.sched]
    stmt = sched.stmts[occ.stmt]
    if occ.kind == "prim":
        after = sched.stmts[:occ.stmt + 1]
        state = await ls.schedule_state(an, sched.op, after, stmt.span.line)
        text = F.primitive_hover(stmt.prim) or f"`{stmt.prim}`"
        if state is not None:
            note = "" if state["ok"] else f"\n\n(stopped: {state['error'].message})"
            text += f"\n\nloop nest after line {stmt.span.line}:\n```\n{state['tree']}\n```{note}"
        if "pragma_auto_unroll_max_step" in an.index.line(stmt.span.line - 1):
            unrolls = F.unroll_text(await ls.unroll_report(an, sched.op, sched.stmts))
            text += f"\n\n{unrolls}" if unrolls else ""
        return text
    # a name: the state before the statement, or after it for the names it binds
    upto = sched.stmts[:occ.stmt + 1] if occ.bound_by_stmt else sched.stmts[:occ.stmt]
    line = stmt.span.line if occ.bound_by_stmt else stmt.span.line - 1
    name = _ref_text_at(an, occ)
    state = await ls.schedule_state(an, sched.op, upto, line, resolve=(name,))
    if state is None:
        if occ.key and occ.key[0] == "tensor":
            return F.stage_hover(an, occ.key[1], occ.key[2])
        return f"`{name}`"
    r = state["resolved"].get(name, {})
    where = f"after line {line}" if occ.bound_by_stmt else f"before line {stmt.span.line}"
    if "loop" in r:
        rec = r["loop"]
        bound = f", bound to `{rec['binding']}`" if rec.get("binding") else ""
        kind = f", {rec['kind']}" if rec.get("kind") not in ("serial", "thread_binding", None) else ""
        return (f"**loop `{name}`**: extent {rec['extent'] if rec['extent'] is not None else '?'}{kind}{bound} "
                f"({where}; TVM loop `{rec['tvm_name']}`)")
    if "stage" in r:
        st = r["stage"]
        block = f" (TVM block `{st['block']}`)" if st["block"] != name else ""
        text = f"**stage `{name}`**{block} ({where})"
        if occ.key and occ.key[0] == "tensor":
            more = F.stage_hover(an, occ.key[1], occ.key[2])
            text += "\n\n" + (more or "")
        return text
    return f"`{name}`: {r.get('error', 'unknown')} ({where})"


def _ref_text_at(an: Analysis, occ: Occ) -> str:
    """The whole dotted name an occurrence is part of (`AS.ax0` for either part)."""
    line = an.index.line(occ.span.line - 1)
    a, b = occ.span.col - 1, occ.span.end_col - 1
    while a > 0 and (line[a - 1].isalnum() or line[a - 1] in "._"):
        a -= 1
    while b < len(line) and (line[b].isalnum() or line[b] in "._"):
        b += 1
    return line[a:b]


def main() -> int:
    logging.basicConfig(level=os.environ.get("TENSORLANG_LSP_LOG", "WARNING"), stream=sys.stderr,
                        format="%(asctime)s %(name)s %(levelname)s: %(message)s")
    server = create_server()
    server.start_io()
    return 0


if __name__ == "__main__":
    sys.exit(main())
