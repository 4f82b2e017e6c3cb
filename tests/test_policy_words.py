"""Every message of the shipped default policy, rendered for every entity of its kind on nodes in the states that
used to read badly (no durable destination known, no durable checkpoint so an unbounded recovery point, GPUs
unknown, the node draining and a pod being deleted, a verified copy): a sentence a person can act on, never ``null``,
``None``, ``inf``, ``nan`` or ``_`` standing for a value; a message about a run names the run and where it is, and one
about checkpoints only on the node's storage says where they could go or how to set a destination.

The entities are built from Views (the fixture Kubernetes node of test_status_render.py, and a generic node with
nothing durable mounted) by the same code the agent runs (storwatch.policy.schema.entities); each rule's message is
rendered whatever its condition, so a message no fixture would fire is read too.
"""

from __future__ import annotations

import dataclasses
import math
import re

import pytest

from storwatch.actions.base import Entity
from storwatch.agent.policy import SHIPPED_DEFAULT
from storwatch.analysis.build import build_view
from storwatch.analysis.view import View
from storwatch.checkpoints.manifest import FoundCopy
from storwatch.classify import Classifier
from storwatch.policy.load import load_policy, render_message
from storwatch.policy.schema import entities
from storwatch.snapshot import Snapshot
from storwatch.sources.checkpoints import CheckpointFacts, RunState
from storwatch.sources.copies import CopiesFacts
from storwatch.sources.kubevolumes import KubeVolumeEvidence, NodeInfo
from storwatch.vocabulary import Platform
from tests.builders import ckpt, mount, stall_gpus
from tests.status_fixture import T, fixture_view

ROOT = "/mnt/local-nvme/ckpt"
NOT_WORDS = re.compile(r"(?<![\w./-])(null|None|inf|-inf|nan|NaN|_)(?![\w/-])")
"""A value that is no word: null, None, inf, nan, or a lone underscore."""


def _runs(root: str, *names: str, writer: int | None = 4242) -> CheckpointFacts:
    runs = tuple(
        RunState(
            f"{root}/{n}",
            root,
            (
                dataclasses.replace(ckpt(7200.0), path=f"{root}/{n}/step-1.pt", writer_pid=writer),
                dataclasses.replace(ckpt(600.0), path=f"{root}/{n}/step-2.pt", writer_pid=writer),
            ),
        )
        for n in names
    )
    return CheckpointFacts(T, runs, False, None, 0.1, (root,))


def _kube_node(draining: bool) -> View:
    """The fixture Kubernetes node, its runs on node-local NVMe, a pod being deleted and (``draining``) the node
    cordoned with a removal taint; run "copied" has a verified copy of its newest save."""
    facts = _runs(ROOT, "bare", "copied")
    view = fixture_view(gpus=stall_gpus(T, 0.9), checkpoints=facts)
    kube = view.snapshot.kube
    assert kube is not None
    pods = {uid: dataclasses.replace(p, deletion_timestamp=T + 20.0) for uid, p in kube.cluster.pods.items()}
    node = (
        NodeInfo(
            "gpu-node-1", True, (("ToBeDeletedByClusterAutoscaler", "NoSchedule"),), ("ToBeDeletedByClusterAutoscaler",)
        )
        if draining
        else NodeInfo("gpu-node-1", False)
    )
    kube = dataclasses.replace(kube, cluster=dataclasses.replace(kube.cluster, pods=pods), node=node)
    newest = facts.runs[1].newest_complete
    assert newest is not None
    copy = FoundCopy("/fsx/storwatch/copied/step-2.pt", newest.path, facts.runs[1].path, newest.mtime, T - 60, 1, 1)
    classifier = Classifier("together-k8s")
    classifier.add_provider(KubeVolumeEvidence(kube))
    snap = Snapshot(T, facts={**dict(view.snapshot.facts), "kube": kube, "copies": CopiesFacts((copy,), ("/fsx",))})
    return build_view(snap, classifier, Platform("together-k8s", "test"))


def _bare_node() -> View:
    """A generic node with only its root disk and a local scratch: nothing durable, no destination known, no GPU
    process tied to the run (its GPUs unknown)."""
    mounts = (
        mount("/", "ext4", "/dev/nvme0n1p1"),
        dataclasses.replace(mount("/scratch", "ext4", "/dev/nvme1n1"), mount_id=31),
    )
    snap = Snapshot(T, mounts, checkpoints=_runs("/scratch", "lonely", writer=None), gpus=stall_gpus(T, 0.0))
    return build_view(snap, Classifier("generic"), Platform("generic", "test"))


VIEWS = {"kube-draining": lambda: _kube_node(True), "kube-pod-deleted": lambda: _kube_node(False), "bare": _bare_node}


@pytest.mark.parametrize("name", sorted(VIEWS))
def test_every_shipped_message_is_words_a_person_can_act_on(name: str) -> None:
    view = VIEWS[name]()
    policy = load_policy([SHIPPED_DEFAULT])
    by_kind = entities(view)
    assert by_kind["run"], "the fixture has runs"
    read = 0
    for rule in policy.rules:
        for entity in by_kind.get(rule.on, ()):
            text = render_message(rule.message, entity.fields)
            read += 1
            bad = NOT_WORDS.findall(text)
            assert not bad, f"{rule.name} on {entity.kind} {entity.key}: {bad} in {text!r}"
            if rule.on == "run":
                assert f"run {entity.key}" in text, (rule.name, text)
                assert str(entity.fields["path"]) in text or "{path}" not in rule.message, (rule.name, text)
    assert read > 10


def _run(view: View, label: str) -> Entity:
    (run,) = [e for e in entities(view)["run"] if e.key == label]
    return run


def test_a_run_says_what_protects_it_what_is_at_risk_and_where_it_could_go() -> None:
    draining = _kube_node(True)
    copied, bare = _run(draining, "copied"), _run(draining, "bare")
    assert copied.fields["protection"] == (
        "its newest checkpoint that survives losing the node is 10 min old "
        "(storwatch's verified copy at /fsx/storwatch/copied/step-2.pt)"
    )
    assert bare.fields["protection"] == "no checkpoint of it survives losing the node"
    assert bare.fields["recovery_point_seconds"] == math.inf
    assert str(bare.fields["at_risk"]).startswith("all the GPU time of its "), bare.fields["at_risk"]
    going = str(bare.fields["going"])
    assert going.startswith("the node is draining and its pod ") and going.endswith(" is being deleted (20 s left)")
    assert bare.fields["move_to"] == "/fsx" and bare.fields["next_step"] == "copy them to /fsx"

    lonely = _run(_bare_node(), "lonely")
    assert lonely.fields["gpus"] is None and lonely.fields["at_risk"] == "its GPUs are unknown"
    assert lonely.fields["going"] is None and lonely.fields["move_to"] is None
    assert str(lonely.fields["next_step"]).startswith("no durable destination known: set sync.destinations")
