"""The entity schema (storwatch/policy/schema.py): docs/policy.md is generated from it and kept current; the entities
of a View with facts for every area hold exactly the declared fields with their types; unknown is null; a GPU's stall
share over ten minutes comes from the settled totals of the Views seen, and is null until ten minutes are covered."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

from storwatch.analysis.stalls import StallState
from storwatch.policy.schema import SCHEMA, StallShares, entities, markdown, problems
from storwatch.sources.kubevolumes import HOST_PATH, ClusterObjects, VolumeInfo
from tests.rich_view import NOW, rich_view

DOC = Path(__file__).resolve().parents[1] / "docs" / "policy.md"


def test_docs_policy_md_is_generated_from_the_schema() -> None:
    assert DOC.read_text(encoding="utf-8") == markdown(), "run: storwatch policy show > docs/policy.md"


def test_every_field_is_documented_once() -> None:
    for spec in SCHEMA.values():
        names = [f.name for f in spec.fields]
        assert len(set(names)) == len(names), spec.kind
        assert all(f.doc.endswith(".") and "\n" not in f.doc for f in spec.fields), spec.kind
        for f in spec.fields:
            assert f"| `{f.name}` |" in markdown()


def test_the_entities_of_a_rich_view_match_the_schema() -> None:
    ents = entities(rich_view())
    assert {kind: len(es) for kind, es in ents.items()} == {
        "mount": 6,
        "run": 3,
        "gpu": 3,
        "workload": 3,
        "finding": 3,
        "node": 1,
        "alert": 0,
    }
    assert [(e.kind, e.key, p) for es in ents.values() for e in es for p in problems(e.kind, e.fields)] == []


def test_what_the_view_does_not_know_is_null() -> None:
    ents = entities(rich_view())
    home = next(e for e in ents["mount"] if e.key == "/home")  # stuck: statvfs never answered
    assert (home.fields["stuck"], home.fields["size_bytes"], home.fields["used_ratio"]) == (True, None, None)
    lost = next(e for e in ents["gpu"] if e.fields["index"] == 2)  # NVML lost it
    assert (lost.fields["up"], lost.fields["utilization_ratio"], lost.fields["memory_used_bytes"]) == (
        False,
        None,
        None,
    )
    weights = next(e for e in ents["run"] if e.key == "models/llama-weights")  # only on node-local storage, no copy
    assert weights.fields["recovery_point_seconds"] == math.inf and weights.fields["durable_checkpoint"] is False
    assert weights.fields["node_draining"] is True
    llama = next(e for e in ents["run"] if e.key == "llama")  # node-local, its step-100 copied to durable storage
    assert llama.fields["recovery_point_seconds"] == 3600.0 and llama.fields["durable_checkpoint"] is True
    node = ents["node"][0].fields
    assert (node["draining"], node["stuck_mounts"], node["terminating_pods"]) == (True, 1, 1)


def test_the_stall_share_covers_ten_minutes_of_views() -> None:
    base = rich_view()
    shares = StallShares()

    def at(t: float, seconds: float) -> dict[str, float | None]:
        totals = {("0", "/scratch", "checkpoint_write"): seconds}
        view = dataclasses.replace(base, snapshot=dataclasses.replace(base.snapshot, timestamp=NOW + t))
        return shares.observe(dataclasses.replace(view, stalls=StallState(totals=totals)))

    assert at(0, 100.0)["0"] is None
    assert at(300, 160.0)["0"] is None  # five minutes seen: not yet ten
    assert at(600, 250.0)["0"] == 150.0 / 600  # 150 s settled as stalled in the ten minutes
    assert at(900, 280.0)["0"] == 120.0 / 600  # since the View at 300
    assert at(960, 10.0)["0"] is None  # a total that dropped: the window starts again
    one = entities(dataclasses.replace(base, stalls=StallState(totals={})), shares={"0": 0.25})
    assert [e.fields["stall_share_10m"] for e in one["gpu"]] == [0.25, None, None]
    untracked = entities(dataclasses.replace(base, stalls=None), shares={"0": 0.25})
    assert {e.fields["stall_share_10m"] for e in untracked["gpu"]} == {None}
    assert {e.fields["stalling"] for e in untracked["gpu"]} == {None}


def test_a_run_names_its_pod_its_grace_and_its_newest_complete_checkpoint() -> None:
    """The run on the pod's hostPath volume carries the pod's name, how long it has left and its grace period, and
    its newest complete checkpoint (the incomplete step-300 being written is not it) for ``sync`` to copy; a run in
    no pod's volume whose writer is no pod names none."""
    view = rich_view()
    assert view.kube is not None
    (pod,) = view.kube.cluster.pods.values()
    pod = dataclasses.replace(pod, volumes=(VolumeInfo("scratch", HOST_PATH, path="/scratch"),))
    kube = dataclasses.replace(view.kube, cluster=ClusterObjects(pods={pod.uid: pod}))
    view = dataclasses.replace(view, snapshot=dataclasses.replace(view.snapshot, kube=kube))
    runs = {e.key: e for e in entities(view)["run"]}
    llama = runs["llama"]
    assert {k: llama.fields[k] for k in ("namespace", "pod", "pod_terminating", "pod_grace_seconds")} == {
        "namespace": "ml",
        "pod": "trainer-0",
        "pod_terminating": True,
        "pod_grace_seconds": 30.0,
    }
    assert llama.fields["pod_seconds_left"] == 20.0 and llama.fields["checkpoint"] == "step-200"
    assert (llama.checkpoint_path, llama.checkpoint_mtime) == ("/scratch/llama/step-200", NOW - 600.0)
    bert = runs["ckpt/bert"]  # written by Slurm job 77: no pod
    assert (bert.fields["namespace"], bert.fields["pod"], bert.fields["pod_grace_seconds"]) == (None, None, None)
    assert bert.fields["checkpoint"] == "step-2"


def test_each_entity_names_its_owner_as_the_kernel_and_the_cluster_say() -> None:
    """The owner an action's budget is kept by: a run in a pod's volume is its namespace's; a run no pod holds is its
    directory's owner (the uid the scan's lstat saw), else the user of the Slurm job whose process the kernel shows
    writing it; a finding is its run's; a workload is its pod's namespace or its job's user; the node's own things
    (mounts, GPUs, the node) are nobody's."""
    view = rich_view()
    assert view.kube is not None
    (pod,) = view.kube.cluster.pods.values()
    pod = dataclasses.replace(pod, volumes=(VolumeInfo("scratch", HOST_PATH, path="/scratch"),))
    kube = dataclasses.replace(view.kube, cluster=ClusterObjects(pods={pod.uid: pod}))
    view = dataclasses.replace(view, snapshot=dataclasses.replace(view.snapshot, kube=kube))
    ents = entities(view)
    runs = {e.key: e.owner for e in ents["run"]}
    assert runs == {"llama": "namespace:ml", "models/llama-weights": "namespace:ml", "ckpt/bert": "uid:1000"}
    assert {e.fields["run"]: e.owner for e in ents["finding"] if e.fields["kind"] != "dataset"} == {
        "llama": "namespace:ml",
        "models/llama-weights": "namespace:ml",
    }
    workloads = {e.fields["pid"]: e.owner for e in ents["workload"]}
    assert workloads == {4242: "namespace:ml", 4343: None, 5151: "uid:1000"}
    assert {e.owner for kind in ("mount", "gpu", "node") for e in ents[kind]} == {None}
    # The directory's owner, where the scan saw it, before the job's user.
    bert = next(rv for rv in view.checkpoints if rv.label == "ckpt/bert")
    owned = dataclasses.replace(bert, run=dataclasses.replace(bert.run, uid=1234))
    view = dataclasses.replace(view, checkpoints=tuple(owned if rv is bert else rv for rv in view.checkpoints))
    assert {e.key: e.owner for e in entities(view)["run"]}["ckpt/bert"] == "uid:1234"


def test_an_alert_acts_on_the_run_mount_or_gpu_its_labels_name() -> None:
    """The most specific label decides (run, then mountpoint, then uuid or gpu); a run label naming no run here names
    nothing (not its mount); the alert's actions are its subject's, within its subject's owner's budgets."""
    from storwatch.actions.base import Alert, acted_on

    view = rich_view()

    def alert(fp: str, **labels: str) -> Alert:
        return Alert(fp, "firing", {"alertname": "X", "node": "n", **labels}, {}, NOW - 60.0, None, NOW)

    alerts = [
        alert("a1", run="llama", mountpoint="/home"),
        alert("a2", mountpoint="/scratch"),
        alert("a3", uuid="GPU-00000001-aaaa-bbbb-cccc-dddddddddddd", gpu="0"),
        alert("a4", gpu="2"),
        alert("a5", run="gone", mountpoint="/scratch"),
        alert("a6"),
    ]
    ents = entities(view, alerts)
    by_fp = {e.key: e for e in ents["alert"]}
    assert [(e.key, *problems("alert", e.fields)) for e in by_fp.values()] == [(fp,) for fp in by_fp]
    named = {fp: (e.fields["entity_kind"], e.fields["entity_key"], e.fields["checkpoint"]) for fp, e in by_fp.items()}
    assert named == {
        "a1": ("run", "llama", "step-200"),
        "a2": ("mount", "/scratch", None),
        "a3": ("gpu", "GPU-00000001-aaaa-bbbb-cccc-dddddddddddd", None),
        "a4": ("gpu", "GPU-00000002-aaaa-bbbb-cccc-dddddddddddd", None),
        "a5": (None, None, None),
        "a6": (None, None, None),
    }
    llama = next(e for e in ents["run"] if e.key == "llama")
    a1 = by_fp["a1"]
    assert a1.subject == llama and acted_on(a1) is a1.subject and a1.owner == llama.owner
    assert (a1.subject.checkpoint_path, a1.subject.run_dir) == (llama.checkpoint_path, llama.run_dir)
    assert acted_on(by_fp["a5"]) is by_fp["a5"] and by_fp["a5"].owner is None


def test_a_run_has_its_findings_severity_and_a_warning_without_one() -> None:
    view = rich_view()
    severity = {e.key: e.fields["severity"] for e in entities(view)["run"]}
    findings = {f.run: f.severity for f in view.findings if f.kind != "dataset"}
    assert findings == {"llama": "critical", "models/llama-weights": "critical"}
    assert severity == {**findings, "ckpt/bert": "warning"}  # bert is on durable storage: no finding
    calm = dataclasses.replace(view, findings=tuple(dataclasses.replace(f, severity="warning") for f in view.findings))
    assert {e.fields["severity"] for e in entities(calm)["run"]} == {"warning"}
