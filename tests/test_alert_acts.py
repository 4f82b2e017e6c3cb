"""An alert acts on what it names, in the real agent: an alert for this node whose ``run`` label names a run the agent
sees, posted to the agent's Alertmanager receiver as Alertmanager posts it, makes the shipped ``on: alert`` sync rule
(``alert-sync-checkpoint``) copy that run's newest complete checkpoint to the durable root, verified; a newer
checkpoint written while the alert fires is copied too (the rule repeats per checkpoint, not per hour). An alert that
names no run here copies nothing.

The node is Together-like (tests/fixtures/k8s-node: the root disk on NVMe, /home node-local by the preset), without
Kubernetes; the run is under /home. Alertmanager itself routing the shipped alerts is tests/test_alertmanager_route.py.
"""

from __future__ import annotations

import json
import shutil
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.agentproc import AgentProcess, running_agent, wait_until
from tests.builders import torch_like_zip

pytestmark = pytest.mark.realpart

FIXTURES = Path(__file__).parent / "fixtures"
NODE = "gpu-node-7"
TOKEN = "am-t0ken"
RUN = "alice/run1"


def _status(agent: AgentProcess) -> dict[str, Any] | None:
    resp = agent.fetch("/api/status")
    return json.loads(resp.body) if resp.status == 200 else None  # type: ignore[no-any-return]


def _post(agent: AgentProcess, *alerts: dict[str, Any]) -> dict[str, Any]:
    """A webhook post as Alertmanager makes it (version 4), with the bearer token."""
    body = {"version": "4", "status": "firing", "receiver": f"storwatch-{NODE}", "alerts": list(alerts)}
    request = urllib.request.Request(
        agent.url("/api/v1/alertmanager"),
        data=json.dumps(body).encode(),
        method="POST",
        headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=10) as resp:
        return json.loads(resp.read())  # type: ignore[no-any-return]


def _alert(fingerprint: str, **labels: str) -> dict[str, Any]:
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - 60))
    return {
        "status": "firing",
        "labels": {"alertname": "StorwatchRecoveryPointOverBudget", "node": NODE, "severity": "warning", **labels},
        "annotations": {"summary": "A training run would lose more than its recovery-point budget."},
        "startsAt": started,
        "endsAt": "0001-01-01T00:00:00Z",
        "fingerprint": fingerprint,
    }


def _copies(agent: AgentProcess) -> list[dict[str, Any]]:
    s = _status(agent) or {"policy": {}}
    return [j for j in s["policy"].get("syncs", []) if j["rule"] == "alert-sync-checkpoint"]


def _done(agent: AgentProcess, source: Path) -> dict[str, Any]:
    def finished() -> dict[str, Any] | None:
        jobs = [j for j in _copies(agent) if j["source"] == str(source)]
        return jobs[0] if jobs and jobs[0]["state"] in ("done", "failed") else None

    return wait_until(finished, timeout=60, interval=0.2, what=f"the copy of {source.name}")


def test_an_alert_naming_a_run_copies_its_newest_checkpoint_and_each_newer_one(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    (proc / "1").mkdir(parents=True)
    shutil.copy(FIXTURES / "k8s-node" / "proc" / "1" / "mountinfo", proc / "1" / "mountinfo")
    root = tmp_path / "root"
    run = root / "home" / RUN
    run.mkdir(parents=True)
    (root / "durable").mkdir()
    first = run / "step-100.pt"
    torch_like_zip(first, b"a" * 65536)
    token = tmp_path / "am-token"
    token.write_text(TOKEN + "\n")
    cfg = tmp_path / "storwatch.yaml"
    cfg.write_text(
        "platform: together-k8s\n"
        f"paths: {{procfs: {proc}, sysfs: {FIXTURES / 'gpu-node' / 'sys'}, rootfs: {root}}}\n"
        "mounts: {interval_seconds: 5, statvfs_timeout_seconds: 0.2}\n"
        "kube: {enabled: false}\ngpu: {enabled: false}\n"
        "checkpoints: {roots: [/home], interval_seconds: 0.5, settle_seconds: 0, deep_per_scan: 0}\n"
        "sync: {destinations: [/durable]}\n"
        f"alertmanager: {{enabled: true, token_file: {token}, node_name: {NODE}}}\n"
    )
    env = {"KUBECONFIG": None, "KUBERNETES_SERVICE_HOST": None}
    with running_agent("--config", str(cfg), "--listen", "127.0.0.1:0", env=env, timeout=60) as agent:

        def seen() -> dict[str, Any] | None:
            runs = [r for r in (_status(agent) or {}).get("checkpoints", []) if r["run"] == RUN]
            return runs[0] if runs and runs[0]["newest_complete"] else None

        assert wait_until(seen, timeout=60, interval=0.2, what="the run")["durability"] == "node"
        answer = _post(
            agent,
            _alert("a1b2", run=RUN, mountpoint="/", storwatch_action="sync"),
            _alert("c3d4", run="bob/elsewhere", storwatch_action="sync"),  # no such run here: nothing to copy
        )
        assert (answer["accepted"], answer["stored"]) == (2, 2), answer
        job = _done(agent, first)
        assert job["state"] == "done" and "verified" in job["detail"], job
        dest = Path(job["destination"])
        # sync.template's default {namespace}/{pod}/{run}/{checkpoint}: no pod off Kubernetes.
        assert dest == root / "durable" / "_" / "_" / "alice%2Frun1" / first.name, dest
        assert dest.read_bytes() == first.read_bytes()
        # A newer checkpoint while the alert fires: copied too, without waiting out any cooldown.
        second = run / "step-200.pt"
        torch_like_zip(second, b"b" * 65536)
        job = _done(agent, second)
        assert job["state"] == "done", job
        assert Path(job["destination"]).read_bytes() == second.read_bytes()
        # One copy per checkpoint, all of this run; the alert naming no run here started none.
        assert sorted(Path(j["source"]).name for j in _copies(agent)) == ["step-100.pt", "step-200.pt"]
        status = _status(agent)
        assert status is not None
        fired = [a for a in status["policy"]["active"] if a["rule"] == "alert-sync-checkpoint"]
        assert [(a["key"], a["state"], a["severity"]) for a in fired] == [("a1b2", "firing", "warning")], fired
