"""storwatch.printable: what a name from data becomes on a terminal and in a log line."""

from __future__ import annotations

import io
import logging

import pytest

from storwatch.printable import Lines, PrintableFormatter, printable, printable_lines


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        pytest.param("/data/run-1/step-00100.safetensors", "/data/run-1/step-00100.safetensors", id="plain"),
        pytest.param("/mnt/café ☃/日本", "/mnt/café ☃/日本", id="letters-of-any-script"),
        pytest.param("/a b\\x1b", "/a b\\x1b", id="spaces-and-backslashes-kept"),
        pytest.param("a\x1b[1Ab\x1b[2K", "a\\x1b[1Ab\\x1b[2K", id="esc"),
        pytest.param("a\rb\nc\td\x07\x00", "a\\x0db\\x0ac\\x09d\\x07\\x00", id="c0"),
        pytest.param("a\x7fb", "a\\x7fb", id="del"),
        pytest.param("a\x9b31mb\x85c", "a\\x9b31mb\\x85c", id="c1-csi-and-nel"),
        pytest.param("evil\u202egnp.sh", "evil\\u202egnp.sh", id="bidi-override"),
        pytest.param("a\u2066b\u2069c\u200fd", "a\\u2066b\\u2069c\\u200fd", id="bidi-isolates-and-marks"),
        pytest.param("a\u2028b\u2029c", "a\\u2028b\\u2029c", id="line-and-paragraph-separators"),
        pytest.param("a\u200bb\ufeffc", "a\\u200bb\\ufeffc", id="zero-width"),
        pytest.param("tag\U000e0041", "tag\\U000e0041", id="astral-format-character"),
        pytest.param("bad\udcffbyte", "bad\\xffbyte", id="non-utf8-byte-as-on-disk"),
        pytest.param("lone\ud800", "lone\\ud800", id="other-surrogate"),
    ],
)
def test_printable(text: str, shown: str) -> None:
    assert printable(text) == shown
    assert printable(shown) == shown  # escaping twice changes nothing
    assert shown.isascii() or shown == text or "\\" in shown


def test_every_control_character_is_escaped_and_nothing_else_of_latin1() -> None:
    for code in range(0x100):
        char = chr(code)
        expected = f"\\x{code:02x}" if code < 0x20 or 0x7F <= code <= 0x9F else char
        if code == 0xAD:  # SOFT HYPHEN: a format character (Cf), shown only where a line breaks
            expected = "\\xad"
        assert printable(char) == expected, hex(code)


def test_printable_lines_keeps_lines_and_indents_all_but_the_first() -> None:
    assert printable_lines("one\ntwo\x1b[2J\nthree") == "one\n    two\\x1b[2J\n    three"
    assert printable_lines("a\nb", indent="") == "a\nb"
    assert printable_lines("a\r\nb") == "a\\x0d\n    b"


def test_a_log_record_quoting_a_hostile_path_is_one_record_on_screen() -> None:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(PrintableFormatter("%(levelname)s %(name)s: %(message)s"))
    log = logging.getLogger("storwatch.test_printable")
    log.addHandler(handler)
    log.propagate = False
    try:
        path = "/ckpt/x\x1b[2K\rINFO storwatch: all well\n\x07"
        log.warning("cannot read %s", path)
        try:
            raise RuntimeError(f"cannot open {path}")
        except RuntimeError:
            log.exception("scan of %s failed", "/ckpt")
    finally:
        log.removeHandler(handler)
    text = stream.getvalue()
    assert not set(text) & {"\x1b", "\r", "\x07"}
    lines = text.splitlines()
    # The quoted path is data: escaped whole, its newline too, so the record is one line.
    assert lines[0] == (
        "WARNING storwatch.test_printable: cannot read /ckpt/x\\x1b[2K\\x0dINFO storwatch: all well\\x0a\\x07"
    )
    # A traceback's lines are the record's own: kept, indented after the first, the exception's message (the path in
    # it) escaped; its newline starts one more indented line, never a record of its own.
    assert lines[1] == "ERROR storwatch.test_printable: scan of /ckpt failed"
    assert [line for line in lines if not line.startswith("    ")] == lines[:2]
    assert "    RuntimeError: cannot open /ckpt/x\\x1b[2K\\x0dINFO storwatch: all well" in lines
    assert lines[-1] == "    \\x07"


def test_a_message_that_is_not_a_string_is_data_too() -> None:
    formatter = PrintableFormatter("%(message)s")
    record = logging.LogRecord("x", logging.ERROR, __file__, 1, OSError("no\nway\x1b"), None, None)
    assert formatter.format(record) == "no\\x0away\\x1b"
    numbers = logging.LogRecord("x", logging.INFO, __file__, 1, "%d of %.1f s in %s", (3, 2.25, "/a\nb"), None)
    assert formatter.format(numbers) == "3 of 2.2 s in /a\\x0ab"
    assert numbers.args == (3, 2.25, "/a\nb")  # the record itself is left as it was logged


def test_lines_quoted_keep_their_own_line_breaks_indented() -> None:
    formatter = PrintableFormatter("%(levelname)s: %(message)s")
    errors = Lines("/etc/a.yaml:3: mounts: bad\n/etc/a.yaml:7: tls\x1b[2J: bad")
    record = logging.LogRecord("x", logging.ERROR, __file__, 1, "reload failed:\n%s", (errors,), None)
    assert formatter.format(record).splitlines() == [
        "ERROR: reload failed:",
        "    /etc/a.yaml:3: mounts: bad",
        "    /etc/a.yaml:7: tls\\x1b[2J: bad",
    ]
