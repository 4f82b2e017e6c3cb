"""Writes seen through the writer's open files (sources/access.py, analysis/writes.py): a real process holds a file
open for writing while the access source looks, as the agent paces it (a look at the open files and the write
counters between passes); and the spans and links the View makes of what it saw."""

from __future__ import annotations

import dataclasses
import math
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from storwatch.analysis.writes import SPAN_TOLERANCE, run_writes, timed_by_open_files
from storwatch.checkpoints.record import Checkpoint, RunId
from storwatch.paths import HostPaths
from storwatch.procfs.pidio import ProcessIO
from storwatch.sources.access import (
    IDLE_WATCH_SECONDS,
    AccessConfig,
    AccessFacts,
    AccessSource,
    WorkloadAccess,
    WrittenFile,
)
from storwatch.sources.fileevents import FileSpan
from tests.builders import host_mounts

WRITER = """
import os, sys
f = g = None
for line in sys.stdin:
    cmd, _, arg = line.strip().partition(" ")
    if cmd == "open":
        f = open(arg, "wb")
    elif cmd == "write":
        f.write(b"x" * int(arg)); f.flush()
    elif cmd == "close":
        f.close(); f = None
    elif cmd == "reopen":
        g = os.open(arg, os.O_RDONLY)
    elif cmd == "unhold":
        os.close(g); g = None
    print("ok", flush=True)
"""


class Writer:
    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", WRITER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )

    def do(self, line: str) -> None:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        assert self.proc.stdout.readline().strip() == "ok"


@pytest.fixture
def writer() -> Iterator[Writer]:
    w = Writer()
    try:
        yield w
    finally:
        w.proc.kill()
        w.proc.wait()


def test_a_save_begun_between_passes_is_seen_open_and_its_close_is_timed(writer: Writer, tmp_path: Path) -> None:
    """Paced as the agent runs it, with passes an hour apart: the save that starts after the first pass is found by
    its write counter and watched until it closes."""
    now = [1000.0]
    pid = writer.proc.pid
    source = AccessSource(
        HostPaths(), AccessConfig(interval_seconds=3600), lambda: [pid], host_mounts, lambda: now[0], paced=True
    )
    first = source.collect().workloads[pid]
    assert first.written == ()
    # A GPU workload: looked at between passes (every IDLE_WATCH_SECONDS while its write counters stand still)
    assert source.interval_seconds == IDLE_WATCH_SECONDS
    path = tmp_path / "step-1.pt"
    writer.do(f"open {path}")
    writer.do(f"write {2 << 20}")
    now[0] += 0.25
    source.collect()  # a look between passes: the counter rose, so its open files are read
    now[0] += 0.25
    (seen,) = source.collect().workloads[pid].written
    assert seen.path == str(path) and seen.pid == pid and seen.open, seen
    assert seen.first_seen == 1000.25 and seen.looked_before == 1000.0 and seen.last_open == 1000.5, seen
    writer.do("close")
    now[0] += 0.25
    (closed,) = source.collect().workloads[pid].written
    assert closed.closed_by == 1000.75 and closed.last_open == 1000.5 and not closed.open, closed


def test_an_unpaced_source_reads_every_time_and_a_file_only_read_is_not_written(writer: Writer, tmp_path: Path) -> None:
    pid = writer.proc.pid
    source = AccessSource(HostPaths(), AccessConfig(), lambda: [pid], host_mounts, time.time)
    assert source.interval_seconds == AccessConfig().interval_seconds
    (tmp_path / "model.safetensors").write_bytes(b"x")
    writer.do(f"open {tmp_path / 'step-2.pt'}")
    (seen,) = source.collect().workloads[pid].written
    assert seen.path == str(tmp_path / "step-2.pt")
    writer.do("close")
    (closed,) = source.collect().workloads[pid].written  # a whole pass looks again too
    assert closed.closed_by is not None


def test_a_checkpoint_held_open_read_only_is_seen_held_and_a_dataset_file_is_not(
    writer: Writer, tmp_path: Path
) -> None:
    """The writer's second descriptor, opened to fsync what it has just written, is a checkpoint's file held open
    read-only (analysis/writes.py tells a writer's from a reader's); other files read are not remembered."""
    now = [1000.0]
    pid = writer.proc.pid
    source = AccessSource(
        HostPaths(), AccessConfig(interval_seconds=3600), lambda: [pid], host_mounts, lambda: now[0], paced=True
    )
    source.collect()
    path, data = tmp_path / "step-4.pt", tmp_path / "shard-0.txt"
    path.write_bytes(b"x" * 4096)
    data.write_bytes(b"y")
    writer.do(f"open {tmp_path / 'log.pt'}")
    writer.do(f"write {2 << 20}")  # a save's burst: the next look reads its open files
    writer.do(f"reopen {path}")
    now[0] += 0.25
    source.collect()
    seen = source.collect().workloads[pid].held
    assert len(seen) == 1, seen  # failed once under mount churn with two: which two, if it comes again
    (held,) = seen
    assert (held.path, held.pid, held.first_seen, held.last_seen) == (str(path), pid, 1000.25, 1000.25), held
    now[0] = 5000.0  # a whole pass: seen again, the same descriptor
    (again,) = source.collect().workloads[pid].held
    assert (again.first_seen, again.last_seen) == (1000.25, 5000.0), again
    writer.do("unhold")
    writer.do(f"reopen {data}")
    now[0] = 9000.0
    assert [h.path for h in source.collect().workloads[pid].held] == [str(path)]  # remembered as it was


def test_a_temporary_renamed_into_a_run_is_its_writers(tmp_path: Path) -> None:
    """Lightning with TMPDIR on the checkpoint's filesystem: its temporary is written in <mount>/tmp, then renamed
    into the run. The writer seen holding the temporary open under its old name, after it was made there and before
    the rename, writes the run; a file seen under that name before it was made there is another file."""
    rid = RunId("/m", "/m/run")
    moved = FileSpan("/m/run/epoch=0.ckpt", "file", 100.0, 104.0, "moved", "/m/tmp/tmpab12")
    facts = AccessFacts(
        105.0,
        {7: WorkloadAccess(7, 1, ProcessIO(), written=(WrittenFile("/m/tmp/tmpab12", 7, 100.5, 100.2, 103.5, 103.8),))},
    )
    (w,) = run_writes(facts, [rid], HostPaths(), [moved]).values()
    assert w.writers == (7,) and [f.path for f in w.files] == ["/m/run/epoch=0.ckpt"]
    assert run_writes(facts, [rid], HostPaths()) == {}  # without the rename: a file outside the run
    stale = AccessFacts(
        105.0,
        {7: WorkloadAccess(7, 1, ProcessIO(), written=(WrittenFile("/m/tmp/tmpab12", 7, 50.0, 49.8, 60.0, 60.2),))},
    )
    assert run_writes(stale, [rid], HostPaths(), [moved]) == {}
    other_run = FileSpan("/m/elsewhere/x.ckpt", "file", 100.0, 104.0, "moved", "/m/tmp/tmpab12")
    assert run_writes(facts, [rid], HostPaths(), [other_run]) == {}


def test_what_an_ended_workload_wrote_is_kept_and_ties_it_to_no_gpu(writer: Writer, tmp_path: Path) -> None:
    pid = writer.proc.pid
    pids = [pid]
    source = AccessSource(HostPaths(), AccessConfig(), lambda: pids, host_mounts, time.time)
    writer.do(f"open {tmp_path / 'step-3.pt'}")
    source.collect()
    writer.proc.kill()
    writer.proc.wait()
    facts = source.collect()  # the driver still names it; the process is gone
    assert pid not in facts.workloads
    (ended,) = facts.ended
    assert ended.path == str(tmp_path / "step-3.pt") and ended.closed_by is not None
    rid = RunId(str(tmp_path.parent), str(tmp_path))
    (w,) = run_writes(facts, [rid], HostPaths()).values()
    assert w.writers == () and w.open_since is None and len(w.files) == 1


def _file(path: str, first: float, last: float, closed: float | None, before: float | None = None) -> WrittenFile:
    return WrittenFile(path, 7, first, before, last, closed)


def _ckpt(path: str, mtime: float, **kw: object) -> Checkpoint:
    return dataclasses.replace(Checkpoint(path, "torch", "complete", "ok", 1000, mtime), **kw)  # type: ignore[arg-type]


def _born(path: str, mtime: float, birth: float) -> Checkpoint:
    """A checkpoint as the scan gives it where the filesystem keeps a birth time: its start, and no duration."""
    return _ckpt(path, mtime, write_start=birth, write_untimed_reason="only its birth time is known")


def test_a_span_from_birth_to_seen_closed_and_the_cases_that_are_no_duration() -> None:
    born = _born("/r/step-1.pt", 101.0, 100.0)
    # open from its birth (100) past its last write (101, then an fsync) until seen closed between 104.0 and 104.2
    timed = timed_by_open_files(born, [_file("/r/step-1.pt", 100.1, 104.0, 104.2, before=99.9)])
    assert timed.write_timed_by == "open_files" and timed.write_start == 100.0
    assert timed.write_seconds == pytest.approx(4.1) and timed.write_bytes_per_second == pytest.approx(1000 / 4.1)
    # seen open 0.9 s after its birth, past its last change at 100.05 (an fsync), then closed by 101.0: the birth
    # time's span leaves the fsync out, and the end is known to within 0.05 s: a duration from birth to the middle
    quick = _born("/r/step-1.pt", 100.05, 100.0)
    synced = timed_by_open_files(quick, [_file("/r/step-1.pt", 100.1, 100.9, 101.0, before=99.9)])
    assert synced.write_timed_by == "open_files" and synced.write_seconds == pytest.approx(0.95)
    # looks too far apart to say when it closed (seen open at 100.9, closed by 102.0): no duration, not the birth
    # time's 0.05 s, which what was seen contradicts
    far = timed_by_open_files(quick, [_file("/r/step-1.pt", 100.1, 100.9, 102.0, before=99.9)])
    assert far.write_seconds is None and far.write_timed_by is None and far.write_bytes_per_second is None, far
    assert "0.90 s after its birth, past its last change" in str(far.write_untimed_reason), far
    # seen open only before its last change (100.8), then closed by 102.0: it ended between the two, which is no
    # duration (birth to mtime would leave out whatever came after the last write); the start is kept
    early = _born("/r/step-1.pt", 100.8, 100.0)
    vague = timed_by_open_files(early, [_file("/r/step-1.pt", 100.1, 100.2, 102.0, before=99.9)])
    assert vague.write_seconds is None and vague.write_timed_by is None and vague.write_start == 100.0, vague
    assert "seen closed only 1.20 s after its last change" in str(vague.write_untimed_reason), vague
    # seen open only before its last change, and seen closed just after it: birth to the middle of that
    brief = timed_by_open_files(early, [_file("/r/step-1.pt", 100.1, 100.2, 100.9, before=99.9)])
    assert brief.write_timed_by == "open_files" and brief.write_seconds == pytest.approx(0.85), brief
    # an event log's span is exact: kept
    logged = dataclasses.replace(born, write_timed_by="event_log")
    assert timed_by_open_files(logged, [_file("/r/step-1.pt", 100.1, 104.0, 104.2)]) is logged
    # still open: the save goes on, nothing changes
    assert timed_by_open_files(born, [_file("/r/step-1.pt", 100.1, 104.0, None)]) is born
    # the same name written again later (first looked at after this checkpoint's last change): another save
    assert timed_by_open_files(born, [_file("/r/step-1.pt", 200.0, 201.0, 201.2, before=199.0)]) is born
    # no birth time: first seen open 5 s after the look before, on a 2 s write: no duration, and the reason
    plain = _ckpt("/r/step-2.pt", 101.0, write_untimed_reason="no birth time")
    vague = timed_by_open_files(plain, [_file("/r/step-2.pt", 100.0, 101.8, 102.0, before=95.0)])
    assert vague.write_seconds is None and vague.write_timed_by is None
    assert vague.write_untimed_reason is not None and "within 5.1" in vague.write_untimed_reason
    # first seen with no look before it: the start is unknown
    unknown = timed_by_open_files(plain, [_file("/r/step-2.pt", 100.0, 101.8, 102.0)])
    assert unknown.write_seconds is None and "only once the write had begun" in str(unknown.write_untimed_reason)
    # looks close enough together: a duration
    close = timed_by_open_files(plain, [_file("/r/step-2.pt", 100.0, 101.8, 102.0, before=99.8)])
    assert close.write_timed_by == "open_files" and close.write_seconds == pytest.approx(1.9)
    assert SPAN_TOLERANCE >= 0.3 / 1.9


def test_a_directory_checkpoint_spans_its_files_and_logs_beside_it_are_not_checkpoints() -> None:
    run = RunId("/data", "/data/job")
    files = (
        _file("/data/job/checkpoint-10/model.safetensors", 50.0, 52.0, 52.2, before=49.9),
        _file("/data/job/checkpoint-10/optimizer.pt", 52.5, 53.0, 53.2, before=52.4),
        _file("/data/job/runs/events.out.tfevents.1", 1.0, 60.0, None, before=0.5),  # a log, open for hours
    )
    facts = AccessFacts(60.0, {7: WorkloadAccess(7, 1, _io(), written=files)})
    (w,) = run_writes(facts, [run], HostPaths()).values()
    assert w.writers == (7,) and w.open_since is None and len(w.files) == 2, w
    d = _ckpt("/data/job/checkpoint-10", 53.0, kind="dir", files=4)
    timed = timed_by_open_files(d, w.files)
    assert timed.write_timed_by == "open_files" and timed.write_start == 50.0
    assert timed.write_seconds == pytest.approx(3.1) and math.isfinite(timed.write_bytes_per_second or math.nan)
    # a file of the next save open now: the run is being written
    more = (*files, _file("/data/job/checkpoint-20/model.safetensors", 59.0, 60.0, None, before=58.0))
    facts = AccessFacts(60.0, {7: WorkloadAccess(7, 1, _io(), written=more)})
    (w,) = run_writes(facts, [run], HostPaths()).values()
    assert w.open_since == 59.0


def _io() -> object:
    from storwatch.procfs.pidio import ProcessIO

    return ProcessIO()
