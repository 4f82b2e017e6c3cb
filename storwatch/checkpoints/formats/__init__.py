"""Identify a checkpoint's format from its layout and decide whether it is complete, incomplete, corrupt, unsafe or
unknown.

Formats: torch.save ZIP archives (``.pt``, ``.pth``, ``.bin``, Lightning ``.ckpt``) and torch.save's legacy format
(the same suffixes, told apart by their first bytes), safetensors (single and sharded with an index), torch
Distributed Checkpoint (also Megatron's torch_dist), torchsnapshot, DeepSpeed, Hugging Face Trainer, Accelerate's
``save_state`` directory, Orbax and Megatron.

The cheap check reads structure and metadata, never bulk data: a ZIP's end records and central directory and its
``data.pkl`` (every storage it names must be in the archive with the bytes it needs), a safetensors header, a DCP
``.metadata`` or torchsnapshot manifest (every shard must hold the extent the metadata places in it, so a shard cut
short is ``incomplete``), marker and tracker files. The deep check also reads every byte (ZIP CRC32s, inflated in
bounded chunks) and, where torch is installed, loads a torch.save file with ``weights_only=True`` in a separate,
short-lived, resource-limited process (``deep.py``).

Trust: checkpoint files are written by jobs the agent does not trust. Nothing here unpickles with the standard
unpickler or imports torch: pickles (``data.pkl``, DCP ``.metadata``, a legacy file's pickles) are read by the
restricted machine in ``pickles.py``, which imports and calls nothing. A pickle naming a global that runs code when
loaded (``os.system``, ``builtins.exec``, ``torch.load``...) makes the checkpoint ``unsafe``; one naming classes the
reader merely does not know is read with inert records in their place, and the result carries a note naming them.
Every parse is bounded (``limits.DeepLimits``); past a bound the verdict names the bound. Symlinks are followed only
while they stay inside the checkpoint's own directory; FIFOs and devices are never opened for reading.

Verdicts speak of damage: ``complete``; ``incomplete`` (a save that did not finish, or a file cut short); ``corrupt``
(finished, then damaged, or never valid); ``unknown`` (not a checkpoint, or a check stopped at a limit that says
nothing against the checkpoint). Safety is a verdict of its own: ``unsafe`` (a pickle names a global that runs code
when loaded), never complete and outranking every other finding in a directory. ``check`` never raises: an
exception while checking is a ``corrupt`` verdict naming it.

Damage only on evidence: a name is none. A ``.pt`` or ``.bin`` whose first bytes are not a ZIP archive's, not torch's
legacy magic number (nor a few bytes of either, a save cut inside them) and no other format's is ``unknown``, "not a
checkpoint format", never a save cut short; only an empty one changed within the settle time is ``incomplete`` (a
torch.save has opened it and not written yet). Inside a step directory whose framework writes such a file with
torch.save, the directory is the evidence, and the member makes it ``incomplete``.

What cannot be checked cheaply: Orbax writes tensorstore/OCDBT chunks whose layout only tensorstore knows, so an
Orbax step is judged by its commit (the temporary directory renamed, ``commit_success.txt`` on object stores) and
the verdict's reason says that its chunks were not compared.

One registry (:data:`REGISTRY`) says, per format, how it is recognised on disk and how it is checked;
:func:`identify` and :func:`check` here, and the directory scan's candidate rules (``checkpoints/scan.py``), all
read it.

The checks live beside the formats they know: :mod:`.zip` (torch.save's ZIP: structure, streamed CRCs, the
restricted read of data.pkl), :mod:`.legacy` (torch.save's legacy format: its pickles, then each storage's count and
bytes), :mod:`.safetensors` (single files and sharded indexes), :mod:`.dcp`
(torch.distributed.checkpoint and torchsnapshot: metadata read with the restricted unpickler, shard extents),
:mod:`.steps` (step directories: DeepSpeed, Megatron, Hugging Face Trainer, Accelerate, Orbax) and
:mod:`.common` (the verdict type, bounded reads that never follow links out of a checkpoint, the JSON and YAML
readers with their limits).

A check is ``(path, ctx) -> (verdict, reason)``; ``ctx.deep`` says whether it reads every byte (the deep check) or
only structure and sizes (the cheap check, which still catches a shard cut short).
"""

from __future__ import annotations

import os
import re
import stat
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass

from storwatch.checkpoints import pickles
from storwatch.checkpoints.formats.common import (
    _DCP_METADATA,
    DEFAULT_LIMITS,
    FALLBACK,
    MAX_NOTED_GLOBALS,
    NOT_A_CHECKPOINT,
    TORCH_SUFFIXES,
    VERDICTS,
    CheckResult,
    _Bad,
    _Ctx,
    _describe,
    _dir_names,
    _Finding,
    _footprint,
    _NotFollowed,
    _NotRegular,
    _unsafe,
    unknown_note,
)
from storwatch.checkpoints.formats.dcp import _check_dcp, _check_torchsnapshot
from storwatch.checkpoints.formats.gguf import GGUF_MAGIC, _check_gguf
from storwatch.checkpoints.formats.legacy import SNIFF_BYTES, _check_torch_legacy, is_legacy_cut, is_legacy_head
from storwatch.checkpoints.formats.safetensors import (
    SAFETENSORS_INDEX_SUFFIX,
    _check_safetensors,
    _check_safetensors_sharded,
)
from storwatch.checkpoints.formats.steps import (
    _DEEPSPEED_STEP,
    _HF_STEP,
    _MEGATRON_STEP,
    _MEGATRON_TRACKER,
    _ORBAX_MARKERS,
    _ORBAX_TMP,
    ACCELERATE_MARKER,
    _check_accelerate,
    _check_deepspeed,
    _check_hf_trainer,
    _check_megatron,
    _check_orbax,
    accelerate_beside,
    accelerate_layout,
    is_accelerate_entry,
    is_accelerate_member,
)
from storwatch.checkpoints.formats.zip import _LOCAL_SIG, _check_torch_zip
from storwatch.checkpoints.limits import DeepLimits, LimitReached
from storwatch.nofollow import file_kind

__all__ = ["FORMATS", "REGISTRY", "VERDICTS", "CheckResult", "Format", "check", "identify"]

Check = Callable[[str, _Ctx], _Finding]


@dataclass(frozen=True)
class Format:
    """One checkpoint format, declared once: how it is recognised, how it is checked, and what makes the directory
    scan take something for one."""

    name: str
    check: Check
    """Its check: structure and sizes, or every byte when ``ctx.deep``."""
    file_suffixes: tuple[str, ...] = ()
    """A regular file whose name ends so is of this format."""
    magic: bytes | None = None
    """A regular file starting with these bytes is of this format (when no suffix said, or several formats share
    its suffix)."""
    sniff: Callable[[bytes], bool] | None = None
    """Likewise, for a start that is not fixed bytes: true of the file's first ``SNIFF_BYTES`` bytes."""
    sniff_cut: Callable[[bytes], bool] | None = None
    """True of a whole file too short to hold the start ``sniff`` looks for, whose bytes begin it: a save of this
    format cut short inside its first bytes. (With ``magic``, a file shorter than the magic that begins it.) Taken
    only where the file's suffix already names the format."""
    dir_name: re.Pattern[str] | None = None
    """A directory whose name matches is of this format."""
    name_first: bool = False
    """The name decides before the directory is listed (a name no other format's directory takes)."""
    dir_entry: Callable[[str], bool] | None = None
    """A directory holding an entry of which this is true is of this format."""
    dir_layout: Callable[[Collection[str]], bool] | None = None
    """A directory whose entries' names, taken together, are true of this is of this format (no one entry says it:
    a model's weights beside an optimizer state of this framework's name)."""
    dir_rank: int = 0
    """Among formats recognised in a directory's listing, the lower rank wins (a Megatron step holds DCP files)."""
    dir_beside: Callable[[str, Collection[str]], bool] | None = None
    """The last resort, when no format's name, entry or layout took the directory: true of a directory (its path and
    its entries' names) that its siblings make this format's (a step directory a save of their series left cut
    short). It may list the parent."""
    scan_suffixes: tuple[str, ...] = ()
    """Files the scan takes as checkpoints by themselves (outside a checkpoint directory)."""
    scan_markers: frozenset[str] = frozenset()
    """Entries that make the scan take their directory as a checkpoint directory."""
    scan_dir_name: str | None = None
    """A regular expression: directories so named are taken by the scan as checkpoint directories."""
    shard_suffix: str | None = None
    """Shard files: the scan takes the directory holding them, not the shards."""
    scan_partial_member: Callable[[str], bool] | None = None
    """A name of what this format's saves write before their last file: the scan takes a step directory holding
    nothing but such files (or nothing at all) as one checkpoint of this format, cut short, when a sibling step
    directory with its prefix is a candidate of this format (the ``dir_beside`` rule)."""


REGISTRY: tuple[Format, ...] = (
    Format(
        "torch-zip",
        _check_torch_zip,
        file_suffixes=TORCH_SUFFIXES,
        magic=_LOCAL_SIG,
        scan_suffixes=TORCH_SUFFIXES,
    ),
    Format(
        "torch-legacy",
        _check_torch_legacy,
        file_suffixes=TORCH_SUFFIXES,
        sniff=is_legacy_head,
        sniff_cut=is_legacy_cut,
    ),
    Format("safetensors", _check_safetensors, file_suffixes=(".safetensors",), scan_suffixes=(".safetensors",)),
    Format("gguf", _check_gguf, file_suffixes=(".gguf",), magic=GGUF_MAGIC, scan_suffixes=(".gguf",)),
    Format(
        "safetensors-sharded",
        _check_safetensors_sharded,
        file_suffixes=(SAFETENSORS_INDEX_SUFFIX,),
        dir_entry=lambda e: e.endswith(SAFETENSORS_INDEX_SUFFIX),
        dir_rank=3,
        scan_markers=frozenset({"model.safetensors.index.json"}),  # Hugging Face save_pretrained
    ),
    Format(
        "torch-dcp",
        _check_dcp,
        dir_entry=lambda e: bool(_DCP_METADATA.fullmatch(e)) or e.endswith(".distcp") or e == ".metadata.tmp",
        dir_rank=4,
        scan_markers=frozenset({".metadata"}),
        shard_suffix=".distcp",
    ),
    Format(
        "torchsnapshot",
        _check_torchsnapshot,
        dir_entry=lambda e: e == ".snapshot_metadata",
        dir_rank=5,
        scan_markers=frozenset({".snapshot_metadata"}),
    ),
    Format(
        "deepspeed",
        _check_deepspeed,
        dir_name=_DEEPSPEED_STEP,
        dir_entry=lambda e: bool(_DEEPSPEED_STEP.fullmatch(e)),
        dir_rank=1,
        scan_dir_name=r"global_step\d+",
    ),
    Format(
        "hf-trainer",
        _check_hf_trainer,
        dir_name=_HF_STEP,
        name_first=True,
        scan_markers=frozenset({"trainer_state.json"}),
        scan_dir_name=r"checkpoint-\d+",
    ),
    Format(
        "accelerate",
        _check_accelerate,
        dir_entry=is_accelerate_entry,
        dir_layout=accelerate_layout,
        dir_rank=2,
        dir_beside=accelerate_beside,
        # Accelerator.save_state: one directory of several files, not one checkpoint per file, finished or not.
        scan_markers=frozenset({ACCELERATE_MARKER}),
        scan_partial_member=is_accelerate_member,
    ),
    Format(
        "orbax",
        _check_orbax,
        dir_name=re.compile(r".*" + re.escape(_ORBAX_TMP) + r".*", re.DOTALL),
        name_first=True,
        dir_entry=lambda e: e in _ORBAX_MARKERS,
        dir_rank=6,
        # commit_success.txt: Orbax on object storage, which has no atomic rename
        scan_markers=frozenset({"commit_success.txt", "_CHECKPOINT_METADATA"}),
        scan_dir_name=r".+\.orbax-checkpoint-tmp-.*",
    ),
    Format(
        "megatron",
        _check_megatron,
        dir_name=_MEGATRON_STEP,
        dir_entry=lambda e: e == _MEGATRON_TRACKER,
        dir_rank=0,
        scan_dir_name=r"iter_\d{7}",
    ),
)

FORMATS = tuple(f.name for f in REGISTRY)
_CHECKS: dict[str, Check] = {f.name: f.check for f in REGISTRY}
_BY_DIR_RANK = sorted(
    (f for f in REGISTRY if f.dir_name is not None or f.dir_entry is not None or f.dir_layout is not None),
    key=lambda f: f.dir_rank,
)
_HEAD_BYTES = max(SNIFF_BYTES, *(len(f.magic) for f in REGISTRY if f.magic is not None))


# ---- identification ----------------------------------------------------------------------------------------------


def identify(path: str) -> str | None:
    """The checkpoint format of a file or directory, from names and a few leading bytes; None when unknown: a file
    whose suffix several formats share (torch.save's ZIP and legacy formats: ``.pt``, ``.bin``...) is of none of
    them unless its bytes say which, and an empty one says nothing."""
    name = os.path.basename(os.path.normpath(path))
    if os.path.isdir(path):
        return _identify_dir(path, name)
    if not os.path.isfile(path):
        return None
    by_suffix = [f for f in REGISTRY if f.file_suffixes and name.endswith(f.file_suffixes)]
    if len(by_suffix) == 1:
        return by_suffix[0].name
    head = _head(path)
    if not head:
        return None
    # Formats sharing a suffix (torch.save's ZIP and legacy formats) are told apart by their first bytes, which also
    # tell a save cut short inside them (a few bytes of the ZIP signature or of the legacy magic number's pickle).
    # A file whose bytes are none of theirs may still be another format's (GGUF named .bin); one that is no
    # format's at all is no checkpoint, whatever its name, and not a damaged one: nothing in it says a save began.
    found = next((f.name for f in by_suffix if _starts_as(f, head) or _cut_inside_start(f, head)), None)
    return found or next((f.name for f in REGISTRY if _starts_as(f, head)), None)


def _head(path: str) -> bytes:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | getattr(os, "O_NOCTTY", 0))
    except OSError:
        return b""
    try:
        return os.read(fd, _HEAD_BYTES) if stat.S_ISREG(os.fstat(fd).st_mode) else b""
    except OSError:
        return b""
    finally:
        os.close(fd)


def _starts_as(f: Format, head: bytes) -> bool:
    return (f.magic is not None and head.startswith(f.magic)) or (f.sniff is not None and f.sniff(head))


def _cut_inside_start(f: Format, head: bytes) -> bool:
    """``head`` is a whole file cut short inside the format's first bytes (shorter than ``_HEAD_BYTES``, so the head
    read is all of the file)."""
    if f.magic is not None and 0 < len(head) < len(f.magic) and f.magic.startswith(head):
        return True
    return f.sniff_cut is not None and f.sniff_cut(head)


def _identify_dir(path: str, name: str) -> str | None:
    for f in REGISTRY:
        if f.name_first and f.dir_name is not None and f.dir_name.fullmatch(name):
            return f.name
    try:
        entries = _dir_names(path)
    except OSError:
        return None
    for f in _BY_DIR_RANK:
        if f.dir_name is not None and f.dir_name.fullmatch(name):
            return f.name
        entry = f.dir_entry
        if entry is not None and any(entry(e) for e in entries):
            return f.name
        if f.dir_layout is not None and f.dir_layout(entries):
            return f.name
    for f in REGISTRY:
        if f.dir_beside is not None and f.dir_beside(path, entries):
            return f.name
    return None


# ---- entry point -------------------------------------------------------------------------------------------------


def check(
    path: str,
    deep: bool = False,
    now: float | None = None,
    settle_seconds: float = 60.0,
    limits: DeepLimits | None = None,
    closed: bool = False,
) -> CheckResult:
    """Check one checkpoint file or directory; never raises. ``now`` (seconds since the epoch) is injected for the
    settle time; ``limits`` bounds the check (the defaults are safe for an agent reading hostile files). ``closed``:
    the caller saw that no process holds any of its files open for writing, so what has no end marker (a Trainer or
    Accelerate directory, an empty file) is judged now instead of after ``settle_seconds``."""
    limits = limits or DEFAULT_LIMITS
    ctx = _Ctx(
        deep,
        time.time() if now is None else now,
        settle_seconds,
        limits,
        limits.deadline(),
        identify,
        _CHECKS,
        closed=closed,
    )
    fmt: str | None = None
    size, mtime = 0, 0.0
    limit: str | None = None
    error: str | None = None
    try:
        fmt = identify(path)
        size, mtime = _footprint(path, ctx.deadline)
        finding = _check_format(path, fmt, ctx)
    except LimitReached as err:
        finding, limit = (err.verdict, str(err)), err.limit
    except _Bad as err:
        finding = err.finding
    except pickles.UnsafeGlobal as err:  # the checks catch it where they read a pickle; this holds if one does not
        finding = _unsafe("a pickle", err)
    except MemoryError:
        finding, error = (
            ("unknown", "the check ran out of memory; it says nothing against the checkpoint"),
            "MemoryError",
        )
    except Exception as err:
        error = type(err).__name__
        finding = ("corrupt", f"checking it failed ({error}: {_describe(err)}); {FALLBACK}")
    notes = list(ctx.notes)
    unknown = sorted(ctx.unknown)
    if unknown and finding[0] != "unsafe":
        notes.insert(0, unknown_note(ctx.unknown))
    return CheckResult(
        path,
        fmt,
        finding[0],
        finding[1] or "all checks passed",
        size,
        mtime,
        deep,
        limit,
        error,
        tuple(notes),
        tuple(unknown[:MAX_NOTED_GLOBALS]),
        len(unknown),
    )


def _check_format(path: str, fmt: str | None, ctx: _Ctx) -> _Finding:
    if not os.path.lexists(path):
        return "incomplete", f"{path} does not exist; {FALLBACK}"
    if fmt is None:
        try:
            st = os.stat(path)
        except OSError as err:
            return "unknown", f"{path} cannot be read ({err.strerror or err}): no checkpoint found"
        if not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode)):
            return "unknown", f"{path} is {file_kind(st.st_mode)}, not a checkpoint; it was not read"
        if stat.S_ISREG(st.st_mode) and path.endswith(TORCH_SUFFIXES):
            return _no_torch_format(path, st, ctx)
        return "unknown", f"{path} {NOT_A_CHECKPOINT}: no checkpoint found"
    try:
        return _CHECKS[fmt](path, ctx)
    except _NotFollowed as err:
        return "incomplete", f"{err}: the checkpoint cannot be verified where it lies"
    except _NotRegular as err:
        return "unknown", f"{err}: not a checkpoint"
    except OSError as err:
        return (
            "corrupt",
            f"reading {err.filename or path} failed: {err.strerror or err}; the storage may be "
            f"failing or the file was removed while being checked; {FALLBACK}",
        )


def _no_torch_format(path: str, st: os.stat_result, ctx: _Ctx) -> _Finding:
    """A regular file named like a torch.save file (``.pt``, ``.bin``...) whose bytes are no checkpoint format's.
    Damage is claimed only on evidence, and these bytes carry none: a dataset shard, a text file or random bytes
    under that name is ``unknown``, never a save cut short. An empty one is the exception while it is fresh: torch.save
    opens its file before it writes a byte, so an empty file changed within the settle time may be a save that has
    just begun, ``incomplete`` (and so "being written" for the scan) until it settles."""
    if st.st_size == 0:
        if ctx.closed:
            return (
                "unknown",
                f"{path} is empty and no process has it open for writing: not a checkpoint format (no save wrote a "
                "byte of it); no damage is claimed",
            )
        if ctx.now - ctx.settle <= st.st_mtime <= ctx.now + ctx.settle:
            return (
                "incomplete",
                f"the file is empty and changed within the {ctx.settle:.0f} s settle time: a save may have just "
                "begun (or stopped before writing anything); check again later",
            )
        return (
            "unknown",
            f"{path} is empty and unchanged for longer than the {ctx.settle:.0f} s settle time: not a checkpoint "
            "format (no save wrote a byte of it); no damage is claimed",
        )
    return (
        "unknown",
        f"{path} is not a checkpoint format: it is named like a torch.save file, but its first bytes are neither a "
        "ZIP archive's nor torch's legacy magic number, nor any other format's storwatch knows, so nothing says a "
        "save was cut short; no damage is claimed",
    )
