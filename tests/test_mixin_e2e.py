"""End to end with the real servers on loopback: two real agents, Debian's ``prometheus`` loaded with the rules of
alerts/ scraping them every second, and Debian's ``prometheus-alertmanager`` routing one node's alerts to that node's
agent, whose ``on: alert`` policy rule runs its action. Then every PromQL expression of alerts/ and dashboards/ is
evaluated against that Prometheus and must return data.

The layout makes every alert hold:

- node ``gpu-node-1``: the fake NVML library, driven by a CPU torch training loop (tests/training_loop.py) that
  checkpoints with atomic_save onto a tmpfs (important data only on ephemeral storage, a live run whose recovery
  point is +Inf, GPU time stalled in checkpoint writes); beside it on that tmpfs a truncated checkpoint (incomplete),
  a ZIP without a pickle (corrupt) and a pickle that runs code (unsafe); a 1 MiB tmpfs holding a 600 KiB checkpoint
  (the next will not fit); a FUSE mount whose statfs hangs (stuck); a kubeconfig naming a closed port (the kube
  collector fails).
- node ``gpu-node-2``: NVML answers "driver not loaded" (NVML down), the test's Kubernetes API shows the node with a
  cluster-autoscaler removal taint (draining) while a tmpfs holds its checkpoints: Alertmanager posts
  StorwatchNodeDrainingWithEphemeralCheckpoints to its receiver, and its rule's ``log`` action runs; a rule on one of
  its two runs copies its newest checkpoint to a durable root while the node drains (``sync``), verified (the other
  run's checkpoints stay only on the tmpfs, which keeps the alert firing).
- node ``gpu-node-3``: a target on a closed port (an agent down).

Prometheus loads a variant of the checked-in rules: every ``for`` 1s, and the stall-share threshold 0, as a minute of
data cannot show a share of a ten-minute window over 20 %; the test asserts the expressions are otherwise the
checked-in ones. Only StorwatchAgentAbsent cannot hold while agents are up: its argument is evaluated instead. A few
dashboard queries need what no node here has (:data:`NEEDS_WHAT_IS_NOT_HERE`, each with why).

A second test scrapes a healthy node (no finding, no stall, no drain, nothing copied or failed): every panel has data,
and the figures the agent counts from nothing read 0 there, not "No data" (:data:`ZERO_ON_A_HEALTHY_NODE`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import subprocess
import sys
import time
import urllib.parse
import urllib.request
import zipfile
from collections.abc import Callable
from contextlib import AbstractContextManager as ContextManager
from pathlib import Path
from typing import Any, TypeVar

import pytest

from mixin.rules import rule_groups as make_rule_groups
from mixin.rules import rules_file
from mixin.thresholds import THRESHOLDS
from tests.agentproc import AgentProcess, running_agent, wait_until
from tests.builders import own_mount_table, torch_like_zip
from tests.hostile import payload, torch_zip
from tests.kubeapi import fake_kube_api, write_kubeconfig
from tests.mixin_exprs import Expression, dashboard_expressions, rule_expressions, rule_groups
from tests.nvml import FakeNVMLUnavailable, build_fake_nvml
from tests.promtools import binary, free_port, get_json, prometheus_config, server
from tests.realmounts import fuse_mount, tmpfs_mount

pytestmark = pytest.mark.realpart

T = TypeVar("T")
Enter = Callable[[ContextManager[T]], T]
REPO_ROOT = Path(__file__).resolve().parents[1]
TOKEN = "am-to-storwatch-e2e-0123456789"
DRAIN_ALERT = "StorwatchNodeDrainingWithEphemeralCheckpoints"
VARIANT = dataclasses.replace(THRESHOLDS.with_every_for("1s"), stall_share=0.0)
NOT_HOLDING = {"StorwatchAgentAbsent": 'up{job="storwatch"} == 1'}
"""Alerts that cannot hold while agents are up, and the expression evaluated in their place (their argument)."""
NO_NFS = "no NFS server runs on the test machine (tests/test_mountstats.py and the golden scrape hold the counters)"
NEEDS_WHAT_IS_NOT_HERE = {
    "storwatch-node.json: NFS operations": NO_NFS,
    "storwatch-node.json: NFS round trip per operation": NO_NFS,
    "storwatch-node.json: NFS errors, timeouts and retransmissions": NO_NFS,
    "storwatch-node.json: Time left for pods being deleted": "no pod is being deleted (tests/test_sync_drain.py does)",
    "storwatch-node.json: Disk time per operation": "a device that did no read (or write) in the window has no time "
    "per operation: a gap, not 0",
    "storwatch-node.json: Workload average call size": "likewise for a workload that made no read (or write) call",
}
"""Dashboard panels (file: title) whose queries may return nothing on the nodes of these tests, and why."""


def node_a_layout(tmp_path: Path, real_mounts: Enter[Any]) -> tuple[Path, Path, Path]:
    ram = real_mounts(tmpfs_mount(tmp_path / "ram", size="96m")).mountpoint
    tiny = real_mounts(tmpfs_mount(tmp_path / "tiny", size="1m")).mountpoint
    hung = real_mounts(fuse_mount(tmp_path / "hung", block_statfs=True)).mountpoint
    (ram / "llama" / "run1").mkdir(parents=True)
    broken = ram / "broken" / "run" / "step-100.pt"
    broken.parent.mkdir(parents=True)
    torch_like_zip(broken)
    broken.write_bytes(broken.read_bytes()[:-10])  # the end of the central directory cut off: a save cut short
    corrupt = ram / "bad" / "run" / "step-100.pt"
    corrupt.parent.mkdir(parents=True)
    with zipfile.ZipFile(corrupt, "w") as z:
        z.writestr("readme.txt", b"not a checkpoint")
    torch_zip(ram / "evil" / "run" / "step-100.pt", payload(tmp_path / "never-made"))
    full = tiny / "full" / "run" / "step-100.pt"
    full.parent.mkdir(parents=True)
    torch_like_zip(full, payload=b"x" * 600_000)
    old = time.time() - 600
    for path in (broken, corrupt, full):
        os.utime(path, (old, old))
    return ram, tiny, hung


def alertmanager_config(path: Path, agent_port: int, token_file: Path) -> Path:
    path.write_text(
        f"""\
route:
  receiver: people
  group_wait: 100ms
  group_interval: 1s
  repeat_interval: 1h
  routes:
    - matchers: ['node="gpu-node-2"']
      receiver: storwatch-gpu-node-2
      group_by: [alertname, node]
receivers:
  - name: people
  - name: storwatch-gpu-node-2
    webhook_configs:
      - url: http://127.0.0.1:{agent_port}/api/v1/alertmanager
        send_resolved: true
        http_config:
          authorization:
            type: Bearer
            credentials_file: {token_file}
"""
    )
    return path


def panel_of(expr: Expression) -> str:
    """ "FILE: TITLE" of a dashboard panel's query (its where without the ref)."""
    return re.sub(r" \([A-Z]\)$", "", expr.where)


def query(prom: str, promql: str) -> list[dict[str, Any]]:
    url = f"{prom}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
    data = get_json(url)
    assert data["status"] == "success", (promql, data)
    result = data["data"]["result"]
    return result if isinstance(result, list) else [result]


def test_metric_to_alert_to_alertmanager_to_agent_action(real_mounts: Enter[Any], tmp_path: Path) -> None:
    prometheus = binary("prometheus")
    alertmanager = binary("prometheus-alertmanager", "alertmanager")
    pytest.importorskip("torch", reason="torch==2.13.0 is installed by make test")
    try:
        lib = build_fake_nvml(tmp_path / "nvml")
    except FakeNVMLUnavailable as err:
        pytest.skip(str(err))
    # The variant Prometheus loads differs from the checked-in rules only where the test says (its descriptions
    # quote the shorter fors).
    variant, shipped = make_rule_groups(VARIANT), rule_groups()

    def same(rule: dict[str, Any]) -> dict[str, Any]:
        return {k: x for k, x in rule.items() if k not in ("for", "annotations")}

    for v_group, s_group in zip(variant, shipped, strict=True):
        for v, s in zip(v_group["rules"], s_group["rules"], strict=True):
            assert same(v) == same(s) or (v["alert"] == "StorwatchGPUStallShareHigh" and v["expr"].endswith("> 0")), v
    rules = tmp_path / "rules.yaml"
    rules.write_text(rules_file(VARIANT))

    ram, tiny, hung = node_a_layout(tmp_path, real_mounts)
    ramb = real_mounts(tmpfs_mount(tmp_path / "ramb", size="8m")).mountpoint
    for name in ("job", "kept"):  # job's run is copied while the node drains; kept's stays only there (the alert)
        (ramb / name / "run").mkdir(parents=True)
        for step in (100, 200):
            torch_like_zip(ramb / name / "run" / f"step-{step}.pt")

    script_a = tmp_path / "nvml-a.txt"
    script_a.write_text("gpu 0 uuid=GPU-e2e-0000 name=Fake_Trainer util=0 mem_used=0 mem_total=85899345920\n")
    script_b = tmp_path / "nvml-b.txt"
    script_b.write_text("init error=9\n")  # NVML_ERROR_DRIVER_NOT_LOADED
    token_file = tmp_path / "am-token"
    token_file.write_text(TOKEN + "\n")
    policy_b = tmp_path / "policy-b.yaml"
    policy_b.write_text(
        "rules:\n  - name: drain-alert-seen\n    on: alert\n"
        f"    when: alertname == '{DRAIN_ALERT}' && status == 'firing'\n"
        "    severity: critical\n    message: '{alertname} for this node: {annotations}'\n"
        "    actions: [{action: log}]\n"
        "  - name: drain-copy\n    on: run\n"
        "    when: node_draining == true && ephemeral == true && complete > 0 && run == 'job/run'\n"
        "    severity: critical\n    message: 'copying {run} while the node drains'\n"
        "    actions: [{action: sync}]\n"
    )
    durable_b = tmp_path / "durable-b"
    durable_b.mkdir()
    cfg_a, cfg_b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    cfg_a.write_text(
        "tick_seconds: 0.2\nplatform: generic\n"
        "mounts: {interval_seconds: 1, statvfs_timeout_seconds: 0.2}\n"
        "kube: {interval_seconds: 0.5}\n"
        "gpu: {interval_seconds: 0.1, samples_interval_seconds: 0}\n"
        f"probes: {{mountpoints: [{json.dumps(str(ram))}], interval_seconds: 1}}\n"
        f"checkpoints: {{roots: [{json.dumps(str(ram))}, {json.dumps(str(tiny))}], interval_seconds: 0.5, "
        "kubelet: false, deep_per_scan: 0, settle_seconds: 0}\n"
    )
    cfg_b.write_text(
        "tick_seconds: 0.2\nplatform: generic\n"
        "mounts: {interval_seconds: 1}\nkube: {interval_seconds: 0.5}\n"
        f"checkpoints: {{roots: [{json.dumps(str(ramb))}], interval_seconds: 0.5, kubelet: false, "
        "deep_per_scan: 0, settle_seconds: 0}\n"
        f"alertmanager: {{enabled: true, token_file: {json.dumps(str(token_file))}}}\n"
        f"policy: {{default_set: false, files: [{json.dumps(str(policy_b))}]}}\n"
        f"sync: {{destinations: [{json.dumps(str(durable_b))}]}}\n"
    )
    dead_kube = write_kubeconfig(tmp_path / "dead-kubeconfig", f"http://127.0.0.1:{free_port()}")
    env_a = {
        "LD_LIBRARY_PATH": str(lib.parent),
        "FAKE_NVML_SCRIPT": str(script_a),
        "KUBECONFIG": str(dead_kube),
        "NODE_NAME": "gpu-node-1",
    }
    prefix_a = own_mount_table(tmp_path / "table-a", [ram, tiny, hung])
    prefix_b = own_mount_table(tmp_path / "table-b", [ramb])
    am_port, prom_port = free_port(), free_port()
    prom = f"http://127.0.0.1:{prom_port}"
    with contextlib.ExitStack() as stack:
        api = stack.enter_context(fake_kube_api())
        api.add(
            {
                "kind": "Node",
                "metadata": {"name": "gpu-node-2"},
                "spec": {
                    "unschedulable": True,
                    "taints": [{"key": "ToBeDeletedByClusterAutoscaler", "value": "1", "effect": "NoSchedule"}],
                },
            }
        )
        env_b = {
            "LD_LIBRARY_PATH": str(lib.parent),
            "FAKE_NVML_SCRIPT": str(script_b),
            "KUBECONFIG": str(api.kubeconfig(tmp_path)),
            "NODE_NAME": "gpu-node-2",
        }
        a = stack.enter_context(
            running_agent("--config", str(cfg_a), "--listen", "127.0.0.1:0", env=env_a, timeout=30, prefix=prefix_a)
        )
        b = stack.enter_context(
            running_agent("--config", str(cfg_b), "--listen", "127.0.0.1:0", env=env_b, timeout=30, prefix=prefix_b)
        )
        stack.enter_context(
            server(
                [
                    alertmanager,
                    f"--config.file={alertmanager_config(tmp_path / 'am.yml', b.port, token_file)}",
                    f"--storage.path={tmp_path / 'am-data'}",
                    f"--web.listen-address=127.0.0.1:{am_port}",
                    "--cluster.listen-address=",
                ],
                tmp_path / "alertmanager.log",
                f"http://127.0.0.1:{am_port}/-/ready",
            )
        )
        targets = {"gpu-node-1": a.port, "gpu-node-2": b.port, "gpu-node-3": free_port()}
        stack.enter_context(
            server(
                [
                    prometheus,
                    f"--config.file={prometheus_config(tmp_path / 'prometheus.yml', rules, am_port, targets)}",
                    f"--storage.tsdb.path={tmp_path / 'prom-data'}",
                    f"--web.listen-address=127.0.0.1:{prom_port}",
                ],
                tmp_path / "prometheus.log",
                f"{prom}/-/ready",
            )
        )
        loop = subprocess.Popen(  # the job: on gpu-node-1's only GPU, writing onto its tmpfs
            [sys.executable, "-m", "tests.training_loop", str(ram / "llama" / "run1"), str(script_a),
             str(tmp_path / "loop.json"), "--saves", "500", "--compute", "0.8", "--mib", "1", "--keep", "8",
             "--fsync-seconds", "0.5"],
            cwd=REPO_ROOT,
            stdout=subprocess.DEVNULL,
            stderr=stack.enter_context((tmp_path / "loop.log").open("w")),
            env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        )  # fmt: skip
        stack.callback(lambda: loop.kill() if loop.poll() is None else None)

        def logs() -> str:
            return "\n".join(
                [f"-- {p.name}:\n{p.read_text(errors='replace')[-3000:]}" for p in (tmp_path / "alertmanager.log",)]
                + [f"-- agent {n}:\n{ag.stderr_text()[-3000:]}" for n, ag in (("a", a), ("b", b))]
                + [
                    line
                    for line in a.fetch("/metrics").text().splitlines()
                    if line.startswith(("storwatch_gpu_seconds_at_risk", "storwatch_gpu_stall", "storwatch_recovery"))
                ]
            )

        # Every alert but those that cannot hold fires in Prometheus.
        expected = {g["alert"] for grp in shipped for g in grp["rules"] if "alert" in g} - set(NOT_HOLDING)

        def firing() -> set[str] | bool | None:
            if loop.poll() is not None:
                return True  # ends the wait: the job died, and what it printed is the failure's cause
            alerts = get_json(f"{prom}/api/v1/alerts")["data"]["alerts"]
            names = {x["labels"]["alertname"] for x in alerts if x["state"] == "firing"}
            return names if expected <= names else None

        try:
            wait_until(firing, timeout=75, interval=1.0, what="every alert firing")
            assert loop.poll() is None, f"the training loop ended: {(tmp_path / 'loop.log').read_text()[-3000:]}"
        except AssertionError as err:
            now = get_json(f"{prom}/api/v1/alerts")["data"]["alerts"]
            raise AssertionError(f"{err}\nfiring: {sorted({x['labels']['alertname'] for x in now})}\n{logs()}") from err

        # Alertmanager delivered node 2's drain alert to its agent, whose rule ran its action.
        def delivered(agent: AgentProcess) -> list[dict[str, Any]] | None:
            status = json.loads(agent.fetch("/api/status").body)
            held = [x for x in status["alerts"] if x["labels"].get("alertname") == DRAIN_ALERT]
            acted = [x for x in status["policy"]["actions"] if x["rule"] == "drain-alert-seen"]
            return held if held and acted and acted[0]["outcome"] == "ok" else None

        try:
            held_all = wait_until(lambda: delivered(b), timeout=30, interval=0.5, what="the drain alert acted on")
        except AssertionError as err:
            raise AssertionError(f"{err}\n{logs()}") from err
        for held in held_all:  # one per finding of the node: its runs on node storage, as the scans have found them
            assert held["status"] == "firing" and held["labels"]["node"] == "gpu-node-2", held
            assert held["labels"]["severity"] == "critical" and str(held["annotations"]["runbook_url"]).endswith(
                "#storwatchnodedrainingwithephemeralcheckpoints"
            )
        b.wait_for_stderr(rf"drain-alert-seen.*{DRAIN_ALERT} for this node")
        # The draining node copied its runs' newest checkpoints, verified, and counted them (maybe before a scrape).
        try:
            wait_until(
                lambda: query(prom, 'storwatch_sync_copies_total{node="gpu-node-2", result="verified"} > 0'),
                timeout=60,
                interval=1.0,
                what="a verified copy counted on the draining node",
            )
        except AssertionError as err:
            policy = json.loads(b.fetch("/api/status").body)["policy"]
            raise AssertionError(f"{err}\n{policy['actions']}\n{policy['syncs']}\n{logs()}") from err

        # Every expression of the rules and dashboards returns data from this Prometheus.
        empty = []
        for expr in rule_expressions() + dashboard_expressions():
            promql = NOT_HOLDING.get(expr.name, expr.promql)
            if expr.kind == "alert" and expr.name not in NOT_HOLDING:
                promql = next(
                    r["expr"] for grp in variant for r in grp["rules"] if r.get("alert") == expr.name
                )  # as loaded, with the variant's threshold
            if not query(prom, promql) and panel_of(expr) not in NEEDS_WHAT_IS_NOT_HERE:
                empty.append(f"{expr.where}: {promql}")
        assert not empty, "no data:\n" + "\n".join(empty)
        assert loop.poll() is None


ZERO_ON_A_HEALTHY_NODE = (
    "storwatch-node.json: Stuck mounts",
    "storwatch-node.json: GPU time stalled on storage, by cause",
    "storwatch-node.json: Runs with no durable checkpoint",
    "storwatch-node.json: Important data on ephemeral storage",
    "storwatch-node.json: Findings by severity",
    "storwatch-node.json: Drain state",
    "storwatch-node.json: Pods being deleted",
    "storwatch-node.json: Drain over time",
    "storwatch-node.json: Copies by outcome",
    "storwatch-node.json: Actions by result",
    "storwatch-node.json: Received alerts",
    "storwatch-fleet.json: Training runs with no durable checkpoint, by node",
    "storwatch-fleet.json: Important data on ephemeral storage, by node",
    "storwatch-fleet.json: Stuck mounts, by node",
    "storwatch-fleet.json: GPU time stalled on storage, by cause",
    "storwatch-fleet.json: Most stalled GPUs",
    "storwatch-fleet.json: Copies by outcome, by node",
    "storwatch-fleet.json: Nodes draining",
    "storwatch-fleet.json: Agents down",
    "storwatch-fleet.json: Nodes with a failing collector",
)
"""Panels (file: title) that count what goes wrong: on a healthy node each of their queries has series, all 0."""
NOTHING_OF_IT_ON_A_HEALTHY_NODE = {
    "storwatch-node.json: GPU-seconds at risk per run": "no run holds a GPU on it (nothing at risk to count)",
    "storwatch-node.json: Age of the newest verified copy per run": "nothing was copied (the first test's drain does)",
    "storwatch-node.json: Workload I/O": "no GPU workload runs on it (the first test's training loop does)",
    "storwatch-node.json: Workload read and write calls": "likewise",
    "storwatch-node.json: Workload mounts": "likewise",
    "storwatch-checkpoints.json: Write time": "its checkpoints were written before the agent started: none timed",
    "storwatch-checkpoints.json: Write throughput": "likewise",
    "storwatch-checkpoints.json: Checkpoint overhead": "likewise",
}
"""Panels with nothing to show on this healthy node, and why (each has data in the first test)."""


def test_a_healthy_node_shows_zeros_and_words_not_no_data(real_mounts: Enter[Any], tmp_path: Path) -> None:
    """One agent on a healthy node: a GPU, a run whose checkpoints are on storage that survives the node (a tmpfs its
    configuration pins to ``cluster``), a Kubernetes node neither cordoned nor draining, the default policy, the
    Alertmanager receiver on, nothing copied. Prometheus scrapes it; then every panel of the dashboards has data but
    those with nothing to show here (each named, with why), and each panel that counts what goes wrong reads 0."""
    prometheus = binary("prometheus")
    try:
        lib = build_fake_nvml(tmp_path / "nvml")
    except FakeNVMLUnavailable as err:
        pytest.skip(str(err))
    durable = real_mounts(tmpfs_mount(tmp_path / "durable", size="16m")).mountpoint
    run = durable / "alice" / "run1"
    run.mkdir(parents=True)
    # Saved as a job that joins storwatch saves: each save's span in the run's event log, so the run has a write
    # cost and a recommended interval (a file written before the agent started, and nothing else, is untimed).
    import torch

    from storwatch_training import atomic_save

    for step in (100, 200):
        atomic_save({"w": torch.zeros(4)}, str(run / f"step-{step}.pt"), step=step)
    script = tmp_path / "nvml.txt"
    script.write_text("gpu 0 uuid=GPU-e2e-0001 name=Fake_Idle util=0 mem_used=0 mem_total=85899345920\n")
    token_file = tmp_path / "am-token"
    token_file.write_text(TOKEN + "\n")
    cfg = tmp_path / "healthy.yaml"
    cfg.write_text(
        "tick_seconds: 0.2\nplatform: generic\n"
        f"mounts: {{interval_seconds: 1, overrides: [{{mountpoint: {json.dumps(str(durable))}, durability: cluster, "
        'reason: "the test\'s stand-in for network storage"}]}\n'
        "kube: {interval_seconds: 0.5}\n"
        "gpu: {interval_seconds: 0.1, samples_interval_seconds: 0}\n"
        f"probes: {{mountpoints: [{json.dumps(str(durable))}], interval_seconds: 1}}\n"
        f"checkpoints: {{roots: [{json.dumps(str(durable))}], interval_seconds: 0.5, kubelet: false, "
        "deep_per_scan: 0, settle_seconds: 0}\n"
        f"alertmanager: {{enabled: true, token_file: {json.dumps(str(token_file))}}}\n"
    )
    prom_port = free_port()
    prom = f"http://127.0.0.1:{prom_port}"
    with contextlib.ExitStack() as stack:
        api = stack.enter_context(fake_kube_api())
        api.add({"kind": "Node", "metadata": {"name": "gpu-node-4"}, "spec": {}})
        env = {
            "LD_LIBRARY_PATH": str(lib.parent),
            "FAKE_NVML_SCRIPT": str(script),
            "KUBECONFIG": str(api.kubeconfig(tmp_path)),
            "NODE_NAME": "gpu-node-4",
        }
        prefix = own_mount_table(tmp_path / "table", [durable])
        rules, prom_yml = tmp_path / "rules.yaml", tmp_path / "prometheus.yml"
        rules.write_text(rules_file())  # the checked-in rules: the Fleet panels read their records
        agent = stack.enter_context(
            running_agent("--config", str(cfg), "--listen", "127.0.0.1:0", env=env, timeout=30, prefix=prefix)
        )
        stack.enter_context(
            server(
                [
                    prometheus,
                    f"--config.file={prometheus_config(prom_yml, rules, free_port(), {'gpu-node-4': agent.port})}",
                    f"--storage.tsdb.path={tmp_path / 'prom-data'}",
                    f"--web.listen-address=127.0.0.1:{prom_port}",
                ],
                tmp_path / "prometheus.log",
                f"{prom}/-/ready",
            )
        )
        panels = [e for e in dashboard_expressions() if e.kind == "panel"]

        def answers() -> dict[str, list[dict[str, Any]]] | None:
            got = {e.where: query(prom, e.promql) for e in panels}
            wanted = [e for e in panels if panel_of(e) not in NOTHING_OF_IT_ON_A_HEALTHY_NODE | NEEDS_WHAT_IS_NOT_HERE]
            return got if all(got[e.where] for e in wanted) else None

        try:
            got = wait_until(answers, timeout=60, interval=1.0, what="every panel with data")
        except AssertionError as err:
            last = {e.where: query(prom, e.promql) for e in panels}
            missing = [
                f"{e.where}: {e.promql}"
                for e in panels
                if not last[e.where] and panel_of(e) not in NOTHING_OF_IT_ON_A_HEALTHY_NODE | NEEDS_WHAT_IS_NOT_HERE
            ]
            raise AssertionError(
                f"{err}: no data:\n" + "\n".join(missing) + f"\n{agent.stderr_text()[-3000:]}"
            ) from err
        status = json.loads(agent.fetch("/api/status").body)
    # Healthy indeed: nothing found, nothing stuck, the run covered.
    assert status["findings"] == [], status["findings"]
    (run_view,) = [r for r in status["checkpoints"] if r["path"] == str(run)]
    zero = [e for e in panels if panel_of(e) in ZERO_ON_A_HEALTHY_NODE]
    assert {panel_of(e) for e in zero} == set(ZERO_ON_A_HEALTHY_NODE), "a panel named here is gone"
    for e in zero:
        values = {float(sample["value"][1]) for sample in got[e.where]}
        assert values == {0.0}, f"{e.where}: {values} on a healthy node\n{e.promql}"
    # The stall panels have a 0 for each cause on the node's GPU, not one line for all.
    (stalls,) = [e for e in panels if e.where == "storwatch-node.json: GPU time stalled on storage, by cause (A)"]
    assert sorted((s["metric"]["gpu"], s["metric"]["cause"]) for s in got[stalls.where]) == [
        ("0", "checkpoint_write"),
        ("0", "data_read"),
        ("0", "io_contention"),
    ]
    # The run's recovery point is a number of seconds, drawn over time; the at-risk stat shows it too.
    (point,) = [e for e in panels if e.where == "storwatch-node.json: Recovery point per run (A)"]
    (sample,) = [s for s in got[point.where] if s["metric"]["run"] == run_view["run"]]
    assert 0 <= float(sample["value"][1]) < THRESHOLDS.rpo_budget_seconds, sample
