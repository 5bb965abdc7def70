"""Source spans: 1-based line and column, end exclusive."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, order=True)
class Span:
    line: int
    col: int
    end_line: int
    end_col: int

    def contains(self, line: int, col: int) -> bool:
        return (self.line, self.col) <= (line, col) <= (self.end_line, self.end_col)


NO_SPAN = Span(0, 0, 0, 0)


def line_starts(text: str) -> list[int]:
    """The character offset at which each line of `text` starts (lines split at "\n")."""
    return [0] + [i + 1 for i, ch in enumerate(text) if ch == "\n"]


def offset_in(starts: list[int], text: str, line0: int, col0: int) -> int:
    """The character offset of a 0-based (line, col) given `line_starts(text)`, clamped into the text."""
    line0 = max(0, min(line0, len(starts) - 1))
    end = starts[line0 + 1] - 1 if line0 + 1 < len(starts) else len(text)
    return starts[line0] + max(0, min(col0, end - starts[line0]))
