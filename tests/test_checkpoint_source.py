"""The checkpoint source over time: runs, newest complete, ages and intervals under an injected clock, write timings
from the training side's event log, and the durability of the mount a run is on."""

from __future__ import annotations

import json
import os
import zipfile
from pathlib import Path

import pytest

from storwatch.analysis.view import build_view
from storwatch.classify import Classifier
from storwatch.exporter import Exporter
from storwatch.model import FsUsage, Mount, Platform, Snapshot
from storwatch.paths import HostPaths
from storwatch.sources.checkpoints import EVENT_LOG, CheckpointSource, default_roots


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def torch_like_zip(path: Path, payload: bytes = b"x" * 4096) -> None:
    """A file with the layout torch.save writes (a stored ZIP with archive/data.pkl), built without torch."""
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED) as z:
        z.writestr("archive/data.pkl", b"\x80\x02}q\x00.")
        z.writestr("archive/data/0", payload)
        z.writestr("archive/version", b"3\n")


def set_mtime(path: Path, t: float) -> None:
    os.utime(path, (t, t))


def test_runs_ages_and_intervals_are_exact(tmp_path: Path) -> None:
    run = tmp_path / "jobs" / "llama"
    run.mkdir(parents=True)
    t0 = 1_800_000_000.0
    for i, t in enumerate((t0, t0 + 600, t0 + 1200)):
        f = run / f"step-{i}.pt"
        torch_like_zip(f)
        set_mtime(f, t)
    clock = Clock(t0 + 1500)
    source = CheckpointSource([str(tmp_path)], clock=clock, deep_per_scan=0)
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


def test_truncated_and_in_progress_checkpoints(tmp_path: Path) -> None:
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
    source = CheckpointSource([str(tmp_path)], clock=Clock(2100.0), deep_per_scan=0)
    (state,) = source.collect().runs
    verdicts = {os.path.basename(c.path): c.verdict for c in state.checkpoints}
    assert verdicts["a.pt"] == "complete"
    assert verdicts["b.pt"] == "incomplete"  # no ZIP end record: a save cut short, not a damaged file
    assert state.newest_complete is not None and state.newest_complete.path == str(good)


def test_write_duration_from_the_event_log_and_from_watching(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    f = run / "step-1.pt"
    torch_like_zip(f)
    events = run / EVENT_LOG
    events.write_text(
        "not json\n" + json.dumps({"path": str(f), "start": 100.0, "end": 112.5, "bytes": 2500.0, "step": 1}) + "\n"
    )
    clock = Clock(200.0)
    source = CheckpointSource([str(tmp_path)], clock=clock, deep_per_scan=0)
    (state,) = source.collect().runs
    (ckpt,) = state.checkpoints
    assert ckpt.write_seconds == 12.5
    assert ckpt.write_bytes_per_second == 200.0

    # Without an event log: first seen incomplete at 300, first seen complete at 330.
    g = run / "step-2.pt"
    torch_like_zip(g)
    whole = g.read_bytes()
    g.write_bytes(whole[:100])
    clock.now = 300.0
    source.collect()
    g.write_bytes(whole)
    clock.now = 330.0
    (state,) = source.collect().runs
    second = next(c for c in state.checkpoints if c.path == str(g))
    assert second.verdict == "complete"
    assert second.write_seconds == 30.0


def test_deep_check_runs_at_a_low_rate_and_catches_a_flipped_byte(tmp_path: Path) -> None:
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
    source = CheckpointSource([str(tmp_path)], clock=Clock(5000.0), deep_per_scan=1)
    first = source.collect().runs[0]
    assert sum(c.deep_checked for c in first.checkpoints) == 1  # one deep check per scan, newest first
    assert next(c for c in first.checkpoints if c.deep_checked).path == str(files[2])
    source.collect()
    third = source.collect().runs[0]
    flipped = next(c for c in third.checkpoints if c.path == str(files[0]))
    assert flipped.deep_checked and flipped.verdict == "corrupt"
    assert "CRC" in flipped.reason
    assert third.corrupt == 1


def test_metrics_carry_the_durability_of_the_mount(tmp_path: Path) -> None:
    run = tmp_path / "scratch" / "run"
    run.mkdir(parents=True)
    f = run / "model.pt"
    torch_like_zip(f)
    set_mtime(f, 1234.0)
    facts = CheckpointSource([str(tmp_path)], clock=Clock(2000.0), deep_per_scan=0).collect()
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
    text = Exporter(process_metrics=False).render(view).decode()
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
def test_atomic_save_events_give_exact_write_timings(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch", reason="torch==2.13.0 is installed by make test")
    from storwatch.training import atomic_save

    run = tmp_path / "run"
    run.mkdir()
    atomic_save({"w": torch.zeros(1000)}, run / "step-7.pt", step=7)
    (state,) = CheckpointSource([str(tmp_path)], deep_per_scan=1).collect().runs
    (ckpt,) = state.checkpoints
    assert ckpt.verdict == "complete" and ckpt.deep_checked
    assert ckpt.write_seconds is not None and 0 <= ckpt.write_seconds < 5
    size = (run / "step-7.pt").stat().st_size
    if ckpt.write_seconds > 0:
        assert ckpt.write_bytes_per_second == pytest.approx(size / ckpt.write_seconds)
    else:  # the clock did not move during the write: no rate rather than a division by zero
        assert ckpt.write_bytes_per_second is None
