"""Latency of the language server, measured like an editor sees it: a real client (pygls) talks to
`python -m tensorlang lsp` over stdio. Every sample is taken right after an edit that makes the text new
(no answer can come from a cache of answers; the server's incremental state -- parsed chunks, the
legality of unchanged schedules, the loop names of unchanged statements, generated schedules of
unchanged operators -- is reused, as in an editing session).

The document is `check_speed.big_file()` (the examples renamed and repeated, ~370 lines). Rows:
- diagnostics: didChange -> the first publishDiagnostics of that version (syntax + semantic, legality of
  the unchanged schedules reused); and -> the publish that adds the edited schedule's legality (TVM);
- completion: request -> response, sent right after the edit: keywords at top level, tensor names in an
  operator body, loop names in a schedule statement (the statements above unchanged, or edited so that
  TVM re-applies them), and the generated schedule in an empty schedule block (the operator unchanged, or
  edited so that the policy runs again).

    .venv/bin/python benchmarks/lsp_latency.py [--samples 40] [--json benchmarks/results/lsp_latency.json]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT))

from check_speed import big_file  # noqa: E402

from tensorlang.machine import describe, host_line  # noqa: E402
from lsprotocol import types as T  # noqa: E402
from pygls.lsp.client import LanguageClient  # noqa: E402

URI = (ROOT / "benchmarks" / "lsp-latency.tsched").as_uri()


def p95(xs):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(0.95 * (len(xs) - 1))))]


class Bench:
    def __init__(self):
        self.client = LanguageClient("lsp-latency", "1")
        self.publishes: list[tuple[float, int | None, list]] = []
        self.changed = asyncio.Event()
        self.version = 1
        self.text = ""

        @self.client.feature(T.TEXT_DOCUMENT_PUBLISH_DIAGNOSTICS)
        def on_diagnostics(ls, params: T.PublishDiagnosticsParams):
            self.publishes.append((time.perf_counter(), params.version, list(params.diagnostics)))
            self.changed.set()

        @self.client.feature(T.WINDOW_LOG_MESSAGE)
        def on_log(ls, params):
            pass

        @self.client.feature(T.WINDOW_WORK_DONE_PROGRESS_CREATE)
        def on_progress_create(ls, params):
            return None

        @self.client.feature(T.PROGRESS)
        def on_progress(ls, params):
            pass

    async def start(self):
        t = time.perf_counter()
        await self.client.start_io(sys.executable, "-m", "tensorlang", "lsp")
        caps = T.ClientCapabilities(
            text_document=T.TextDocumentClientCapabilities(
                completion=T.CompletionClientCapabilities(
                    completion_item=T.ClientCompletionItemOptions(snippet_support=True)),
                publish_diagnostics=T.PublishDiagnosticsClientCapabilities(version_support=True)),
            window=T.WindowClientCapabilities(work_done_progress=True))
        await self.client.initialize_async(T.InitializeParams(capabilities=caps, process_id=None))
        self.client.initialized(T.InitializedParams())
        return (time.perf_counter() - t) * 1e3

    async def wait_publish(self, version: int, count: int = 1, timeout: float = 120.0):
        """Wait for the count-th publish of a version; its time."""
        deadline = time.perf_counter() + timeout
        while True:
            got = [p for p in self.publishes if p[1] == version]
            if len(got) >= count:
                return got[count - 1]
            self.changed.clear()
            left = deadline - time.perf_counter()
            if left <= 0:
                raise TimeoutError(f"no publish #{count} for version {version}")
            try:
                await asyncio.wait_for(self.changed.wait(), left)
            except asyncio.TimeoutError:
                pass

    async def status(self):
        return await self.client.protocol.send_request_async("tensorlang/status", None)

    async def settle(self, timeout: float = 300.0):
        """Wait until the current version's legality is published."""
        deadline = time.perf_counter() + timeout
        while time.perf_counter() < deadline:
            st = await self.status()
            doc = next((d for d in st.documents if d.uri == URI), None)
            if doc is not None and doc.legality_done == self.version:
                return
            await asyncio.sleep(0.02)
        raise TimeoutError("legality did not settle")

    def open(self, text: str):
        self.text = text
        self.client.text_document_did_open(T.DidOpenTextDocumentParams(T.TextDocumentItem(URI, "tsched", 1, text)))

    def edit(self, text: str) -> tuple[int, float]:
        """Send the changed stretch as an incremental change, like an editor; return (version, time sent)."""
        old = self.text
        p = 0
        n = min(len(old), len(text))
        while p < n and old[p] == text[p]:
            p += 1
        q = 0
        while q < n - p and old[-1 - q] == text[-1 - q]:
            q += 1

        def position(offset: int) -> T.Position:
            line = old.count("\n", 0, offset)
            return T.Position(line, offset - (old.rfind("\n", 0, offset) + 1))

        change = T.TextDocumentContentChangePartial(range=T.Range(position(p), position(len(old) - q)),
                                                    text=text[p:len(text) - q])
        self.version += 1
        self.text = text
        t = time.perf_counter()
        self.client.text_document_did_change(T.DidChangeTextDocumentParams(
            T.VersionedTextDocumentIdentifier(version=self.version, uri=URI), [change]))
        return self.version, t

    async def complete(self, line: int, col: int):
        t = time.perf_counter()
        res = await self.client.text_document_completion_async(
            T.CompletionParams(T.TextDocumentIdentifier(URI), T.Position(line, col)))
        ms = (time.perf_counter() - t) * 1e3
        items = res.items if isinstance(res, T.CompletionList) else (res or [])
        return ms, items


def find(text: str, needle: str, after: int = 0) -> int:
    lines = text.split("\n")
    return next(n for n in range(after, len(lines)) if needle in lines[n])


def with_line(text: str, n: int, line: str, replace: bool = False) -> str:
    lines = text.split("\n")
    lines[n:n + (1 if replace else 0)] = [line]
    return "\n".join(lines)


FACTORS = [(a, b, 512 // (a * b)) for a in (1, 2, 4, 8, 16, 32, 64) for b in (1, 2, 4, 8, 16, 32) if 512 % (a * b) == 0
           and 512 // (a * b) >= 1]


async def run(samples: int) -> dict:
    bench = Bench()
    rows = {}
    startup_ms = await bench.start()
    base = big_file()
    t = time.perf_counter()
    bench.open(base)
    await bench.wait_publish(1)
    first_ms = (time.perf_counter() - t) * 1e3
    await bench.settle()
    open_full_ms = (time.perf_counter() - t) * 1e3

    # ---- diagnostics: type a comment into a statement of a schedule (a new text every time)
    sched = find(base, "schedule matmul_0 on cpu")
    stmt = find(base, "parallel(i0)", sched)
    first, legal = [], []
    for k in range(samples):
        text = with_line(bench.text, stmt, f"    parallel(i0)  # edit {k}", replace=True)
        if k % 2:  # every other edit also inserts a line above, moving everything below
            text = with_line(text, sched - 1, f"# note {k}")
            sched, stmt = sched + 1, stmt + 1
        v, t0 = bench.edit(text)
        t1, _, _ = await bench.wait_publish(v, 1)
        t2, _, _ = await bench.wait_publish(v, 2)
        first.append((t1 - t0) * 1e3)
        legal.append((t2 - t0) * 1e3)
    rows["diagnostics: syntax + semantic (first publish)"] = (first, 100.0)
    rows["diagnostics: + legality of the edited schedule (TVM)"] = (legal, None)
    await bench.settle()

    # ---- keyword completion at top level (a blank line between two items), after an edit on it
    top = find(bench.text, "target h200") + 1
    bench.edit(with_line(bench.text, top, ""))
    await bench.settle()
    xs = []
    for k in range(samples):
        bench.edit(with_line(bench.text, top, "s" if k % 2 else "", replace=True) + f"\n# {k}")
        ms, items = await bench.complete(top, 1 if k % 2 else 0)
        assert any(i.label == "schedule" for i in items), [i.label for i in items][:5]
        xs.append(ms)
        await bench.wait_publish(bench.version)
    rows["completion: keywords"] = (xs, 50.0)

    # ---- tensor names in an operator body
    body = find(bench.text, "T[i, j] += X[i, k] * W[j, k]")
    saved = bench.text
    xs = []
    for k in range(samples):
        line = f"    Z{k}[i, j] = X[i, j] + "
        bench.edit(with_line(bench.text, body + 1, line, replace=k > 0))
        ms, items = await bench.complete(body + 1, len(line))
        assert any(i.label == "X" for i in items), [i.label for i in items][:8]
        xs.append(ms)
        await bench.wait_publish(bench.version)
    bench.edit(saved)
    await bench.settle()
    rows["completion: tensor names in an op body"] = (xs, 50.0)

    # ---- loop names in a schedule statement, the statements above unchanged
    h200 = find(bench.text, "schedule matmul_0 on h200")
    after = find(bench.text, "compute_at(AS, k0)", h200)
    xs = []
    for k in range(samples):
        line = f"    x{k} = fuse(AS."
        bench.edit(with_line(bench.text, after + 1, line, replace=k > 0))
        ms, items = await bench.complete(after + 1, len(line))
        assert any(i.label == "AS.ax0" for i in items), [i.label for i in items][:8]
        xs.append(ms)
        await bench.wait_publish(bench.version)
    rows["completion: loop names (statements above unchanged)"] = (xs, 50.0)
    # ... and with a statement above edited, so that TVM applies them again
    split = find(bench.text, "split(C.i, [8, 1, 16, 4])", h200)
    xs = []
    for k in range(samples):
        a, b, c = FACTORS[k % len(FACTORS)]
        text = with_line(bench.text, split, f"    i0, i1, i2, i3 = split(C.i, [{a}, {b}, {c}, 1])", replace=True)
        bench.edit(with_line(text, after + 1, f"    y{k} = fuse(AS.", replace=True))
        ms, items = await bench.complete(after + 1, len(f"    y{k} = fuse(AS."))
        xs.append(ms)
        await bench.wait_publish(bench.version)
    rows["completion: loop names (a statement above edited: TVM)"] = (xs, None)
    bench.edit(base)
    await bench.settle()

    # ---- the generated schedule in an empty schedule block of an @auto operator
    auto_op = find(bench.text, "op layernorm_0")
    end = find(bench.text, "}", auto_op)
    bench.edit(with_line(bench.text, end + 1, "\nschedule layernorm_0 on cpu {\n    \n}"))
    await bench.settle()
    blank = find(bench.text, "schedule layernorm_0 on cpu") + 1
    xs, got = [], 0
    for k in range(samples):
        bench.edit(with_line(bench.text, blank, "    " if k % 2 else "  ", replace=True) + f"\n# {k}")
        ms, items = await bench.complete(blank, 4 if k % 2 else 2)
        got += any(i.kind == T.CompletionItemKind.Snippet for i in items)
        xs.append(ms)
        await bench.wait_publish(bench.version)
    rows["completion: generated schedule (op unchanged)"] = (xs, 500.0)
    # ... with the operator edited each time, so that the policy runs again
    eps = find(bench.text, "+ 0.00001", auto_op)
    orig = bench.text.split("\n")[eps]
    xs = []
    for k in range(samples):
        text = with_line(bench.text, eps, orig.replace("+ 0.00001", f"+ 0.0000{k + 10}"), replace=True)
        bench.edit(text)
        ms, items = await bench.complete(blank, 4)
        got += any(i.kind == T.CompletionItemKind.Snippet for i in items)
        xs.append(ms)
        await bench.wait_publish(bench.version)
    rows["completion: generated schedule (op edited: policy runs)"] = (xs, 500.0)

    st = await bench.status()
    await bench.client.shutdown_async(None)
    bench.client.exit(None)
    await bench.client.stop()
    return {"rows": rows, "startup_ms": startup_ms, "open_first_ms": first_ms, "open_full_ms": open_full_ms,
            "generated_items": got, "lines": base.count("\n"), "tvm_in_server": st.tvm_loaded}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--samples", type=int, default=40)
    ap.add_argument("--json", default=str(ROOT / "benchmarks" / "results" / "lsp_latency.json"))
    args = ap.parse_args()
    res = asyncio.run(run(args.samples))
    print(f"file: {res['lines']} lines; server start-up (initialize answered) {res['startup_ms']:.0f} ms; "
          f"open: first diagnostics {res['open_first_ms']:.0f} ms, with legality (cold TVM worker) "
          f"{res['open_full_ms']:.0f} ms; TVM imported by the server process: {res['tvm_in_server']}")
    head = f"{'measure':<58} {'n':>3} {'median ms':>10} {'p95 ms':>8} {'max ms':>8} {'target':>8}  ok"
    print(head)
    print("-" * len(head))
    out_rows = []
    ok_all = True
    for name, (xs, target) in res["rows"].items():
        med, q, mx = statistics.median(xs), p95(xs), max(xs)
        ok = target is None or q <= target
        ok_all &= ok
        print(f"{name:<58} {len(xs):>3} {med:>10.1f} {q:>8.1f} {mx:>8.1f} {target if target else '-':>8}  "
              f"{'yes' if ok and target else '-' if target is None else 'NO'}")
        out_rows.append({"measure": name, "samples": len(xs), "median_ms": round(med, 2), "p95_ms": round(q, 2),
                         "max_ms": round(mx, 2), "target_p95_ms": target, "within_target": ok if target else None})
    print(f"generated-schedule items offered: {res['generated_items']} of {2 * args.samples} schedule completions")
    print(f"host: {host_line()}")
    result = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "machine": {**describe(), "platform": platform.platform()},
        "file_lines": res["lines"], "server_startup_ms": round(res["startup_ms"], 1),
        "open_first_diagnostics_ms": round(res["open_first_ms"], 1),
        "open_with_legality_ms": round(res["open_full_ms"], 1), "tvm_imported_by_server": res["tvm_in_server"],
        "generated_items_offered": res["generated_items"], "results": out_rows,
    }
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.json}")
    return 0 if ok_all else 1


if __name__ == "__main__":
    sys.exit(main())
