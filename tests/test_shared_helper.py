"""The agent's statvfs calls and checkpoint walks share one helper process (``registry.shared_helper``): the node pays
for one interpreter, about 10 MB resident, where it paid for two, and each source keeps its own bounds on it
(tests/test_blocking_pool.py holds those). Real parts: the real helper program, real statvfs of a real directory, a
real walk and check of a checkpoint file; the mount table is a fixture naming only that directory, so nothing here
depends on the host's other mounts."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from storwatch.agent import Agent
from storwatch.config import CheckpointsConfig, Config, MountsConfig
from storwatch.paths import HostPaths
from storwatch.registry import BY_NAME, SourceContext, shared_helper
from tests.builders import torch_like_zip


def _cmdline(pid: int) -> bytes:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return f.read()


def test_the_mount_and_checkpoint_sources_measure_through_one_helper(tmp_path: Path) -> None:
    data = tmp_path / "data"
    (data / "run").mkdir(parents=True)
    torch_like_zip(data / "run" / "step-100.pt")
    proc = tmp_path / "proc"
    (proc / "self").mkdir(parents=True)
    (proc / "self" / "mountinfo").write_text(f"36 25 0:32 / {data} rw,relatime shared:1 - ext4 /dev/sdz1 rw\n")
    ctx = SourceContext(
        HostPaths(procfs=str(proc)), lambda: 0.0, lambda key: None, lambda consumer: None, helper=shared_helper()
    )
    mounts = BY_NAME["mounts"].make(ctx, MountsConfig())
    checkpoints = BY_NAME["checkpoints"].make(
        ctx, CheckpointsConfig(roots=(str(data),), default_roots=False, kubelet=False)
    )
    try:
        (mount,) = mounts.collect()
        usage = os.statvfs(data)
        assert mount.mountpoint == str(data) and mount.usage is not None
        assert mount.usage.size_bytes == usage.f_blocks * usage.f_frsize
        facts = checkpoints.collect()
        assert facts.failure is None, facts.failure
        assert [c.path for run in facts.runs for c in run.checkpoints] == [str(data / "run" / "step-100.pt")]
        pid = mounts.calls.helper_pid
        assert pid is not None and checkpoints.calls.helper_pid == pid
        assert b"storwatch._checkpoint_worker" in _cmdline(pid)
    finally:
        mounts.close()
        checkpoints.close()
    assert mounts.calls.helper_pid is None  # stopped with the last source that used it


def test_the_agent_gives_both_sources_one_helper() -> None:
    agent = Agent(dataclasses.replace(Config(), listen="127.0.0.1:0", platform="generic"), process_metrics=False)
    try:
        mounts = agent._collectors.source("mounts")
        checkpoints = agent._collectors.source("checkpoints")
        assert mounts is not None and checkpoints is not None
        assert mounts.calls._helper is checkpoints.calls._helper
    finally:
        agent.stop()
