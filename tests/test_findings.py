"""Findings: checkpoints on storage that does not survive the node, counted to the byte, with the durable place
they should go (a layout like Together's Kubernetes nodes: a pod's scratch emptyDir and its PVC side by side)."""

from __future__ import annotations

from typing import Any

import pytest

from storwatch.analysis.copies import join_copies
from storwatch.analysis.findings import find as find_joined
from storwatch.analysis.findings import severity
from storwatch.analysis.view import MountView, RunView, View
from storwatch.config import FindingsConfig
from storwatch.exporter import ExportState, render_text
from storwatch.exporter import checkpoints as checkpoints_area
from storwatch.report import view_to_dict
from storwatch.snapshot import Snapshot
from storwatch.sources.checkpoints import Checkpoint, RunState
from storwatch.vocabulary import Durability, Mount, Platform, Verdict

NOW = 1_800_000_000.0


def find(runs: object, mounts: object, now: float, **kw: object) -> tuple[Any, ...]:
    """The findings of ``runs`` once joined with their durable copies, as the View's runs are (analysis/copies.py)."""
    from storwatch.paths import HostPaths

    return find_joined(join_copies(list(runs), (), HostPaths()), mounts, now, **kw)  # type: ignore[arg-type]


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
        f"llama/run1 ({SCRATCH}/llama/run1): 3 checkpoints, 42.8 GiB, newest 6 min old, only on node storage "
        f"{SCRATCH}; newest durable copy 3 h old (step-100.pt: a copy at the same path at {PVC}/llama/run1); "
        f"copy them to {PVC}"
    )
    assert finding.exposed_seconds == 10800.0 - 360.0 and not finding.exposed_at_least
    assert finding.severity_reason == (
        "3 h of training only on this node, past the 60 min recovery-point budget (findings.rpo_budget_seconds)"
    )
    assert find([scratch, copy], MOUNTS, NOW + 60)[0].id == finding.id  # stable as its figures move


def test_home_on_a_node_disk_goes_to_the_nodes_shared_storage_and_durable_data_is_no_finding() -> None:
    home = run("/home", "alice/ckpt", HOME, ckpt("/home/alice/ckpt/model.safetensors", 60.0, 1_000))
    shared = run("/mnt/shared", "bob", _SHARED, ckpt("/mnt/shared/bob/step-1.pt", 60.0, 5_000))
    (finding,) = find([home, shared], MOUNTS, NOW)
    assert finding.mountpoint == "/home" and finding.pod_uid is None
    assert finding.move_to == "/mnt/shared"  # not another pod's volume
    assert finding.durable_age_seconds is None
    # One checkpoint and no durable copy: no more than the run's work before it is known to be only here.
    assert finding.severity == "warning" and finding.exposed_seconds == 0.0 and finding.exposed_at_least
    assert finding.sentence.endswith("no durable copy; copy them to /mnt/shared")
    assert find([shared], MOUNTS, NOW) == ()


def test_no_durable_storage_on_the_node_is_said() -> None:
    home = run("/home", "alice", HOME, ckpt("/home/alice/step.pt", 60.0, 10))
    (finding,) = find([home], (MOUNTS[0], HOME), NOW)
    assert finding.move_to is None
    assert finding.sentence.endswith(
        "no durable destination known: set sync.destinations (or checkpoints.roots on durable storage), as this node "
        "has no cluster or region storage mounted"
    )


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
        labels = f'id="{f.id}",kind="{f.kind}",mountpoint="{f.mountpoint}",run="{f.run}",severity="{f.severity}"'
        assert f"storwatch_finding{{{labels}}} 1.0" in lines
    data = view_to_dict(view)
    assert [f["bytes"] for f in data["findings"]] == [1000, 15, 5]  # most severe first, then the biggest
    assert data["findings"][0]["move_to"] == PVC


def test_two_runs_on_one_mount_are_two_findings_each_naming_its_run_and_path() -> None:
    """The same figures on one mount: what tells them apart is the run and its directory."""
    runs = [
        run(SCRATCH, label, SCRATCH_MV, ckpt(f"{SCRATCH}/{label}/step-1.pt", 120.0, 4096))
        for label in ("plain", "trainer/plain")
    ]
    findings = find(runs, MOUNTS, NOW)
    assert len({f.id for f in findings}) == 2 and len({f.sentence for f in findings}) == 2
    for f in findings:
        assert f.path == f"{SCRATCH}/{f.run}"
        assert f.sentence.startswith(f"{f.run} ({SCRATCH}/{f.run}): 1 checkpoint, 4.0 KiB, newest 2 min old, ")
    view = View(Snapshot(NOW), Platform("generic", "test"), mounts=MOUNTS, checkpoints=tuple(runs), findings=findings)
    data = view_to_dict(view)
    assert {(f["run"], f["path"]) for f in data["findings"]} == {(r.label, r.directory) for r in runs}


def test_the_path_is_the_one_the_host_names() -> None:
    """Under --path.rootfs the scan reaches a run at /host/...: a finding names it as the host does."""
    rv = RunView(
        RunState("/host/home/alice", "/host/home", (ckpt("/host/home/alice/s.pt", 5.0, 1),)),
        "alice",
        HOME,
        "/home/alice",
    )
    (f,) = find([rv], MOUNTS, NOW)
    assert f.path == "/home/alice" and f.sentence.startswith("alice (/home/alice): ")


HOUR = 3600.0
# C: a durable copy 90 min older than its newest work here; A: no durable copy, its checkpoints here span 2 h; B: no
# durable copy, 10 min of checkpoints. The largest is the least urgent.
RANKED = (
    run(SCRATCH, "a", SCRATCH_MV, ckpt(f"{SCRATCH}/a/1.pt", 2 * HOUR + 60, 5), ckpt(f"{SCRATCH}/a/2.pt", 60, 5)),
    run(SCRATCH, "b", SCRATCH_MV, ckpt(f"{SCRATCH}/b/1.pt", 660, 500), ckpt(f"{SCRATCH}/b/2.pt", 60, 500)),
    run(SCRATCH, "c", SCRATCH_MV, ckpt(f"{SCRATCH}/c/1.pt", 60, 500)),
    run(PVC, "c", PVC_MV, ckpt(f"{PVC}/c/1.pt", 60 + 1.5 * HOUR, 500)),
)


@pytest.mark.parametrize(
    ("rules", "draining", "ranked"),
    [
        pytest.param(FindingsConfig(), False, [("c", "critical"), ("a", "critical"), ("b", "warning")], id="budget"),
        pytest.param(
            FindingsConfig(rpo_budget_seconds=3 * HOUR),
            False,
            [("b", "warning"), ("c", "warning"), ("a", "warning")],
            id="larger-budget",
        ),
        pytest.param(
            FindingsConfig(rpo_budget_seconds=3 * HOUR),
            True,
            [("b", "critical"), ("c", "critical"), ("a", "critical")],
            id="draining",
        ),
        pytest.param(
            FindingsConfig(rpo_budget_seconds=3 * HOUR, critical_while_draining=False),
            True,
            [("b", "warning"), ("c", "warning"), ("a", "warning")],
            id="draining-not-critical",
        ),
    ],
)
def test_severity_ranks_by_the_budget_and_the_drain_most_severe_then_largest_first(
    rules: FindingsConfig, draining: bool, ranked: list[tuple[str, str]]
) -> None:
    findings = find(RANKED, MOUNTS, NOW, rules=rules, draining=draining)
    assert [(f.run, f.severity) for f in findings] == ranked
    by_run = {f.run: f for f in findings}
    assert by_run["a"].exposed_seconds == 2 * HOUR and by_run["a"].exposed_at_least
    assert by_run["c"].exposed_seconds == 1.5 * HOUR and not by_run["c"].exposed_at_least
    for f in findings:
        assert ("draining" in f.severity_reason) == (draining and rules.critical_while_draining)


@pytest.mark.parametrize(
    ("exposed", "at_least", "expected"),
    [
        pytest.param(None, False, ("warning", "how much training only this node holds is unknown"), id="unknown"),
        pytest.param(3600.0, False, ("warning", "60 min of training only on this node, within"), id="at-budget"),
        pytest.param(3601.0, True, ("critical", "at least 60 min of training only on this node, past"), id="past"),
        pytest.param(0.0, True, ("warning", "no span of training is known to be only on this node"), id="one-time"),
    ],
)
def test_severity_of_a_span(exposed: float | None, at_least: bool, expected: tuple[str, str]) -> None:
    level, why = severity(exposed, at_least, False, FindingsConfig())
    assert level == expected[0] and expected[1] in why


def test_a_draining_node_makes_the_views_findings_critical_and_the_budget_comes_from_the_config() -> None:
    """The wiring: build_view reads the drain from the Kubernetes facts, the agent's tick passes findings.*."""
    from storwatch.agent.tick import ViewMaker
    from storwatch.analysis.stall_feed import StallFeed
    from storwatch.classify import Classifier
    from storwatch.config import Config
    from storwatch.sources.checkpoints import CheckpointFacts
    from storwatch.sources.kubevolumes import KubeFacts, KubeVolumeEvidence, NodeInfo

    scratch = Mount(1, "/scratch", "tmpfs", "tmpfs", "/", 0, 40, False, (), (), None, False, 0.0)
    root = Mount(2, "/", "/dev/vda1", "ext4", "/", 8, 1, False, (), (), None, False, 0.0)
    state = RunState("/scratch/r", "/scratch", (ckpt("/scratch/r/1.pt", 2 * HOUR, 9), ckpt("/scratch/r/2.pt", 60, 9)))
    facts = CheckpointFacts(NOW, (state,), False, None, 0.1, ("/scratch",))

    def made(kube: KubeFacts | None, config: Config) -> list[str]:
        snap = Snapshot(NOW, (root, scratch), checkpoints=facts, kube=kube)
        maker = ViewMaker(config, StallFeed(), KubeVolumeEvidence())
        view = maker.make(snap, True, Classifier("generic"), Platform("generic", "test"), config)
        return [f.severity for f in view.findings]

    drain = NodeInfo("n1", True, removal_taints=("ToBeDeletedByClusterAutoscaler",))
    calm = NodeInfo("n1", False)
    lenient = Config(findings=FindingsConfig(rpo_budget_seconds=3 * HOUR))
    assert made(None, Config()) == ["critical"]  # at least 2 h only here, past the default 1 h
    assert made(None, lenient) == ["warning"]
    assert made(KubeFacts(True, True, node=calm, timestamp=NOW), lenient) == ["warning"]
    assert made(KubeFacts(True, True, node=drain, timestamp=NOW), lenient) == ["critical"]
