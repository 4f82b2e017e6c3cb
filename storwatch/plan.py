"""``storwatch plan``: the storage tiers of this node, measured. For each writable mount it is asked to measure, it
writes a bounded test file sequentially (O_DIRECT where the filesystem takes it, so the page cache does not flatter
the figure, then fsync), and from that throughput works out, for a checkpoint of a given size (``--checkpoint-bytes``,
else the largest complete checkpoint under the configured checkpoint roots, else 10 GiB, and the output says which):
how long one write takes, whether it survives losing the node, and the shortest interval that keeps checkpoint
overhead under a budget (write time / interval <= budget), beside Daly's optimum for the configured mean time between
failures.

Writing is opt-in (``--mount`` names each mount, ``--all`` takes every writable storage mount) and bounded: the test
file is at most ``--size`` and at most a tenth of the mount's free space, lives in a fresh directory made with
``mkdtemp`` (never a path anyone else made), and is removed when done, on error too.
"""

from __future__ import annotations

import mmap
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, replace

from storwatch.analysis.build import host_path
from storwatch.analysis.rpo import daly_interval
from storwatch.analysis.view import MountView, View
from storwatch.classify import is_pseudo_mount
from storwatch.paths import HostPaths

BLOCK = 4 << 20
"""Bytes per write: what ``dd bs=4M`` writes, large enough that per-call cost does not count."""
POOL_BLOCKS = 16
"""Different random blocks written in turn (64 MiB)."""
DEFAULT_SIZE = 256 << 20
MAX_SIZE = 8 << 30
FREE_SHARE = 0.1
"""The test file takes at most this share of the mount's free space."""
MIN_SIZE = 8 << 20
DEFAULT_BUDGET = 0.05
DEFAULT_CHECKPOINT_BYTES = 10 << 30
"""Without a complete checkpoint under the checkpoint roots and without --checkpoint-bytes: a 10 GiB checkpoint (a
1-3B model with Adam)."""


@dataclass(frozen=True)
class CheckpointSize:
    """The checkpoint size a plan is made for, and where it came from."""

    bytes: int
    source: str
    """``flag`` (--checkpoint-bytes), ``checkpoint`` (the largest complete checkpoint under the checkpoint roots) or
    ``default`` (none found, or nowhere to look)."""
    path: str | None = None
    """The checkpoint it was taken from, as the host names it (``source == "checkpoint"``)."""
    roots: tuple[str, ...] = ()
    """The checkpoint roots searched, as the host names them; empty when there was nowhere to look."""
    caveat: str | None = None
    """Why a larger complete checkpoint may have been missed: the scan failed, stopped at a limit or has roots that
    did not answer."""

    def sentence(self) -> str:
        """Where the size came from, for a person: a path and the roots are data from disk (escape before a
        terminal shows it)."""
        from storwatch.report import human_bytes

        size = f"checkpoint size {human_bytes(self.bytes)}"
        roots = ", ".join(self.roots)
        if self.source == "flag":
            text = f"{size}: from --checkpoint-bytes"
        elif self.source == "checkpoint":
            text = f"{size}: the largest complete checkpoint, {self.path} (under the checkpoint roots {roots})"
        elif self.roots:
            text = f"{size}: default, no complete checkpoint found under {roots}"
        else:
            text = f"{size}: default, no checkpoint roots to search (set checkpoints.roots in a --config file)"
        return text + (f"; {self.caveat}" if self.caveat else "")


def checkpoint_size(view: View, requested: int | None, roots: Iterable[str], paths: HostPaths) -> CheckpointSize:
    """The size to plan for: ``requested`` (--checkpoint-bytes) where given, else the largest complete checkpoint the
    scan of the checkpoint roots found, else the default. ``roots`` are the roots the scan was to search (as this
    process reaches them), named even when the scan could not run; every run counts, not only those the View keeps
    rows for."""
    facts = view.checkpoint_scan
    searched = tuple(host_path(paths, r) for r in (facts.roots if facts is not None else roots))
    if requested is not None:
        return CheckpointSize(requested, "flag", roots=searched)
    caveat = None
    if facts is None and searched:
        status = next((c for c in view.collectors if c.name == "checkpoints"), None)
        caveat = "the checkpoint roots could not be scanned" + (f": {status.error}" if status and status.error else "")
    elif facts is not None and facts.stuck_roots:
        caveat = "a larger one may be under roots that did not answer: " + ", ".join(
            host_path(paths, s.path) for s in facts.stuck_roots
        )
    elif facts is not None and facts.truncated:
        caveat = f"the scan stopped at a limit ({facts.truncated_reason}): a larger one may have been missed"
    done = [c for run in (facts.runs if facts is not None else ()) for c in run.checkpoints if c.verdict == "complete"]
    if not done:
        return CheckpointSize(DEFAULT_CHECKPOINT_BYTES, "default", roots=searched, caveat=caveat)
    largest = max(done, key=lambda c: (c.size_bytes, c.mtime, c.path))
    return CheckpointSize(largest.size_bytes, "checkpoint", host_path(paths, largest.path), searched, caveat)


@dataclass(frozen=True)
class TierPlan:
    mountpoint: str
    fstype: str
    durability: str
    survives_node_loss: bool
    checkpoint_bytes: int
    test_bytes: int = 0
    """Bytes written to measure; 0 when not measured."""
    seconds: float | None = None
    throughput_bytes_per_second: float | None = None
    direct_io: bool = False
    """The test wrote with O_DIRECT (else buffered writes, then fsync)."""
    write_seconds: float | None = None
    min_interval_seconds: float | None = None
    """The shortest checkpoint interval that keeps overhead (write time / interval) under the budget."""
    daly_interval_seconds: float | None = None
    error: str | None = None


def writable(mv: MountView) -> bool:
    """A storage mount that takes writes: not read-only, not a kernel interface, not stuck."""
    m = mv.mount
    return not m.readonly and not is_pseudo_mount(m.mountpoint) and not mv.stuck and m.usage is not None


def test_size(mv: MountView, wanted: int) -> int:
    """The bytes to write on ``mv``: ``wanted``, at most a tenth of its free space, in whole blocks."""
    avail = mv.mount.usage.avail_bytes if mv.mount.usage is not None else 0
    size = min(wanted, MAX_SIZE, int(avail * FREE_SHARE))
    return (size // BLOCK) * BLOCK


def measure(directory: str, size: int, clock: Callable[[], float] = time.perf_counter) -> tuple[float, bool]:
    """Write ``size`` bytes sequentially into a new file in a fresh directory under ``directory`` and fsync it;
    return (seconds, whether O_DIRECT was used). The file and directory are removed whatever happens."""
    workdir = tempfile.mkdtemp(prefix=".storwatch-plan-", dir=directory)
    path = os.path.join(workdir, "throughput")
    # Random bytes, so a compressing or deduplicating filesystem (ZFS, btrfs with compression) or a virtual disk that
    # turns zeros into unmaps writes them all; and POOL_BLOCKS different blocks, as a checkpoint's bytes all differ
    # (the same 4 MiB written again and again stays in the CPU's and a hypervisor's caches: a loop mount measured
    # about 30 % faster than dd writing a file of random bytes). An anonymous mmap is page-aligned, as O_DIRECT needs.
    pool = min(POOL_BLOCKS, max(1, size // BLOCK))
    buf = mmap.mmap(-1, BLOCK * pool)
    for _ in range(pool):
        buf.write(os.urandom(BLOCK))
    blocks = [memoryview(buf)[i * BLOCK : (i + 1) * BLOCK] for i in range(pool)]
    try:
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        direct = True
        try:
            fd = os.open(path, flags | os.O_DIRECT, 0o600)
        except OSError:
            direct = False  # the filesystem refuses O_DIRECT (some FUSE and network filesystems)
            fd = os.open(path, flags, 0o600)
        try:
            started = clock()
            written = 0
            while written < size:
                try:
                    n = os.write(fd, blocks[(written // BLOCK) % pool])
                except OSError:
                    if not direct or written:
                        raise
                    # O_DIRECT accepted at open but not on write (EINVAL): buffered, from the start
                    os.close(fd)
                    os.unlink(path)
                    fd = os.open(path, flags, 0o600)
                    direct = False
                    started = clock()
                    continue
                written += n
            os.fsync(fd)
            seconds = clock() - started
        finally:
            os.close(fd)
        return seconds, direct
    finally:
        for view in blocks:
            view.release()
        buf.close()
        shutil.rmtree(workdir, ignore_errors=True)


def plan(
    view: View,
    mountpoints: Iterable[str] | None,
    checkpoint_bytes: int,
    size: int = DEFAULT_SIZE,
    budget: float = DEFAULT_BUDGET,
    mtbf_seconds: float = 86_400.0,
    local: Callable[[str], str] = lambda p: p,
    progress: Callable[[str], None] = lambda line: None,
) -> list[TierPlan]:
    """Measure the named mounts (every writable one when ``mountpoints`` is None) and plan for a checkpoint of
    ``checkpoint_bytes`` (:func:`checkpoint_size`). ``local`` maps a host mountpoint to where this process reaches
    it."""
    ckpt = checkpoint_bytes
    wanted = None if mountpoints is None else list(mountpoints)
    by_mp = {mv.mount.mountpoint: mv for mv in view.mounts}
    chosen = [mv for mv in view.mounts if writable(mv)] if wanted is None else [by_mp.get(mp) or mp for mp in wanted]
    out = []
    for mv in chosen:
        if isinstance(mv, str):
            out.append(TierPlan(mv, "", "unknown", False, ckpt, error="not a mount"))
            continue
        m, d = mv.mount, mv.verdict.durability
        row = TierPlan(m.mountpoint, m.fstype, d.value, not d.ephemeral, ckpt)
        n = test_size(mv, size)
        if not writable(mv) or n < MIN_SIZE:
            why = "read-only, stuck or not storage" if not writable(mv) else "too little free space to measure"
            out.append(replace(row, error=why))
            continue
        progress(f"measuring {m.mountpoint}: writing {n >> 20} MiB")
        try:
            seconds, direct = measure(local(m.mountpoint), n)
        except OSError as err:
            out.append(replace(row, error=f"{err.strerror or err} ({m.mountpoint})"))
            continue
        rate = n / seconds if seconds > 0 else None
        write = ckpt / rate if rate else None
        out.append(
            replace(
                row,
                test_bytes=n,
                seconds=seconds,
                throughput_bytes_per_second=rate,
                direct_io=direct,
                write_seconds=write,
                min_interval_seconds=write / budget if write is not None else None,
                daly_interval_seconds=daly_interval(write, mtbf_seconds) if write else None,
            )
        )
    return out


def as_dicts(rows: Iterable[TierPlan]) -> list[dict[str, object]]:
    return [asdict(r) for r in rows]


def format_plan(rows: list[TierPlan], budget: float) -> str:
    from storwatch.report import human_bytes, human_seconds

    if not rows:
        return "no writable storage mount to measure"
    headers = (
        "MOUNTPOINT",
        "TYPE",
        "DURABILITY",
        "SURVIVES NODE",
        "WRITE MB/s",
        "CHECKPOINT",
        "WRITE TIME",
        f"MIN INTERVAL ({budget:.0%})",
        "DALY INTERVAL",
    )
    table = []
    for r in rows:
        if r.error:
            table.append(
                (
                    r.mountpoint,
                    r.fstype,
                    r.durability,
                    "yes" if r.survives_node_loss else "no",
                    "-",
                    human_bytes(r.checkpoint_bytes),
                    f"not measured: {r.error}",
                    "",
                    "",
                )
            )
            continue
        rate = r.throughput_bytes_per_second
        table.append(
            (
                r.mountpoint,
                r.fstype,
                r.durability,
                "yes" if r.survives_node_loss else "no",
                f"{rate / 1e6:.0f}" + ("" if r.direct_io else " (buffered)") if rate else "-",
                human_bytes(r.checkpoint_bytes),
                human_seconds(r.write_seconds),
                human_seconds(r.min_interval_seconds),
                human_seconds(r.daly_interval_seconds),
            )
        )
    widths = [max(len(h), *(len(row[i]) for row in table)) for i, h in enumerate(headers)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in (headers, *table)]
    return "\n".join(lines)
