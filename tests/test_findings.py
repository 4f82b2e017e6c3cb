"""Findings: checkpoints on storage that does not survive the node, counted to the byte, with the durable place
they should go (a layout like Together's Kubernetes nodes: a pod's scratch emptyDir and its PVC side by side)."""

from __future__ import annotations

from storwatch.analysis.findings import find
from storwatch.analysis.view import MountView, RunView, View
from storwatch.exporter import ExportState, render_text
from storwatch.exporter import checkpoints as checkpoints_area
from storwatch.report import view_to_dict
from storwatch.snapshot import Snapshot
from storwatch.sources.checkpoints import Checkpoint, RunState
from storwatch.vocabulary import Durability, Mount, Platform, Verdict

NOW = 1_800_000_000.0
POD = "0b5c6f3e-1c9a-4a5e-9c1f-2b7d8e9f0a1b"
SCRATCH = f"/var/lib/kubelet/pods/{POD}/volumes/kubernetes.io~empty-dir/scratch"
PVC = f"/var/lib/kubelet/pods/{POD}/volumes/kubernetes.io~csi/pvc-ckpt/mount"


def mount(mountpoint: str, durability: Durability, fstype: str = "ext4") -> MountView:
    m = Mount(1, mountpoint, "dev", fstype, "/", 8, 1, False, (), (), None, False, 0.0)
    return MountView(m, Verdict(durability, "test", ()))


def ckpt(path: str, age: float, size: int, verdict: str = "complete") -> Checkpoint:
    return Checkpoint(path, "torch-zip", verdict, verdict, size, NOW - age, False, NOW - age, None, None)


def run(root: str, label: str, where: MountView, *checkpoints: Checkpoint) -> RunView:
    return RunView(RunState(f"{root}/{label}", root, checkpoints), label, where)


MOUNTS = (
    mount("/", Durability.NODE),
    mount("/home", Durability.NODE),
    mount(SCRATCH, Durability.NODE),
    mount(PVC, Durability.CLUSTER, "nfs4"),
    mount("/mnt/shared", Durability.CLUSTER, "lustre"),
)
_, HOME, SCRATCH_MV, PVC_MV, _SHARED = MOUNTS


def test_checkpoints_on_a_pods_scratch_volume_go_to_the_same_pods_pvc() -> None:
    scratch = run(
        SCRATCH,
        "llama/run1",
        SCRATCH_MV,
        ckpt(f"{SCRATCH}/llama/run1/step-100.pt", 7200.0, 21_474_836_480),
        ckpt(f"{SCRATCH}/llama/run1/step-200.pt", 3600.0, 21_474_836_481),
        ckpt(f"{SCRATCH}/llama/run1/step-300.pt", 360.0, 3_000_000_007),
        ckpt(f"{SCRATCH}/llama/run1/step-400.pt", 10.0, 999, "incomplete"),  # not counted: not complete
    )
    copy = run(PVC, "llama/run1", PVC_MV, ckpt(f"{PVC}/llama/run1/step-100.pt", 10800.0, 21_474_836_480))
    (finding,) = find([scratch, copy], MOUNTS, NOW)
    assert finding.bytes == 21_474_836_480 + 21_474_836_481 + 3_000_000_007  # exact to the byte
    assert finding.count == 3 and finding.pod_uid == POD and finding.move_to == PVC
    assert finding.severity == "critical"  # the durable copy is 3 h old, the newest work 6 min
    assert finding.sentence == (
        f"3 checkpoints, 42.8 GiB, newest 6 min old, only on node storage {SCRATCH}; "
        f"newest durable copy 3 h old; copy them to {PVC}"
    )
    assert find([scratch, copy], MOUNTS, NOW + 60)[0].id == finding.id  # stable as its figures move


def test_home_on_a_node_disk_goes_to_the_nodes_shared_storage_and_durable_data_is_no_finding() -> None:
    home = run("/home", "alice/ckpt", HOME, ckpt("/home/alice/ckpt/model.safetensors", 60.0, 1_000))
    shared = run("/mnt/shared", "bob", _SHARED, ckpt("/mnt/shared/bob/step-1.pt", 60.0, 5_000))
    (finding,) = find([home, shared], MOUNTS, NOW)
    assert finding.mountpoint == "/home" and finding.pod_uid is None
    assert finding.move_to == "/mnt/shared"  # not another pod's volume
    assert finding.durable_age_seconds is None and finding.severity == "critical"
    assert finding.sentence.endswith("no durable copy; copy them to /mnt/shared")
    assert find([shared], MOUNTS, NOW) == ()


def test_no_durable_storage_on_the_node_is_said() -> None:
    home = run("/home", "alice", HOME, ckpt("/home/alice/step.pt", 60.0, 10))
    (finding,) = find([home], (MOUNTS[0], HOME), NOW)
    assert finding.move_to is None
    assert finding.sentence.endswith("this node has no cluster or region storage to copy to")


def test_findings_in_the_scrape_and_the_report() -> None:
    runs = (
        run(SCRATCH, "a", SCRATCH_MV, ckpt(f"{SCRATCH}/a/1.pt", 100.0, 7), ckpt(f"{SCRATCH}/a/2.pt", 50.0, 8)),
        run(SCRATCH, "b", SCRATCH_MV, ckpt(f"{SCRATCH}/b/1.pt", 100.0, 1000)),
        run("/home", "c", HOME, ckpt("/home/c/1.pt", 100.0, 5)),
    )
    findings = find(runs, MOUNTS, NOW)
    view = View(Snapshot(NOW), Platform("together-k8s", "test"), mounts=MOUNTS, checkpoints=runs, findings=findings)
    lines = set(render_text(checkpoints_area.families(view, ExportState())).decode().splitlines())
    assert f'storwatch_ephemeral_important_bytes{{kind="checkpoint",mountpoint="{SCRATCH}"}} 1015.0' in lines
    assert 'storwatch_ephemeral_important_bytes{kind="checkpoint",mountpoint="/home"} 5.0' in lines
    for f in findings:
        assert f'storwatch_finding{{id="{f.id}",severity="{f.severity}"}} 1.0' in lines
    data = view_to_dict(view)
    assert [f["bytes"] for f in data["findings"]] == [1000, 15, 5]  # most severe first, then the biggest
    assert data["findings"][0]["move_to"] == PVC
