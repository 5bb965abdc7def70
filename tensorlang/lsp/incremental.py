"""The core parser, applied chunk by chunk so that an edit re-parses only the chunks it touched.

`tensorlang.parser.parse` already cuts a file into top-level chunks (a target, an op with its
decorators, a schedule) and parses each on its own. Parsing a chunk's text alone gives the same
items, diagnostics and comments as inside the whole file, only with line numbers counted from the
chunk's first line; so each chunk's result is cached by its text and shifted to where the chunk is
now. Everything else -- names, shapes, types -- is `check_module` on the whole module, as in
`api.load_text`. The result is an `api.Document` equal to `api.load_text(text)` (tests/test_lsp_unit.py
checks that on random edits).

The chunking itself is the core's `parser.parse.chunks`, so both cut a file the same way.
"""
from __future__ import annotations

import dataclasses
from collections import OrderedDict

from tensorlang import api
from tensorlang.analysis import check_module
from tensorlang.diagnostics import error
from tensorlang.parser import ast as A
from tensorlang.parser import parse
from tensorlang.span import Span

from tensorlang.parser.parse import chunks as _core_chunks  # the same cut as `parse`

_FIELDS: dict[type, tuple[str, ...] | None] = {}


def shift(obj, dl: int):
    """A copy of an AST node (or diagnostic, or tuple of them) with every span moved down `dl` lines."""
    if dl == 0:
        return obj
    t = type(obj)
    if t is Span:
        return obj if obj.line == 0 else Span(obj.line + dl, obj.col, obj.end_line + dl, obj.end_col)
    if t is tuple:
        return tuple(shift(x, dl) for x in obj)
    if t is list:
        return [shift(x, dl) for x in obj]
    names = _FIELDS.get(t, ())
    if names == ():
        names = _FIELDS[t] = (tuple(f.name for f in dataclasses.fields(t))
                              if dataclasses.is_dataclass(t) else None)
    if names is None:
        return obj
    new = object.__new__(t)
    for name in names:
        object.__setattr__(new, name, shift(getattr(obj, name), dl))
    return new


@dataclasses.dataclass(frozen=True)
class Chunk:
    start: int  # 0-based first line
    end: int  # 0-based line after the last
    text: str
    items: tuple  # AST items at their real lines
    diags: tuple
    comments: tuple
    unparsed: frozenset

    @property
    def kind(self) -> str | None:
        """'target' | 'op' | 'schedule' | None, from the first word of the chunk's code."""
        for line in self.text.split("\n"):
            code = line.split("#", 1)[0].strip()
            if not code:
                continue
            if code.startswith("@"):
                return "op"
            word = code.split(None, 1)[0].split("(", 1)[0]
            return word if word in ("target", "op", "schedule") else None
        return None


class IncrementalParser:
    def __init__(self, max_entries: int = 4000):
        self._cache: OrderedDict[str, tuple] = OrderedDict()  # chunk text -> result at line 0
        self._placed: OrderedDict[tuple[str, int], Chunk] = OrderedDict()  # (text, start) -> Chunk
        self._max = max_entries

    def _parse_chunk(self, text: str):
        hit = self._cache.get(text)
        if hit is not None:
            self._cache.move_to_end(text)
            return hit
        module, diags = parse(text)
        value = (module.items, tuple(diags), module.comments, module.unparsed)
        self._cache[text] = value
        if len(self._cache) > self._max:
            self._cache.popitem(last=False)
        return value

    def chunks(self, text: str) -> list[Chunk]:
        lines = text.split("\n")
        bounds = _core_chunks(text)
        out = []
        for start, end in bounds:
            chunk_text = "\n".join(lines[start:end])
            key = (chunk_text, start)
            chunk = self._placed.get(key)
            if chunk is None:
                items, diags, comments, unparsed = self._parse_chunk(chunk_text)
                chunk = Chunk(start, end, chunk_text, shift(items, start), shift(diags, start),
                              shift(comments, start), unparsed)
                self._placed[key] = chunk
                if len(self._placed) > self._max:
                    self._placed.popitem(last=False)
            else:
                self._placed.move_to_end(key)
            out.append(chunk)
        return out

    def parse(self, text: str) -> tuple[A.Module, list, list[Chunk]]:
        """(module, syntax diagnostics, chunks), as `parser.parse(text)` gives the first two."""
        chunks = self.chunks(text)
        items, diags, comments, unparsed = [], [], [], set()
        for c in chunks:
            items.extend(c.items)
            diags.extend(c.diags)
            comments.extend(c.comments)
            unparsed.update(c.unparsed)
        blank = frozenset(n + 1 for n, line in enumerate(text.split("\n")) if not line.strip())
        return A.Module(tuple(items), tuple(comments), frozenset(unparsed), blank), diags, chunks

    def load(self, text: str, path: str = "<input>") -> tuple[api.Document, list[Chunk]]:
        """`api.load_text(text, path)`, re-parsing only the chunks that changed."""
        try:
            module, diags, chunks = self.parse(text)
            model, sem = check_module(module)
            return api.Document(path, text, module, model, diags + sem), chunks
        except Exception as e:  # the same contract as api.load_text: bad input never raises
            empty = A.Module(())
            from tensorlang.analysis.model import ModuleModel
            return api.Document(path, text, empty, ModuleModel(empty),
                                [error("TS900", f"internal error in the checker: {type(e).__name__}: {e}")]), []
