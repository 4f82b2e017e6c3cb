"""The safetensors header read entry by entry (checkpoints/formats/safetensors.py): a table of headers, each judged
by check() and by the safetensors library itself (``safetensors.deserialize``), which must agree; the JSON depth
bound on odd documents; and a quarter of a million tensors checked within a bounded memory and the parse budget."""

from __future__ import annotations

import json
import struct
import threading
import tracemalloc
from pathlib import Path

import pytest

from storwatch.checkpoints import DeepLimits, check
from storwatch.checkpoints.formats.common import json_depth_exceeds
from storwatch.checkpoints.limits import MIB, PARSE_BUDGET
from tests.wide_headers import WIDE_TENSORS, wide_safetensors


def f32(begin: int, end: int) -> str:
    """The entry of a tensor of F32 whose extent is [begin, end) (its shape says 2 elements)."""
    return '{"dtype":"F32","shape":[2],"data_offsets":[' + f"{begin},{end}" + "]}"


def fill(template: str, *entries: str) -> str:
    """``template`` with each ``@`` replaced by the next entry."""
    for entry in entries:
        template = template.replace("@", entry, 1)
    return template


def _file(path: Path, header: bytes, data: bytes) -> Path:
    path.write_bytes(struct.pack("<Q", len(header)) + header + data)
    return path


# (id, header, data bytes, our verdict, what the reason says)
HEADERS = [
    ("canonical", fill('{"a":@,"b":@}', f32(0, 8), f32(8, 16)), 16, "complete", ""),
    ("spaced", '{ "a" : { "dtype" : "F32" , "shape" : [ 2 ] , "data_offsets" : [ 0 , 8 ] } }   ', 8, "complete", ""),
    ("keys-reordered", '{"a":{"data_offsets":[0,8],"shape":[2],"dtype":"F32"}}', 8, "complete", ""),
    ("escaped-name", fill('{"a\\u00e9\\"q":@}', f32(0, 8)), 8, "complete", ""),
    ("utf8-name", fill('{"\u00e9\u4e2d\U0001f600":@}', f32(0, 8)), 8, "complete", ""),
    ("metadata", fill('{"__metadata__":{"format":"pt","x":"{[\\"]"},"a":@}', f32(0, 8)), 8, "complete", ""),
    ("metadata-null", fill('{"__metadata__":null,"a":@}', f32(0, 8)), 8, "complete", ""),
    ("no-tensors", "{}", 0, "complete", ""),
    ("scalar", '{"a":{"dtype":"I64","shape":[],"data_offsets":[0,8]}}', 8, "complete", ""),
    (
        "empty-on-a-boundary",
        fill('{"a":@,"e":{"dtype":"F32","shape":[0],"data_offsets":[8,8]},"b":@}', f32(0, 8), f32(8, 16)),
        16,
        "complete",
        "",
    ),
    (
        "empty-inside-another",
        fill('{"a":@,"e":{"dtype":"F32","shape":[0],"data_offsets":[4,4]}}', f32(0, 8)),
        8,
        "corrupt",
        "'e' is empty at 4",
    ),
    ("gap", fill('{"a":@,"b":@}', f32(0, 8), f32(12, 20)), 20, "corrupt", "'b' starts at 12"),
    ("overlap", fill('{"a":@,"b":@}', f32(0, 8), f32(4, 12)), 12, "corrupt", "starts at 4"),
    ("not-from-0", fill('{"a":@}', f32(4, 12)), 12, "corrupt", "starts at 4"),
    ("size-mismatch", '{"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}', 8, "corrupt", "needs 12"),
    ("leading-zero", '{"a":{"dtype":"F32","shape":[2],"data_offsets":[00,8]}}', 8, "corrupt", "not valid JSON"),
    ("float-offset", '{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8.0]}}', 8, "corrupt", "data_offsets"),
    ("negative-dim", '{"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}}', 8, "corrupt", "shape"),
    ("no-dtype", '{"a":{"shape":[2],"data_offsets":[0,8]}}', 8, "corrupt", "dtype"),
    ("not-an-object", "[1,2]", 0, "corrupt", "not a JSON object"),
    ("tensor-not-an-object", '{"a":[0,8]}', 8, "corrupt", "not an object"),
    ("unterminated", fill('{"a":@', f32(0, 8)), 8, "corrupt", "invalid"),
    ("junk-after", fill('{"a":@}x', f32(0, 8)), 8, "corrupt", "follow the header"),
    ("control-in-name", fill('{"a\nb":@}', f32(0, 8)), 8, "corrupt", "not a JSON string"),
    ("duplicate", fill('{"a":@,"a":@}', f32(0, 8), f32(8, 16)), 16, "corrupt", "'a' is listed twice"),
    ("duplicate-escaped", fill('{"a":@,"\\u0061":@}', f32(0, 8), f32(8, 16)), 16, "corrupt", "twice"),
    ("trailing-comma", fill('{"a":@,}', f32(0, 8)), 8, "corrupt", "invalid"),
]


@pytest.mark.parametrize(("header", "data", "verdict", "says"), [h[1:] for h in HEADERS], ids=[h[0] for h in HEADERS])
def test_header_table(tmp_path: Path, header: str, data: int, verdict: str, says: str) -> None:
    path = _file(tmp_path / "m.safetensors", header.encode(), bytes(data))
    result = check(str(path))
    assert (result.verdict, result.format) == (verdict, "safetensors"), result.reason
    assert says in result.reason
    # The library is the judge of what a legal file is: it must load exactly those we call complete.
    safetensors = pytest.importorskip("safetensors")
    try:
        safetensors.deserialize(path.read_bytes())
        loads = True
    except Exception:
        loads = False
    assert loads == (verdict == "complete"), f"safetensors {'loads' if loads else 'refuses'} it; we: {result.reason}"


def test_non_utf8_header_is_corrupt(tmp_path: Path) -> None:
    header = b'{"a\xff":' + f32(0, 8).encode() + b"}"
    result = check(str(_file(tmp_path / "m.safetensors", header, bytes(8))))
    assert result.verdict == "corrupt" and "UTF-8" in result.reason


@pytest.mark.parametrize(
    ("doc", "limit", "deeper"),
    [
        (b"[" * 200_000 + b"]" * 200_000, 64, True),
        (b"[" * 65 + b"]" * 65, 64, True),
        (b"[" * 64 + b"]" * 64, 64, False),
        (b"[" * 65, 64, True),  # unmatched openers are nesting too
        (b'{"a":"[[[[[[[[","b":[{}]}', 3, False),  # brackets inside strings do not count
        (b'{"a":"\\"[[[[","b":"\\\\"}', 1, False),  # nor after an escaped quote or backslash
        (b'{"a":[{"b":[1]}]}', 4, False),
        (b'{"a":[{"b":[1]}]}', 3, True),
        (b"42", 0, False),
    ],
    ids=["200k", "65", "64", "unmatched", "in-strings", "escapes", "4-of-4", "4-of-3", "scalar"],
)
def test_json_depth(doc: bytes, limit: int, deeper: bool) -> None:
    assert json_depth_exceeds(doc, limit) is deeper


def test_a_quarter_million_tensors_are_judged_in_bounded_memory(tmp_path: Path) -> None:
    """The legal 14.6 MB header is read, not refused: built as dicts it took about 200 MB; read entry by entry,
    the check holds the header and about 100 bytes per tensor."""
    empty = wide_safetensors(tmp_path / "empty.safetensors")
    stored = wide_safetensors(tmp_path / "stored.safetensors", tensors=150_000, stored=150_000)
    for path in (empty, stored):
        header_len = struct.unpack("<Q", path.read_bytes()[:8])[0]
        tracemalloc.start()
        try:
            result = check(str(path))
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert result.verdict == "complete", result.reason
        print(f"{path.name}: header {header_len / MIB:.1f} MiB, traced peak {peak / MIB:.1f} MiB")
        assert peak < 3 * header_len + 100 * WIDE_TENSORS
    assert PARSE_BUDGET.in_use == 0


def test_too_many_tensors_and_over_the_budget_are_unknown(tmp_path: Path) -> None:
    path = wide_safetensors(tmp_path / "wide.safetensors", tensors=20_000)
    result = check(str(path), limits=DeepLimits(max_json_values=10_000))
    assert (result.verdict, result.limit) == ("unknown", "max_json_values")
    assert "10,000" in result.reason
    result = check(str(path), limits=DeepLimits(parse_budget_bytes=1 * MIB))
    assert (result.verdict, result.limit) == ("unknown", "parse_budget_bytes")
    assert "MiB that metadata parses may hold at once" in result.reason
    index = tmp_path / "model.safetensors.index.json"
    index.write_text(json.dumps({"weight_map": {f"t{i}": "wide.safetensors" for i in range(20_000)}}))
    result = check(str(index), limits=DeepLimits(max_json_values=10_000))
    assert (result.verdict, result.limit) == ("unknown", "max_json_values")


def test_parses_wait_for_each_other_in_the_budget(tmp_path: Path) -> None:
    """Two checks whose headers cannot both fit: the second waits until the first is done, then is judged; the
    budget's peak never passes its capacity."""
    path = wide_safetensors(tmp_path / "wide.safetensors", tensors=40_000)
    limits = DeepLimits(parse_budget_bytes=12 * MIB)  # one header needs about 9.3 MiB
    PARSE_BUDGET.peak = 0
    results: list[str] = []
    threads = [threading.Thread(target=lambda: results.append(check(str(path), limits=limits).verdict)) for _ in "ab"]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert results == ["complete", "complete"]
    assert 0 < PARSE_BUDGET.peak <= 12 * MIB and PARSE_BUDGET.in_use == 0


def test_sharded_index_names_tensors_a_shard_lacks(tmp_path: Path) -> None:
    wide_safetensors(tmp_path / "model-00001-of-00001.safetensors", tensors=5_000)
    names = {f"w{i:06d}": "model-00001-of-00001.safetensors" for i in range(5_000)}
    index = tmp_path / "model.safetensors.index.json"
    index.write_text(json.dumps({"weight_map": names}))
    assert check(str(tmp_path)).verdict == "complete"
    index.write_text(json.dumps({"weight_map": {**names, "w999999": "model-00001-of-00001.safetensors"}}))
    result = check(str(tmp_path))
    assert result.verdict == "corrupt" and "'w999999'" in result.reason
