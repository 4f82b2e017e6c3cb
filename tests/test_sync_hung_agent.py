"""The sync action in the real agent with its destination on a FUSE mount that hangs (getattr never answered, as a
dead NFS server's): the copy waits in its helper process in the kernel, and the agent does not. Scrapes are
answered throughout, and SIGTERM ends the agent within 5 s (the issue's bound: the helper is killed, never waited
for)."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from tests.agentproc import running_agent, wait_until
from tests.builders import torch_like_zip
from tests.realmounts import fuse_mount, tmpfs_mount

pytestmark = pytest.mark.realpart


def test_a_hung_destination_leaves_scrapes_and_the_exit_alone(tmp_path: Path, real_mounts) -> None:  # type: ignore[no-untyped-def]
    scratch = real_mounts(tmpfs_mount(tmp_path / "scratch", size="32m"))
    run = Path(scratch.mountpoint) / "run1"
    run.mkdir()
    torch_like_zip(run / "step-10.pt", b"w" * (1 << 20))
    backing = tmp_path / "backing"
    backing.mkdir()
    hung = real_mounts(fuse_mount(tmp_path / "durable", backing=backing, block_getattr=True))
    site = tmp_path / "site.yaml"
    site.write_text(
        "rules:\n  - name: copy-off-tmpfs\n    on: run\n    when: ephemeral == true && complete > 0\n"
        "    severity: warning\n    actions: [{action: sync}]\n"
    )
    cfg = tmp_path / "storwatch.yaml"
    cfg.write_text(
        "tick_seconds: 0.2\nplatform: generic\nkube: {enabled: false}\ngpu: {enabled: false}\n"
        "mounts: {interval_seconds: 1, statvfs_timeout_seconds: 0.3}\n"
        f"checkpoints: {{roots: [{json.dumps(str(scratch.mountpoint))}], interval_seconds: 0.5, settle_seconds: 0}}\n"
        f"sync: {{destinations: [{json.dumps(str(hung.mountpoint))}], template: '{{run}}/{{checkpoint}}'}}\n"
        f"policy: {{default_set: false, files: [{json.dumps(str(site))}]}}\n"
    )
    with running_agent("--config", str(cfg), "--listen", "127.0.0.1:0", timeout=30) as agent:
        # The rule fires and its copy starts: the helper goes to the destination, and stays in the kernel there.
        def started() -> list[dict[str, Any]] | None:
            resp = agent.fetch("/api/status")
            data = json.loads(resp.body) if resp.status == 200 else {}
            acts = [a for a in (data.get("policy") or {}).get("actions", []) if a["action"] == "sync"]
            return acts or None

        wait_until(started, timeout=30, interval=0.2, what="the sync action to run")
        time.sleep(1.0)  # the helper has had time to reach the hung mount
        for _ in range(20):
            resp = agent.fetch("/metrics")
            assert resp.status == 200 and b"storwatch_sync_in_progress" in resp.body
        assert "storwatch_sync_in_progress 1.0" in agent.fetch("/metrics").body.decode()
        stopped = time.monotonic()
        agent.proc.send_signal(signal.SIGTERM)
        code = agent.proc.wait(timeout=30)
        took = time.monotonic() - stopped
    assert code == 0, code
    assert took < 5.0, f"the agent took {took:.1f} s to exit with a copy hung on its destination"
