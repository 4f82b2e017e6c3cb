"""Text from data (file and mount names, reasons that quote them, errors that embed paths) made safe to print on a
terminal or in a log: every character that a terminal acts on or that reorders or splits a line is shown as an
escape instead. It imports nothing of storwatch, so any module may use it.
"""

from __future__ import annotations

import logging
import unicodedata
from collections.abc import Mapping
from typing import TypeVar, cast

T = TypeVar("T")

__all__ = ["Lines", "PrintableFormatter", "printable", "printable_lines", "shown", "shown_data"]

# Beyond C0, DEL and C1: format characters (the bidirectional overrides and isolates that reorder what follows them,
# zero-width characters), surrogates (a name's bytes that are not UTF-8, as os.fsdecode leaves them) and the line and
# paragraph separators U+2028 and U+2029, which some terminals and most editors break lines at.
_ESCAPED_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})


def _escaped(char: str) -> str:
    code = ord(char)
    if code < 0x100:
        return f"\\x{code:02x}"
    if 0xDC80 <= code <= 0xDCFF:
        # A byte that is not UTF-8, kept by os.fsdecode's surrogateescape: shown as the byte it was on disk, as
        # sources.mounts.display_path shows it.
        return f"\\x{code - 0xDC00:02x}"
    if code <= 0xFFFF:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def _needs_escape(char: str) -> bool:
    if char < " " or "\x7f" <= char <= "\x9f":
        return True
    return char > "\x9f" and unicodedata.category(char) in _ESCAPED_CATEGORIES


def printable(text: str) -> str:
    """``text`` with every C0 and C1 control character and DEL (newline, carriage return, ESC and BEL included)
    written as ``\\xNN``, and every other Unicode format, surrogate or line/paragraph separator character as
    ``\\uNNNN`` (a surrogate of a byte that is not UTF-8 as ``\\xNN``, that byte). Printed, the result is one line
    that a terminal shows as it is.

    Backslashes are left as they are, as ``display_path`` leaves them, so escaping twice changes nothing; a name
    whose own characters spell an escape reads the same as the escaped one (``--json`` tells them apart).
    """
    if text.isprintable():  # nearly every name: no character to look at one by one
        return text
    return "".join(_escaped(c) if _needs_escape(c) else c for c in text)


def _undecodable(text: str) -> bool:
    return not text.isascii() and any("\ud800" <= c <= "\udfff" for c in text)


def shown(text: str) -> str:
    """``text`` (a name from disk, bytes kept as ``os.fsdecode`` leaves them) as Unicode text any output can carry: a
    byte that is not UTF-8 written ``\\xNN`` (the byte it was on disk), any other lone surrogate ``\\uNNNN``, the
    rest as it is. Names are bytes until shown: every output (JSON, labels, HTML, Events, webhooks) shows them so,
    where a lone surrogate would raise on encoding or reach a reader as no character at all."""
    if not _undecodable(text):
        return text
    return "".join(_escaped(c) if "\ud800" <= c <= "\udfff" else c for c in text)


def shown_data(data: T) -> T:
    """``data`` (mappings, lists and tuples of plain values, as json.dumps takes them) with every string, key or value,
    :func:`shown`; containers holding none that changes are kept as they are, not copied."""
    out: object = data
    if isinstance(data, str):
        out = shown(data)
    elif isinstance(data, Mapping):
        pairs = [(shown(k) if isinstance(k, str) else k, shown_data(v)) for k, v in data.items()]
        if not all(k is k0 and v is v0 for (k, v), (k0, v0) in zip(pairs, data.items(), strict=True)):
            out = dict(pairs)
    elif isinstance(data, list | tuple):
        items = [shown_data(v) for v in data]
        if not all(v is v0 for v, v0 in zip(items, data, strict=True)):
            out = items if isinstance(data, list) else tuple(items)
    return cast(T, out)


def printable_lines(text: str, indent: str = "    ") -> str:
    """``text`` of several lines (a log record with its traceback, a list of configuration errors): each line made
    printable, and every line after the first indented, so that no line of it, whatever data it quotes, can pass for
    a line of its own."""
    return ("\n" + indent).join(printable(line) for line in text.split("\n"))


class Lines(str):
    """Text quoted in a log record whose line breaks are its own, not data's (the list of errors found in a
    configuration file, one a line): :class:`PrintableFormatter` keeps them, each line made printable and indented."""

    __slots__ = ()


class PrintableFormatter(logging.Formatter):
    """A log formatter whose records are printable. What a record quotes (its arguments: mountpoints, paths, errors
    that embed them; or a message that is not a string) is data, made :func:`printable` whole, a newline included;
    the record's own further lines (its format string's, a traceback's, those of an argument given as :class:`Lines`)
    are kept, indented (:func:`printable_lines`). So no quoted name can move the cursor or start a line that looks
    like a record."""

    def format(self, record: logging.LogRecord) -> str:
        if record.args or not isinstance(record.msg, str):
            # A copy: other handlers (pytest's, say) see the record as it was logged.
            record = logging.makeLogRecord(
                {
                    **record.__dict__,
                    "msg": record.msg if isinstance(record.msg, str) else printable(str(record.msg)),
                    "args": _quoted(record.args),
                }
            )
        return printable_lines(super().format(record))


def _quoted(args: tuple[object, ...] | Mapping[str, object] | None) -> tuple[object, ...] | Mapping[str, object] | None:
    if isinstance(args, Mapping):
        return {key: _data(value) for key, value in args.items()}
    return None if args is None else tuple(_data(value) for value in args)


def _data(value: object) -> object:
    # Numbers stay numbers, for the %d and %.0f of format strings; Lines keep their line breaks (the whole record is
    # made printable_lines after); anything else is shown as its printable str.
    if value is None or isinstance(value, int | float | Lines):
        return value
    return printable(str(value))
