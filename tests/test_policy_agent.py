"""The policy in the real agent, on a Together-like Kubernetes node (tests/fixtures/k8s-node: the root disk on NVMe,
node-local; a PVC on NFS) with the official client against the test's API server (tests/kubeapi.py): the shipped
default set, with a site file loaded after it that shortens a rule's ``for`` and adds a webhook, fires "important
data only on ephemeral storage" for the run under /home and not for the run on the PVC, posts its Event, reaches an
HTTPS receiver with the documented payload, and a dry-run rule logs without posting. A policy that breaks on reload
keeps the last good one.
"""

from __future__ import annotations

import json
import shutil
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from tests.agentproc import running_agent, wait_until
from tests.builders import torch_like_zip
from tests.kubeapi import NODE, TRAINER_UID, fake_kube_api, k8s_node_objects
from tests.pki import have_openssl, make_ca, server_for_loopback
from tests.webhook_receiver import receiver

pytestmark = pytest.mark.realpart

FIXTURES = Path(__file__).parent / "fixtures"
PVC_MOUNT = (
    f"/var/lib/kubelet/pods/{TRAINER_UID}/volumes/kubernetes.io~csi/pvc-0a6f2e1d-3c4b-4a59-8e7f-112233445566/mount"
)
RULE = "important-data-only-on-ephemeral-storage"


def _status(agent: Any) -> dict[str, Any] | None:
    resp = agent.fetch("/api/status")
    return json.loads(resp.body) if resp.status == 200 else None  # type: ignore[no-any-return]


def test_the_default_policy_fires_for_the_home_run_and_acts(tmp_path: Path) -> None:
    if not have_openssl():
        pytest.skip("openssl is installed by scripts/system-deps")
    # The node: the fixture's mount table, and under --path.rootfs the two runs' directories.
    proc = tmp_path / "proc"
    (proc / "1").mkdir(parents=True)
    shutil.copy(FIXTURES / "k8s-node" / "proc" / "1" / "mountinfo", proc / "1" / "mountinfo")
    root = tmp_path / "root"
    home_run = root / "home" / "alice" / "run1"
    pvc_run = root / PVC_MOUNT.lstrip("/") / "run2"
    for run in (home_run, pvc_run):
        run.mkdir(parents=True)
        torch_like_zip(run / "step-100.pt")
    (tmp_path / "pki").mkdir()
    ca = make_ca(tmp_path / "pki", "hooks-ca")
    token = tmp_path / "hook-token"
    token.write_text("s3cret\n")
    site = tmp_path / "site.yaml"
    cfg = tmp_path / "storwatch.yaml"
    with fake_kube_api() as api, receiver(server_for_loopback(tmp_path / "pki", ca)) as hooks:
        for obj in k8s_node_objects():
            api.add(obj)
        site.write_text(
            "rules:\n"
            f"  - name: {RULE}\n"
            "    override: {for: replace, actions: append}\n"
            "    for: 2s\n"
            "    actions:\n"
            f"      - action: webhook\n        params: {{url: '{hooks.url}', ca_file: '{ca[0]}', "
            f"bearer_token_file: '{token}'}}\n"
            "  - name: dry-run-copy\n"
            "    on: finding\n"
            "    when: durable_age_seconds == null\n"
            "    severity: info\n"
            "    dry_run: true\n"
            "    actions: [{action: event, params: {reason: DryRunCopy}}]\n"
        )
        cfg.write_text(
            "tick_seconds: 0.2\nplatform: together-k8s\n"
            f"paths: {{procfs: {proc}, sysfs: {FIXTURES / 'gpu-node' / 'sys'}, rootfs: {root}}}\n"
            "mounts: {interval_seconds: 5, statvfs_timeout_seconds: 0.2}\n"
            "kube: {interval_seconds: 0.2}\ngpu: {enabled: false}\n"
            "checkpoints: {roots: [/home], interval_seconds: 0.5, settle_seconds: 0}\n"
            f"policy: {{files: [{json.dumps(str(site))}]}}\n"
        )
        env = {"KUBECONFIG": str(api.kubeconfig(tmp_path)), "NODE_NAME": NODE}
        with running_agent("--config", str(cfg), "--listen", "127.0.0.1:0", env=env, timeout=30) as agent:
            # Pending first (the override's 2 s), then firing, for the /home run only.
            def firing() -> dict[str, Any] | None:
                s = _status(agent)
                if s is None:
                    return None
                active = [a for a in s["policy"]["active"] if a["rule"] == RULE]
                return s if any(a["state"] == "firing" for a in active) else None

            status = wait_until(firing, timeout=60, interval=0.2, what=f"{RULE} firing")
            policy = status["policy"]
            assert policy["last_reload_success"] and policy["files"][-1] == str(site), policy
            fired = [a for a in policy["active"] if a["rule"] == RULE]
            findings = {f["id"]: f for f in status["findings"]}
            assert [findings[a["key"]]["run"] for a in fired] == ["alice/run1"], (fired, findings)
            assert not any("run2" in (f.get("run") or "") for f in status["findings"]), status["findings"]
            # Its Event, in the test's API server, about this Node
            posted = wait_until(
                lambda: (
                    [e for e in api.recorded if e.verb == "create" and "Important" in e.body.get("reason", "")] or None
                ),
                timeout=30,
                interval=0.2,
                what="the rule's Event",
            )
            assert posted[0].body["involvedObject"]["kind"] == "Node" and "alice/run1" in posted[0].body["message"]
            # The webhook, over HTTPS, with the documented payload and the bearer token
            got = wait_until(lambda: list(hooks.received) or None, timeout=30, interval=0.2, what="the webhook")
            body = json.loads(got[0].body)
            assert got[0].headers["Authorization"] == "Bearer s3cret"
            assert {body["rule"], body["transition"], body["entity"]["kind"], body["node"]} == {
                RULE,
                "firing",
                "finding",
                NODE,
            }, body
            assert body["entity"]["fields"]["run"] == "alice/run1" and body["version"] == 1, body
            # The dry run: counted and logged, never posted
            done = wait_until(
                lambda: (
                    [
                        a
                        for a in (_status(agent) or {"policy": {"actions": []}})["policy"]["actions"]
                        if a["rule"] == "dry-run-copy"
                    ]
                    or None
                ),
                timeout=30,
                interval=0.2,
                what="the dry run's record",
            )
            assert {a["outcome"] for a in done} == {"dry_run"}, done
            assert not [e for e in api.recorded if e.body.get("reason") == "DryRunCopy"], api.recorded
            # /status: what fires since when, and the last actions with their results
            page = agent.fetch("/status").body.decode()
            firing_rows = page.split('<table id="policy-active">')[1].split("</table>")[0]
            assert f"<td>{RULE}</td><td>warning</td><td>finding" in firing_rows and "firing" in firing_rows, firing_rows
            last = page.split('<table id="policy-actions">')[1].split("</table>")[0]
            assert "<td>event</td>" in last and "<td>webhook</td>" in last and "<td>dry_run</td>" in last, last
            metrics = agent.fetch("/metrics").body.decode()
            assert f'storwatch_policy_rule_firing{{rule="{RULE}",severity="warning"}} 1.0' in metrics
            assert f'storwatch_policy_actions_total{{action="event",result="ok",rule="{RULE}"}} 1.0' in metrics
            assert "storwatch_policy_last_reload_success 1.0" in metrics
            # A policy that breaks on reload: the last good one stays, and the failure shows
            site.write_text("rules:\n  - name: broken\n    on: run\n    when: 'gpus >'\n")
            agent.proc.send_signal(signal.SIGHUP)
            wait_until(
                lambda: "storwatch_policy_last_reload_success 0.0" in agent.fetch("/metrics").body.decode(),
                timeout=30,
                interval=0.2,
                what="the failed reload",
            )
            time.sleep(0.5)
            after = _status(agent)
            assert after is not None and any(a["rule"] == RULE for a in after["policy"]["active"])
            assert any(f"{site}:" in e for e in after["policy"]["reload_errors"]), after["policy"]["reload_errors"]
