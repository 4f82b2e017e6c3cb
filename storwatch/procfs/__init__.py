"""Pure parsers for kernel text files: text in, frozen dataclasses out, no I/O."""

from __future__ import annotations


class LineError(ValueError):
    """A line a parser could not read; ``lineno`` is 1-based. Each parser has its own subclass, so callers can tell
    a bad mountinfo line from a bad diskstats line, and every one reads ``line N: what is wrong: 'the line'``."""

    def __init__(self, lineno: int, message: str, line: str) -> None:
        super().__init__(f"line {lineno}: {message}: {line!r}")
        self.lineno = lineno
        self.line = line
