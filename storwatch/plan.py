"""``storwatch plan``: the storage tiers of this node, measured. For each writable mount it is asked to measure, it
writes a bounded test file sequentially (O_DIRECT where the filesystem takes it, so the page cache does not flatter
the figure, then fsync) several times and takes the median, and from that throughput works out, for a checkpoint of
a given size (``--checkpoint-bytes``, else the largest complete checkpoint under the configured checkpoint roots,
else 10 GiB, and the output says which): how long one write takes, whether it survives losing the node, and the
shortest interval that keeps checkpoint overhead under a budget (write time / interval <= budget), beside Daly's
optimum for the configured mean time between failures.

One write is too short a sample: a few hundred MiB to a fast disk take a tenth of a second, in which opening the
file, allocating its first extents, the fsync and a moment of another process's load weigh enough to move the figure
from one run to the next by more than runs should differ (BENCHMARKS.md has the spreads). So each test file is made
large enough to take about a second to write (grown from ``DEFAULT_SIZE`` by the pace the first writes showed;
``--size`` fixes it instead), written in a warm-up round and then ``--rounds`` rounds of about a second, each file a
new one (as each checkpoint is), and the median round's throughput is reported with the spread of the rounds, and
how busy the CPU was meanwhile, so that a reader sees how steady the mount was.

Writing is opt-in (``--mount`` names each mount, ``--all`` takes every writable storage mount) and bounded: a test
file is at most ``MAX_SIZE`` (or ``--size``) and at most a tenth of the mount's free space, one at a time; no round
starts on a mount that would end past ``--max-seconds``; the files live in a fresh directory made with ``mkdtemp``
(never a path anyone else made), removed when done, on error too.
"""

from __future__ import annotations

import mmap
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, replace

from storwatch.analysis.checkpoints import host_path
from storwatch.analysis.rpo import daly_interval
from storwatch.analysis.view import MountView, View
from storwatch.classify import is_pseudo_mount
from storwatch.paths import HostPaths
from storwatch.procfs.pressure import parse_pressure

BLOCK = 4 << 20
"""Bytes per write: what ``dd bs=4M`` writes, large enough that per-call cost does not count."""
POOL_BLOCKS = 16
"""Different random blocks written in turn (64 MiB)."""
DEFAULT_SIZE = 64 << 20
"""The first test file's size, when ``--size`` does not fix it: grown from there until a write takes
``TARGET_WRITE_SECONDS``. Small, so that on a slow mount (object storage through FUSE) the first write alone does not
pass ``--max-seconds``."""
MAX_SIZE = 8 << 30
FREE_SHARE = 0.1
"""A test file takes at most this share of the mount's free space."""
MIN_SIZE = 8 << 20
TARGET_WRITE_SECONDS = 1.0
"""How long a timed round writes (and one test file, where free space allows): long enough that the fixed costs of a
write (open, first extents, fsync) and a scheduling hiccup are a small part of it."""
GROWTH_MARGIN = 1.2
"""A test file is grown to this much more than the size that would have taken ``TARGET_WRITE_SECONDS``, so that the
next write is long enough at once, not one more just short of it."""
DEFAULT_ROUNDS = 5
WARMUP_ROUNDS = 1
"""Rounds written before the counted ones and not counted: the first writes on a mount (a filesystem just mounted, a
disk or a hypervisor's cache not yet in its steady state) run slower than the rest."""
DEFAULT_MAX_SECONDS = 60.0
"""The most one mount's writes may take: no further round starts that would pass it (at least one is counted)."""
CPU_BUSY = 0.2
"""From this share of the measuring time during which some task waited for a CPU (PSI), the output says the node was
busy: writes cost CPU time (the page pinning of O_DIRECT, a loop device's worker), so figures taken then come out low
and vary from run to run."""
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
    """Bytes of each test file; 0 when not measured."""
    seconds: float | None = None
    """How long one test file took to write, at the median throughput."""
    throughput_bytes_per_second: float | None = None
    """The median of the rounds' throughputs."""
    rounds: int = 0
    """Rounds timed: each wrote test files, one after another, for about ``TARGET_WRITE_SECONDS``."""
    bytes_written: int = 0
    """Bytes the timed rounds wrote, all told (sizing writes aside)."""
    round_throughputs: tuple[float, ...] = ()
    """Each round's throughput (bytes per second), in the order written."""
    spread: float | None = None
    """(fastest - slowest) / median of the rounds: how steady the mount was while measured."""
    sizing_writes: int = 0
    """Writes made only to find a test file size that takes ``TARGET_WRITE_SECONDS`` (not counted)."""
    cpu_pressure: float | None = None
    """The share of the measuring time during which some task waited for a CPU (``pressure/cpu``, ``some``); None
    where the kernel has no PSI."""
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


def test_cap(mv: MountView, limit: int = MAX_SIZE) -> int:
    """The most bytes one test file may hold on ``mv``: ``limit``, at most a tenth of its free space, in whole
    blocks."""
    avail = mv.mount.usage.avail_bytes if mv.mount.usage is not None else 0
    size = min(limit, MAX_SIZE, int(avail * FREE_SHARE))
    return (size // BLOCK) * BLOCK


@dataclass(frozen=True)
class Round:
    """One timed round: test files written one after another until the clock has run ``TARGET_WRITE_SECONDS``."""

    bytes: int
    seconds: float
    """Time spent writing and fsyncing them (removing each is not counted)."""
    files: int


@dataclass(frozen=True)
class Measurement:
    """The timed rounds on one mount."""

    file_bytes: int
    """Bytes of each test file of the rounds."""
    rounds: tuple[Round, ...]
    direct: bool
    """The writes went with O_DIRECT (else buffered, then fsync)."""
    sizing_writes: int = 0
    """Writes made to size the test file, not counted."""

    @property
    def throughputs(self) -> tuple[float, ...]:
        return tuple(r.bytes / r.seconds for r in self.rounds if r.seconds > 0)

    @property
    def throughput(self) -> float | None:
        rates = self.throughputs
        return statistics.median(rates) if rates else None

    @property
    def spread(self) -> float | None:
        rates, mid = self.throughputs, self.throughput
        return (max(rates) - min(rates)) / mid if rates and mid else None


def grown_size(size: int, seconds: float, cap: int, target: float = TARGET_WRITE_SECONDS) -> int:
    """The next test file's size after ``size`` bytes took ``seconds``: enough for ``target`` seconds at that pace
    (with a margin; at most 64 times larger, as a write too short to time says little of the pace), at least a block
    larger, at most ``cap``, in whole blocks."""
    wanted = cap if seconds <= 0 else int(size * min(target / seconds * GROWTH_MARGIN, 64.0))
    wanted = max(wanted, size + BLOCK)
    return max(BLOCK, (min(wanted, cap) // BLOCK) * BLOCK)


def measure(
    directory: str,
    size: int,
    cap: int | None = None,
    rounds: int = DEFAULT_ROUNDS,
    max_seconds: float = DEFAULT_MAX_SECONDS,
    clock: Callable[[], float] = time.perf_counter,
    progress: Callable[[str], None] = lambda line: None,
    target_seconds: float = TARGET_WRITE_SECONDS,
    warmup: int = WARMUP_ROUNDS,
) -> Measurement:
    """Time ``rounds`` rounds of sequential writes in a fresh directory under ``directory``: each round writes test
    files of ``size`` bytes, each a new file, fsynced and removed, until the round has spent ``target_seconds``
    writing. With ``cap`` above ``size`` the file first grows (those writes not counted) until one write takes
    ``target_seconds`` or the file reaches ``cap``; then ``warmup`` rounds are written and not counted. Once a round
    is counted, none starts that would, at the last one's pace, end past ``max_seconds`` from the first write, and a
    round under way past it is dropped. The files and the directory are removed whatever happens."""
    cap = size if cap is None else max(size, cap)
    workdir = tempfile.mkdtemp(prefix=".storwatch-plan-", dir=directory)
    # Random bytes, so a compressing or deduplicating filesystem (ZFS, btrfs with compression) or a virtual disk that
    # turns zeros into unmaps writes them all; and POOL_BLOCKS different blocks, as a checkpoint's bytes all differ
    # (the same 4 MiB written again and again stays in the CPU's and a hypervisor's caches: a loop mount measured
    # about 30 % faster than dd writing a file of random bytes). An anonymous mmap is page-aligned, as O_DIRECT needs.
    pool = min(POOL_BLOCKS, max(1, cap // BLOCK))
    buf = mmap.mmap(-1, BLOCK * pool)
    for _ in range(pool):
        buf.write(os.urandom(BLOCK))
    blocks = [memoryview(buf)[i * BLOCK : (i + 1) * BLOCK] for i in range(pool)]
    try:
        began = clock()
        counted: list[Round] = []
        sizing = written = warmed = 0
        sized = cap <= size
        direct: bool | None = None
        n = size
        now = Round(0, 0.0, 0)
        while len(counted) < rounds:
            seconds, direct = _timed_write(workdir, f"test-{written}", n, blocks, direct, clock)
            written += 1
            if not sized and seconds < target_seconds and n < cap:
                sizing += 1
                grown = grown_size(n, seconds, cap, target_seconds)
                progress(f"sizing: {n >> 20} MiB took {seconds:.2f} s, next {grown >> 20} MiB")
                n = grown
                continue
            sized = True
            now = Round(now.bytes + n, now.seconds + seconds, now.files + 1)
            elapsed = clock() - began
            if now.seconds < target_seconds:
                if counted and elapsed > max_seconds:
                    break
                continue
            rate = now.bytes / now.seconds if now.seconds > 0 else 0.0
            if warmed < warmup:
                warmed += 1
                progress(f"warm-up round: {rate / 1e6:,.0f} MB/s ({now.files} x {n >> 20} MiB, not counted)")
            else:
                counted.append(now)
                progress(f"round {len(counted)} of {rounds}: {rate / 1e6:,.0f} MB/s ({now.files} x {n >> 20} MiB)")
                if elapsed + now.seconds > max_seconds:
                    break
            now = Round(0, 0.0, 0)
        return Measurement(n, tuple(counted), bool(direct), sizing)
    finally:
        for view in blocks:
            view.release()
        buf.close()
        shutil.rmtree(workdir, ignore_errors=True)


def _timed_write(
    workdir: str,
    name: str,
    size: int,
    blocks: list[memoryview],
    direct: bool | None,
    clock: Callable[[], float],
) -> tuple[float, bool]:
    """Write ``size`` bytes into a new file ``name`` and fsync it: (seconds, whether O_DIRECT was used). ``direct``
    None tries O_DIRECT and falls back to buffered writes where the filesystem refuses it; True or False is what the
    first write found. The file is removed, and the removal made durable, after the clock stops: freeing its blocks
    is not charged to the next write."""
    path = os.path.join(workdir, name)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    use_direct = direct is not False
    fd = -1
    if use_direct:
        try:
            fd = os.open(path, flags | os.O_DIRECT, 0o600)
        except OSError:
            use_direct = False  # the filesystem refuses O_DIRECT (some FUSE and network filesystems)
    if fd < 0:
        fd = os.open(path, flags, 0o600)
    pool = len(blocks)
    try:
        started = clock()
        written = 0
        while written < size:
            try:
                n = os.write(fd, blocks[(written // BLOCK) % pool])
            except OSError:
                if not use_direct or written or direct is not None:
                    raise
                # O_DIRECT accepted at open but not on write (EINVAL): buffered, from the start
                os.close(fd)
                os.unlink(path)
                fd = os.open(path, flags, 0o600)
                use_direct = False
                started = clock()
                continue
            written += n
        os.fsync(fd)
        seconds = clock() - started
    finally:
        os.close(fd)
    os.unlink(path)
    dir_fd = os.open(workdir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    return seconds, use_direct


def plan(
    view: View,
    mountpoints: Iterable[str] | None,
    checkpoint_bytes: int,
    size: int | None = None,
    budget: float = DEFAULT_BUDGET,
    rounds: int = DEFAULT_ROUNDS,
    max_seconds: float = DEFAULT_MAX_SECONDS,
    mtbf_seconds: float = 86_400.0,
    local: Callable[[str], str] = lambda p: p,
    progress: Callable[[str], None] = lambda line: None,
    cpu_stalled: Callable[[], float | None] = lambda: None,
) -> list[TierPlan]:
    """Measure the named mounts (every writable one when ``mountpoints`` is None) and plan for a checkpoint of
    ``checkpoint_bytes`` (:func:`checkpoint_size`). ``size`` fixes each test file's bytes (None: grown until a write
    takes ``TARGET_WRITE_SECONDS``); ``rounds`` and ``max_seconds`` bound the writes on each mount. ``local`` maps a
    host mountpoint to where this process reaches it; ``cpu_stalled`` reads the seconds tasks have waited for a CPU
    (:func:`cpu_stall_reader`)."""
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
        cap = test_cap(mv, MAX_SIZE if size is None else size)
        if not writable(mv) or cap < MIN_SIZE:
            why = "read-only, stuck or not storage" if not writable(mv) else "too little free space to measure"
            out.append(replace(row, error=why))
            continue
        where = m.mountpoint
        stalled, began = cpu_stalled(), time.monotonic()
        try:
            got = measure(
                local(where),
                cap if size is not None else min(DEFAULT_SIZE, cap),
                cap=cap,
                rounds=rounds,
                max_seconds=max_seconds,
                progress=_prefixed(progress, f"measuring {where}: "),
            )
        except OSError as err:
            out.append(replace(row, error=f"{err.strerror or err} ({where})"))
            continue
        rate = got.throughput
        write = ckpt / rate if rate else None
        stalled_after, spent = cpu_stalled(), time.monotonic() - began
        pressure = None
        if stalled is not None and stalled_after is not None and spent > 0:
            pressure = min(max(stalled_after - stalled, 0.0) / spent, 1.0)
        out.append(
            replace(
                row,
                test_bytes=got.file_bytes,
                seconds=got.file_bytes / rate if rate else None,
                throughput_bytes_per_second=rate,
                rounds=len(got.rounds),
                bytes_written=sum(r.bytes for r in got.rounds),
                round_throughputs=got.throughputs,
                spread=got.spread,
                sizing_writes=got.sizing_writes,
                cpu_pressure=pressure,
                direct_io=got.direct,
                write_seconds=write,
                min_interval_seconds=write / budget if write is not None else None,
                daly_interval_seconds=daly_interval(write, mtbf_seconds) if write else None,
            )
        )
    return out


def cpu_stall_reader(paths: HostPaths) -> Callable[[], float | None]:
    """A function reading the seconds, since boot, during which some task waited for a CPU (PSI); None where the
    file cannot be read or parsed (no PSI: a kernel before 4.20, or ``psi=0``)."""
    path = paths.proc("pressure", "cpu")

    def read() -> float | None:
        try:
            with open(path, "rb") as fh:
                data = fh.read(4096)
        except OSError:
            return None
        pressure, _ = parse_pressure(data)
        return pressure.some.total_us / 1e6 if pressure is not None and pressure.some is not None else None

    return read


def _prefixed(progress: Callable[[str], None], prefix: str) -> Callable[[str], None]:
    return lambda line: progress(prefix + line)


def as_dicts(rows: Iterable[TierPlan]) -> list[dict[str, object]]:
    return [asdict(r) for r in rows]


def legend(budget: float, mtbf_seconds: float) -> list[str]:
    """What each column of the plan means, printed under the table."""
    from storwatch.words import span

    return [
        "SURVIVES NODE: whether what is written there outlives this node (its durability class is cluster or region);",
        "  a checkpoint on a mount that does not is lost with the node, however often it is written.",
        "WRITE MB/s: the median of the timed rounds, written with O_DIRECT then fsync ('buffered': through the page "
        "cache, where the filesystem refuses O_DIRECT).",
        "SPREAD: (fastest - slowest) / median of the timed rounds, 'of N' the rounds timed: a large spread means the "
        "mount's speed moved while it was measured.",
        "CHECKPOINT: the checkpoint size planned for (the line above the table says where it comes from); WRITE TIME: "
        "CHECKPOINT / WRITE MB/s, the time one save blocks training.",
        f"MIN INTERVAL ({budget:.0%}): the shortest time between two saves that keeps their write time under "
        f"{budget:.0%} of the training time (--budget).",
        "DALY INTERVAL: Daly's interval, the time between saves that loses the least work to failures and saving "
        f"together, for this write time and a mean time between failures of {span(mtbf_seconds)} "
        "(checkpoints.mtbf_seconds: the job's, not one node's).",
    ]


def format_plan(rows: list[TierPlan], budget: float, mtbf_seconds: float = 86_400.0) -> str:
    from storwatch.report import human_bytes, human_seconds

    if not rows:
        return "no writable storage mount to measure"
    headers = (
        "MOUNTPOINT",
        "TYPE",
        "DURABILITY",
        "SURVIVES NODE",
        "WRITE MB/s",
        "SPREAD",
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
                    "",
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
                f"{r.spread:.0%} of {r.rounds}" if r.spread is not None else "-",
                human_bytes(r.checkpoint_bytes),
                human_seconds(r.write_seconds),
                human_seconds(r.min_interval_seconds),
                human_seconds(r.daly_interval_seconds),
            )
        )
    widths = [max(len(h), *(len(row[i]) for row in table)) for i, h in enumerate(headers)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in (headers, *table)]
    lines += ["", *legend(budget, mtbf_seconds)]
    for r in rows:
        if r.cpu_pressure is not None and r.cpu_pressure >= CPU_BUSY:
            lines.append(
                f"note: the CPU was busy while {r.mountpoint} was measured (a task waited for it "
                f"{r.cpu_pressure:.0%} of the time): figures taken on a busy node come out low and vary from run to run"
            )
    return "\n".join(lines)
