"""torch.distributed.checkpoint (also Megatron's torch_dist) and torchsnapshot: metadata read with the restricted
unpickler (DCP) or as bounded JSON/YAML (torchsnapshot), and each shard's size compared with the extent the
metadata places in it, so a shard cut short is ``incomplete`` without reading bulk data."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

from storwatch.checkpoints import pickles
from storwatch.checkpoints.formats.common import (
    _DCP_METADATA,
    _OK,
    _TORCH_DTYPE_BYTES,
    FALLBACK,
    _Bad,
    _Ctx,
    _dcp_resolver,
    _dir_names,
    _Finding,
    _load_json,
    _load_yaml,
    _open_regular,
    _read_all,
    _read_bounded,
    _safe_relative,
    _unsafe,
    _worst,
)
from storwatch.checkpoints.formats.safetensors import _check_index

# ---- torch Distributed Checkpoint ------------------------------------------------------------------------------


def _check_dcp(path: str, ctx: _Ctx) -> _Finding:
    entries = _dir_names(path)
    # Without rank coordination each rank writes its own __N.metadata for its own files.
    ranks = sorted(e for e in entries if _DCP_METADATA.fullmatch(e))
    metadata = [".metadata"] if ".metadata" in entries else ranks
    if not metadata:
        tmp = " (only .metadata.tmp: it stopped while writing the metadata)" if ".metadata.tmp" in entries else ""
        return (
            "incomplete",
            f"no .metadata file{tmp}: torch.distributed.checkpoint writes it last, after every rank's "
            f"data, so this save did not finish; {FALLBACK}",
        )
    finding = _OK
    for name in metadata:
        finding = _worst(finding, _check_dcp_metadata(path, name, ctx))
    return finding


def _check_dcp_metadata(path: str, name: str, ctx: _Ctx) -> _Finding:
    data = _read_bounded(os.path.join(path, name), path, ctx.limits.max_pickle_bytes, "max_pickle_bytes", name)
    if not data:
        return "corrupt", f"{name} is empty although DCP renames it into place only when written; {FALLBACK}"
    if data[:1] == b"{":
        # torch's Hugging Face storage writer keeps a safetensors index in .metadata instead of a pickle.
        return _check_index(data, path, name, ctx)
    try:
        metadata = pickles.load(
            data,
            _dcp_resolver(ctx.limits.allowed_globals),
            None,
            ctx.limits.max_pickle_objects,
            ctx.deadline,
            ctx.unknown,
        )
    except pickles.UnsafeGlobal as err:
        return _unsafe(name, err)
    except pickles.PickleError as err:
        return "corrupt", f"{name} is not a valid DCP metadata pickle: {err}; {FALLBACK}"
    extents = _dcp_extents(metadata, name)
    if extents is None:
        return (
            "complete",
            f"{name} holds no file-system storage table (a storage layer storwatch does not know wrote it): only "
            "its presence was checked",
        )
    for rel, end in sorted(extents.items()):
        data_path = os.path.join(path, rel)
        if not os.path.lexists(data_path):
            return (
                "incomplete",
                f"{rel}, named in {name}, is missing: the save did not finish or the directory was copied or "
                f"cleaned up only in part; {FALLBACK}",
            )
        f, size = _open_regular(data_path, path)
        with f:
            if end > size:
                return (
                    "incomplete",
                    f"{rel} has {size:,} bytes but {name} places data up to {end:,}: the file was truncated; "
                    f"{FALLBACK}",
                )
            if ctx.deep and _read_all(f, ctx) < end:
                return "incomplete", f"{rel} ended before {end:,} bytes while being read; {FALLBACK}"
    return _OK


def _dcp_extents(metadata: Any, name: str) -> dict[str, int] | None:
    """The end of the last byte the metadata places in each data file (relative path -> offset + length)."""

    def bad(problem: str) -> _Bad:
        return _Bad("corrupt", f"{name} is not DCP metadata as torch writes it: {problem}; {FALLBACK}")

    if not isinstance(metadata, pickles.Record) or not metadata.kind.endswith(".Metadata"):
        raise bad(f"it holds a {getattr(metadata, 'kind', type(metadata).__name__)!s:.80}, not a Metadata")
    storage = metadata.get("storage_data")
    if storage is None:
        return None
    if not isinstance(storage, dict):
        raise bad("its storage_data is not a table")
    extents: dict[str, int] = {}
    for info in storage.values():
        if not isinstance(info, pickles.Record) or not info.kind.endswith("._StorageInfo"):
            if isinstance(info, pickles.Record) and info.kind.endswith("._HFStorageInfo"):
                continue  # safetensors-backed DCP: the files carry their own headers, checked as shards
            raise bad("an entry of its storage_data is not a _StorageInfo")
        rel, offset, length = info.get("relative_path"), info.get("offset"), info.get("length")
        if not isinstance(rel, str) or not _safe_relative(rel):
            raise bad(f"a storage entry names the file {str(rel)[:80]!r}, outside the checkpoint directory")
        if type(offset) is not int or type(length) is not int or not (0 <= offset < 1 << 63 and 0 <= length < 1 << 63):
            raise bad(f"a storage entry of {rel[:80]!r} has no valid offset and length")
        extents[rel] = max(extents.get(rel, 0), offset + length)
    return extents


# ---- torchsnapshot -----------------------------------------------------------------------------------------------


def _check_torchsnapshot(path: str, ctx: _Ctx) -> _Finding:
    if ".snapshot_metadata" not in _dir_names(path):
        return (
            "incomplete",
            f"no .snapshot_metadata: torchsnapshot writes it last, so this snapshot did not finish; {FALLBACK}",
        )
    raw = _read_bounded(
        os.path.join(path, ".snapshot_metadata"),
        path,
        ctx.limits.max_yaml_bytes,
        "max_yaml_bytes",
        ".snapshot_metadata",
    )
    # torchsnapshot 0.1 writes JSON (a subset of YAML); older releases wrote YAML.
    document = _load_json(raw, ".snapshot_metadata", ctx) if raw.lstrip()[:1] == b"{" else _load_yaml(raw, ctx)
    manifest = document.get("manifest") if isinstance(document, dict) else None
    if not isinstance(manifest, dict):
        return "corrupt", f".snapshot_metadata has no manifest: it is damaged or not torchsnapshot's; {FALLBACK}"
    extents: dict[str, int] = {}
    for key, entry in manifest.items():
        for location, end in _snapshot_extents(entry):
            if not _safe_relative(location):
                return "corrupt", f"the manifest entry {str(key)[:80]!r} names a file outside the snapshot"
            extents[location] = max(extents.get(location, 0), end)
    for location, end in sorted(extents.items()):
        data_path = os.path.join(path, location)
        if not os.path.lexists(data_path):
            return (
                "incomplete",
                f"{location}, named in the manifest, is missing: the snapshot was copied or cleaned up only in "
                f"part; {FALLBACK}",
            )
        f, size = _open_regular(data_path, path)
        with f:
            if end > size:
                return (
                    "incomplete",
                    f"{location} has {size:,} bytes but the manifest places data up to {end:,}: the file was "
                    f"truncated; {FALLBACK}",
                )
            if ctx.deep:
                _read_all(f, ctx)
    return _OK


def _snapshot_extents(entry: Any) -> Iterator[tuple[str, int]]:
    """(location, end of its data) for a manifest entry; a whole file without a byte range counts from 0, and a
    file whose size the entry does not fix (torch_save, objects) must hold at least one byte."""
    if not isinstance(entry, dict):
        return
    for nested in ("shards", "chunks"):
        items = entry.get(nested)
        if isinstance(items, list):
            for shard in items:
                if isinstance(shard, dict):
                    yield from _snapshot_extents(shard.get("tensor"))
    location = entry.get("location")
    if not isinstance(location, str):
        return
    span = entry.get("byte_range")
    if isinstance(span, list) and len(span) == 2 and all(type(v) is int and 0 <= v < 1 << 63 for v in span):
        yield location, span[1]
        return
    width = _TORCH_DTYPE_BYTES.get(str(entry.get("dtype")))
    shape = entry.get("shape")
    if entry.get("serializer") == "buffer_protocol" and width and isinstance(shape, list):
        count = 1
        for d in shape:
            if type(d) is not int or d < 0:
                return
            count = min(count * d, 1 << 63)
        yield location, count * width
        return
    yield location, 1


def identify_dcp(path: str) -> bool:
    """Whether a directory holds torch Distributed Checkpoint files (Megatron's torch_dist format does)."""
    try:
        return any(_DCP_METADATA.fullmatch(e) or e.endswith(".distcp") for e in _dir_names(path))
    except OSError:
        return False
