"""Temporaries left by killed saves: reported by the running agent (metric, /status, /api/status) and by
``storwatch verify``, and removed by the run's next atomic_save.

The temporaries are made by real writers (``storwatch.training``'s atomic write in a process of its own, killed with
SIGKILL while it writes), then aged by a couple of minutes as the time until the job's next save would age them.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from storwatch import training
from tests.agentproc import REPO_ROOT, running_agent, wait_until
from tests.builders import torch_like_zip

pytestmark = pytest.mark.realpart

_WRITER = """
import os, sys
from storwatch import training

def write(f):
    f.write(b"w" * int(sys.argv[2]))
    f.flush()
    print("writing", flush=True)
    sys.stdin.readline()

training._atomic_write(sys.argv[1], write)
"""


def _killed_save(final: Path, size: int) -> None:
    writer = subprocess.Popen(
        [sys.executable, "-c", _WRITER, str(final), str(size)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
    )
    try:
        assert writer.stdout is not None and writer.stdout.readline().strip() == "writing"
        writer.send_signal(signal.SIGKILL)
    finally:
        writer.kill()
        writer.wait(10)


def _metric(text: str, line_start: str) -> float | None:
    for line in text.splitlines():
        if line.startswith(line_start):
            return float(line.rsplit(" ", 1)[1])
    return None


def test_orphaned_temporaries_are_reported_everywhere_and_removed_by_the_next_save(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch", reason="torch==2.13.0 is installed by make test")
    root = tmp_path / "ckpt"
    run = root / "run"
    run.mkdir(parents=True)
    torch_like_zip(run / "step-1.pt")
    for step, size in ((2, 3000), (3, 5000), (4, 7000)):
        _killed_save(run / f"step-{step}.pt", size)
    temps = sorted(p for p in run.iterdir() if training.is_temp_name(p.name))
    assert len(temps) == 3
    # One left sparse: it claims 5 TiB and takes what its 3000 written bytes take. Space is the point here.
    os.truncate(temps[0], 5 << 40)
    then = time.time() - 2 * training.TEMP_GRACE_SECONDS
    for t in temps:
        os.utime(t, (then, then))
    taken = sum(t.stat().st_blocks * 512 for t in temps)
    assert 15000 <= taken < 1 << 20

    # storwatch verify: the checkpoint's verdict as before, and a line naming the litter (exit status unchanged).
    out = subprocess.run(
        [sys.executable, "-m", "storwatch", "verify", str(run)], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert "ORPHANED" in out.stdout and f"3 temporaries of atomic_save, {taken} bytes" in out.stdout
    assert all(str(t) in out.stdout for t in temps)
    out = subprocess.run(
        [sys.executable, "-m", "storwatch", "verify", str(run / "step-1.pt"), "--json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0 and "ORPHANED" in out.stderr and "ORPHANED" not in out.stdout

    config = tmp_path / "storwatch.yaml"
    config.write_text(
        f"tick_seconds: 0.2\ncheckpoints:\n  roots: ['{root}']\n  kubelet: false\n  interval_seconds: 0.3\n"
    )
    with running_agent("--config", str(config), "--listen", "127.0.0.1:0") as agent:
        key = 'storwatch_checkpoint_orphaned_temp_bytes{run="run"}'
        wait_until(lambda: _metric(agent.fetch("/metrics").text(), key) == taken, 15, what=f"{taken} orphaned bytes")
        data = json.loads(agent.fetch("/api/status").text())
        (entry,) = [r for r in data["checkpoints"] if r["run"] == "run"]
        assert entry["orphaned_temps"] == 3 and entry["orphaned_temp_paths"] == [str(t) for t in temps]
        assert "3 orphaned temporaries" in agent.fetch("/status").text()
        collectors = {c["name"]: c for c in data["collectors"]}
        assert collectors["checkpoints"]["success"] is True  # litter is a finding, not a failure of the scan

        # The job's next save removes them; the agent's next scan sees them gone.
        training.atomic_save({"w": torch.zeros(8)}, str(run / "step-5.pt"), step=5)
        assert not [p for p in run.iterdir() if training.is_temp_name(p.name)]
        wait_until(lambda: _metric(agent.fetch("/metrics").text(), key) == 0.0, 15, what="no orphaned bytes left")


def test_a_save_in_progress_is_a_write_in_progress_and_no_orphan(tmp_path: Path) -> None:
    """A live writer's temporary (its lock held, just written) makes the run's write_in_progress, with when it was
    first seen; the same temporary once its writer is killed and it has aged is an orphan, not a write."""
    from storwatch.config import CheckpointsConfig
    from storwatch.sources.checkpoints import CheckpointSource

    run = tmp_path / "run"
    run.mkdir()
    torch_like_zip(run / "step-1.pt")
    old = time.time() - 3600
    os.utime(run / "step-1.pt", (old, old))
    writer = subprocess.Popen(
        [sys.executable, "-c", _WRITER, str(run / "step-2.pt"), "4096"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
    )
    clock = [time.time()]
    source = CheckpointSource([str(tmp_path)], CheckpointsConfig(deep_per_scan=0), clock=lambda: clock[0])
    try:
        assert writer.stdout is not None and writer.stdout.readline().strip() == "writing"
        (state,) = source.collect().runs
        assert state.write_in_progress and state.writing_since == clock[0] and state.orphaned_temps == 0
        assert state.writing_pids == (writer.pid,)  # the temporary's name carries its writer
        assert training.temp_writer_pid(".x.pt.tmp-12-" + "a" * 16) == 12
        assert training.temp_writer_pid(".x.pt.tmp-0-" + "a" * 16) is None
        assert training.temp_writer_pid("x.pt") is None
        first = clock[0]
        clock[0] += 5
        (state,) = source.collect().runs
        assert state.writing_since == first  # first seen, kept
        writer.send_signal(signal.SIGKILL)
        writer.wait(10)
        (temp,) = [p for p in run.iterdir() if training.is_temp_name(p.name)]
        os.utime(temp, (old, old))  # its writer is gone and it stopped changing an hour ago
        clock[0] = time.time()
        (state,) = source.collect().runs
        assert not state.write_in_progress and state.writing_since is None and state.orphaned_temps == 1
    finally:
        writer.kill()
        writer.wait(10)
        source.close()
