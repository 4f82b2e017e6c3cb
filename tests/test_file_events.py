"""Write spans from the kernel's own file events (sources/fileevents.py with its helper process, analysis/writes.py):
real inotify on real directories, for the ways saves are made: a file written and closed, a temporary renamed into
place, a directory renamed into place, a file rewritten in place, a file moved in from a directory not watched; a log
beside them makes no span; the watches are bounded; a directory on a hung mount strands only the helper."""

from __future__ import annotations

import dataclasses
import os
import struct
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path

import pytest

from storwatch import registry
from storwatch._events_worker import ReopenFilter
from storwatch.analysis.writes import EventSave, burst_writers, event_saves, synced_saves, timed_by_file_events
from storwatch.calls.blocking import BlockingCalls, CallOutcome
from storwatch.checkpoints.record import Checkpoint
from storwatch.config import CheckpointsConfig
from storwatch.paths import HostPaths
from storwatch.procfs.inotify import (
    IN_CLOSE_NOWRITE,
    IN_CLOSE_WRITE,
    IN_CREATE,
    IN_DELETE,
    IN_ISDIR,
    IN_MODIFY,
    IN_MOVED_FROM,
    IN_MOVED_TO,
    IN_OPEN,
    IN_Q_OVERFLOW,
    parse_events,
)
from storwatch.procfs.pidio import ProcessIO
from storwatch.registry import SourceContext
from storwatch.sources.access import AccessFacts, HeldFile, WorkloadAccess, WrittenFile
from storwatch.sources.checkpoints import DEEP_AFTER_SECONDS, CheckpointSource, RunState
from storwatch.sources.fileevents import (
    FILE_EVENTS,
    MAX_REOPEN_SECONDS,
    FileEventFacts,
    FileEventsConfig,
    FileEventSource,
    FileSpan,
)
from tests.builders import torch_like_zip

WAIT = 10.0
"""A bound against events that never come; never what is asserted."""
DEEP_WAIT = 120.0
"""A bound against a deep check that never answers (its child imports torch: seconds on a busy machine)."""


def _record(wd: int, mask: int, cookie: int, name: bytes) -> bytes:
    padded = name + b"\0" * (-len(name) % 8 or (8 if name else 0)) if name else b""
    return struct.pack("=iIII", wd, mask, cookie, len(padded)) + padded


@pytest.mark.parametrize(
    ("data", "events", "whole"),
    [
        pytest.param(b"", [], True, id="empty"),
        pytest.param(_record(1, IN_CREATE, 0, b"a.pt"), [(1, IN_CREATE, 0, b"a.pt")], True, id="one"),
        pytest.param(
            _record(1, IN_CREATE | IN_ISDIR, 0, b"ck") + _record(2, IN_CLOSE_WRITE, 0, b"x" * 20),
            [(1, IN_CREATE | IN_ISDIR, 0, b"ck"), (2, IN_CLOSE_WRITE, 0, b"x" * 20)],
            True,
            id="two-padded",
        ),
        pytest.param(_record(-1, IN_Q_OVERFLOW, 0, b""), [(-1, IN_Q_OVERFLOW, 0, b"")], True, id="overflow"),
        pytest.param(_record(1, IN_CREATE, 0, b"a.pt")[:-3], [], False, id="cut-name"),
        pytest.param(_record(1, IN_CREATE, 0, b"a.pt") + b"\0\0", [(1, IN_CREATE, 0, b"a.pt")], False, id="cut-header"),
    ],
)
def test_parse_events(data: bytes, events: list[tuple[int, int, int, bytes]], whole: bool) -> None:
    got, clean = parse_events(data)
    assert [(e.wd, e.mask, e.cookie, e.name) for e in got] == events
    assert clean is whole


@pytest.fixture
def run(tmp_path: Path) -> Path:
    made = tmp_path / "root" / "alice" / "run"
    made.mkdir(parents=True)
    return made


@pytest.fixture
def source(tmp_path: Path) -> Iterator[FileEventSource]:
    (tmp_path / "root").mkdir(exist_ok=True)  # there when the agent starts (one made later is asked for a while later)
    made = FileEventSource(FileEventsConfig(), lambda: [(str(tmp_path / "root"), False)])
    made.collect()  # the helper started, the root and what is below it watched
    yield made
    made.close()


def _spans(source: FileEventSource, want: int) -> list[FileSpan]:
    """The spans once ``want`` of them ended (the events come through the helper's pipe)."""
    end = time.monotonic() + WAIT
    while True:
        spans = [s for s in source.collect().spans if s.end is not None]
        if len(spans) >= want or time.monotonic() > end:
            return spans
        time.sleep(0.05)


def _watched(source: FileEventSource, directory: Path) -> None:
    end = time.monotonic() + WAIT
    while str(directory) not in {p for p, _ in source._wd.values()}:
        assert time.monotonic() < end, f"{directory} not watched"
        source.collect()
        time.sleep(0.02)


def test_the_ways_saves_are_made_give_their_spans(source: FileEventSource, run: Path, tmp_path: Path) -> None:
    _watched(source, run)
    t0 = time.time()
    with open(run / "step-1.pt", "wb") as f:  # written, flushed, fsynced, closed
        f.write(b"x" * 4096)
        f.flush()
        os.fsync(f.fileno())
    with open(run / "step-2.pt.tmp", "wb") as f:  # a temporary, renamed into place
        f.write(b"y" * 4096)
    os.rename(run / "step-2.pt.tmp", run / "step-2.pt")
    (run / "tmp-checkpoint-5").mkdir()  # a directory of files, renamed into place
    # Its watch is added as its creation is read (inotify watches no directory by itself before that): files
    # written in the moment between are seen from their next write on, those after from their creation.
    _watched(source, run / "tmp-checkpoint-5")
    for name in ("model.safetensors", "trainer_state.json"):
        (run / "tmp-checkpoint-5" / name).write_bytes(b"z" * 100)
    os.rename(run / "tmp-checkpoint-5", run / "checkpoint-5")
    with open(run / "step-1.pt", "r+b") as f:  # rewritten in place: no creation, its first write starts it
        f.write(b"w")
    elsewhere = tmp_path / "unwatched"
    elsewhere.mkdir()
    (elsewhere / "tmpab12").write_bytes(b"l" * 100)  # Lightning's temporary in the system temp directory
    os.rename(elsewhere / "tmpab12", run / "last.ckpt")
    (run / "train.log").write_text("a log beside them")
    (run / "done.pt").write_bytes(b"d")  # the last event of the test: once its span is in, every one before is
    end = time.monotonic() + WAIT
    spans = _spans(source, 9)
    while not any(s.path == str(run / "done.pt") for s in spans):
        assert time.monotonic() < end, spans
        spans = _spans(source, 9)
    t1 = time.time()
    by = {(s.path.removeprefix(str(run) + "/"), s.end_how): s for s in spans}
    assert ("train.log", "closed") not in by
    first = by[("step-1.pt", "closed")]
    assert first.start is not None and first.end is not None and t0 <= first.start <= first.end <= t1
    moved = by[("step-2.pt", "moved")]
    assert moved.moved_from == str(run / "step-2.pt.tmp") and moved.start == by[("step-2.pt.tmp", "closed")].start
    directory = by[("checkpoint-5", "moved")]
    assert directory.kind == "dir" and directory.moved_from == str(run / "tmp-checkpoint-5")
    members = {p for p, how in by if p.startswith("checkpoint-5/")}
    assert members == {"checkpoint-5/model.safetensors", "checkpoint-5/trainer_state.json"}  # renamed with it
    assert by[("last.ckpt", "moved")].start is None  # began out of sight
    rewritten = [s for s in spans if s.path == str(run / "step-1.pt") and s.end_how == "closed"]
    assert len(rewritten) == 2 and rewritten[1].start is not None and rewritten[1].start >= rewritten[0].end  # type: ignore[operator]
    saves = {s.checkpoint.removeprefix(str(run) + "/"): s for s in event_saves(str(run), spans)}
    assert set(saves) == {"step-1.pt", "step-2.pt", "checkpoint-5", "last.ckpt", "done.pt"}  # the temporary's is step-2
    assert saves["checkpoint-5"].start == directory.start and saves["checkpoint-5"].end == directory.end


def test_a_file_being_written_is_an_open_save(source: FileEventSource, run: Path) -> None:
    _watched(source, run)
    f = open(run / "step-9.pt", "wb")  # noqa: SIM115 - held open across the look
    try:
        f.write(b"x" * 100)
        f.flush()
        end = time.monotonic() + WAIT
        while not [s for s in source.collect().spans if s.end is None and s.path.endswith("step-9.pt")]:
            assert time.monotonic() < end
            time.sleep(0.05)
        (save,) = event_saves(str(run), source.collect().spans)
        assert save.end is None and save.start is not None
    finally:
        f.close()


def test_the_watches_are_bounded_and_what_is_refused_is_counted(tmp_path: Path) -> None:
    dirs = [tmp_path / f"d{i}" for i in range(3)]
    for d in dirs:
        d.mkdir()
    made = FileEventSource(FileEventsConfig(max_watches=2), lambda: [(str(d), True) for d in dirs])
    try:
        end = time.monotonic() + WAIT
        while True:
            facts = made.collect()
            if facts.watched == 2 and facts.refused >= 1:
                break
            assert time.monotonic() < end, facts
            time.sleep(0.05)
    finally:
        made.close()


def _ck(path: str, mtime: float, size: int = 1000, **kw: object) -> Checkpoint:
    return Checkpoint(path, "torch-zip", "complete", "all checks passed", size, mtime, **kw)  # type: ignore[arg-type]


def test_a_checkpoint_is_timed_by_the_save_that_wrote_it() -> None:
    saves = (EventSave("/r/a.pt", 100.0, 101.5), EventSave("/r/a.pt", 200.0, 203.0), EventSave("/r/b.pt", 5.0, None))
    timed, writing = timed_by_file_events(_ck("/r/a.pt", 202.9), saves)
    assert (timed.write_start, timed.write_seconds, timed.write_timed_by, writing) == (200.0, 3.0, "file_events", False)
    # moved in from out of sight: its birth starts it, where there is one; else it is untimed, and says why
    moved = (EventSave("/r/c.pt", None, 50.0),)
    born = _ck("/r/c.pt", 49.0, write_start=40.0, write_untimed_reason="only its birth time is known")
    assert timed_by_file_events(born, moved)[0].write_seconds == 10.0
    untimed = timed_by_file_events(_ck("/r/c.pt", 49.0), moved)[0]
    assert untimed.write_seconds is None and "moved in from a directory not watched" in (
        untimed.write_untimed_reason or ""
    )
    # an event log's span stands; a save of it still open says it is being written
    logged = _ck("/r/b.pt", 4.0, write_start=1.0, write_seconds=2.0, write_timed_by="event_log")
    assert timed_by_file_events(logged, saves) == (logged, True)


def test_a_save_too_quick_to_be_seen_open_is_tied_by_its_writers_bursts() -> None:
    run = RunState("/r", "/", (_ck("/r/a.pt", 100.0, size=6 << 20),), uid=1000)
    saves = (EventSave("/r/a.pt", 99.99, 100.0),)

    def workload(pid: int, bursts: tuple[tuple[float, float, int], ...], uid: int) -> WorkloadAccess:
        return WorkloadAccess(pid, 1, ProcessIO(), write_bursts=bursts, uid=uid)

    writer = workload(11, ((99.8, 100.05, 6 << 20),), 1000)
    idle = workload(12, ((50.0, 50.25, 6 << 20),), 1000)
    other_user = workload(13, ((99.8, 100.05, 8 << 20),), 2000)
    facts = AccessFacts(101.0, {11: writer, 12: idle, 13: other_user})
    assert burst_writers(run, saves, facts) == (11,)
    twins = AccessFacts(101.0, {11: writer, 14: workload(14, ((99.9, 100.1, 7 << 20),), 1000)})
    assert burst_writers(run, saves, twins) == ()  # two could have written it: neither is taken


def test_a_save_is_not_judged_before_the_counters_were_read_after_it() -> None:
    """Read during the save's window, the counters hold the writer's burst in part (a throttled write) and another
    job's, saving at the same moment elsewhere, whole: that job is not taken for the writer; once they were read
    after the window, the writer's whole burst ties the run (and the other's alone no longer could)."""
    run = RunState("/r", "/", (_ck("/r/a.pt", 100.0, size=6 << 20),), uid=1000)
    saves = (EventSave("/r/a.pt", 99.0, 100.0),)
    partly = WorkloadAccess(11, 1, ProcessIO(), write_bursts=((99.0, 100.2, 2 << 20),), uid=1000)
    elsewhere = WorkloadAccess(12, 1, ProcessIO(), write_bursts=((99.5, 100.0, 6 << 20),), uid=1000)
    assert burst_writers(run, saves, AccessFacts(100.2, {11: partly, 12: elsewhere})) == ()
    whole = WorkloadAccess(11, 1, ProcessIO(), write_bursts=((99.0, 100.0, 6 << 20),), uid=1000)
    assert burst_writers(run, saves, AccessFacts(100.6, {11: whole, 12: elsewhere})) == ()  # two could have: unknown
    apart = WorkloadAccess(12, 1, ProcessIO(), write_bursts=((90.0, 90.5, 6 << 20),), uid=1000)
    assert burst_writers(run, saves, AccessFacts(100.6, {11: whole, 12: apart})) == (11,)


def test_a_save_is_judged_by_its_whole_checkpoint_not_a_part_a_scan_saw() -> None:
    """A scan in the middle of a 96 MiB save saw 24 MiB of it (incomplete): another job's 32 MiB save at the same
    moment matches that part, its own writer's 96 MiB burst does not. The save ties nobody until the scan finds the
    checkpoint complete, then its writer."""

    def workload(pid: int, bursts: tuple[tuple[float, float, int], ...]) -> WorkloadAccess:
        return WorkloadAccess(pid, 1, ProcessIO(), write_bursts=bursts, uid=1000)

    writer = workload(41, ((99.8, 100.2, 96 << 20),))
    other = workload(42, ((100.1, 100.4, 32 << 20),))  # its own save elsewhere, begun as this one ended
    facts = AccessFacts(101.0, {41: writer, 42: other})
    saves = (EventSave("/r/a.pt", 99.9, 100.2),)
    seen_mid_save = dataclasses.replace(_ck("/r/a.pt", 100.0, size=24 << 20), verdict="incomplete")
    assert burst_writers(RunState("/r", "/", (seen_mid_save,), uid=1000), saves, facts) == ()
    whole = _ck("/r/a.pt", 100.2, size=96 << 20)
    assert burst_writers(RunState("/r", "/", (whole,), uid=1000), saves, facts) == (41,)


def test_jobs_saving_at_once_are_told_apart_by_size_and_by_the_saves_each_matched() -> None:
    """Two jobs save at the same moments, one 16 MiB, one 6 MiB: a burst far larger than a save is another save,
    so each run is tied to its own job. Jobs of the same size, each saving at the same moment as the run's writer
    once: the job that matched every save of the run is its writer. The same bytes at the same moments always:
    unknown."""

    def workload(pid: int, bursts: tuple[tuple[float, float, int], ...]) -> WorkloadAccess:
        return WorkloadAccess(pid, 1, ProcessIO(), write_bursts=bursts, uid=1000)

    small = RunState("/fast", "/", (_ck("/fast/a.pt", 100.0, size=6 << 20),), uid=1000)
    large = RunState("/plain", "/", (_ck("/plain/a.pt", 100.0, size=16 << 20),), uid=1000)
    fast = workload(21, ((99.8, 100.05, 6 << 20),))
    plain = workload(22, ((98.5, 100.1, 16 << 20),))
    both = AccessFacts(101.0, {21: fast, 22: plain})
    assert burst_writers(small, (EventSave("/fast/a.pt", 99.98, 100.0),), both) == (21,)
    assert burst_writers(large, (EventSave("/plain/a.pt", 98.6, 100.0),), both) == (22,)

    run = RunState("/r", "/", (_ck("/r/a.pt", 300.0, size=6 << 20),), uid=1000)
    saves = (EventSave("/r/a.pt", 99.98, 100.0), EventSave("/r/a.pt", 299.98, 300.0))
    mine = workload(31, ((99.8, 100.05, 6 << 20), (299.8, 300.05, 6 << 20)))
    first = workload(32, ((99.8, 100.05, 6 << 20), (199.8, 200.05, 6 << 20)))  # saved with it at 100, not at 300
    second = workload(34, ((299.8, 300.05, 6 << 20),))  # started later: saved with it at 300
    assert burst_writers(run, saves, AccessFacts(301.0, {31: mine, 32: first, 34: second})) == (31,)
    twin = workload(33, ((99.8, 100.05, 6 << 20), (299.8, 300.05, 6 << 20)))
    assert burst_writers(run, saves, AccessFacts(301.0, {31: mine, 33: twin})) == ()


@pytest.mark.realpart
def test_a_directory_on_a_hung_mount_strands_only_the_helper(tmp_path: Path, real_mounts) -> None:  # type: ignore[no-untyped-def]
    """Adding a watch looks the directory up: on a mount whose getattr never answers (a dead NFS server) that call
    never returns. It runs in the helper: the source's collections return, and the other directories are watched."""
    from tests.realmounts import fuse_mount

    backing = tmp_path / "backing"
    (backing / "run").mkdir(parents=True)
    hung = real_mounts(fuse_mount(tmp_path / "hung", backing=backing, block_getattr=True))
    good = tmp_path / "good"
    good.mkdir()
    made = FileEventSource(FileEventsConfig(), lambda: [(str(hung.mountpoint / "run"), True), (str(good), True)])
    try:
        _watched(made, good)
        (good / "step-1.pt").write_bytes(b"x" * 100)
        (span,) = _spans(made, 1)
        assert span.path == str(good / "step-1.pt")
        assert str(hung.mountpoint / "run") not in {p for p, _ in made._wd.values()}
    finally:
        made.close()


# -- a save's fsync through a second descriptor (torch.save, then the file opened again and fsynced)

A, B = b"step-1.pt", b"step-2.pt"


@pytest.mark.parametrize(
    ("events", "kept"),
    [
        pytest.param(
            [(IN_CLOSE_WRITE, A, 10.0), (IN_OPEN, A, 10.01), (IN_CLOSE_NOWRITE, A, 13.0)], [1, 1, 1], id="sync"
        ),
        pytest.param(
            [(IN_CLOSE_WRITE, A, 10.0), (IN_OPEN, A, 11.5), (IN_CLOSE_NOWRITE, A, 12.0)], [1, 0, 0], id="late"
        ),
        pytest.param([(IN_OPEN, A, 10.0), (IN_CLOSE_NOWRITE, A, 10.5)], [0, 0], id="a-reader"),
        pytest.param(
            [(IN_CLOSE_WRITE, A, 10.0), (IN_OPEN, B, 10.01), (IN_CLOSE_NOWRITE, B, 10.5)], [1, 0, 0], id="other"
        ),
        pytest.param(
            [
                (IN_CLOSE_WRITE, A, 10.0),
                (IN_OPEN, A, 10.1),
                (IN_OPEN, A, 10.2),
                (IN_CLOSE_NOWRITE, A, 11.0),
                (IN_CLOSE_NOWRITE, A, 12.0),
                (IN_CLOSE_NOWRITE, A, 13.0),
            ],
            [1, 1, 1, 1, 1, 0],
            id="two-held",
        ),
        pytest.param(
            [(IN_CLOSE_WRITE, A, 10.0), (IN_DELETE, A, 10.1), (IN_OPEN, A, 10.2)], [1, 1, 0], id="removed-between"
        ),
        pytest.param([(IN_OPEN | IN_ISDIR, A, 10.0), (IN_CLOSE_NOWRITE | IN_ISDIR, A, 10.1)], [0, 0], id="directory"),
        pytest.param([(IN_MODIFY, A, 10.0), (IN_CREATE, B, 10.1)], [1, 1], id="others-pass"),
    ],
)
def test_the_helper_passes_on_only_the_opens_just_after_a_close_after_writing(
    events: list[tuple[int, bytes, float]], kept: list[int]
) -> None:
    """A node opens far more files than it writes: only a reopen at once after a close after writing (and the closes
    that end it) goes through the pipe."""
    f = ReopenFilter()
    assert [int(f.keep(1, mask, name, t)) for mask, name, t in events] == kept


def _lines(source: FileEventSource, run: str, events: list[tuple[float, int, str]]) -> list[FileSpan]:
    """The source fed event lines as its helper writes them (the directory's watch is 1), then its spans."""
    source._wd[1] = (run, 0)
    for t, mask, name in events:
        source._apply(f"ev {t:.6f} 1 {mask} 0 {name.encode().hex()}")
    return [s for s in source._spans if s.path.startswith(run)]


def test_a_reopen_just_after_a_save_marks_its_span_until_that_descriptor_closes() -> None:
    source = FileEventSource(FileEventsConfig(), lambda: [])
    made = [(10.0, IN_CREATE, "a.pt"), (10.1, IN_MODIFY, "a.pt"), (10.5, IN_CLOSE_WRITE, "a.pt")]
    (span,) = _lines(source, "/r", [*made, (10.5, IN_OPEN, "a.pt")])
    assert (span.start, span.end, span.reopened, span.reclosed) == (10.0, 10.5, 10.5, None)  # syncing now
    (span,) = _lines(source, "/r", [(14.0, IN_CLOSE_NOWRITE, "a.pt")])
    assert (span.end, span.reopened, span.reclosed) == (10.5, 10.5, 14.0)
    # an open long after the close is a reader's: nothing
    made_b = [(20.0, IN_CREATE, "b.pt"), (20.1, IN_MODIFY, "b.pt"), (20.5, IN_CLOSE_WRITE, "b.pt")]
    spans = _lines(source, "/r", [*made_b, (22.0, IN_OPEN, "b.pt"), (22.5, IN_CLOSE_NOWRITE, "b.pt")])
    assert [(s.path, s.reopened) for s in spans if s.path == "/r/b.pt"] == [("/r/b.pt", None)]
    # opened again and written: a rewrite, a save of its own, and the first one ends at its close
    made_c = [(30.0, IN_CREATE, "c.pt"), (30.1, IN_MODIFY, "c.pt"), (30.5, IN_CLOSE_WRITE, "c.pt")]
    again = [(30.6, IN_OPEN, "c.pt"), (30.7, IN_MODIFY, "c.pt"), (31.0, IN_CLOSE_WRITE, "c.pt")]
    spans = _lines(source, "/r", made_c + again)
    assert [(s.start, s.end, s.reopened) for s in spans if s.path == "/r/c.pt"] == [
        (30.0, 30.5, None),
        (30.7, 31.0, None),
    ]
    # held open again for ever (a reader that came at once): forgotten after MAX_REOPEN_SECONDS
    made_d = [(40.0, IN_CREATE, "d.pt"), (40.1, IN_MODIFY, "d.pt"), (40.5, IN_CLOSE_WRITE, "d.pt")]
    _lines(source, "/r", [*made_d, (40.6, IN_OPEN, "d.pt")])
    source._expire_reopens(40.6 + MAX_REOPEN_SECONDS + 1)
    (span,) = [s for s in source._spans if s.path == "/r/d.pt"]
    assert (span.end, span.reopened) == (40.5, None)


def test_each_save_that_ends_is_counted_once() -> None:
    """The count that brings the checkpoint scan forward (``ended``): a close after writing, a move into place and the
    close of a sync's second descriptor each count; a log beside them, a reader's open and a file made but never
    written count nothing."""
    source = FileEventSource(FileEventsConfig(), lambda: [])
    _lines(source, "/r", [(1.0, IN_CREATE, "a.pt"), (1.1, IN_MODIFY, "a.pt"), (1.5, IN_CLOSE_WRITE, "a.pt")])
    assert source.ended == 1
    _lines(source, "/r", [(1.5, IN_OPEN, "a.pt"), (3.0, IN_CLOSE_NOWRITE, "a.pt")])  # torch.save's fsync
    assert source.ended == 2
    log_and_reader = [(4.0, IN_CREATE, "train.log"), (4.1, IN_MODIFY, "train.log"), (4.2, IN_CLOSE_WRITE, "train.log")]
    _lines(source, "/r", [*log_and_reader, (9.0, IN_OPEN, "a.pt"), (9.1, IN_CLOSE_NOWRITE, "a.pt")])
    assert source.ended == 2
    _lines(source, "/r", [(10.0, IN_CREATE, "c.pt")])  # made, not yet written
    assert source.ended == 2
    _lines(source, "/r", [(10.1, IN_MODIFY, "c.pt"), (10.2, IN_CLOSE_WRITE, "c.pt")])
    assert source.ended == 3
    source._apply(f"ev 12.0 1 {IN_MOVED_FROM | IN_ISDIR} 8 {b'tmp-checkpoint-10'.hex()}")  # a directory renamed in
    source._apply(f"ev 12.0 1 {IN_MOVED_TO | IN_ISDIR} 8 {b'checkpoint-10'.hex()}")
    assert source.ended == 4


def test_a_real_reopen_and_fsync_is_seen(source: FileEventSource, run: Path) -> None:
    """torch.save's way: the file written and closed, then opened read-only and fsynced: the events show the second
    descriptor's close, after the first's."""
    _watched(source, run)
    path = run / "step-3.pt"
    path.write_bytes(b"x" * 65536)
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    end = time.monotonic() + WAIT
    while True:
        spans = [s for s in source.collect().spans if s.path == str(path)]
        if spans and spans[-1].reclosed is not None:
            break
        assert time.monotonic() < end, spans
        time.sleep(0.05)
    (span,) = spans
    assert span.end is not None and span.reopened is not None and span.end <= span.reopened <= span.reclosed


def test_the_directories_already_in_a_new_directory_are_watched_with_it(
    source: FileEventSource, tmp_path: Path
) -> None:
    """A directory that appears with directories in it: a tree moved in whole, or ``mkdir -p bob/run``, which makes run
    before the helper has read bob's creation and watched it (found in a full run on a busy machine: a run made so
    was never watched). Its directories are watched as it is, and a save in one of them is seen."""
    _watched(source, tmp_path / "root")
    made = tmp_path / "made-elsewhere" / "bob"
    (made / "run" / "checkpoint-1").mkdir(parents=True)
    os.rename(made, tmp_path / "root" / "bob")
    run = tmp_path / "root" / "bob" / "run"
    _watched(source, run / "checkpoint-1")
    (run / "checkpoint-1" / "model.safetensors").write_bytes(b"x" * 4096)
    spans = [s for s in _spans(source, 2) if s.kind == "file"]  # bob's move, and the save
    assert [(s.path, s.end_how) for s in spans] == [(str(run / "checkpoint-1" / "model.safetensors"), "closed")], spans


def _workload(
    pid: int, held: tuple[HeldFile, ...] = (), bursts: tuple[tuple[float, float, int], ...] = (), **kw: object
) -> WorkloadAccess:
    return WorkloadAccess(pid, 1, ProcessIO(), held=held, write_bursts=bursts, **kw)  # type: ignore[arg-type]


def test_a_reopen_is_the_saves_where_its_writer_held_it_and_wrote_it() -> None:
    """The reopen counts, and ties the run, only where the kernel shows whose it was: a GPU workload seen holding the
    file open after its close after writing, which wrote half its bytes as it was written; never a reader's."""
    run = RunState("/r", "/", (_ck("/r/a.pt", 100.2, size=32 << 20),))
    synced = EventSave("/r/a.pt", 100.0, 100.3, 100.3, 104.0)
    syncing = EventSave("/r/a.pt", 100.0, 100.3, 100.3, None)
    held = (HeldFile("/r/a.pt", 11, 100.5, 103.5),)
    writer = _workload(11, held, ((99.9, 100.4, 32 << 20),))
    reader = _workload(12, (HeldFile("/r/a.pt", 12, 100.5, 103.5),))  # held it, wrote nothing
    paths = HostPaths()
    assert synced_saves(run, (synced,), AccessFacts(105.0, {11: writer, 12: reader}), paths) == (
        (EventSave("/r/a.pt", 100.0, 104.0, 100.3, 104.0),),
        (11,),
    )
    # while the writer still syncs, the save goes on
    assert synced_saves(run, (syncing,), AccessFacts(102.0, {11: writer}), paths)[0][0].end is None
    # a reader alone, or a hold seen only before the save: the save ends at its close after writing, no one tied
    assert synced_saves(run, (synced,), AccessFacts(105.0, {12: reader}), paths) == ((synced,), ())
    before = _workload(11, (HeldFile("/r/a.pt", 11, 90.0, 95.0),), ((99.9, 100.4, 32 << 20),))
    assert synced_saves(run, (synced,), AccessFacts(105.0, {11: before}), paths) == ((synced,), ())
    # seen writing it is enough, without a burst
    seen = _workload(13, held, written=(WrittenFile("/r/a.pt", 13, 100.1, 100.0, 100.2, 100.4),))
    assert synced_saves(run, (synced,), AccessFacts(105.0, {13: seen}), paths)[1] == (13,)
    # two could have: neither is taken
    twin = _workload(14, (HeldFile("/r/a.pt", 14, 100.5, 103.5),), ((99.9, 100.4, 32 << 20),))
    assert synced_saves(run, (synced,), AccessFacts(105.0, {11: writer, 14: twin}), paths) == ((synced,), ())


def test_watches_added_at_once_on_threads_of_their_own_keep_to_the_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    """The helper adds watches on a thread that a lookup on a hung mount strands, the next ones on a new thread: a
    watch still being added counts against ``max_watches``, or two added together both pass a limit of one. (A stand-in
    for the inotify descriptor, whose add waits until the test lets it go: the kernel's own cannot be made to wait.)"""
    import threading

    from storwatch import _events_worker as worker

    monkeypatch.setattr(worker, "_paths", {})
    monkeypatch.setattr(worker, "_limit", [1])
    monkeypatch.setattr(worker, "_adding", [0], raising=False)
    entered, release = threading.Event(), threading.Event()

    class SlowInotify:
        def add(self, path: bytes) -> int:
            entered.set()
            release.wait(WAIT)
            return 1 if path == b"/a" else 2

    notify = SlowInotify()
    first: list[int] = []
    adding = threading.Thread(target=lambda: first.append(worker._add(notify, b"/a", 0)))  # type: ignore[arg-type]
    adding.start()
    assert entered.wait(WAIT)
    second: list[object] = []

    def add_second() -> None:
        try:
            second.append(worker._add(notify, b"/b", 0))  # type: ignore[arg-type]
        except OSError as err:
            second.append(err.errno)

    other = threading.Thread(target=add_second)
    other.start()
    other.join(0.5)  # refused at once; or, without the reservation, waiting in the add (let go below)
    release.set()
    adding.join(WAIT)
    other.join(WAIT)
    assert first == [1] and second == [28] and list(worker._paths) == [1]


@pytest.mark.parametrize(
    ("path", "directories", "below"),
    [
        pytest.param("/r/a/b", {"/r"}, True, id="two-levels-down"),
        pytest.param("/r/a", {"/r/a"}, False, id="the-directory-itself"),
        pytest.param("/ra/b", {"/r"}, False, id="a-name-that-only-starts-the-same"),
        pytest.param("/x/b", {"/"}, True, id="below-the-root"),
        pytest.param("/x", {"/y", "/x/z"}, False, id="above-one"),
        pytest.param("//x/y", {"//x"}, True, id="two-leading-slashes"),
    ],
)  # fmt: skip
def test_below_is_what_a_prefix_says(path: str, directories: set[str], below: bool) -> None:
    from storwatch.sources.fileevents import _below

    assert _below(path, directories) is below
    assert any(path.startswith(d.rstrip("/") + "/") for d in directories) is below


def test_the_watches_are_gone_through_again_only_when_they_or_the_wanted_directories_change(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every second the source holds its watches against the directories wanted (thousands of watches on a node with
    hundreds of runs): it does so when either changed, and a watch that is no longer wanted is still let go."""
    import storwatch.sources.fileevents as fileevents

    looked: list[str] = []
    below = fileevents._below
    monkeypatch.setattr(fileevents, "_below", lambda path, dirs: looked.append(path) or below(path, dirs))
    root, other = tmp_path / "root", tmp_path / "other"
    (root / "alice" / "run").mkdir(parents=True)
    other.mkdir()
    wanted = [(str(root), False)]
    made = FileEventSource(FileEventsConfig(), lambda: list(wanted))
    try:
        end = time.monotonic() + WAIT
        while made.collect().watched < 3:  # root, alice, run
            assert time.monotonic() < end
            time.sleep(0.05)
        made.collect()  # holds the watches that came with the last collection's answers
        looked.clear()
        made.collect()
        made.collect()
        assert looked == []  # nothing changed since: no watch looked at
        (root / "bob").mkdir()
        while made.collect().watched < 4:  # the new directory watched as it came
            assert time.monotonic() < end
            time.sleep(0.05)
        made.collect()
        assert str(root / "bob") in looked
        wanted[:] = [(str(other), False)]
        made.collect()
        # Root's watches let go, other's asked (and maybe answered already: the helper is quick, and this thread may
        # wait for the core between asking and reading the answers).
        assert {path for path, _ in made._wd.values()} <= {str(other)} and set(made._asked) == {str(other)}
        while made.collect().watched < 1:
            assert time.monotonic() < end
            time.sleep(0.05)
    finally:
        made.close()


def test_a_wanted_directory_that_is_not_there_is_not_asked_for_every_second(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run removed since the scan that found it (or a root not made yet) stays wanted until the next scan: its watch
    is asked for again after MISSING_RETRY_SECONDS, or at once when the wanted directories change, not every second
    (on bench/at_scale.py's node the requests re-sent each second were the file events source's main cost)."""
    import storwatch.sources.fileevents as fileevents

    asked: list[str] = []
    send = fileevents._Helper.send
    monkeypatch.setattr(fileevents._Helper, "send", lambda self, line: asked.append(line) or send(self, line))
    now = [1000.0]
    run, gone = tmp_path / "run", tmp_path / "gone"
    run.mkdir()
    wanted = [(str(run), True), (str(gone), True)]
    made = FileEventSource(FileEventsConfig(), lambda: list(wanted), clock=lambda: now[0])
    gone_hex = os.fsencode(str(gone)).hex()
    try:
        end = time.monotonic() + WAIT
        while made.collect().watched < 1 or str(gone) in made._asked:  # the answers not read yet
            assert time.monotonic() < end
            time.sleep(0.05)
        for _ in range(5):  # a second each (time for an answer to come back between two)
            now[0] += 1.0
            facts = made.collect()
            time.sleep(0.05)
        assert [line for line in asked if line.endswith(gone_hex)] == [asked[2]]  # asked once
        assert facts.watched == 1 and facts.refused == 0  # not there is not refused
        now[0] += fileevents.MISSING_RETRY_SECONDS
        made.collect()
        assert len([line for line in asked if line.endswith(gone_hex)]) == 2  # asked again, a while later
        while str(gone) in made._asked:
            made.collect()
            assert time.monotonic() < end
            time.sleep(0.05)
        gone.mkdir()
        wanted.append((str(tmp_path), False))  # a new scan: asked again at once
        while made.collect().watched < 3:  # run, gone (now there) and tmp_path
            assert time.monotonic() < end
            time.sleep(0.05)
        assert len([line for line in asked if line.endswith(gone_hex)]) == 3
    finally:
        made.close()


def test_watches_go_on_past_a_lookup_that_hangs_and_its_thread_ends_when_it_returns(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The helper adds watches in order on one thread; one still being added after STRANDED_SECONDS is left to its
    thread, the next ones are added on a new one, and the thread left behind ends once its lookup returns (a slow
    mount, not a hung one, leaves no thread behind). (A stand-in for the inotify descriptor, whose add waits until
    the test lets it go: the kernel's own cannot be made to wait.)"""
    import queue
    import threading

    from storwatch import _events_worker as worker

    monkeypatch.setattr(worker, "_paths", {})
    monkeypatch.setattr(worker, "_adding", [0])
    monkeypatch.setattr(worker, "STRANDED_SECONDS", 0.2)
    said: list[str] = []
    monkeypatch.setattr(worker, "_say", said.append)
    release = threading.Event()

    class SlowInotify:
        def add(self, path: bytes) -> int:
            if path == b"/hung":
                release.wait(WAIT)
            return len(path)

    todo: queue.SimpleQueue[tuple[str, bytes, int]] = queue.SimpleQueue()
    before = {t.ident for t in threading.enumerate()}
    dispatch = threading.Thread(target=worker._watches, args=(SlowInotify(), todo), daemon=True)
    dispatch.start()
    todo.put(("1", b"/hung", 0))
    todo.put(("2", b"/ok", 0))
    end = time.monotonic() + WAIT
    while "watched 2 3" not in said:  # answered while the first still waits
        assert time.monotonic() < end, said
        time.sleep(0.02)
    assert not any(line.startswith("watched 1 ") for line in said)
    release.set()
    while "watched 1 5" not in said:
        assert time.monotonic() < end, said
        time.sleep(0.02)

    def watchers() -> int:
        return sum(1 for t in threading.enumerate() if t.ident not in before and t is not dispatch)

    while watchers() > 1:  # the one left behind has ended; the one adding the next watches stays
        assert time.monotonic() < end, watchers()
        time.sleep(0.02)
    assert watchers() == 1


def test_the_files_whose_save_may_still_be_under_way() -> None:
    """What the agent does not read in full yet (``FileEventFacts.saving``): a file being written, one whose sync's
    second descriptor is still open, one closed after writing too recently for that sync to have opened it; not one
    whose sync closed, one closed long ago, a file moved into place or a directory."""
    now = 100.0
    spans = (
        FileSpan("/r/writing.pt", "file", 90.0, None),
        FileSpan("/r/syncing.pt", "file", 90.0, 95.0, "closed", reopened=95.0),
        FileSpan("/r/synced.pt", "file", 90.0, 95.0, "closed", reopened=95.0, reclosed=98.0),
        FileSpan("/r/just-closed.pt", "file", 90.0, now - 0.5, "closed"),
        FileSpan("/r/closed.pt", "file", 90.0, now - 5.0, "closed"),
        FileSpan("/r/moved.pt", "file", 90.0, now - 0.5, "moved", moved_from="/r/moved.pt.tmp"),
        FileSpan("/r/checkpoint-10", "dir", 90.0, now - 0.5, "moved"),
    )
    assert FileEventFacts(spans).saving(now) == {"/r/writing.pt", "/r/syncing.pt", "/r/just-closed.pt"}


def test_no_deep_check_reads_a_checkpoint_its_writer_is_still_syncing(
    source: FileEventSource, run: Path, tmp_path: Path
) -> None:
    """torch.save, then the file opened again and fsynced: the events cannot say whose that second descriptor's close
    is, so the agent's deep check (a child that holds the file while it imports torch) must not be begun while the
    sync holds it, or a check that outlasts the sync is timed as the save's. The checkpoint source, as the agent
    makes it, takes the file events' word: deep-checked only once the sync's descriptor is closed."""
    _watched(source, run)
    path = run / "step-3.pt"
    torch_like_zip(path)
    latest: dict[object, object] = {}
    ctx = SourceContext(HostPaths(), time.time, latest.get, lambda _: None)
    section = CheckpointsConfig(roots=(str(tmp_path / "root"),), default_roots=False, deep_per_scan=1)
    checkpoints = registry._checkpoints(ctx, section)
    checkpoints.clock = lambda: time.time() + DEEP_AFTER_SECONDS  # the file's age is not what holds it back here
    asked = _DeepAsked(checkpoints.calls)
    checkpoints.calls = asked  # type: ignore[assignment]
    try:
        fd = os.open(path, os.O_RDONLY)  # the sync's descriptor
        try:
            latest[FILE_EVENTS] = _until(source, lambda s: s.reopened is not None, str(path))
            for _ in range(3):  # the scans while the descriptor stays open
                (ckpt,) = _checkpoints_of(checkpoints)
                assert ckpt.verdict == "complete", ckpt
            assert asked.paths == [], "a deep check was begun while the sync held the file"
            os.fsync(fd)
        finally:
            os.close(fd)
        latest[FILE_EVENTS] = _until(source, lambda s: s.reclosed is not None, str(path))
        end = time.monotonic() + DEEP_WAIT
        while not _checkpoints_of(checkpoints)[0].deep_checked:
            assert time.monotonic() < end, "no deep check once the sync was over"
            time.sleep(0.1)
    finally:
        checkpoints.close()


class _DeepAsked:
    """The checkpoint source's real helper calls, with the paths each deep check was asked for noted."""

    def __init__(self, calls: BlockingCalls) -> None:
        self.calls = calls
        self.paths: list[str] = []

    def call_many(
        self, op: str, requests: Mapping[str, Sequence[str]], timeout: float, wait: float | None = None
    ) -> dict[str, CallOutcome]:
        if op == "ckpt_deep":
            self.paths.extend(str(path) for path, _ in requests.values())
        return self.calls.call_many(op, requests, timeout, wait)

    def __getattr__(self, name: str) -> object:
        return getattr(self.calls, name)


def _until(source: FileEventSource, ready: Callable[[FileSpan], bool], path: str) -> FileEventFacts:
    """The file events' facts once ``path``'s newest span is ``ready``."""
    end = time.monotonic() + WAIT
    while True:
        facts = source.collect()
        spans = [s for s in facts.spans if s.path == path]
        if spans and ready(spans[-1]):
            return facts
        assert time.monotonic() < end, spans
        time.sleep(0.05)


def _checkpoints_of(checkpoints: CheckpointSource) -> tuple[Checkpoint, ...]:
    """The checkpoints of the one run, once the walk has answered."""
    end = time.monotonic() + WAIT
    while True:
        facts = checkpoints.collect()
        if facts.runs and not checkpoints.waiting:
            (state,) = facts.runs
            return state.checkpoints
        assert time.monotonic() < end, "the walk did not answer"
        time.sleep(0.05)


def test_the_wanted_directories_are_gone_through_only_when_a_scan_gives_new_ones(tmp_path: Path) -> None:
    """The directories to watch come from the checkpoint scan's facts (hundreds of runs on a node) every second: they
    are made into the watch list once per scan, and a collection given the same ones does not go through them."""
    from types import SimpleNamespace

    import storwatch.sources.fileevents as fileevents
    from storwatch.sources.checkpoints import CHECKPOINTS, CheckpointFacts

    class Counted(tuple[tuple[str, bool], ...]):
        reads = 0

        def __iter__(self) -> Iterator[tuple[str, bool]]:
            Counted.reads += 1
            return super().__iter__()

    run = tmp_path / "run"
    run.mkdir()
    latest: dict[object, object] = {}
    ctx = SimpleNamespace(latest=latest.get, clock=time.time)
    wanted = fileevents._Wanted(ctx)
    assert wanted() == ()
    facts = CheckpointFacts(1.0, (RunState(str(run), str(tmp_path), ()),), False, None, 0.0, (str(tmp_path),))
    latest[CHECKPOINTS] = facts
    first = wanted()
    assert first == ((str(run), True), (str(tmp_path), False))
    assert wanted() is first  # the same facts: the same object
    latest[CHECKPOINTS] = dataclasses.replace(facts)
    assert wanted() is not first and wanted() == first  # a new scan's facts: a new object

    given = Counted(first)
    made = FileEventSource(FileEventsConfig(), lambda: given)
    try:
        made.collect()  # the first also asks whether there is anything to watch (and starts the helper)
        assert set(made._asked) == {str(run), str(tmp_path)}
        reads = Counted.reads
        made.collect()
        made.collect()
        assert Counted.reads == reads  # the same object: not gone through again
        given = Counted(((str(run), True),))
        made.collect()
        assert Counted.reads == reads + 1 and set(made._keep) == {str(run)}  # a new one is
    finally:
        made.close()
