"""Access patterns (sources/access.py): a real process tree (a "trainer" and its data-loader worker) reading one
mount and writing another, read through the real /proc: its counters (and the call sizes they give), the mounts by
access mode, the workers counted; the /proc/<pid>/io parser on odd input; and the metrics."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager as ContextManager
from pathlib import Path
from typing import Any, TypeVar

import pytest

from storwatch.analysis.view import View
from storwatch.exporter import ExportState, render_text
from storwatch.exporter import access as access_area
from storwatch.paths import HostPaths
from storwatch.procfs.pidio import access_mode, parse_children, parse_io
from storwatch.report import view_to_dict
from storwatch.snapshot import Snapshot
from storwatch.sources import read_bounded
from storwatch.sources.access import (
    ACCESS,
    IDLE_WATCH_SECONDS,
    QUIET_SECONDS,
    WATCH_SECONDS,
    AccessConfig,
    AccessFacts,
    AccessSource,
    WorkloadAccess,
)
from storwatch.vocabulary import Platform
from tests.builders import host_mounts
from tests.realmounts import tmpfs_mount

T = TypeVar("T")
Enter = Callable[[ContextManager[T]], T]

TRAINER = textwrap.dedent(
    """
    import os, sys, time, multiprocessing as mp

    def worker(path):
        with open(path, "rb", buffering=0) as f:   # the data loader: 64 KiB reads, again and again
            while True:
                f.seek(0)
                while f.read(65536):
                    pass
                time.sleep(0.01)

    if __name__ == "__main__":
        data, ckpt = sys.argv[1], sys.argv[2]
        mp.set_start_method("fork")
        p = mp.Process(target=worker, args=(data,), daemon=True)
        p.start()
        out = open(ckpt, "wb", buffering=0)           # the trainer: 1 MiB writes, flushed
        print("ready", p.pid, flush=True)
        block = os.urandom(1 << 20)
        while True:
            out.seek(0)
            for _ in range(4):
                out.write(block)
            os.fsync(out.fileno())
            time.sleep(0.05)
    """
)


@pytest.fixture
def trainer(real_mounts: Enter[Any], tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], int, Path, Path]]:
    data_mount = real_mounts(tmpfs_mount(tmp_path / "datasets", size="64m"))
    ckpt_mount = real_mounts(tmpfs_mount(tmp_path / "ckpt", size="64m"))
    (data_mount.mountpoint / "shard-0000.tar").write_bytes(b"\1" * (8 << 20))
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            TRAINER,
            str(data_mount.mountpoint / "shard-0000.tar"),
            str(ckpt_mount.mountpoint / "x"),
        ],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its worker is killed with it: a SIGKILLed parent leaves forked children behind
    )
    assert proc.stdout is not None
    line = proc.stdout.readline().split()
    assert line[0] == "ready", line
    try:
        yield proc, int(line[1]), data_mount.mountpoint, ckpt_mount.mountpoint
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


@pytest.mark.realpart
def test_a_trainer_and_its_worker_read_one_mount_and_write_another(trainer: Any) -> None:
    proc, _worker, data, ckpt = trainer
    clock = time.time
    source = AccessSource(HostPaths(), AccessConfig(), lambda: [proc.pid], host_mounts, clock)
    first = source.collect().workloads[proc.pid]
    assert first.processes == 2, first  # the trainer and its worker
    time.sleep(1.0)
    facts = source.collect()
    w = facts.workloads[proc.pid]
    # (the interpreter may hold files of / open too)
    assert str(data) in w.mounts_read and str(data) not in w.mounts_written, w
    assert str(ckpt) in w.mounts_written and str(ckpt) not in w.mounts_read, w
    # Counters, not rates: what the two processes did between the reads is the difference, as rate() takes it.
    # tmpfs reads come from memory (rchar, not read_bytes); the call sizes are the program's.
    did = {f: getattr(w.io, f) - getattr(first.io, f) for f in ("rchar", "wchar", "syscr", "syscw")}
    assert did["syscr"] > 100 and did["syscw"] > 10, did
    assert 60_000 <= did["rchar"] / did["syscr"] <= 65_536, did
    assert did["wchar"] / did["syscw"] == pytest.approx(1 << 20, rel=0.05), did
    assert w.comm is not None and w.comm == Path(f"/proc/{proc.pid}/comm").read_text().strip(), w
    # the metrics, named by the process's command where no pod or job is known: no PID anywhere
    view = View(Snapshot(clock(), facts={ACCESS.name: facts}), Platform("generic", "test"))
    text = render_text(list(access_area.families(view, ExportState()))).decode()
    assert "pid=" not in text, text
    name = f'workload="process:{w.comm}"'
    assert f'storwatch_workload_mount{{mode="read",mountpoint="{data}",{name}}} 1.0' in text
    assert f'storwatch_workload_mount{{mode="write",mountpoint="{ckpt}",{name}}} 1.0' in text
    assert f"storwatch_workload_write_calls_total{{{name}}} " in text
    (row,) = view_to_dict(view)["workloads"]
    assert row["workload"] == f"pid:{proc.pid}" and row["pid"] == proc.pid and row["comm"] == w.comm, row
    assert str(data) in row["mounts_read"] and row["processes"] == 2 and row["io"]["wchar"] == w.io.wchar, row


def test_a_gpu_process_that_is_gone_is_left_out_and_no_gpu_process_is_off() -> None:
    source = AccessSource(HostPaths(), AccessConfig(), lambda: [2**22 - 1], lambda: (), time.time)
    assert source.collect().workloads == {} and source.off_reason is None
    idle = AccessSource(HostPaths(), AccessConfig(), lambda: [], lambda: (), time.time)
    assert idle.collect().workloads == {} and idle.off_reason == "no GPU process on this node (NVML names none)"


def test_the_io_parser_keeps_good_lines_and_names_bad_ones() -> None:
    io, errors = parse_io(
        b"rchar: 10\nwchar: x\nsyscr: 3\nnew_field: 5\ngarbage\nread_bytes: 99999999999999999999999\n"
    )
    assert io is not None and (io.rchar, io.syscr, io.wchar, io.read_bytes) == (10, 3, 0, 0)
    assert [str(e).split(":")[0] for e in errors] == ["line 2", "line 5", "line 6"]
    assert parse_io(b"")[0] is None
    assert access_mode(b"pos:\t0\nflags:\t0100002\nmnt_id:\t25\n") == "rw"
    assert access_mode(b"flags:\t02100000\n") == "r" and access_mode(b"flags: 01\n") == "w"
    assert access_mode(b"flags: zz\n") is None and access_mode(b"") is None
    assert parse_children(b"12 13 x 0 99999999\n") == [12, 13]


SLOW_WRITER = textwrap.dedent(
    """
    import sys, time
    print("ready", flush=True)
    sys.stdin.readline()
    with open(sys.argv[1], "wb", buffering=0) as f:   # a save the device holds back: 256 KiB every 0.1 s
        for _ in range(32):
            f.write(b"x" * (256 << 10))
            time.sleep(0.1)
    print("closed", flush=True)
    sys.stdin.readline()
    """
)


def _said(proc: subprocess.Popen[str], word: str) -> bool:
    """Whether the process has printed its next line, and it is ``word`` (without waiting for it)."""
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], 0)
    return bool(ready) and proc.stdout.readline().strip() == word


def _looked_at_between_passes(script: str, target: Path, done: str) -> WorkloadAccess:
    """Run ``script`` (it prints ``ready``, waits for a line, saves to ``target``, prints ``done``, waits) as a GPU
    process: a pass first, then its save, looked at as the agent looks between passes (paced: every WATCH_SECONDS)
    until it says ``done``; what the source then says of it."""
    proc = subprocess.Popen(
        [sys.executable, "-c", script, str(target)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdin is not None and proc.stdout is not None
    try:
        assert proc.stdout.readline().strip() == "ready"
        source = AccessSource(HostPaths(), AccessConfig(), lambda: [proc.pid], host_mounts, time.time, paced=True)
        source.collect()  # the pass
        proc.stdin.write("go\n")
        proc.stdin.flush()
        deadline = time.monotonic() + 120
        while not _said(proc, done):
            assert time.monotonic() < deadline, f"the writer never said {done!r}"
            time.sleep(WATCH_SECONDS)
            source.collect()
        return source.collect().workloads[proc.pid]
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.realpart
def test_a_save_written_slower_than_the_trigger_between_looks_is_seen_open_and_counted_whole(tmp_path: Path) -> None:
    """A writer the device holds back passes less than WRITE_TRIGGER_BYTES to write calls between two looks, all
    through its save (8 MiB at 2.5 MiB/s: about 0.6 MiB a look): what it wrote adds up across looks into bursts that
    count every byte but the last look's, and the look that sees the trigger reached reads its open files while the
    save is open. The looks come as the agent makes them (paced: every WATCH_SECONDS between passes); the save
    begins after a pass and ends before the next (5 s apart at the default), so only the looks can see it."""
    target = tmp_path / "step-1.pt"
    w = _looked_at_between_passes(SLOW_WRITER, target, "closed")
    counted = sum(n for _, _, n in w.write_bursts)
    assert 7 << 20 <= counted <= 8 << 20, w.write_bursts
    assert [f.path for f in w.written] == [str(target)], w.written


WRITE_THEN_SYNC = textwrap.dedent(
    """
    import sys, time
    print("ready", flush=True)
    sys.stdin.readline()
    f = open(sys.argv[1], "wb", buffering=0)   # the save: its bytes in the page cache at once
    f.write(b"x" * (2 << 20))
    time.sleep(1.0)
    f.close()
    g = open(sys.argv[1], "rb")                # then opened again to sync it: nothing written meanwhile
    time.sleep(2.0)
    g.close()
    print("synced", flush=True)
    sys.stdin.readline()
    """
)


HOLD_THEN_CLOSE = textwrap.dedent(
    """
    import sys
    print("ready", flush=True)
    sys.stdin.readline()
    f = open(sys.argv[1], "wb", buffering=0)
    f.write(b"x" * (2 << 20))
    print("open", flush=True)
    sys.stdin.readline()
    f.close()
    print("closed", flush=True)
    sys.stdin.readline()
    """
)


def _stepped(script: str, target: Path) -> tuple[subprocess.Popen[str], Callable[[str], None]]:
    """``script`` started on ``target``, and a step: tell it to go on, and wait until it says ``word``."""
    proc = subprocess.Popen(
        [sys.executable, "-c", script, str(target)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )

    def step(word: str) -> None:
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write("go\n")
        proc.stdin.flush()
        assert proc.stdout.readline().strip() == word

    return proc, step


@pytest.mark.realpart
def test_the_looks_keep_their_pace_while_a_saves_file_is_open(tmp_path: Path) -> None:
    """While a file a GPU workload writes is open, the source says it keeps its pace (no budget stretches its looks:
    the close, and a sync opened at once after it, must be seen within WATCH_SECONDS); before and after, it does not."""
    target = tmp_path / "step-1.pt"
    proc, step = _stepped(HOLD_THEN_CLOSE, target)
    assert proc.stdout is not None

    try:
        assert proc.stdout.readline().strip() == "ready"
        source = AccessSource(HostPaths(), AccessConfig(), lambda: [proc.pid], host_mounts, time.time, paced=True)
        source.collect()
        assert not source.keeps_pace  # nothing written
        step("open")
        deadline = time.monotonic() + 60
        while not source.keeps_pace:  # a burst of 2 MiB: the next look reads its open files
            assert time.monotonic() < deadline, "the save's file was never seen open"
            time.sleep(WATCH_SECONDS)
            source.collect()
        step("closed")
        source.collect()  # the look that finds it closed
        assert not source.keeps_pace
        assert [f.closed_by is not None for f in source.collect().workloads[proc.pid].written] == [True]
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.realpart
def test_the_looks_slow_while_the_workloads_write_nothing_and_quicken_once_they_write(tmp_path: Path) -> None:
    """Between passes the source looks every IDLE_WATCH_SECONDS while its workloads' write counters stand still (a
    job computing between saves), every WATCH_SECONDS from the look that finds one moved or a file it writes open,
    and slows again once the counters have stood still for QUIET_SECONDS."""
    target = tmp_path / "step-1.pt"
    proc, step = _stepped(HOLD_THEN_CLOSE, target)
    assert proc.stdout is not None
    now = [1000.0]

    def look() -> AccessFacts:
        """A look when the agent would make it: the source's interval after the last, on its clock."""
        now[0] += source.interval_seconds
        return source.collect()

    try:
        assert proc.stdout.readline().strip() == "ready"
        source = AccessSource(HostPaths(), AccessConfig(), lambda: [proc.pid], host_mounts, lambda: now[0], paced=True)
        source.collect()  # the pass
        assert source.interval_seconds == IDLE_WATCH_SECONDS
        look()
        assert source.interval_seconds == IDLE_WATCH_SECONDS  # still nothing written
        step("open")
        look()  # the counter moved 2 MiB: this look reads its open files
        assert source.keeps_pace and source.interval_seconds == WATCH_SECONDS
        step("closed")
        look()  # finds the file closed; the counter moved (the word it printed)
        assert not source.keeps_pace and source.interval_seconds == WATCH_SECONDS
        moved = now[0]
        while now[0] + WATCH_SECONDS - moved <= QUIET_SECONDS:
            look()
            assert source.interval_seconds == WATCH_SECONDS, now[0] - moved
        look()
        assert now[0] - moved > QUIET_SECONDS and source.interval_seconds == IDLE_WATCH_SECONDS
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.realpart
def test_a_file_opened_again_after_its_close_is_seen_held_by_its_writer(tmp_path: Path) -> None:
    """``torch.save``, then the file opened again and fsynced: the save's end is the second descriptor's close,
    counted where the writer is seen holding the file then (analysis/writes.py). The sync writes nothing, so no
    write burst asks for a read of the writer's open files: the look that sees the first descriptor closed does.
    The save begins after a pass and ends before the next, so only the looks between passes can see it."""
    target = tmp_path / "step-1.pt"
    w = _looked_at_between_passes(WRITE_THEN_SYNC, target, "synced")
    (written,) = w.written
    assert written.path == str(target) and written.closed_by is not None, w.written
    assert [h.path for h in w.held] == [str(target)], w.held
    (held,) = w.held
    assert held.first_seen >= written.closed_by, (held, written)


CLOSE_THEN_REOPEN = textwrap.dedent(
    """
    import sys, time
    def step(word):
        print(word, flush=True)
        sys.stdin.readline()
    step("ready")
    f = open(sys.argv[1], "wb", buffering=0)
    f.write(b"x" * (2 << 20))
    step("written")
    f.close()
    step("closed")                             # descheduled between its close and the sync's open
    g = open(sys.argv[1], "rb")
    step("reopened")
    g.close()
    step("synced")
    """
)


@pytest.mark.realpart
def test_a_sync_opened_after_the_look_that_saw_the_close_is_still_seen_held(tmp_path: Path) -> None:
    """A look can fall between a save's close and the sync's open (a writer descheduled there on a busy node): the
    writer's open files are read again at the looks after the close, so the second descriptor is seen; before, that
    look was the only read the close asked for, and the sync, writing nothing, asked for none."""
    target = tmp_path / "step-1.pt"
    proc, step = _stepped(CLOSE_THEN_REOPEN, target)
    assert proc.stdout is not None

    now = [1000.0]

    def look() -> AccessFacts:
        """A look, WATCH_SECONDS after the last on the source's clock, whatever the machine's load made it."""
        now[0] += WATCH_SECONDS
        return source.collect()

    try:
        assert proc.stdout.readline().strip() == "ready"
        source = AccessSource(HostPaths(), AccessConfig(), lambda: [proc.pid], host_mounts, lambda: now[0], paced=True)
        source.collect()  # the pass: the next comes pass_seconds later, so only the looks below read anything
        step("written")
        look()  # a burst of 2 MiB: this look reads its open files
        assert source.keeps_pace, "the save's file was not seen open"
        step("closed")
        assert look().workloads[proc.pid].held == ()  # the look that sees it closed: nothing held yet
        step("reopened")
        look()  # a look within REOPEN_SECONDS of the close
        step("synced")
        w = look().workloads[proc.pid]
        assert now[0] - 1000.0 < source.pass_seconds  # no pass came: the looks alone saw it
        (written,) = w.written
        assert written.closed_by is not None, w.written
        assert [h.path for h in w.held] == [str(target)], w.held
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.realpart
def test_a_mount_table_longer_than_a_page_is_read_whole(real_mounts: Enter[Any], tmp_path: Path) -> None:
    """The kernel gives at most a page of ``/proc/PID/mountinfo``'s records to one read; a node's table is longer
    (a Kubernetes node has a mount per pod volume): a file written on a mount past the first page is still placed
    on its mount (it went to no mount at all while the table was read in one read)."""
    made = [
        real_mounts(tmpfs_mount(tmp_path / f"pod-volume-{i:03d}-{'x' * 40}", size="1m")).mountpoint for i in range(40)
    ]
    table = read_bounded("/proc/self/mountinfo", 4 << 20)
    assert len(table) > 8192 and all(str(m).encode() in table for m in made), len(table)
    last = made[-1]
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; f = open(sys.argv[1], 'wb'); print('open', flush=True); time.sleep(60)",
            str(last / "x"),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    try:
        assert proc.stdout.readline().strip() == "open"
        source = AccessSource(HostPaths(), AccessConfig(), lambda: [proc.pid], host_mounts, time.time)
        w = source.collect().workloads[proc.pid]
        assert str(last) in w.mounts_written, w
    finally:
        proc.kill()
        proc.wait()
