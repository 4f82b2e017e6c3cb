"""Checkpoint discovery: walks the configured roots with ``os.scandir`` and finds checkpoint candidates (files and
directories), grouped into runs, within fixed bounds on entries, depth and time; rescans re-list only changed dirs.

What is a candidate
  * a regular file named ``*.pt``, ``*.pth``, ``*.bin``, ``*.ckpt`` or ``*.safetensors`` (``kind="file"``);
  * a directory (``kind="dir"``) named ``checkpoint-N`` (Hugging Face Trainer), ``global_stepN`` (DeepSpeed),
    ``iter_NNNNNNN`` (Megatron), ``*.orbax-checkpoint-tmp-*`` (Orbax, still being written), or holding a ``*.distcp``
    file or one of the markers in ``DIR_MARKERS`` (torch.distributed.checkpoint ``.metadata``, torchsnapshot
    ``.snapshot_metadata``, a sharded safetensors index, Orbax ``commit_success.txt``/``_CHECKPOINT_METADATA``,
    ``trainer_state.json``, Accelerate's ``random_states_0.pkl``: a ``save_state`` directory is one checkpoint, not
    one per file), or holding entries whose names together are a format's layout (``dir_layout``: Accelerate's
    model weights beside its ``optimizer.bin``, what a ``save_state`` killed before its random states leaves).
    Everything below a candidate directory belongs to it: its size is the sum of the sizes
    of all regular files in its subtree, and no nested candidate is reported (``checkpoint-500/global_step500/`` is
    one checkpoint, not two);
  * a step directory (``checkpoint_3``) holding nothing but what a format's saves write before their last file
    (``scan_partial_member``: Accelerate's weights alone), or nothing at all, beside a sibling step directory of the
    same prefix that is a candidate directory of that format: a save of that series cut short, one checkpoint (whose
    check calls it incomplete), not files of a run of their own.
  A name makes a candidate, not a checkpoint: its check (``checkpoints.formats``) says what it is, and a file of no
  format under a checkpoint's name (nanoGPT's ``train.bin`` of tokens) is ``unknown``, not a damaged checkpoint.

The run rule (where a job writes its series)
  A candidate's run is its parent directory. One exception: when the parent holds this one candidate only and is a
  *step directory* (its name is a prefix and a number, ``step_100``, ``epoch=3``, ``000500``) and at least one
  sibling step directory with the same prefix also holds a candidate, the run is the grandparent: in
  ``run/step_100/model.pt`` and ``run/step_200/model.pt`` the series is ``run/``, not two runs of one file each.
  The rule never lifts a run above its root.

Bounds (progress never blocks the agent)
  At most ``max_entries`` directory entries per scan (entries of reused listings count too, so a scan covers the
  same ground whether or not it is incremental), no directory deeper than ``max_depth`` (a root is depth 0), and no
  more than ``max_seconds`` by ``clock``. Hitting one stops the walk and reports ``truncated=True`` with the reason
  and what was found so far.

Safety
  Symlinks are never followed, neither to directories nor to files: ``DirEntry.is_dir(follow_symlinks=False)``,
  directories opened with ``O_NOFOLLOW | O_DIRECTORY`` and files stat'ed with ``lstat``. Each root is resolved with
  ``os.path.realpath`` once, at construction; every other path is that root joined with names read from the
  directory, and ``.``/``..`` (which ``scandir`` never yields) or names holding ``/`` or NUL are rejected anyway,
  so no path leaves its root. (A directory swapped for a symlink *above* the one being opened, between listing and
  opening, is outside what path-based walking can rule out; that needs ``openat`` chains.)

Incremental rescans
  Each listed directory is cached with its ``st_mtime_ns``. A later scan takes one ``fstat``/``lstat`` per
  directory and re-lists only those whose mtime changed; the others reuse their cached listing. A file that grows
  in place does not change its directory's mtime, so candidate *files* are re-stat'ed on every scan (one ``lstat``
  each) and always report their current size. Files inside candidate *directories* are stat'ed when their directory
  is listed, i.e. once per change of that directory, with two guards against stale sizes: a listing is not trusted
  while the directory's mtime is within ``RACY_SECONDS`` of the moment it was listed (a change in the same
  timestamp tick would leave the mtime equal, as with git's "racy" index entries), and a listing inside a candidate
  is not trusted while its newest file is younger than ``settle_seconds`` (a checkpoint still being written). A
  file rewritten in place in a settled checkpoint directory is therefore not noticed until that directory changes;
  writers create new files (which changes the mtime), and ``checkpoints.formats.check`` stats what it verifies.
  The cache holds only directories seen by the last complete scan (a truncated scan keeps the previous entries too,
  at most ``max_entries`` of them), so its size follows the tree, not the agent's uptime.

Temporaries
  Regular files named like ``storwatch.training``'s temporaries (``.NAME.tmp-PID-RANDOM``) are noted per listing and
  reported with the result (``temps``), reused listings included, so whoever scans can test each for an orphan.

Cost
  A non-candidate file costs no system call beyond the ``getdents`` that lists it (its type comes from ``d_type``);
  a directory costs one ``open``, ``fstat`` and ``close``; a candidate file one ``lstat``.

Where it runs
  The agent never walks a root itself: its checkpoint source runs one scanner per root, and per mount below a root,
  in a helper process (``storwatch/_checkpoint_worker.py``), so a walk that hangs on a mount strands a thread there.
  The module is standard library only for that reason (so are ``storwatch.training`` and the format registry it
  imports, whose candidate rules it applies).

Why one file: one walk with its bounds, its reuse of unchanged listings and its grouping into
runs; the three read the same per-directory state, and the rules for what is a candidate come from the format
registry (checkpoints/formats).
"""

from __future__ import annotations

import errno
import logging
import os
import re
import stat
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, NamedTuple

from storwatch.checkpoints.formats import REGISTRY
from storwatch.checkpoints.formats.steps import STEP_NAME
from storwatch.labels import MAX_DATASET_DIRS
from storwatch.training import TEMP_MARKER, is_temp_name

log = logging.getLogger(__name__)

FILE_SUFFIXES = tuple(suffix for f in REGISTRY for suffix in f.scan_suffixes)
"""A regular file with one of these suffixes is a candidate by itself (outside a candidate directory)."""
(DCP_SUFFIX,) = (f.shard_suffix for f in REGISTRY if f.shard_suffix is not None)
"""torch.distributed.checkpoint shard files: the directory holding them is the candidate, not the shards."""
DIR_MARKERS = frozenset(marker for f in REGISTRY for marker in f.scan_markers)
"""A directory holding an entry with one of these names is a candidate directory."""
_MARKER_FORMAT = {marker: f.name for f in REGISTRY for marker in f.scan_markers}
_LAYOUTS = tuple((f.name, f.dir_layout) for f in REGISTRY if f.dir_layout is not None)
_PARTIAL_MEMBERS = {f.name: f.scan_partial_member for f in REGISTRY if f.scan_partial_member is not None}
_CANDIDATE_DIR_NAME = re.compile("|".join(f.scan_dir_name for f in REGISTRY if f.scan_dir_name is not None))
_STEP_DIR_NAME = re.compile(r"(\D*)\d+")
_ANY_SUFFIXES = (*FILE_SUFFIXES, DCP_SUFFIX)

RACY_SECONDS = 2.0
"""A directory listed less than this after its last change is listed again on the next scan (see module doc)."""
MAX_ERRORS = 100
"""Errors kept per scan (unreadable directories, vanished files); further ones are only counted."""
MAX_UNREADABLE_PATHS = 10
"""Entries refused (permission) named per scan; all of them are counted."""
MAX_TEMPS = 1000
"""Temporary files reported per scan."""
DATASET_SUFFIXES = (".parquet", ".arrow", ".tfrecord", ".tfrecords", ".jsonl.zst", ".mds", ".lance")
"""Files that are dataset shards by their suffix (Parquet, Arrow, TFRecord, compressed JSON lines, MosaicML
streaming, Lance); WebDataset shards are ``*-NNN.tar`` (_WEBDATASET)."""
_WEBDATASET = re.compile(r".*[-_.]\d{3,}\.tar")
_CLOCK_EVERY = 4096
"""Entries between two reads of the clock inside one large directory."""
_OPEN_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC | getattr(os, "O_NONBLOCK", 0)

CandidateKind = Literal["file", "dir"]
TruncatedReason = Literal["max_entries", "max_depth", "max_seconds"]


@dataclass(frozen=True)
class CheckpointCandidate:
    path: str
    """Absolute path below ``root``: the file, or the checkpoint directory."""
    kind: CandidateKind
    """``file``: a single-file checkpoint; ``dir``: a checkpoint directory (all files below it belong to it)."""
    root: str
    """The scan root it was found under (as resolved by ``os.path.realpath``)."""
    run: str
    """The directory the job writes its series into (see the run rule in the module doc)."""
    reason: str
    """What made it a candidate: ``suffix .pt``, ``name checkpoint-N``, ``marker .metadata``, ``suffix .distcp``."""
    size_bytes: int
    """File: its size. Directory: the sum of the sizes of the regular files in its subtree."""
    files: int
    """Regular files it holds (1 for a file candidate)."""
    mtime: float
    """Its own modification time, seconds since the epoch."""
    newest_mtime: float
    """Directory: the newest mtime of anything in its subtree (itself included). File: its mtime."""
    allocated_bytes: int = 0
    """The space it takes on disk (``st_blocks * 512``, summed like ``size_bytes``): less than its size when it is
    sparse or compressed."""


@dataclass(frozen=True)
class CheckpointRun:
    path: str
    """The run directory."""
    root: str
    """The scan root it lies in."""
    candidates: tuple[CheckpointCandidate, ...]
    """Its checkpoints, oldest first (by ``newest_mtime``)."""

    @property
    def newest(self) -> CheckpointCandidate:
        return self.candidates[-1]

    @property
    def size_bytes(self) -> int:
        return sum(c.size_bytes for c in self.candidates)


@dataclass(frozen=True)
class ScanStats:
    dirs_listed: int
    """Directories read with ``scandir`` in this scan (new or changed since the last one)."""
    dirs_reused: int
    """Directories whose cached listing was reused (mtime unchanged)."""
    entries_visited: int
    """Directory entries counted against ``max_entries`` (those of reused listings included)."""
    files_stated: int
    """``stat`` calls on files (candidate files, and files inside candidate directories being listed)."""
    symlinks_skipped: int
    """Symlinks met and not followed (in listed directories only)."""
    errors: int
    """Directories or files that could not be read (all of them; ``ScanResult.errors`` keeps the first few)."""
    seconds: float
    """Duration of the scan by the scanner's clock."""
    cached_dirs: int
    """Directory listings held after the scan."""


@dataclass(frozen=True)
class ScanResult:
    candidates: tuple[CheckpointCandidate, ...]
    """Every candidate found, sorted by path."""
    runs: tuple[CheckpointRun, ...]
    """The candidates grouped into runs, sorted by path."""
    truncated: bool
    """True when a bound stopped the walk: what was found is reported, what lay beyond was not seen."""
    truncated_reason: TruncatedReason | None
    """Which bound (a fixed keyword, fit for a label)."""
    truncated_detail: str | None
    """The bound in words, with the first place it was hit (for logs)."""
    errors: tuple[str, ...]
    """The first ``MAX_ERRORS`` problems: missing roots, unreadable directories."""
    stats: ScanStats
    temps: tuple[str, ...] = ()
    """Paths of regular files named like ``storwatch.training``'s temporaries (``is_temp_name``), in every directory
    the walk went through: saves in progress, or left by a writer that was killed (at most ``MAX_TEMPS``)."""
    datasets: tuple[DatasetDir, ...] = ()
    """Directories of dataset shards the walk went through, the largest first (at most ``MAX_DATASET_DIRS``)."""
    unreadable: int = 0
    """Entries the walk was refused (EACCES, EPERM): what lies below them was not seen."""
    unreadable_paths: tuple[str, ...] = ()
    """The first ``MAX_UNREADABLE_PATHS`` of them."""


@dataclass(frozen=True)
class _Listing:
    """A directory as last listed: only what the walk needs, not every name."""

    mtime_ns: int
    listed_wall_ns: int
    """Wall time of the listing, for the racy and settle rules."""
    entries: int
    """All its entries (what it counts against ``max_entries``)."""
    subdirs: tuple[str, ...]
    """Names of its subdirectories (symlinks excluded)."""
    candidate_files: tuple[str, ...]
    """Names of regular files with a candidate suffix, kept only where the walk stats them one by one: outside any
    candidate directory. Inside one (most of a node's checkpoint files) its totals are all it needs."""
    marker: str | None
    """Why it is a candidate directory by its content (``marker X`` / ``suffix .distcp``), else None."""
    file_bytes: int | None
    """Sum of its regular files' sizes; None when it was listed outside a candidate (files not stat'ed)."""
    file_allocated: int
    file_count: int
    newest_file_ns: int
    """Newest mtime of its regular files (0 when none or not stat'ed)."""
    temps: tuple[str, ...] = ()
    """Names of its regular files named like atomic_save's temporaries."""
    dataset_files: int = 0
    """Its regular files that are dataset shards (DATASET_SUFFIXES, WebDataset tars), their bytes and newest mtime."""
    dataset_bytes: int = 0
    dataset_newest_ns: int = 0


@dataclass(frozen=True)
class DatasetDir:
    """A directory holding dataset shards (its own files, not its subdirectories')."""

    path: str
    files: int
    bytes: int
    newest_mtime: float


class _DirAcc:
    """A candidate directory's totals, summed over its subtree during one walk."""

    __slots__ = ("allocated", "files", "fmt", "mtime_ns", "newest_ns", "path", "reason", "root", "size")

    def __init__(self, path: str, root: str, reason: str, mtime_ns: int) -> None:
        self.path, self.root, self.reason = path, root, reason
        self.mtime_ns = self.newest_ns = mtime_ns
        self.size = self.files = self.allocated = 0
        self.fmt = _reason_format(reason)
        """The format its reason names (a marker's, a layout's), else None."""


class _FileTotals:
    """Sizes and newest mtime of the regular files of one directory being listed inside a candidate."""

    __slots__ = ("allocated", "count", "newest_ns", "path", "scanner", "size")

    def __init__(self, scanner: CheckpointScanner, path: str) -> None:
        self.scanner, self.path = scanner, path
        self.size = self.count = self.newest_ns = self.allocated = 0

    def add(self, entry: os.DirEntry[str]) -> None:
        if entry.is_symlink():
            self.scanner._symlinks += 1
            return
        if not entry.is_file(follow_symlinks=False):
            return
        self.scanner._stated += 1
        try:
            st = entry.stat(follow_symlinks=False)
        except OSError as err:
            self.scanner._os_error(f"{self.path}/{entry.name}", err)
            return
        self.size += st.st_size
        self.allocated += st.st_blocks * 512
        self.count += 1
        self.newest_ns = max(self.newest_ns, st.st_mtime_ns)


class _Stop(Exception):
    """A bound was hit: unwind the walk."""


_TEMP_DECORATION = re.compile(r"(?:\.(?:tmp|temp|part|partial)(?:[-._][^/]*)?|~)$", re.ASCII)
"""What a save through a temporary adds to its final name: ``model.pt.tmp``, ``model.pt.tmp-1234``,
``model.safetensors.part``, ``model.pt~``, ``.metadata.tmp``."""


def checkpoint_member(below_run: str) -> bool:
    """Whether a file at this path below a run's directory is part of a checkpoint as the scan knows them (a file
    with a checkpoint's suffix, a marker of a checkpoint directory, anything in a directory named as checkpoints are,
    or named so once a ``tmp-`` is taken off, a save's temporary: storwatch's own, or a checkpoint's name with a
    temporary's decoration), not a log or an event file written beside them."""
    parts = [p for p in below_run.split("/") if p not in ("", ".")]
    if not parts or ".." in parts:
        return False
    name = parts[-1]
    bare = _TEMP_DECORATION.sub("", name)
    return (
        name.endswith(_ANY_SUFFIXES)
        or bare.endswith(_ANY_SUFFIXES)
        or name in DIR_MARKERS
        or bare in DIR_MARKERS
        or is_temp_name(name)
        or any(_CANDIDATE_DIR_NAME.fullmatch(d.removeprefix("tmp-")) for d in parts[:-1])
    )


def _safe_name(name: str) -> bool:
    return name not in (".", "..") and "/" not in name and "\0" not in name


class CheckpointScanner:
    """Finds checkpoint candidates below ``roots``; keep one instance per agent so rescans are incremental."""

    def __init__(
        self,
        roots: list[str],
        max_entries: int = 200_000,
        max_depth: int = 12,
        max_seconds: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        settle_seconds: float = 60.0,
    ) -> None:
        # Resolved once: every path the walk builds is one of these joined with names read from the directories.
        resolved: list[str] = []
        for root in roots:
            real = os.path.realpath(root)
            if real not in resolved:
                resolved.append(real)
        self.roots: tuple[str, ...] = tuple(resolved)
        self.max_entries = max_entries
        self.max_depth = max_depth
        self.max_seconds = max_seconds
        self.clock = clock
        self.wall_clock = wall_clock
        self.skip: frozenset[str] = frozenset()
        """Directories not to enter (set by the caller before a scan: the mountpoints of stuck mounts)."""
        self.settle_seconds = settle_seconds
        self._cache: dict[str, _Listing] = {}
        self.stats = ScanStats(0, 0, 0, 0, 0, 0, 0.0, 0)
        """The last scan's counters."""

    # -- the walk

    def scan(self) -> ScanResult:
        self._start = self.clock()
        self._wall_ns = int(self.wall_clock() * 1e9)
        self._entries = 0
        self._listed = self._reused = self._stated = self._symlinks = self._error_count = 0
        self._errors: list[str] = []
        self._unreadable = 0
        self._unreadable_paths: list[str] = []
        self._truncated: tuple[TruncatedReason, str] | None = None
        self._seen: dict[str, _Listing] = {}
        self._files: list[tuple[str, str, str, os.stat_result]] = []  # path, root, reason, stat
        self._dirs: list[_DirAcc] = []
        try:
            for root in self.roots:
                self._walk_root(root)
        except _Stop:
            pass
        if self._truncated is None:
            self._cache = self._seen
        else:
            # A truncated scan did not see everything that still exists: keep the older listings too, bounded.
            merged = dict(self._seen)
            for path, listing in self._cache.items():
                if len(merged) >= len(self._seen) + self.max_entries:
                    break
                merged.setdefault(path, listing)
            self._cache = merged
        self._adopt_cut_short()
        candidates, runs = _group_runs(self._candidates())
        self.stats = ScanStats(
            dirs_listed=self._listed,
            dirs_reused=self._reused,
            entries_visited=self._entries,
            files_stated=self._stated,
            symlinks_skipped=self._symlinks,
            errors=self._error_count,
            seconds=self.clock() - self._start,
            cached_dirs=len(self._cache),
        )
        reason, detail = self._truncated if self._truncated else (None, None)
        if self._truncated:
            log.info("checkpoint scan truncated: %s", detail)
        temps = [os.path.join(path, name) for path, listing in self._seen.items() for name in listing.temps]
        datasets = sorted(
            (
                DatasetDir(path, listing.dataset_files, listing.dataset_bytes, listing.dataset_newest_ns / 1e9)
                for path, listing in self._seen.items()
                if listing.dataset_files
            ),
            key=lambda d: (-d.bytes, d.path),
        )[:MAX_DATASET_DIRS]
        return ScanResult(
            candidates=tuple(candidates),
            runs=tuple(runs),
            truncated=self._truncated is not None,
            truncated_reason=reason,
            truncated_detail=detail,
            errors=tuple(self._errors),
            unreadable=self._unreadable,
            unreadable_paths=tuple(self._unreadable_paths),
            stats=self.stats,
            temps=tuple(sorted(temps)[:MAX_TEMPS]),
            datasets=tuple(datasets),
        )

    def _os_error(self, path: str, err: OSError, what: str = "") -> None:
        """An entry the walk could not open or stat: unreadable when permission was refused (a tenant's closed home,
        an agent without CAP_DAC_READ_SEARCH), counted apart so a gap in what the agent sees is never an empty
        tree."""
        if err.errno in (errno.EACCES, errno.EPERM):
            self._unreadable += 1
            if len(self._unreadable_paths) < MAX_UNREADABLE_PATHS:
                self._unreadable_paths.append(path)
        self._error(f"{what}{path}: {err.strerror}")

    def _error(self, message: str) -> None:
        self._error_count += 1
        if len(self._errors) < MAX_ERRORS:
            self._errors.append(message)

    def _stop(self, reason: TruncatedReason, detail: str) -> None:
        # A hard stop (entries, time) outranks a depth cut, which only prunes one branch and lets the walk go on.
        if self._truncated is None or (reason != "max_depth" and self._truncated[0] == "max_depth"):
            self._truncated = (reason, detail)
        if reason != "max_depth":
            raise _Stop

    def _check_time(self, where: str) -> None:
        if self.clock() - self._start > self.max_seconds:
            self._stop("max_seconds", f"max_seconds {self.max_seconds:g} passed at {where}")

    def _count(self, n: int, where: str) -> None:
        """Adds one directory's entries to the scan's total; stops the walk beyond ``max_entries``."""
        self._entries += n
        if self._entries > self.max_entries:
            self._entries = self.max_entries
            self._stop("max_entries", f"max_entries {self.max_entries} reached at {where}")

    def _walk_root(self, root: str) -> None:
        try:
            st = os.lstat(root)
        except OSError as err:
            self._os_error(root, err, "root ")
            return
        if not stat.S_ISDIR(st.st_mode):
            self._error(f"root {root}: not a directory")
            return
        # Depth-first, with an explicit stack: (path, depth, the candidate directory it belongs to, or None).
        stack: list[tuple[str, int, _DirAcc | None]] = [(root, 0, None)]
        while stack:
            path, depth, owner = stack.pop()
            if path in self.skip:
                continue  # a mount whose statvfs is stuck: listing it would hang this walk too
            self._check_time(path)
            name_match = owner is None and _CANDIDATE_DIR_NAME.fullmatch(os.path.basename(path)) is not None
            listing = self._listing(path, owner is not None or name_match)
            if listing is None:
                continue
            if name_match:
                owner = self._new_dir(path, root, f"name {_name_pattern(os.path.basename(path))}", listing.mtime_ns)
            elif owner is None and listing.marker is not None:
                owner = self._new_dir(path, root, listing.marker, listing.mtime_ns)
            if owner is not None:
                owner.size += listing.file_bytes or 0
                owner.allocated += listing.file_allocated
                owner.files += listing.file_count
                owner.newest_ns = max(owner.newest_ns, listing.mtime_ns, listing.newest_file_ns)
            else:
                for name in listing.candidate_files:
                    self._stat_candidate_file(os.path.join(path, name), root)
            if not listing.subdirs:
                continue
            if depth >= self.max_depth:
                self._stop("max_depth", f"max_depth {self.max_depth} reached at {path}")
                continue
            for name in listing.subdirs:
                stack.append((os.path.join(path, name), depth + 1, owner))

    def _new_dir(self, path: str, root: str, reason: str, mtime_ns: int) -> _DirAcc:
        acc = _DirAcc(path, root, reason, mtime_ns)
        self._dirs.append(acc)
        return acc

    def _stat_candidate_file(self, path: str, root: str) -> None:
        self._stated += 1
        try:
            st = os.lstat(path)
        except OSError as err:
            self._os_error(path, err)
            return
        if stat.S_ISREG(st.st_mode):
            suffix = os.path.splitext(path)[1]
            self._files.append((path, root, f"suffix {suffix}", st))

    def _listing(self, path: str, inside: bool) -> _Listing | None:
        """The directory's listing, from the cache when its mtime is unchanged and the listing can be trusted."""
        try:
            fd = os.open(path, _OPEN_FLAGS)
        except OSError as err:
            # ELOOP/ENOTDIR: it was replaced by a symlink or a file since its parent was listed.
            self._os_error(path, err)
            return None
        try:
            mtime_ns = os.fstat(fd).st_mtime_ns
            cached = self._cache.get(path)
            if cached is not None and cached.mtime_ns == mtime_ns and self._trusted(cached, inside):
                self._reused += 1
                self._count(cached.entries, path)
                self._seen[path] = cached
                return cached
            listing = self._list(fd, path, mtime_ns, inside)
        except OSError as err:
            self._os_error(path, err)
            return None
        finally:
            os.close(fd)
        if listing is not None:
            self._seen[path] = listing
        return listing

    def _trusted(self, listing: _Listing, inside: bool) -> bool:
        if inside or listing.marker is not None:
            if listing.file_bytes is None:
                return False
            newest = max(listing.mtime_ns, listing.newest_file_ns)
            return newest < listing.listed_wall_ns - int(self.settle_seconds * 1e9)
        if listing.file_bytes is not None:
            return False  # listed inside a candidate, which keeps no candidate file names: list it again
        return listing.mtime_ns < listing.listed_wall_ns - int(RACY_SECONDS * 1e9)

    def _list(self, fd: int, path: str, mtime_ns: int, inside: bool) -> _Listing:
        self._listed += 1
        subdirs: list[str] = []
        candidate_files: list[str] = []
        temps: list[str] = []
        marker: str | None = None
        entries = 0
        budget = self.max_entries - self._entries
        markers = DIR_MARKERS
        files = _FileTotals(self, path)
        shards = _FileTotals(self, path)
        with os.scandir(fd) as it:
            for entry in it:
                entries += 1
                if entries > budget:
                    self._count(entries, path)
                if not entries % _CLOCK_EVERY:
                    self._check_time(path)
                name = entry.name
                if entry.is_dir(follow_symlinks=False):
                    if _safe_name(name):
                        subdirs.append(name)
                    if marker is None and name in markers:
                        marker = f"marker {name}"
                    continue
                if name in markers:
                    if marker is None:
                        marker = f"marker {name}"
                elif name.endswith(_ANY_SUFFIXES):
                    if name.endswith(DCP_SUFFIX):
                        if marker is None:
                            marker = f"suffix {DCP_SUFFIX}"
                    elif not inside and entry.is_file(follow_symlinks=False) and _safe_name(name):
                        candidate_files.append(name)
                elif (
                    name.endswith(DATASET_SUFFIXES) or _WEBDATASET.fullmatch(name)
                ) and shards.count < self.max_entries:
                    shards.add(entry)
                elif (
                    name[0] == "."
                    and TEMP_MARKER in name
                    and is_temp_name(name)
                    and entry.is_file(follow_symlinks=False)
                    and _safe_name(name)
                    and len(temps) < MAX_TEMPS
                ):
                    temps.append(name)
                if inside:
                    files.add(entry)
                elif entry.is_symlink():
                    self._symlinks += 1
        self._count(entries, path)
        if marker is None and not inside and (candidate_files or subdirs):
            names = (*candidate_files, *subdirs)
            marker = next((f"layout {name}" for name, layout in _LAYOUTS if layout(names)), None)
        if marker is not None and not inside:
            # A candidate by its content, found only now: its files belong to it and are stat'ed after all.
            # scandir on a descriptor rewinds it when done, so it can be read again.
            inside = True
            with os.scandir(fd) as it:
                for entry in it:
                    files.add(entry)
        return _Listing(
            mtime_ns=mtime_ns,
            listed_wall_ns=self._wall_ns,
            entries=entries,
            subdirs=tuple(subdirs),
            candidate_files=tuple(candidate_files) if marker is None else (),
            marker=marker,
            file_bytes=files.size if inside else None,
            file_allocated=files.allocated if inside else 0,
            file_count=files.count,
            newest_file_ns=files.newest_ns,
            temps=tuple(temps),
            dataset_files=shards.count,
            dataset_bytes=shards.size,
            dataset_newest_ns=shards.newest_ns,
        )

    # -- results

    def _adopt_cut_short(self) -> None:
        """Step directories a save of their siblings' series was cut short in (the module doc's second kind of
        candidate directory): each becomes one candidate directory, holding the files the walk took one by one."""
        series: dict[tuple[str, str], str] = {}
        for acc in self._dirs:
            step = STEP_NAME.fullmatch(os.path.basename(acc.path))
            if step is not None and acc.fmt in _PARTIAL_MEMBERS:
                series[(os.path.dirname(acc.path), step.group(1))] = acc.fmt
        if not series:
            return
        adopted: dict[str, _DirAcc] = {}
        for path, listing in self._seen.items():
            if listing.marker is not None or listing.file_bytes is not None or listing.subdirs or path in self.roots:
                continue  # a candidate already, inside one, or holding more than a save's files
            step = STEP_NAME.fullmatch(os.path.basename(path))
            fmt = series.get((os.path.dirname(path), step.group(1))) if step is not None else None
            if fmt is None or listing.entries != len(listing.candidate_files):
                continue
            if not all(_PARTIAL_MEMBERS[fmt](name) for name in listing.candidate_files):
                continue
            root = max((r for r in self.roots if path.startswith(r.rstrip("/") + "/")), key=len, default=None)
            if root is not None:
                acc = _DirAcc(path, root, f"beside {fmt} step directories", listing.mtime_ns)
                acc.fmt = fmt
                adopted[path] = acc
        if not adopted:
            return
        kept: list[tuple[str, str, str, os.stat_result]] = []
        for found in self._files:
            into = adopted.get(os.path.dirname(found[0]))
            if into is None:
                kept.append(found)
                continue
            st = found[3]
            into.size += st.st_size
            into.allocated += st.st_blocks * 512
            into.files += 1
            into.newest_ns = max(into.newest_ns, st.st_mtime_ns)
        self._files = kept
        self._dirs.extend(adopted.values())

    def _candidates(self) -> list[_Found]:
        """What the walk found, by path: each candidate but its run, which needs them all (_group_runs)."""
        out = [
            _Found(
                acc.path, "dir", acc.root, acc.reason, acc.size, acc.files, acc.mtime_ns, acc.newest_ns, acc.allocated
            )
            for acc in self._dirs
        ]
        out += [
            _Found(path, "file", root, reason, st.st_size, 1, st.st_mtime_ns, st.st_mtime_ns, st.st_blocks * 512)
            for path, root, reason, st in self._files
        ]
        out.sort(key=lambda f: f.path)
        return out


class _Found(NamedTuple):
    """A candidate as the walk found it, before its run is known."""

    path: str
    kind: CandidateKind
    root: str
    reason: str
    size_bytes: int
    files: int
    mtime_ns: int
    newest_ns: int
    allocated_bytes: int


def _reason_format(reason: str) -> str | None:
    """The format a candidate directory's reason names: its marker's (``marker random_states_0.pkl``), its layout's
    (``layout accelerate``)."""
    kind, _, what = reason.partition(" ")
    if kind == "marker":
        return _MARKER_FORMAT.get(what)
    return what if kind == "layout" else None


def _name_pattern(name: str) -> str:
    if name.startswith("checkpoint-"):
        return "checkpoint-N"
    if name.startswith("global_step"):
        return "global_stepN"
    if name.startswith("iter_"):
        return "iter_NNNNNNN"
    return "*.orbax-checkpoint-tmp-*"


def run_of(candidate_path: str, root: str, by_parent: dict[str, int], step_siblings: dict[tuple[str, str], int]) -> str:
    """The run directory of a candidate (the rule is in the module doc)."""
    parent = os.path.dirname(candidate_path)
    if parent in (root, candidate_path) or by_parent.get(parent, 0) != 1:
        return parent
    m = _STEP_DIR_NAME.fullmatch(os.path.basename(parent))
    if m is None:
        return parent
    grandparent = os.path.dirname(parent)
    if step_siblings.get((grandparent, m.group(1)), 0) >= 2:
        return grandparent
    return parent


def _group_runs(found: list[_Found]) -> tuple[list[CheckpointCandidate], list[CheckpointRun]]:
    """The candidates, each with its run, in the order found; and the runs, by path."""
    by_parent: dict[str, int] = defaultdict(int)
    for f in found:
        by_parent[os.path.dirname(f.path)] += 1
    # Step directories holding exactly one candidate, counted per (grandparent, name prefix).
    step_siblings: dict[tuple[str, str], int] = defaultdict(int)
    for parent, n in by_parent.items():
        m = _STEP_DIR_NAME.fullmatch(os.path.basename(parent))
        if n == 1 and m is not None:
            step_siblings[(os.path.dirname(parent), m.group(1))] += 1
    candidates: list[CheckpointCandidate] = []
    grouped: dict[str, list[CheckpointCandidate]] = defaultdict(list)
    for f in found:
        run = run_of(f.path, f.root, by_parent, step_siblings)
        c = CheckpointCandidate(
            path=f.path,
            kind=f.kind,
            root=f.root,
            run=run,
            reason=f.reason,
            size_bytes=f.size_bytes,
            files=f.files,
            mtime=f.mtime_ns / 1e9,
            newest_mtime=f.newest_ns / 1e9,
            allocated_bytes=f.allocated_bytes,
        )
        candidates.append(c)
        grouped[run].append(c)
    runs = [
        CheckpointRun(path=run, root=members[0].root, candidates=tuple(sorted(members, key=lambda c: c.newest_mtime)))
        for run, members in grouped.items()
    ]
    runs.sort(key=lambda r: r.path)
    return candidates, runs
