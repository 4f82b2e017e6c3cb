"""The checkpoint source over time: runs, newest complete, ages and intervals under an injected clock, write timings
from the training side's event log, the durability of the mount a run is on, a check that raises kept to its own
checkpoint, and orphaned temporaries. Every source here runs its real helper process (closed by the fixture)."""

from __future__ import annotations

import dataclasses
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from storwatch.analysis.build import build_view
from storwatch.checkpoints.record import RunId
from storwatch.classify import Classifier
from storwatch.exporter import Exporter
from storwatch.paths import HostPaths
from storwatch.registry import exporter_areas
from storwatch.report import view_to_dict
from storwatch.snapshot import Snapshot
from storwatch.sources.checkpoints import DEEP_AFTER_SECONDS, EVENT_LOG, CheckpointSource, default_roots
from storwatch.vocabulary import FsUsage, Mount, Platform
from storwatch.web import render_status_page
from tests.browser import TableParser
from tests.builders import torch_like_zip


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def set_mtime(path: Path, t: float) -> None:
    os.utime(path, (t, t))


def test_runs_ages_and_intervals_are_exact(tmp_path: Path, make_source: Callable[..., CheckpointSource]) -> None:
    run = tmp_path / "jobs" / "llama"
    run.mkdir(parents=True)
    t0 = 1_800_000_000.0
    for i, t in enumerate((t0, t0 + 600, t0 + 1200)):
        f = run / f"step-{i}.pt"
        torch_like_zip(f)
        set_mtime(f, t)
    clock = Clock(t0 + 1500)
    source = make_source([str(tmp_path)], clock=clock, deep_per_scan=0)
    facts = source.collect()
    (state,) = facts.runs
    assert state.path == str(run)
    assert [c.verdict for c in state.checkpoints] == ["complete"] * 3
    newest = state.newest_complete
    assert newest is not None and newest.path.endswith("step-2.pt")
    assert newest.mtime == t0 + 1200
    assert state.interval_seconds == 600.0
    assert len(state.complete) == 3 and state.incomplete == 0 and state.corrupt == 0
    # The View's ages come from its own timestamp: exact under the injected clock.
    snap = Snapshot(timestamp=clock(), checkpoints=facts)
    view = build_view(snap, Classifier("generic"), Platform("generic", "test"))
    from storwatch.report import view_to_dict

    (run_dict,) = view_to_dict(view)["checkpoints"]
    assert run_dict["newest_complete_age_seconds"] == 300.0
    assert run_dict["interval_seconds"] == 600.0
    assert run_dict["run"] == os.path.join("jobs", "llama")


def test_truncated_and_in_progress_checkpoints(tmp_path: Path, make_source: Callable[..., CheckpointSource]) -> None:
    run = tmp_path / "run"
    run.mkdir()
    good = run / "a.pt"
    torch_like_zip(good)
    set_mtime(good, 1000.0)
    partial = run / "b.pt"
    torch_like_zip(partial, b"y" * 65536)
    data = partial.read_bytes()
    partial.write_bytes(data[: len(data) // 2])  # a write cut off half-way: no central directory
    set_mtime(partial, 2000.0)
    source = make_source([str(tmp_path)], clock=Clock(2100.0), deep_per_scan=0)
    (state,) = source.collect().runs
    verdicts = {os.path.basename(c.path): c.verdict for c in state.checkpoints}
    assert verdicts["a.pt"] == "complete"
    assert verdicts["b.pt"] == "incomplete"  # no ZIP end record: a save cut short, not a damaged file
    assert state.newest_complete is not None and state.newest_complete.path == str(good)


def test_files_of_no_format_under_checkpoint_names_are_unknown_not_damage(
    tmp_path: Path, make_source: Callable[..., CheckpointSource]
) -> None:
    """The scan takes every ``.pt`` and ``.bin`` for a candidate by its name; a tokenised dataset (train.bin), zeros
    or a settled empty file under such a name is no checkpoint: unknown, not counted incomplete nor abandoned, and
    the run's newest complete checkpoint stands. An empty file changed within the settle window is a save that may
    have just begun: incomplete and being written until it settles."""
    import random

    run = tmp_path / "run"
    run.mkdir()
    good = run / "a.pt"
    torch_like_zip(good)
    set_mtime(good, 1000.0)
    for name, content, t in (
        ("train.bin", random.Random(5).randbytes(1 << 20), 1500.0),
        ("zeros.pt", bytes(1 << 20), 1600.0),
        ("empty.pt", b"", 1700.0),
    ):
        (run / name).write_bytes(content)
        set_mtime(run / name, t)
    clock = Clock(2100.0)
    source = make_source([str(tmp_path)], clock=clock, deep_per_scan=0, settle_seconds=60.0)

    def collect() -> tuple[Any, str]:
        facts = source.collect()
        view = build_view(
            Snapshot(timestamp=clock(), checkpoints=facts), Classifier("generic"), Platform("generic", "t")
        )
        return facts, Exporter(exporter_areas(), process_metrics=False).render(view).decode()

    facts, text = collect()
    (state,) = facts.runs
    verdicts = {os.path.basename(c.path): c.verdict for c in state.checkpoints}
    assert verdicts == {"a.pt": "complete", "train.bin": "unknown", "zeros.pt": "unknown", "empty.pt": "unknown"}
    assert "not a checkpoint format" in next(c.reason for c in state.checkpoints if c.path.endswith("train.bin"))
    assert (state.incomplete, state.corrupt, state.abandoned, state.write_in_progress) == (0, 0, 0, False)
    assert state.newest_complete is not None and state.newest_complete.path == str(good)
    assert (
        'storwatch_checkpoint_incomplete{run="run"} 0.0' in text
        and 'storwatch_checkpoint_corrupt{run="run"} 0.0' in text
    )

    starting = run / "b.pt"
    starting.write_bytes(b"")
    set_mtime(starting, 2095.0)  # torch.save has opened its file and written nothing yet
    facts, text = collect()
    (state,) = facts.runs
    (b,) = (c for c in state.checkpoints if c.path == str(starting))
    assert b.verdict == "incomplete" and state.write_in_progress and state.abandoned == 0, b
    assert 'storwatch_checkpoint_write_in_progress{run="run"} 1.0' in text

    clock.now = 2200.0  # nothing wrote it since: it settles into no checkpoint, not an abandoned save
    facts, text = collect()
    (state,) = facts.runs
    (b,) = (c for c in state.checkpoints if c.path == str(starting))
    assert b.verdict == "unknown" and not state.write_in_progress and state.abandoned == 0 and state.incomplete == 0
    assert 'storwatch_checkpoint_write_in_progress{run="run"} 0.0' in text


def test_write_spans_from_the_event_log_or_the_files_birth(
    tmp_path: Path, make_source: Callable[..., CheckpointSource]
) -> None:
    run = tmp_path / "run"
    run.mkdir()
    f = run / "step-1.pt"
    torch_like_zip(f)
    # The line's span must agree with the file's own times: written (mtime) within it, born when it began.
    born = f.stat().st_mtime
    os.utime(f, (born + 8.0, born + 8.0))  # its ctime is now (the utime): the span ends by then, give or take
    size = f.stat().st_size
    events = run / EVENT_LOG
    events.write_text(
        "not json\n"
        + json.dumps({"path": str(f), "start": born - 0.5, "end": born + 8.0, "bytes": size, "step": 1})
        + "\n"
    )
    clock = Clock(born + 100.0)
    source = make_source([str(tmp_path)], clock=clock, deep_per_scan=0)
    facts = source.collect()
    (state,) = facts.runs
    (ckpt,) = state.checkpoints
    assert ckpt.write_seconds == 8.5
    assert ckpt.write_bytes_per_second == size / 8.5
    assert facts.claims_rejected["malformed"] == 1  # "not json", counted once however often the log is read
    assert source.collect().claims_rejected["malformed"] == 1
    assert ckpt.write_timed_by == "event_log"

    # Without an event log: the kernel's birth time of the file, where the filesystem keeps one (ext4 and tmpfs do),
    # is the save's start, and only that: its newest mtime misses an fsync after the last write, so no duration is
    # made of it (the file events or the writer's open files end it: analysis/writes.py). Watching it go from
    # incomplete to complete times nothing either (a scan interval is no duration).
    from storwatch.checkpoints.birth import birth_time

    g = run / "step-2.pt"
    torch_like_zip(g)
    whole = g.read_bytes()
    g.write_bytes(whole[:100])
    clock.now = born + 300.0
    (state,) = source.collect().runs
    first = next(c for c in state.checkpoints if c.path == str(g))
    assert first.verdict == "incomplete" and first.write_seconds is None and first.write_untimed_reason
    g.write_bytes(whole)
    written = g.stat().st_mtime + 2.5
    os.utime(g, (written, written))  # the save went on 2.5 s after its file was made
    clock.now = born + 330.0
    (state,) = source.collect().runs
    second = next(c for c in state.checkpoints if c.path == str(g))
    assert second.verdict == "complete"
    birth = birth_time(str(g))
    assert second.write_seconds is None and second.write_timed_by is None and second.write_bytes_per_second is None
    if birth is None:  # a filesystem without birth times: not timed, and says why
        assert second.write_start is None and "no birth time" in (second.write_untimed_reason or "")
    else:  # its start, and why that is no duration
        assert second.write_start == birth and "only its birth time" in (second.write_untimed_reason or "")


def test_an_incomplete_checkpoint_is_written_while_it_changes_and_abandoned_once_it_stops(
    tmp_path: Path, make_source: Callable[..., CheckpointSource]
) -> None:
    """ "writing" only while something writes: a newest checkpoint cut short is being written while its mtime is
    within the settle window of the source's clock, abandoned once it has been unchanged for longer (the run that
    read "writing; 1 incomplete" eight minutes after its file was cut short), and written again when it changes."""
    run = tmp_path / "run"
    run.mkdir()
    good = run / "a.pt"
    torch_like_zip(good)
    set_mtime(good, 1000.0)
    partial = run / "b.pt"
    torch_like_zip(partial, b"y" * 65536)
    data = partial.read_bytes()
    partial.write_bytes(data[: len(data) // 2])  # cut off half-way: no central directory
    set_mtime(partial, 2000.0)
    clock = Clock(2010.0)
    source = make_source([str(tmp_path)], clock=clock, deep_per_scan=0, settle_seconds=60.0)

    def state_now() -> tuple[bool, bool, int, int, str]:
        facts = source.collect()
        (state,) = facts.runs
        view = build_view(
            Snapshot(timestamp=clock(), checkpoints=facts), Classifier("generic"), Platform("generic", "t")
        )
        page = render_status_page(view_to_dict(view))
        parser = TableParser("checkpoints")
        parser.feed(page)
        parser.close()
        (row,) = parser.body_rows
        (header,) = parser.head_rows
        shown = row[header.index("State")]
        return state.write_in_progress, state.writing_incomplete, state.incomplete, state.abandoned, shown

    writing, by_file, incomplete, abandoned, shown = state_now()
    assert (writing, by_file, incomplete, abandoned) == (True, True, 1, 0)
    assert shown.startswith("writing") and "abandoned" not in shown

    clock.now = 2000.0 + 8 * 60  # eight minutes on, the file unchanged: nothing writes it
    writing, by_file, incomplete, abandoned, shown = state_now()
    assert (writing, by_file, incomplete, abandoned) == (False, False, 1, 1)
    assert "writing" not in shown and "1 incomplete, abandoned" in shown

    partial.write_bytes(data[: len(data) * 3 // 4])  # the writer goes on
    set_mtime(partial, clock.now - 5.0)
    writing, by_file, incomplete, abandoned, _ = state_now()
    assert (writing, by_file, incomplete, abandoned) == (True, True, 1, 0)

    # A tenant's mtime a day ahead is no sign of a write going on: it would read "writing" for a day.
    set_mtime(partial, clock.now + 86400.0)
    writing, by_file, incomplete, abandoned, _ = state_now()
    assert (writing, by_file, incomplete, abandoned) == (False, False, 1, 1)

    # An incomplete checkpoint older than the newest complete one: nothing writes, one abandoned.
    set_mtime(partial, 500.0)
    writing, by_file, incomplete, abandoned, shown = state_now()
    assert (writing, by_file, incomplete, abandoned) == (False, False, 1, 1)
    assert "writing" not in shown


@pytest.mark.slow
def test_deep_check_runs_at_a_low_rate_and_catches_a_flipped_byte(
    tmp_path: Path, make_source: Callable[..., CheckpointSource]
) -> None:
    run = tmp_path / "run"
    run.mkdir()
    files = []
    for i in range(3):
        f = run / f"c{i}.pt"
        torch_like_zip(f, bytes(range(256)) * 16)
        set_mtime(f, 1000.0 + i)
        files.append(f)
    # Flip a byte inside the oldest one's tensor data: the cheap check cannot see it.
    raw = bytearray(files[0].read_bytes())
    at = raw.index(bytes(range(256)))
    raw[at + 10] ^= 0xFF
    files[0].write_bytes(bytes(raw))
    set_mtime(files[0], 1000.0)
    source = make_source([str(tmp_path)], clock=Clock(5000.0), deep_per_scan=1)
    first = source.collect().runs[0]
    assert sum(c.deep_checked for c in first.checkpoints) == 1  # one deep check per scan, newest first
    assert next(c for c in first.checkpoints if c.deep_checked).path == str(files[2])
    source.collect()
    third = source.collect().runs[0]
    flipped = next(c for c in third.checkpoints if c.path == str(files[0]))
    assert flipped.deep_checked and flipped.verdict == "corrupt"
    assert "CRC" in flipped.reason
    assert third.corrupt == 1


def test_no_deep_check_of_a_checkpoint_still_being_saved(
    tmp_path: Path, make_source: Callable[..., CheckpointSource]
) -> None:
    """A deep check holds the file for seconds: none begins on a checkpoint the file events say is still being saved
    (a file, or a file in a checkpoint's directory), nor on one written within DEEP_AFTER_SECONDS; each waits for a
    later scan."""
    run = tmp_path / "run"
    run.mkdir()
    single = run / "step-1.pt"
    torch_like_zip(single)
    set_mtime(single, 900.0)
    shards = run / "checkpoint-2"
    shards.mkdir()
    torch_like_zip(shards / "model.pt")
    (shards / "trainer_state.json").write_text('{"global_step": 2}')  # a Trainer's save: this file comes last
    for f in [*shards.iterdir(), shards]:
        set_mtime(f, 901.0)
    fresh = run / "step-3.pt"
    torch_like_zip(fresh)
    set_mtime(fresh, 1002.0)
    saving = {str(single), str(shards / "model.pt")}
    clock = Clock(1002.0 + DEEP_AFTER_SECONDS / 2)
    source = make_source([str(tmp_path)], clock=clock, deep_per_scan=3, saving=lambda: saving)

    def deep_checked() -> set[str]:
        end = time.monotonic() + 60.0  # a bound against a check that never answers; never what is asserted
        while True:
            (state,) = source.collect().runs
            if not source._deep_pending:
                return {os.path.basename(c.path) for c in state.checkpoints if c.deep_checked}
            assert time.monotonic() < end, source._deep_pending
            time.sleep(0.05)

    assert {os.path.basename(c.path): c.verdict for c in source.collect().runs[0].checkpoints} == {
        "step-1.pt": "complete",
        "checkpoint-2": "complete",
        "step-3.pt": "complete",
    }
    assert not source._deep_pending and deep_checked() == set()
    clock.now = 1002.0 + DEEP_AFTER_SECONDS
    assert deep_checked() == {"step-3.pt"}
    saving.clear()
    assert deep_checked() == {"step-1.pt", "checkpoint-2", "step-3.pt"}


def test_metrics_carry_the_durability_of_the_mount(
    tmp_path: Path, make_source: Callable[..., CheckpointSource]
) -> None:
    run = tmp_path / "scratch" / "run"
    run.mkdir(parents=True)
    f = run / "model.pt"
    torch_like_zip(f)
    set_mtime(f, 1234.0)
    facts = make_source([str(tmp_path)], clock=Clock(2000.0), deep_per_scan=0).collect()
    usage = FsUsage(1 << 30, 1 << 29, 1 << 29, 1000, 500)
    mounts = (
        Mount(1, "/", "/dev/nvme0n1p1", "ext4", "/", 259, 1, False, (), (), usage, False, 0.0),
        Mount(2, str(tmp_path / "scratch"), "tmpfs", "tmpfs", "/", 0, 50, False, (), (), usage, False, 0.0),
    )
    view = build_view(
        Snapshot(timestamp=2000.0, mounts=mounts, checkpoints=facts),
        Classifier("generic"),
        Platform("generic", "test"),
        paths=HostPaths(),
    )
    text = Exporter(exporter_areas(), process_metrics=False).render(view).decode()
    line = next(x for x in text.splitlines() if x.startswith("storwatch_checkpoint_last_complete_timestamp_seconds{"))
    assert 'durability="volatile"' in line and f'mountpoint="{tmp_path / "scratch"}"' in line
    assert line.endswith(" 1234.0")
    assert 'storwatch_checkpoint_kept{run="scratch/run"} 1.0' in text


def test_default_roots_add_the_kubelet_pod_volumes(tmp_path: Path) -> None:
    paths = HostPaths(rootfs=str(tmp_path))
    assert default_roots(paths, ["/data"], kubelet=True) == [str(tmp_path / "data")]
    (tmp_path / "var" / "lib" / "kubelet" / "pods").mkdir(parents=True)
    assert default_roots(paths, [], kubelet=True) == [str(tmp_path / "var/lib/kubelet/pods")]
    assert default_roots(paths, [], kubelet=False) == []


@pytest.mark.realpart
def test_atomic_save_events_give_exact_write_timings(
    tmp_path: Path, make_source: Callable[..., CheckpointSource]
) -> None:
    torch = pytest.importorskip("torch", reason="torch==2.13.0 is installed by make test")
    from storwatch.training import atomic_save

    run = tmp_path / "run"
    run.mkdir()
    before = time.time()
    atomic_save({"w": torch.zeros(1000)}, run / "step-7.pt", step=7)
    after = time.time()
    # Looked at once the checkpoint is old enough for its deep check (one just written waits for a later scan).
    source = make_source([str(tmp_path)], clock=Clock(after + DEEP_AFTER_SECONDS), deep_per_scan=1)
    (state,) = source.collect().runs
    (ckpt,) = state.checkpoints
    assert ckpt.verdict == "complete" and ckpt.deep_checked
    # The event log's span lies within the call that wrote it.
    assert ckpt.write_start is not None and ckpt.write_seconds is not None and ckpt.write_seconds >= 0
    assert before <= ckpt.write_start <= ckpt.write_start + ckpt.write_seconds <= after
    size = (run / "step-7.pt").stat().st_size
    if ckpt.write_seconds > 0:
        assert ckpt.write_bytes_per_second == pytest.approx(size / ckpt.write_seconds)
    else:  # the clock did not move during the write: no rate rather than a division by zero
        assert ckpt.write_bytes_per_second is None


def test_a_check_that_raises_fails_only_its_own_checkpoint(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The guard around check() in the helper (formats.check is built never to raise; the guard still holds if it
    does): the checkpoint becomes corrupt, or unknown when it is no known format, with the exception in the reason."""
    from storwatch import _checkpoint_worker as worker

    good, bad = tmp_path / "good.pt", tmp_path / "bad.pt"
    torch_like_zip(good)
    torch_like_zip(bad)
    real_check = worker.check

    def check(path: str, **kwargs: Any) -> Any:
        if path == str(bad):
            raise RecursionError("maximum recursion depth exceeded while decoding a JSON array")
        return real_check(path, **kwargs)

    monkeypatch.setattr(worker, "check", check)
    errors: dict[str, int] = {}
    assert worker.guarded_check(str(good), False, 0.0, 60.0, errors).verdict == "complete"
    result = worker.guarded_check(str(bad), False, 0.0, 60.0, errors, size=7, mtime=5.0)
    assert result.verdict == "corrupt" and result.format == "torch-zip"
    assert "RecursionError: maximum recursion depth" in result.reason
    assert (result.size_bytes, result.mtime) == (7, 5.0)
    monkeypatch.setattr(worker, "identify", lambda path: None)
    result = worker.guarded_check(str(bad), True, 0.0, 60.0, errors)
    assert result.verdict == "unknown" and result.deep is True
    assert errors == {"recursion_error": 2}
    assert worker.error_reason(OSError()) == "os_error" and worker.error_reason(UnicodeError()) == "value_error"
    assert worker.error_reason(MemoryError()) == "memory_error" and worker.error_reason(KeyError()) == "other"


@pytest.mark.slow
def test_poison_files_beside_a_healthy_run_never_stop_its_tracking(
    tmp_path: Path, make_source: Callable[..., CheckpointSource]
) -> None:
    """Issue 12: a safetensors header of 200,000 nested '[' raised RecursionError and a Megatron tracker holding
    '\u00b2' raised ValueError, each failing the whole collector; new checkpoints of healthy runs went unseen."""
    healthy = tmp_path / "healthy"
    healthy.mkdir()
    torch_like_zip(healthy / "step-1.pt")
    poison = tmp_path / "poison"
    poison.mkdir()
    header = b"[" * 200_000
    (poison / "model.safetensors").write_bytes(len(header).to_bytes(8, "little") + header)
    megatron = poison / "megatron"
    (megatron / "iter_0000100").mkdir(parents=True)
    (megatron / "latest_checkpointed_iteration.txt").write_text("\u00b2")
    source = make_source([str(tmp_path)], deep_per_scan=1)
    first = source.collect()
    assert first.failure is None
    runs = {os.path.basename(r.path): r for r in first.runs}
    assert [c.verdict for c in runs["healthy"].checkpoints] == ["complete"]
    poisoned = [c for r in first.runs if r.path.startswith(str(poison)) for c in r.checkpoints]
    assert poisoned and all(c.verdict != "complete" for c in poisoned), poisoned
    assert all(c.reason for c in poisoned)
    torch_like_zip(healthy / "step-2.pt")
    second = source.collect()
    (run,) = [r for r in second.runs if r.path == str(healthy)]
    assert len(run.complete) == 2 and second.failure is None
    assert set(second.check_errors) == {"os_error", "value_error", "recursion_error", "memory_error", "other"}


def _orphan(directory: Path, final: str, size: int, age: float) -> Path:
    """A temporary of atomic_save whose writer is gone (this version's name: its lock would be free)."""
    path = directory / f".{final}.tmp-4242-{os.urandom(8).hex()}"
    path.write_bytes(b"t" * size)
    then = time.time() - age
    os.utime(path, (then, then))
    return path


def test_orphaned_temporaries_are_reported_per_run(
    tmp_path: Path, make_source: Callable[..., CheckpointSource]
) -> None:
    from storwatch.report import view_to_dict
    from storwatch.training import TEMP_GRACE_SECONDS
    from storwatch.web import render_status_page

    run = tmp_path / "run"
    run.mkdir()
    torch_like_zip(run / "step-1.pt")
    old = [_orphan(run, "step-2.pt", 1000, 2 * TEMP_GRACE_SECONDS), _orphan(run, "step-3.pt", 500, 600)]
    _orphan(run, "step-4.pt", 99, 1)  # within the grace time: perhaps a writer on another node
    lonely = tmp_path / "lonely"  # a run whose every save was killed: no checkpoint, only litter
    lonely.mkdir()
    _orphan(lonely, "model.pt", 7, 3600)
    facts = make_source([str(tmp_path)], deep_per_scan=0).collect()
    runs = {os.path.basename(r.path): r for r in facts.runs}
    taken = sum(p.stat().st_blocks * 512 for p in old)  # the space they take, what removing them frees
    lonely_taken = next(lonely.iterdir()).stat().st_blocks * 512
    assert runs["run"].orphaned_temps == 2 and runs["run"].orphaned_temp_bytes == taken
    assert runs["run"].orphaned_temp_paths == tuple(sorted(str(p) for p in old))
    assert runs["lonely"].checkpoints == () and runs["lonely"].orphaned_temp_bytes == lonely_taken
    view = build_view(Snapshot(timestamp=time.time(), checkpoints=facts), Classifier("generic"), Platform("g", "t"))
    text = Exporter(exporter_areas(), process_metrics=False).render(view).decode()
    assert f'storwatch_checkpoint_orphaned_temp_bytes{{run="run"}} {float(taken)}' in text
    assert f'storwatch_checkpoint_orphaned_temp_bytes{{run="lonely"}} {float(lonely_taken)}' in text
    data = view_to_dict(view)
    entry = next(r for r in data["checkpoints"] if r["run"] == "run")
    assert entry["orphaned_temps"] == 2 and entry["orphaned_temp_bytes"] == taken
    page = render_status_page(data)
    assert "2 orphaned temporaries" in page


def test_a_stuck_unit_keeps_its_last_result_and_fails_the_collector(
    tmp_path: Path, make_source: Callable[..., CheckpointSource]
) -> None:
    """A mount below a root (from the mount table) is walked on its own; one whose statvfs is stuck is not walked at
    all, its last result is kept, and the collector names it; the root and the other units go on."""
    root = tmp_path / "pods"
    vol_a, vol_b = root / "a" / "vol", root / "b" / "vol"
    for vol in (vol_a, vol_b):
        vol.mkdir(parents=True)
        torch_like_zip(vol / "model.pt")
    torch_like_zip(root / "top.pt")
    stuck: list[str] = []
    source = make_source(
        [str(root)],
        deep_per_scan=0,
        mountpoints=lambda: [str(vol_a), str(vol_b), "/elsewhere"],
        stuck_paths=lambda: stuck,
    )
    first = source.collect()
    assert first.failure is None and first.stuck_roots == ()
    assert sorted(os.path.relpath(r.path, root) for r in first.runs) == [".", "a/vol", "b/vol"]
    assert all(r.root == str(root) for r in first.runs)  # labels stay relative to the configured root
    stuck.append(str(vol_b))
    torch_like_zip(vol_b / "model2.pt")  # not seen: its unit is not walked while stuck
    torch_like_zip(vol_a / "model2.pt")
    second = source.collect()
    runs = {os.path.relpath(r.path, root): r for r in second.runs}
    assert len(runs["a/vol"].checkpoints) == 2 and len(runs["b/vol"].checkpoints) == 1
    assert [s.path for s in second.stuck_roots] == [str(vol_b)]
    assert second.failure is not None and str(vol_b) in second.failure and "stuck" in second.failure
    view = build_view(Snapshot(timestamp=time.time(), checkpoints=second), Classifier("generic"), Platform("g", "t"))
    text = Exporter(exporter_areas(), process_metrics=False).render(view).decode()
    assert f'storwatch_checkpoint_root_stuck{{root="{vol_b}"}} 1.0' in text
    assert f'storwatch_checkpoint_root_stuck{{root="{root}"}} 0.0' in text


def test_the_limits_reach_the_checks_in_the_helper(
    tmp_path: Path, make_source: Callable[..., CheckpointSource]
) -> None:
    """checkpoints.deep_* (DeepLimits) travel with each request: a limit the file exceeds shows in its verdict."""
    header = json.dumps({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}).encode()
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "model.safetensors").write_bytes(len(header).to_bytes(8, "little") + header + bytes(8))
    (plain,) = make_source([str(tmp_path)], deep_per_scan=0).collect().runs
    assert plain.checkpoints[0].verdict == "complete"
    (limited,) = make_source([str(tmp_path)], deep_per_scan=0, deep_max_json_depth=2).collect().runs
    assert limited.checkpoints[0].verdict != "complete"
    assert "max_json_depth" in limited.checkpoints[0].reason, limited.checkpoints[0].reason


def test_two_roots_with_the_same_folder_names_stay_two_runs_through_the_whole_path(
    tmp_path: Path, make_source: Callable[..., CheckpointSource]
) -> None:
    """RunId (the root and the path) is the join key from the helper to the View: runs that share their path below
    two roots are two runs, with labels that differ, each joined with its own recovery figures, and /metrics carries
    no series twice."""
    from prometheus_client.parser import text_string_to_metric_families

    from storwatch.report import view_to_dict

    a, b = tmp_path / "a", tmp_path / "b"
    for root, age in ((a, 100.0), (b, 7200.0)):
        (root / "ckpts" / "plain").mkdir(parents=True)
        torch_like_zip(root / "ckpts" / "plain" / "step-1.pt")
        when = time.time() - age
        os.utime(root / "ckpts" / "plain" / "step-1.pt", (when, when))
    facts = make_source([str(a), str(b)], deep_per_scan=0).collect()
    assert sorted(r.id for r in facts.runs) == sorted(
        [RunId(str(a), str(a / "ckpts" / "plain")), RunId(str(b), str(b / "ckpts" / "plain"))]
    )
    view = build_view(Snapshot(timestamp=time.time(), checkpoints=facts), Classifier("generic"), Platform("g", "t"))
    labels = sorted(rv.label for rv in view.checkpoints)
    assert len(set(labels)) == 2 and labels == sorted([str(a / "ckpts" / "plain"), str(b / "ckpts" / "plain")])
    by_run = {r["path"]: r for r in view_to_dict(view)["checkpoints"]}
    assert by_run[str(a / "ckpts" / "plain")]["newest_complete_age_seconds"] < 1000
    assert by_run[str(b / "ckpts" / "plain")]["newest_complete_age_seconds"] > 7000
    text = Exporter(exporter_areas(), process_metrics=False).render(view).decode()
    seen: set[tuple[str, frozenset[tuple[str, str]]]] = set()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            key = (sample.name, frozenset(sample.labels.items()))
            assert key not in seen, key
            seen.add(key)
    assert sum(1 for name, _ in seen if name == "storwatch_checkpoint_size_bytes") == 2
    # one label for the one run of a name: its path below its root
    (alone,) = make_source([str(a)], deep_per_scan=0).collect().runs
    (view_a,) = build_view(
        Snapshot(timestamp=time.time(), checkpoints=make_source([str(a)], deep_per_scan=0).collect()),
        Classifier("generic"),
        Platform("g", "t"),
    ).checkpoints
    assert alone.id.below_root == "ckpts/plain" and view_a.label == "ckpts/plain"


def test_a_rescan_sends_only_the_runs_that_changed(
    tmp_path: Path, make_source: Callable[..., CheckpointSource]
) -> None:
    """The helper answers a rescan with the runs that changed since the answer the source holds, and the paths of
    those gone; the source's runs are then what a whole answer gives (compared with a new source's), and an
    unchanged run keeps its state (the same object, so what the View works out per run is kept). An answer number
    the helper did not give last gets a whole answer."""
    for name in ("a", "b", "c"):
        (tmp_path / name).mkdir()
        torch_like_zip(tmp_path / name / "step-1.pt")
        set_mtime(tmp_path / name / "step-1.pt", 1000.0)
    clock = Clock(5000.0)
    source = make_source([str(tmp_path)], clock=clock, deep_per_scan=0)
    answers: list[dict[str, Any]] = []
    call_many = source.calls.call_many

    def spy(op: str, requests: Any, *args: Any, **kwargs: Any) -> Any:
        outcomes = call_many(op, requests, *args, **kwargs)
        answers.extend(json.loads(o.text) for o in outcomes.values() if op == "ckpt_scan" and o.text is not None)
        return outcomes

    source.calls.call_many = spy  # type: ignore[method-assign]

    def sent() -> tuple[bool, list[str], list[str]]:
        last = answers[-1]
        return bool(last["base"]), [os.path.basename(r["path"]) for r in last["runs"]], last["gone"]

    first = source.collect()
    assert sent() == (False, ["a", "b", "c"], [])
    second = source.collect()
    assert sent() == (True, [], [])
    assert all(x is y for x, y in zip(first.runs, second.runs, strict=True))

    torch_like_zip(tmp_path / "b" / "step-2.pt")
    set_mtime(tmp_path / "b" / "step-2.pt", 2000.0)
    for f in (tmp_path / "c").iterdir():
        f.unlink()
    (tmp_path / "c").rmdir()
    third = source.collect()
    assert sent() == (True, ["b"], [str(tmp_path / "c")])
    assert [os.path.basename(r.path) for r in third.runs] == ["a", "b"]
    assert third.runs[0] is first.runs[0]
    assert [c.mtime for c in third.runs[1].checkpoints] == [1000.0, 2000.0]
    assert third.runs == make_source([str(tmp_path)], clock=clock, deep_per_scan=0).collect().runs

    (unit,) = source._units
    source._units[unit] = dataclasses.replace(source._units[unit], seq=source._units[unit].seq + 1)
    fourth = source.collect()
    assert sent() == (False, ["a", "b"], [])
    assert fourth.runs == third.runs


def test_each_run_carries_its_directory_owner_as_the_kernel_reports_it(
    tmp_path: Path, make_source: Callable[..., CheckpointSource]
) -> None:
    """Whose run it is (the actions' budgets are kept per owner) is the uid the kernel reports for the run's
    directory, seen again at every scan: a chown shows in the next one."""
    if os.geteuid() != 0:
        pytest.skip("chown to other users needs root")
    for name, uid in (("a", 1001), ("b", 1002)):
        (tmp_path / name).mkdir()
        torch_like_zip(tmp_path / name / "step-1.pt")
        os.chown(tmp_path / name, uid, uid)
    source = make_source([str(tmp_path)], clock=Clock(5000.0), deep_per_scan=0)
    assert [(os.path.basename(r.path), r.uid) for r in source.collect().runs] == [("a", 1001), ("b", 1002)]
    os.chown(tmp_path / "b", 1003, 1003)
    assert [(os.path.basename(r.path), r.uid) for r in source.collect().runs] == [("a", 1001), ("b", 1003)]


def test_scans_that_cost_more_than_their_share_come_less_often(
    tmp_path: Path, make_source: Callable[..., CheckpointSource]
) -> None:
    """A scan's cost (the helper's CPU for it, which its answer carries, and the source's own) sets how often scans
    come: within scan_cpu_share they keep interval_seconds; over it (here a share no scan fits in) they stretch to
    scan_max_interval_seconds. A reload measures again."""
    torch_like_zip(tmp_path / "step-1.pt")
    answers: list[dict[str, Any]] = []
    source = make_source(
        [str(tmp_path)], deep_per_scan=0, interval_seconds=30.0, scan_cpu_share=1e-9, scan_max_interval_seconds=600.0
    )
    call_many = source.calls.call_many

    def spy(op: str, requests: Any, *args: Any, **kwargs: Any) -> Any:
        outcomes = call_many(op, requests, *args, **kwargs)
        answers.extend(json.loads(o.text) for o in outcomes.values() if o.text is not None)
        return outcomes

    source.calls.call_many = spy  # type: ignore[method-assign]
    assert source.interval_seconds == 30.0  # nothing measured yet
    source.collect()
    assert source.interval_seconds == 30.0  # a first walk is start-up, not what a scan costs
    source.collect()
    assert answers and answers[-1]["cpu_seconds"] > 0
    assert source.interval_seconds == 600.0
    source.configure(dataclasses.replace(source.settings, scan_cpu_share=1.0))
    assert source.interval_seconds == 30.0
    source.collect()
    assert source.interval_seconds == 30.0  # a whole core: every scan fits
