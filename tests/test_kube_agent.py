"""The Kubernetes source inside the real agent: the official client against the fake API server (tests/kubeapi.py).

Volumes classified by the pod and PVC behind them, GPU processes named by their pod, and a drain seen promptly.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

import pytest

from tests.agentproc import running_agent
from tests.kubeapi import NODE, TRAINER_UID, fake_kube_api, k8s_node_objects
from tests.nvml import FakeNVML, FakeNVMLUnavailable, build_fake_nvml

pytestmark = pytest.mark.realpart

FIXTURES = Path(__file__).parent / "fixtures"
GPU_PID = 5150
CGROUP = (
    "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{uid}.slice/cri-containerd-{cid}.scope\n".format(
        uid=TRAINER_UID.replace("-", "_"), cid="ab" * 32
    )
)


def _tree(tmp_path: Path) -> Path:
    proc = tmp_path / "proc"
    (proc / "1").mkdir(parents=True)
    shutil.copy(FIXTURES / "k8s-node" / "proc" / "1" / "mountinfo", proc / "1" / "mountinfo")
    (proc / str(GPU_PID)).mkdir()
    (proc / str(GPU_PID) / "cgroup").write_text(CGROUP)
    (tmp_path / "root").mkdir()
    cfg = tmp_path / "storwatch.yaml"
    cfg.write_text(
        "tick_seconds: 0.2\nplatform: together-k8s\n"
        f"paths: {{procfs: {proc}, sysfs: {FIXTURES / 'gpu-node' / 'sys'}, rootfs: {tmp_path / 'root'}}}\n"
        "mounts: {interval_seconds: 5, statvfs_timeout_seconds: 0.2}\n"
        "kube: {interval_seconds: 0.2}\ngpu: {interval_seconds: 0.2}\n"
    )
    return cfg


def _status(agent: Any) -> dict[str, Any]:
    resp = agent.fetch("/api/status")
    if resp.status != 200:  # 503 until the first View
        return {"kubernetes": {"api_up": False}, "gpus": []}
    return json.loads(resp.body)  # type: ignore[no-any-return]


def _until(probe, timeout: float, what: str):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.1)


def test_agent_maps_volumes_pods_and_sees_a_drain(tmp_path: Path) -> None:
    try:
        lib = build_fake_nvml(tmp_path / "nvml")
    except FakeNVMLUnavailable as err:
        pytest.skip(str(err))
    fake = FakeNVML(lib.parent, tmp_path)
    fake.write_script(f"gpu 0 uuid=GPU-0 name=H100 util=50 mem_total=1000\nproc 0 pid={GPU_PID} used=4096\n")
    cfg = _tree(tmp_path)
    with fake_kube_api() as api:
        for obj in k8s_node_objects():
            api.add(obj)
        env = {**fake.env(), "KUBECONFIG": str(api.kubeconfig(tmp_path)), "NODE_NAME": NODE}
        env.pop("KUBERNETES_SERVICE_HOST", None)
        with running_agent("--config", str(cfg), "--listen", "127.0.0.1:0", env=env) as agent:
            status = _until(
                lambda: (
                    (s := _status(agent))["kubernetes"]["api_up"]
                    and any(p["pod"] for g in s["gpus"] for p in g["processes"])
                    and s
                ),
                15,
                "the API mapping and the GPU process",
            )
            mounts = {m["mountpoint"]: m for m in status["mounts"]}
            base = f"/var/lib/kubelet/pods/{TRAINER_UID}/volumes"
            nfs = mounts[f"{base}/kubernetes.io~csi/pvc-0a6f2e1d-3c4b-4a59-8e7f-112233445566/mount"]
            assert nfs["durability"] == "cluster"
            assert nfs["evidence"][0]["source"] == "kubernetes"
            assert "trainer-0" in nfs["reason"] and "ckpt-shared" in nfs["reason"]
            local = mounts[f"{base}/kubernetes.io~local-volume/pvc-1b7e3f2a-4d5c-4b6a-9f8e-223344556677"]
            assert local["durability"] == "node" and "ckpt-local" in local["reason"]
            dshm = mounts[f"{base}/kubernetes.io~empty-dir/dshm"]
            assert dshm["durability"] == "volatile" and "dshm" in dshm["reason"]
            # Every mount says which Kubernetes objects are behind it, not only where they decided the class.
            assert nfs["kube"] == {
                "namespace": "train",
                "pod": "trainer-0",
                "pod_uid": TRAINER_UID,
                "volume": "shared",
                "volume_kind": "pvc",
                "pvc": "ckpt-shared",
                "pv": "pvc-0a6f2e1d-3c4b-4a59-8e7f-112233445566",
                "storage_class": "nfs",
                "provisioner": "nfs.csi.k8s.io",
            }
            assert (dshm["kube"]["pod"], dshm["kube"]["volume"], dshm["kube"]["pvc"]) == ("trainer-0", "dshm", None)
            # A hostPath onto Lustre stays cluster; the agent's own hostPath of / is no reason for /.
            fsx = mounts["/fsx"]
            assert fsx["durability"] == "cluster" and "lustre" in fsx["reason"]
            assert (fsx["kube"]["pod"], fsx["kube"]["volume"], fsx["kube"]["volume_kind"]) == (
                "trainer-0",
                "fsx",
                "hostPath",
            )
            root = mounts["/"]
            assert root["kube"] is None and "storwatch" not in root["reason"] and "/dev/nvme0n1p1" in root["reason"]
            (proc,) = status["gpus"][0]["processes"]
            assert (proc["namespace"], proc["pod"], proc["pod_uid"]) == ("train", "trainer-0", TRAINER_UID)
            assert proc["owner"] == "StatefulSet/trainer"
            metrics = agent.fetch("/metrics").body.decode()
            assert 'namespace="train"' in metrics and 'pod="trainer-0"' in metrics
            assert "storwatch_kube_api_up 1.0" in metrics

            # kubectl drain: cordon and the unschedulable taint; seen through the node watch (no relist).
            lists = api.count_requests("/api/v1/nodes", watch=False)
            api.cordon(NODE)
            _until(lambda: "storwatch_node_cordoned 1.0" in agent.fetch("/metrics").body.decode(), 30, "cordon")
            api.cordon(NODE, "ToBeDeletedByClusterAutoscaler")
            _until(lambda: "storwatch_node_draining 1.0" in agent.fetch("/metrics").body.decode(), 30, "drain")
            assert api.count_requests("/api/v1/nodes", watch=False) == lists


def test_api_server_gone_and_back(tmp_path: Path) -> None:
    """While the API server is away, every scrape is answered with storwatch_kube_api_up 0 and the kube collector
    failing, the mapping is kept; once it is back the watches come back. (The backoff's doubling and cap are tested
    on the source, tests/test_kube.py.)"""
    cfg = _tree(tmp_path)
    nfs_mount = (
        f"/var/lib/kubelet/pods/{TRAINER_UID}/volumes/kubernetes.io~csi/pvc-0a6f2e1d-3c4b-4a59-8e7f-112233445566/mount"
    )
    with fake_kube_api() as api:
        for obj in k8s_node_objects():
            api.add(obj)
        env = {"KUBECONFIG": str(api.kubeconfig(tmp_path)), "NODE_NAME": NODE, "LD_LIBRARY_PATH": str(tmp_path)}
        with running_agent("--config", str(cfg), "--listen", "127.0.0.1:0", env=env) as agent:

            def reason() -> str:
                mounts = {m["mountpoint"]: m for m in _status(agent).get("mounts", [])}
                return str(mounts.get(nfs_mount, {}).get("reason", ""))

            _until(lambda: "ckpt-shared" in reason(), 30, "the mapping")
            # Every watch synced first: until then the API shows as down whether or not it is there.
            _until(lambda: "storwatch_kube_api_up 1.0" in agent.fetch("/metrics").body.decode(), 30, "api_up 1")
            api.go_away(3600)
            _until(lambda: "storwatch_kube_api_up 0.0" in agent.fetch("/metrics").body.decode(), 60, "api_up 0")
            for _ in range(20):  # over several ticks and reconnect attempts
                resp = agent.fetch("/metrics")
                body = resp.body.decode()
                assert resp.status == 200
                assert "storwatch_kube_api_up 0.0" in body
                assert 'storwatch_collector_success{collector="kube"} 0.0' in body
                time.sleep(0.25)
            assert "ckpt-shared" in reason()  # the last known mapping is kept
            api.come_back()
            _until(lambda: "storwatch_kube_api_up 1.0" in agent.fetch("/metrics").body.decode(), 60, "api_up 1")
            assert "ckpt-shared" in reason()
            _until(
                lambda: 'storwatch_collector_success{collector="kube"} 1.0' in agent.fetch("/metrics").body.decode(),
                30,
                "the kube collector's success",
            )


def test_a_stretched_view_interval_still_shows_a_drain_at_once(tmp_path: Path) -> None:
    """view_cpu_share so small that every View is over it: Views come view_max_seconds (an hour) apart, and the ticks
    go on; the node drained changes the Kubernetes facts, and that makes a View at the next tick, not in an hour."""
    cfg = _tree(tmp_path)
    cfg.write_text(cfg.read_text() + "view_cpu_share: 0.000000001\nview_max_seconds: 3600\n")
    with fake_kube_api() as api:
        for obj in k8s_node_objects():
            api.add(obj)
        env = {"KUBECONFIG": str(api.kubeconfig(tmp_path)), "NODE_NAME": NODE, "LD_LIBRARY_PATH": str(tmp_path)}
        with running_agent("--config", str(cfg), "--listen", "127.0.0.1:0", env=env) as agent:
            _until(lambda: _status(agent)["kubernetes"]["api_up"], 30, "the API's objects in a View")
            metrics = agent.fetch("/metrics").body.decode()
            shown = [line for line in metrics.splitlines() if line.startswith("storwatch_view_interval")]
            assert shown == ["storwatch_view_interval_seconds 3600.0"]
            assert "storwatch_node_cordoned 0.0" in metrics
            first = _status(agent)["generated_at"]
            time.sleep(1.5)  # more than seven ticks of 0.2 s, and nothing in the API changed
            assert _status(agent)["generated_at"] == first

            api.cordon(NODE)
            _until(lambda: "storwatch_node_cordoned 1.0" in agent.fetch("/metrics").body.decode(), 30, "cordon")
            assert _status(agent)["generated_at"] > first
