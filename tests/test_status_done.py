"""The /status page says what was done about each finding: the durable copy that protects a run (where, how old the
save it protects), the checkpoint the agent asked for and whether a save answered it, a copy still running, the node's
drain and the pods being deleted as states of their own, and the alerts Alertmanager sent; and a page with long,
hostile names still fits a 1400 px window (Chromium lays it out).

The View is built from the fixture Kubernetes node of test_status_render.py; the policy's and the receiver's parts are
the dicts the agent adds to /api/status (agent/policy.py, web/alertmanager.py), written here as the agent writes them.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from storwatch.analysis.build import build_view
from storwatch.analysis.view import View
from storwatch.checkpoints.manifest import FoundCopy
from storwatch.classify import Classifier
from storwatch.report import view_to_dict
from storwatch.snapshot import Snapshot
from storwatch.sources.checkpoints import CheckpointFacts, RunState
from storwatch.sources.copies import CopiesFacts
from storwatch.sources.kubevolumes import KubeVolumeEvidence, NodeInfo
from storwatch.vocabulary import Platform
from storwatch.web import render_status_page
from tests.browser import run_chromium
from tests.builders import ckpt
from tests.status_fixture import T, column, fixture_view, table

ROOT = "/mnt/local-nvme/ckpt"


def _facts(*names: str, age: float = 600.0) -> CheckpointFacts:
    runs = tuple(
        RunState(f"{ROOT}/{n}", ROOT, (dataclasses.replace(ckpt(age), path=f"{ROOT}/{n}/step-100.pt"),)) for n in names
    )
    return CheckpointFacts(T, runs, False, None, 0.1, (ROOT,))


def _with(view: View, **facts: object) -> dict[str, Any]:
    """The fixture View rebuilt with more facts in its snapshot."""
    snap = view.snapshot
    merged = {**dict(snap.facts), **{k: v for k, v in facts.items()}}
    kube = merged.get("kube")
    classifier = Classifier("together-k8s")
    if kube is not None:
        classifier.add_provider(KubeVolumeEvidence(kube))  # type: ignore[arg-type]
    return view_to_dict(build_view(Snapshot(T, facts=merged), classifier, Platform("together-k8s", "test")))


def _policy(actions: list[dict[str, Any]], syncs: list[dict[str, Any]]) -> dict[str, Any]:
    """The policy's part of /api/status as agent/policy.py writes it, with these actions and copies (newest first)."""
    job = {
        "job": 1,
        "rule": "r",
        "why": "",
        "source": "",
        "queued_at": T - 10.0,
        "started_at": None,
        "finished_at": None,
        "deadline_at": None,
        "seconds": None,
        "bytes": 0,
        "detail": "",
    }
    return {
        "enabled": True,
        "files": [],
        "last_evaluation": T,
        "last_reload_success": True,
        "reload_errors": [],
        "rules": [],
        "active": [],
        "actions": [{"rule": "r", "action": "request_checkpoint", "kind": "run", "detail": "", **a} for a in actions],
        "syncs": [{**job, **j} for j in syncs],
    }


def _finding_line(page: str, run: str) -> str:
    panel = page.split("<section id='findings'>", 1)[1].split("</section>", 1)[0]
    (line,) = [li for li in panel.split("<li ")[1:] if f"<span class='sentence'>{run} (" in li]
    return line.split("</li>", 1)[0]


def test_a_verified_copy_shows_where_and_how_old_and_its_run_has_no_finding() -> None:
    """Two runs on node-local NVMe: the one with a verified copy of its newest save says so in the table and has no
    finding; the other still has its finding, and the table says it has no durable copy."""
    facts = _facts("safe", "bare")
    view = fixture_view(checkpoints=facts)
    newest = facts.runs[0].newest_complete
    assert newest is not None
    copy = FoundCopy(
        dest="/fsx/storwatch/safe/step-100.pt",
        source=f"{ROOT}/safe/step-100.pt",
        run=f"{ROOT}/safe",
        covers=newest.mtime,
        finished=T - 30.0,
        bytes=1 << 30,
        files=1,
    )
    data = _with(view, copies=CopiesFacts((copy,), ("/fsx/storwatch",)))
    (safe,) = [r for r in data["checkpoints"] if r["run"] == "safe"]
    assert safe["durable_copy"] == {
        "where": "/fsx/storwatch/safe/step-100.pt",
        "how": "verified",
        "checkpoint": "step-100.pt",
        "covers": newest.mtime,
        "covers_age_seconds": T - newest.mtime,
        "made_at": T - 30.0,
    }
    page = render_status_page(data)
    header, rows = table(page, "checkpoints")
    done = column(header, rows, "Done about it")
    assert done["safe"] == "verified copy of step-100.pt (a save 10 min old) at /fsx/storwatch/safe/step-100.pt", done
    assert done["bare"] == "no durable copy", done
    assert "<span class='sentence'>safe (" not in page
    assert "bare (" in _finding_line(page, "bare")


def test_a_checkpoint_request_shows_with_its_answer() -> None:
    """The request the policy made of a run, how it went, and whether a save newer than it came; a record of asking
    nothing (the rule resolved, the same request within its cooldown) does not hide the request that was made."""
    view = fixture_view(checkpoints=_facts("asked", "waiting", age=60.0))
    data = view_to_dict(view)
    data["policy"] = _policy(
        [  # newest first, as agent/policy.py lists them
            {"at": T - 2.0, "key": "asked", "outcome": "skipped", "detail": "a resolved rule asks for no checkpoint"},
            {"at": T - 5.0, "key": "waiting", "outcome": "ok", "detail": "SIGUSR1 to pid 4242"},
            {"at": T - 120.0, "key": "asked", "outcome": "ok", "detail": "SIGUSR1 to pid 4141"},
        ],
        [],
    )
    page = render_status_page(data)
    header, rows = table(page, "checkpoints")
    done = column(header, rows, "Done about it")
    assert "checkpoint asked 2 min ago (ok: SIGUSR1 to pid 4141); answered by a save 60 s old" in done["asked"], done
    assert "checkpoint asked 5 s ago (ok: SIGUSR1 to pid 4242); not answered yet" in done["waiting"], done
    assert "Done: no durable copy; checkpoint asked 5 s ago" in _finding_line(page, "waiting")


def test_a_running_copy_and_a_failed_one_show() -> None:
    view = fixture_view(checkpoints=_facts("copying", "refused"))
    data = view_to_dict(view)
    data["policy"] = _policy(
        [],
        [
            {"run": "copying", "state": "running", "destination": "/fsx/storwatch"},
            {"run": "refused", "state": "failed", "destination": "/fsx/storwatch", "detail": "no space left"},
        ],
    )
    header, rows = table(render_status_page(data), "checkpoints")
    done = column(header, rows, "Done about it")
    assert "copy to /fsx/storwatch running" in done["copying"], done
    assert "copy to /fsx/storwatch failed: no space left" in done["refused"], done


def test_a_drain_and_pods_being_deleted_are_states_of_their_own() -> None:
    view = fixture_view()
    kube = view.snapshot.kube
    assert kube is not None
    trainer = next(iter(kube.cluster.pods.values()))
    leaving = dataclasses.replace(trainer, deletion_timestamp=T + 20.0, grace_seconds=30.0)  # the time it is killed
    pods = {**kube.cluster.pods, leaving.uid: leaving}
    cluster = dataclasses.replace(kube.cluster, pods=pods)
    node = NodeInfo(
        "gpu-node-1", True, (("ToBeDeletedByClusterAutoscaler", "NoSchedule"),), ("ToBeDeletedByClusterAutoscaler",)
    )
    assert node.draining
    page = render_status_page(_with(view, kube=dataclasses.replace(kube, cluster=cluster, node=node)))
    section = page.split("<section id='node-state' class='leaving'>", 1)[1].split("</section>", 1)[0]
    assert "<b>draining</b>: cordoned, with the removal taint ToBeDeletedByClusterAutoscaler" in section, section
    assert f"<b>pods being deleted</b>: {leaving.namespace}/{leaving.name} (20 s left)" in section, section

    quiet = render_status_page(view_to_dict(view))
    assert "<section id='node-state'><p>Node" in quiet and "not cordoned, not draining" in quiet
    assert "leaving" not in quiet.split("<section id='node-state'", 1)[1].split("</section>", 1)[0]


def test_alerts_received_from_alertmanager_are_listed() -> None:
    data = view_to_dict(fixture_view())
    assert "alerts-received" not in render_status_page(data)  # no receiver: no section
    data["alerts"] = []
    assert "none received" in render_status_page(data)
    data["alerts"] = [
        {
            "fingerprint": "a",
            "status": "firing",
            "starts_at": T - 90.0,
            "ends_at": None,
            "received_at": T - 60.0,
            "labels": {"alertname": "StorwatchCheckpointOnEphemeralStorage", "severity": "warning", "run": "r<1>"},
            "annotations": {"summary": "checkpoints on <node-local> storage"},
        },
        {
            "fingerprint": "b",
            "status": "resolved",
            "starts_at": T - 600.0,
            "ends_at": T - 5.0,
            "received_at": T - 5.0,
            "labels": {"alertname": "StorwatchMountHung", "mountpoint": "/mnt/x"},
            "annotations": {},
        },
    ]
    header, rows = table(render_status_page(data), "alerts-received")
    assert header == ["Alert", "Severity", "About", "Status", "Since", "Summary"]
    assert rows == [
        [
            "StorwatchCheckpointOnEphemeralStorage",
            "warning",
            "run=r<1>",
            "firing",
            "90 s ago",
            "checkpoints on <node-local> storage",
        ],
        ["StorwatchMountHung", "-", "mountpoint=/mnt/x", "resolved", "10 min ago", ""],
    ]


def test_a_page_of_long_hostile_names_fits_a_1400_px_window(chromium: str, tmp_path: Path) -> None:
    """Run names of 200 characters without a break, a 300-character detail and a long alert label: Chromium lays the
    page out in a 1400 px window and the document is no wider than the window."""
    long = "x" * 200
    view = fixture_view(checkpoints=_facts(long, "a" + "-b" * 120))
    data = view_to_dict(view)
    data["policy"] = _policy(
        [{"at": T - 5.0, "key": long, "outcome": "failed", "detail": "y" * 300}],
        [{"run": long, "state": "running", "destination": "/fsx/" + "d" * 250}],
    )
    data["alerts"] = [
        {
            "fingerprint": "a",
            "status": "firing",
            "starts_at": T - 1.0,
            "ends_at": None,
            "received_at": T,
            "labels": {"alertname": "A" * 150, "run": long},
            "annotations": {"summary": "s" * 400},
        }
    ]
    page = render_status_page(data)
    assert "Done about it" in page and long in page
    probe = "<script>document.title = 'width=' + document.documentElement.scrollWidth;</script></body>"
    html_file = tmp_path / "page.html"
    html_file.write_text(page.replace("</body>", probe, 1), encoding="utf-8")
    done = run_chromium(chromium, tmp_path / "profile", "--window-size=1400,900", "--dump-dom", html_file.as_uri())
    assert done.returncode == 0, done.stderr.decode(errors="replace")[-2000:]
    dom = done.stdout.decode()
    width = int(dom.split("<title>width=", 1)[1].split("<", 1)[0])
    assert 0 < width <= 1400, width
