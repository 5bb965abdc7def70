"""Positions and tokens of a document's text (no pygls, no TVM).

The core's spans are 1-based, columns counted in characters (code points), end exclusive. LSP positions
are 0-based with columns in the negotiated encoding: UTF-16 code units by default, or UTF-8 bytes, or
UTF-32 (= code points). `LineIndex` converts both ways; ASCII lines (nearly all) take a fast path.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from tensorlang.span import line_starts, offset_in

UTF8, UTF16, UTF32 = "utf-8", "utf-16", "utf-32"


class LineIndex:
    def __init__(self, text: str, encoding: str = UTF16):
        self.text = text
        self.lines = text.split("\n")
        self.encoding = encoding if encoding in (UTF8, UTF16, UTF32) else UTF16
        self._starts: list[int] | None = None

    def line(self, n0: int) -> str:
        """Line n (0-based) without its newline ('' past the end)."""
        return self.lines[n0].rstrip("\r") if 0 <= n0 < len(self.lines) else ""

    def _units(self, s: str) -> int:
        if s.isascii() or self.encoding == UTF32:
            return len(s)
        if self.encoding == UTF16:
            return len(s) + sum(1 for ch in s if ord(ch) > 0xFFFF)
        return len(s.encode("utf-8"))

    def to_units(self, n0: int, col0: int) -> int:
        """Code-point column -> column in the encoding."""
        text = self.line(n0)
        if text.isascii() or self.encoding == UTF32:
            return col0
        return self._units(text[:col0]) + max(0, col0 - len(text))

    def from_units(self, n0: int, units: int) -> int:
        """Column in the encoding -> code-point column (clamped to the line)."""
        text = self.line(n0)
        if text.isascii() or self.encoding == UTF32:
            return max(0, min(units, len(text)))
        count = 0
        for i, ch in enumerate(text):
            if count >= units:
                return i
            count += (2 if ord(ch) > 0xFFFF else 1) if self.encoding == UTF16 else len(ch.encode("utf-8"))
        return len(text)

    def length_units(self, n0: int, col0: int, length: int) -> int:
        text = self.line(n0)
        return self._units(text[col0:col0 + length])

    def span_to_range(self, span) -> tuple[tuple[int, int], tuple[int, int]]:
        """A 1-based core span -> ((line0, unit col), (line0, unit col)), clamped into the document."""
        last = max(len(self.lines) - 1, 0)
        if span.line <= 0:  # NO_SPAN: the file as a whole; the CLI prints it at 1:1
            return (0, 0), (0, 0)
        l0 = min(span.line - 1, last)
        l1 = min(max(span.end_line - 1, l0), last)
        c0 = max(span.col - 1, 0) if span.line - 1 <= last else len(self.line(last))
        c1 = max(span.end_col - 1, 0) if span.end_line - 1 <= last else len(self.line(last))
        if (l1, c1) < (l0, c0):
            l1, c1 = l0, c0
        return (l0, self.to_units(l0, c0)), (l1, self.to_units(l1, c1))

    def offset(self, n0: int, col0: int) -> int:
        """Character offset of a 0-based (line, code-point col) in the text."""
        if self._starts is None:
            self._starts = line_starts(self.text)
        return offset_in(self._starts, self.text, n0, col0)


# ------------------------------------------------------------------ lexer
TOKEN_RE = re.compile(r"""
    (?P<comment>\#[^\n]*)
  | (?P<string>"(?:[^"\\\n]|\\.)*"?)
  | (?P<number>(?:\d+\.\d*|\.\d+)(?:[eE][+-]?\d+)?|\d+[eE][+-]?\d+|\d+)
  | (?P<stageop>(?:max|min)=(?!=))
  | (?P<name>[A-Za-z_][A-Za-z0-9_]*)
  | (?P<op>->|\+=|//|\*\*|<=|>=|==|!=|[-+*/%<>=(){}\[\],:.@])
  | (?P<ws>[ \t\r\f\v]+)
  | (?P<nl>\n)
  | (?P<other>.)
""", re.X)


@dataclass(frozen=True)
class Token:
    kind: str  # comment string number stageop name op other
    text: str
    line: int  # 0-based
    col: int  # 0-based, code points

    @property
    def end_col(self) -> int:
        return self.col + len(self.text)


def tokenize(text: str, first_line: int = 0) -> list[Token]:
    """Tokens of `text` (whitespace dropped); `first_line` is the 0-based line of its first character."""
    out = []
    line, line_start = first_line, 0
    for m in TOKEN_RE.finditer(text):
        kind = m.lastgroup
        if kind == "nl":
            line += 1
            line_start = m.end()
            continue
        if kind == "ws":
            continue
        out.append(Token(kind, m.group(), line, m.start() - line_start))
    return out


def strip_comment(line: str) -> str:
    """The code part of a line (a '#' inside a string is not a comment)."""
    in_str = esc = False
    for i, ch in enumerate(line):
        if in_str:
            if esc:
                esc = False
            elif ch == "\\":
                esc = True
            elif ch == '"':
                in_str = False
        elif ch == '"':
            in_str = True
        elif ch == "#":
            return line[:i]
    return line


def word_before(line_text: str, col0: int) -> tuple[int, str]:
    """The (possibly dotted) identifier that ends at col0: (start col, text)."""
    head = line_text[:col0]
    m = re.search(r"[A-Za-z_][A-Za-z0-9_.]*$", head)
    if not m:
        return col0, ""
    return m.start(), m.group()


def word_at(line_text: str, col0: int) -> tuple[int, int, str]:
    """The identifier (dots excluded) under col0: (start, end, text); empty when none."""
    start = col0
    while start > 0 and (line_text[start - 1].isalnum() or line_text[start - 1] == "_"):
        start -= 1
    end = col0
    while end < len(line_text) and (line_text[end].isalnum() or line_text[end] == "_"):
        end += 1
    return start, end, line_text[start:end]
