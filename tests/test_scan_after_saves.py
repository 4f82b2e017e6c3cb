"""A save that ended brings the checkpoint scan forward: the real agent, its scans an hour apart, sees a checkpoint
saved after its first scan once the kernel's file events show the save closed (agent/collectors.py,
``ScanAfterSaves``), and no sooner than the scans' CPU share allows (``CheckpointSource.may_scan_soon``).

The agent runs in a mount namespace of its own whose table holds only "/" (tests/builders.py, ``own_mount_table``),
so the host's other mounts never reach it."""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from storwatch.agent.collectors import Collectors, ScanAfterSaves, given
from storwatch.paths import HostPaths
from storwatch.registry import SourceContext
from storwatch.sources.checkpoints import SAVE_SCAN_SECONDS, CheckpointSource
from tests.agentproc import AgentProcess, running_agent, wait_until
from tests.builders import own_mount_table, torch_like_zip


def _run(agent: AgentProcess, run_dir: Path) -> dict[str, Any] | None:
    data = json.loads(agent.fetch("/api/status").body)
    runs = [r for r in data.get("checkpoints") or () if r["directory"] == str(run_dir)]
    return runs[0] if runs else None


def _inotify_watches(agent: AgentProcess) -> int:
    """The inotify watches the agent's file events helper holds, as the kernel lists them (/proc/PID/fdinfo)."""
    count = 0
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            if ppid != agent.pid or b"_events_worker" not in cmdline:
                continue
            for fd in os.listdir(f"/proc/{pid}/fdinfo"):
                count += Path(f"/proc/{pid}/fdinfo/{fd}").read_text().count("inotify wd:")
        except (OSError, ValueError, IndexError):
            continue
    return count


def test_a_save_after_the_first_scan_is_seen_without_waiting_for_the_next(tmp_path: Path) -> None:
    root = tmp_path / "ckpt"
    run_dir = root / "alice-run"
    run_dir.mkdir(parents=True)
    torch_like_zip(run_dir / "step-1.pt")
    cfg = tmp_path / "storwatch.yaml"
    cfg.write_text(
        "gpu: {enabled: false}\nkube: {enabled: false}\n"
        # An hour between scans: only a save's end can bring one (the default is 30 s).
        f"checkpoints: {{roots: [{json.dumps(str(root))}], interval_seconds: 3600, default_roots: false, "
        "kubelet: false}\n"
    )
    prefix = own_mount_table(tmp_path / "table", [])
    with running_agent("--config", str(cfg), "--listen", "127.0.0.1:0", prefix=prefix, timeout=30) as agent:
        first = wait_until(lambda: _run(agent, run_dir), timeout=60, interval=0.5, what="the first scan's run")
        assert first["newest_complete"] == str(run_dir / "step-1.pt"), first
        # The root and the run directory watched (the file events source asks once the scan has named them).
        wait_until(lambda: _inotify_watches(agent) >= 2 or None, timeout=60, interval=0.2, what="the watches")
        torch_like_zip(run_dir / "step-2.pt")

        def newest() -> dict[str, Any] | None:
            run = _run(agent, run_dir)
            return run if run is not None and run["newest_complete"] == str(run_dir / "step-2.pt") else None

        seen = wait_until(newest, timeout=60, interval=0.5, what="the save after the first scan")
        assert seen["kept"] == 2, seen


def test_a_scan_for_a_save_keeps_to_the_scans_cpu_share() -> None:
    """Right after a scan began, none comes for a save before SAVE_SCAN_SECONDS; where scans cost more than the
    share over that, none before their cost says (a node with hundreds of runs keeps its pace)."""
    source = CheckpointSource([])
    try:
        assert source.may_scan_soon()  # none has begun
        source.collect()
        assert not source.may_scan_soon()
        source.began = time.monotonic() - SAVE_SCAN_SECONDS - 0.1
        assert source.may_scan_soon()
        source.budget.spent(0.5)  # a scan of 0.5 s of CPU at the default share (0.1 %): 120 s apart at most
        assert not source.may_scan_soon()
        source.began = time.monotonic() - source.settings.scan_max_interval_seconds - 0.1
        assert source.may_scan_soon()
    finally:
        source.close()


def test_a_first_walk_whose_checks_outlast_a_call_goes_on_and_is_never_stuck(
    tmp_path: Path, make_source: Callable[..., CheckpointSource]
) -> None:
    """A node's first walk of thousands of checkpoints checks each once: a call of the helper stops checking at its
    budget (``check_seconds``: ``max_seconds``, as the walk) and answers ``more``, keeping what it checked, so it is
    never taken for a walk stuck on a hung mount. Nothing partial is shown meanwhile; the next call goes on (an
    incomplete checkpoint is not checked again within the pass), and is brought forward as a save's scan is. Here
    the budget lets one check through per call: five candidates take five calls."""
    run = tmp_path / "run"
    run.mkdir()
    for i in range(3):
        torch_like_zip(run / f"step-{i}.pt")
    (run / "step-3.pt").write_bytes((run / "step-0.pt").read_bytes()[:100])  # cut short: incomplete
    (run / "step-4.pt").write_bytes(b"PK\x05\x06" + bytes(18))  # an empty ZIP: no format storwatch knows
    for i in range(5):
        os.utime(run / f"step-{i}.pt", (1000.0 + i, 1000.0 + i))
    source = make_source([str(tmp_path)], deep_per_scan=0)
    source.check_seconds = 0.0
    collectors = Collectors(
        [given(source)],
        SourceContext(HostPaths(), time.time, lambda _: None, lambda _: None),
        time.time,
        threading.Event(),
        lambda: None,
    )
    (state,) = collectors.states
    saves_scan = ScanAfterSaves(collectors)
    mores = 0
    end = time.monotonic() + 60.0  # a bound against a helper that never answers; never what is asserted
    while True:
        facts = source.collect()
        assert facts.failure is None and not facts.stuck_roots, facts.failure
        if facts.runs:
            break
        if source.more:
            mores += 1
            assert source.waiting == (str(tmp_path),) and source.more == (str(tmp_path),)
            state.soon.clear()
            saves_scan.reported()
            assert not state.soon.is_set()  # not before the scans' share allows
            source.began = time.monotonic() - SAVE_SCAN_SECONDS - 0.1
            saves_scan.reported()
            assert state.soon.is_set()  # the checks go on without waiting out the interval
        assert time.monotonic() < end, "the first walk never answered whole"
        time.sleep(0.05)
    assert mores == 4
    (whole,) = facts.runs
    assert [(os.path.basename(c.path), c.verdict) for c in whole.checkpoints] == [
        ("step-0.pt", "complete"),
        ("step-1.pt", "complete"),
        ("step-2.pt", "complete"),
        ("step-3.pt", "incomplete"),
        ("step-4.pt", "unknown"),
    ]
    assert source.more == () and source.waiting == ()
