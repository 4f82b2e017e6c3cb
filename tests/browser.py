"""Reading the status page: HTML parsers for its tables and its SVG pictures, and headless Chromium to render it."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest

CHROMIUM_TIMEOUT = 60.0


class TableParser(HTMLParser):
    """Collects the text of every cell of the table with a given id: header rows and body rows apart."""

    def __init__(self, table_id: str) -> None:
        super().__init__(convert_charrefs=True)
        self.table_id = table_id
        self.found = False
        self.head_rows: list[list[str]] = []
        self.body_rows: list[list[str]] = []
        self.row_classes: list[str] = []
        self._table_depth = 0  # >0 while inside the table (nested tables counted)
        self._section = ""
        self._row: list[str] | None = None
        self._cell: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "table":
            if self._table_depth:
                self._table_depth += 1
            elif dict(attrs).get("id") == self.table_id:
                self.found = True
                self._table_depth = 1
            return
        if self._table_depth != 1:
            return
        if tag in ("thead", "tbody", "tfoot"):
            self._section = tag
        elif tag == "tr":
            self._row = []
            if self._section == "tbody":
                self.row_classes.append(dict(attrs).get("class") or "")
        elif tag in ("td", "th") and self._row is not None:
            self._cell = []

    def handle_endtag(self, tag: str) -> None:
        if tag == "table" and self._table_depth:
            self._table_depth -= 1
            return
        if self._table_depth != 1:
            return
        if tag in ("td", "th") and self._cell is not None and self._row is not None:
            self._row.append(" ".join("".join(self._cell).split()))
            self._cell = None
        elif tag == "tr" and self._row is not None:
            (self.head_rows if self._section == "thead" else self.body_rows).append(self._row)
            self._row = None
        elif tag in ("thead", "tbody", "tfoot"):
            self._section = ""

    def handle_data(self, data: str) -> None:
        if self._table_depth == 1 and self._cell is not None:
            self._cell.append(data)


class Elements(HTMLParser):
    """Every start tag with its attributes, and the text of each <title>."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str]]] = []
        self.titles: list[str] = []
        self._in_title = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, {k: v or "" for k, v in attrs}))
        self._in_title = tag == "title"

    def handle_data(self, data: str) -> None:
        if self._in_title:
            self.titles.append(data)
            self._in_title = False

    def having(self, tag: str, cls: str) -> list[dict[str, str]]:
        return [a for t, a in self.tags if t == tag and cls in a.get("class", "").split()]


def run_chromium(chromium: str, profile: Path, *args: str) -> subprocess.CompletedProcess[bytes]:
    """Headless Chromium in a session of its own, so a timeout kills the browser's whole process tree."""
    cmd = [
        chromium,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--no-first-run",
        f"--user-data-dir={profile}",
        *args,
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=CHROMIUM_TIMEOUT)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"chromium did not finish within {CHROMIUM_TIMEOUT} s: {err.decode(errors='replace')[-2000:]}")
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)
