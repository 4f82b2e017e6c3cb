"""GGUF model files: a file written the way llama.cpp's gguf writer lays it out is complete; cut short anywhere it is
incomplete; damaged headers are corrupt, never a crash or an unbounded read."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from storwatch.checkpoints.formats import check, identify
from tests.builders import gguf_bytes


def write(tmp_path: Path, data: bytes, name: str = "model-q8_0.gguf") -> str:
    p = tmp_path / name
    p.write_bytes(data)
    return str(p)


@pytest.mark.parametrize("alignment", [None, 64, 4096])
def test_a_whole_file_is_complete(tmp_path: Path, alignment: int | None) -> None:
    path = write(tmp_path, gguf_bytes(alignment))
    r = check(path)
    assert (r.format, r.verdict) == ("gguf", "complete"), r.reason
    assert identify(write(tmp_path, gguf_bytes(), "weights")) == "gguf"  # by its magic, whatever the name


def test_cut_short_anywhere_is_incomplete(tmp_path: Path) -> None:
    data = gguf_bytes()
    for cut in (10, 30, 200, len(data) // 2, len(data) - 300, len(data) - 1):
        r = check(write(tmp_path, data[:cut]))
        assert r.verdict == "incomplete", (cut, r.reason)


@pytest.mark.parametrize(
    "damage",
    [
        lambda d: b"GGUX" + d[4:],
        lambda d: d[:8] + struct.pack("<Q", 1 << 40) + d[16:],  # tensor count
        lambda d: d[:16] + struct.pack("<Q", 1 << 60) + d[24:],  # metadata count
        lambda d: d[:24] + struct.pack("<Q", 1 << 50) + d[32:],  # the first key's length
    ],
)
def test_damaged_headers_are_corrupt_or_incomplete_quickly(tmp_path: Path, damage: object) -> None:
    r = check(write(tmp_path, damage(gguf_bytes())))  # type: ignore[operator]
    assert r.verdict in ("corrupt", "incomplete"), r.reason


def test_an_old_version_is_unknown_not_misread(tmp_path: Path) -> None:
    data = gguf_bytes()
    r = check(write(tmp_path, data[:4] + struct.pack("<I", 1) + data[8:]))
    assert r.verdict == "unknown" and "version 1" in r.reason
