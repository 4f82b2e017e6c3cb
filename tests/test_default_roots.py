"""Zero configuration: where the checkpoint scan looks when nothing is configured, and how it says so.

Each platform preset on a fixture node (a real-format mount table under --path.procfs, the directories under
--path.rootfs): the places the platform puts people's data where the mount table says they are lost with the node
are searched (home directories where node-local, node-local scratch and data mounts, the kubelet's pod volumes),
each with why; durable places are passed over, said so; nothing of the root filesystem's system directories, no
read-only image, no file-backed loop device, no mount a program made in a temporary directory. A real agent with no
``checkpoints`` section finds a checkpoint in a node-local home directory; on an empty node /status names the places
it searched, and on a node with none it says so and how to name one, never "nothing found".
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from storwatch.classify import Classifier, default_places
from storwatch.config import CheckpointsConfig
from storwatch.paths import HostPaths
from storwatch.registry import SourceContext, checkpoint_plan
from storwatch.report import view_to_dict
from storwatch.snapshot import Snapshot
from storwatch.sources.checkpoint_key import (
    CONFIGURED,
    KUBELET_WHY,
    DefaultPlaces,
    SearchPlan,
    SearchRoot,
    search_plan,
)
from storwatch.sources.checkpoints import CheckpointFacts, CheckpointSource
from storwatch.vocabulary import CollectorStatus, Mount, Platform
from tests.agentproc import AgentProcess, start_agent, wait_until
from tests.builders import node_mounts, node_tree, torch_like_zip

FIXTURES = Path(__file__).parent / "fixtures"
NO_CLUSTER = {"KUBECONFIG": None, "KUBERNETES_SERVICE_HOST": None}

SLURM_HOME = (
    "home directories; on Together Slurm clusters /home is NFS from the head node: it persists when this node is lost"
)
# Per preset: the fixture node, the places searched (in order, with why) and those passed over. The rootfs tree has a
# directory at every mountpoint of the table (so none is left out merely for not being there) and /tmp.
PRESETS = {
    "generic": (
        "generic-node",
        [
            ("/home", "home directories, node-local: ext4 on /dev/nvme0n1p2"),
            ("/data", "a node-local xfs mount on /dev/nvme1n1"),
            ("/opt/dlami/nvme", "a node-local ext4 mount on /dev/nvme2n1"),
        ],
        [],
    ),
    "together-k8s": (
        "k8s-node",
        [
            ("/home", "home directories, node-local on together-k8s: ext4 on /dev/nvme0n1p1"),
            ("/mnt/local-nvme", "a node-local xfs mount on /dev/nvme1n1"),
            ("/var/lib/kubelet/pods", KUBELET_WHY),
        ],
        [],
    ),
    "together-slurm": (
        "slurm-node",
        [
            ("/scratch", "scratch space, node-local on together-slurm: xfs on /dev/nvme1n1"),
            ("/tmp", "temporary files, node-local on together-slurm: ext4 on /dev/nvme0n1p1"),
        ],
        [("/home", SLURM_HOME)],
    ),
    "gradient": (
        "gradient-node",
        [
            ("/home/paperspace", "the temporary workspace, node-local on gradient: overlay"),
            (
                "/artifacts",
                "artifacts, collected only when the run ends, node-local on gradient: ext4 on /dev/nvme0n1p1",
            ),
        ],
        [],
    ),
}
HOME_RUN = {  # where each preset's node keeps a person's run on storage lost with the node, and its label
    "generic": ("/home/alice/run1", "alice/run1"),
    "together-k8s": ("/home/alice/run1", "alice/run1"),
    "together-slurm": ("/scratch/alice/run1", "alice/run1"),
    "gradient": ("/home/paperspace/run1", "run1"),
}


def context(proc: Path, root: Path, platform: str) -> SourceContext:
    classifier = Classifier(platform)
    return SourceContext(
        HostPaths(procfs=str(proc), rootfs=str(root)),
        time.time,
        lambda key: None,  # before the mount source's first report: the plan reads the table itself
        lambda consumer: None,
        classifier=lambda: classifier,
    )


def pairs(roots: tuple[SearchRoot, ...]) -> list[tuple[str, str]]:
    return [(r.path, r.why) for r in roots]


@pytest.mark.parametrize("platform", list(PRESETS))
def test_each_preset_searches_the_places_it_loses_and_says_why(tmp_path: Path, platform: str) -> None:
    node, searched, passed = PRESETS[platform]
    proc, root = node_tree(tmp_path, node)
    plan = checkpoint_plan(context(proc, root, platform), CheckpointsConfig())
    assert pairs(plan.roots) == searched
    assert pairs(plan.passed_over) == passed
    assert plan.pending is None and plan.defaults
    # Never the root filesystem, its system directories, an image, a loop device or a temporary directory's mount.
    never = {"/", "/boot/efi", "/run/user/1000", "/dev/shm", "/snap/core20/2318", "/var/lib/docker", "/mnt/image",
             "/tmp/build-7f3a/mnt", "/mnt/team", "/storage", "/notebooks"}  # fmt: skip
    assert not never & {r.path for r in plan.roots}


def test_a_place_that_is_not_on_this_node_is_neither_searched_nor_said(tmp_path: Path) -> None:
    proc, root = node_tree(tmp_path, "slurm-node")
    shutil.rmtree(root / "scratch")
    (root / "tmp").rmdir()
    plan = checkpoint_plan(context(proc, root, "together-slurm"), CheckpointsConfig())
    assert plan.roots == ()
    assert pairs(plan.passed_over) == [("/home", SLURM_HOME)]
    said = plan.nowhere()
    assert said.startswith("no place searched for checkpoints, so nothing is known of what this node would lose")
    assert f"/home: {SLURM_HOME}" in said and said.endswith("name the directories to search in checkpoints.roots")


def test_data_mounts_below_three_levels_are_searched_up_to_the_bound(tmp_path: Path) -> None:
    # /mnt/disks/ssd0/cache/extra is five levels down: a mount a program made, not a node's disk.
    proc, root = node_tree(tmp_path, "generic-node")
    plan = checkpoint_plan(context(proc, root, "generic"), CheckpointsConfig())
    assert "/mnt/disks/ssd0/cache/extra" not in {r.path for r in plan.roots}


def test_durable_and_stuck_places_are_never_looked_at(tmp_path: Path) -> None:
    """A directory on NFS or a stuck mount is not even stat'ed from the agent's threads: a hung server would hang
    the stat. The walk (in the helper, with a deadline) is the only thing that goes there."""
    mounts = node_mounts("slurm-node")
    stuck = [m if m.mountpoint != "/scratch" else _stuck(m) for m in mounts]
    asked: list[str] = []

    def directory(path: str) -> bool:
        asked.append(path)
        return path == "/tmp"  # of the places on local storage, only /tmp is there

    places = default_places(Classifier("together-slurm"), stuck, directory)
    assert "/home" not in asked and "/scratch" not in asked and "/shared" not in asked
    assert pairs(places.passed_over) == [
        ("/home", SLURM_HOME),
        ("/scratch", "scratch space; its mount /scratch is stuck"),
    ]
    assert pairs(places.roots) == [("/tmp", "temporary files, node-local on together-slurm: ext4 on /dev/nvme0n1p1")]


def _stuck(mount: Mount) -> Mount:
    import dataclasses

    return dataclasses.replace(mount, stuck=True, stuck_seconds=30.0)


def test_an_override_decides_what_is_searched(tmp_path: Path) -> None:
    from storwatch.vocabulary import Durability, Override

    mounts = node_mounts("generic-node")
    classifier = Classifier("generic", (Override("/data", Durability.CLUSTER, "replicated by the storage team"),))
    places = default_places(classifier, mounts, lambda path: True)
    assert "/data" not in {r.path for r in places.roots}


def test_a_symbolic_link_is_not_followed_and_said(tmp_path: Path) -> None:
    proc, root = node_tree(tmp_path, "generic-node")
    (root / "home").rmdir()
    (root / "home").symlink_to(root / "data")
    plan = checkpoint_plan(context(proc, root, "generic"), CheckpointsConfig())
    assert "/home" not in {r.path for r in plan.roots}
    assert (
        "/home",
        "home directories; a symbolic link, not followed; name the directories to search in checkpoints.roots "
        "(its target)",
    ) in pairs(plan.passed_over)


def test_configured_roots_are_added_to_the_defaults_or_replace_them(tmp_path: Path) -> None:
    paths = HostPaths(rootfs=str(tmp_path))
    defaults = DefaultPlaces((SearchRoot("/home", "home"), SearchRoot("/data", "data")), (SearchRoot("/x", "no"),))
    added = search_plan(paths, CheckpointsConfig(roots=("/ckpt", "/data/run/")), defaults)
    # Added, configured first; a default at or inside a configured root is that root's walk already.
    assert pairs(added.roots) == [
        ("/ckpt", CONFIGURED),
        ("/data/run", CONFIGURED),
        ("/home", "home"),
        ("/data", "data"),
    ]
    inside = search_plan(paths, CheckpointsConfig(roots=("/home/alice",)), defaults)
    assert pairs(inside.roots) == [("/home/alice", CONFIGURED), ("/home", "home"), ("/data", "data")]
    covered = search_plan(paths, CheckpointsConfig(roots=("/",)), defaults)
    assert pairs(covered.roots) == [("/", CONFIGURED)]
    replaced = search_plan(paths, CheckpointsConfig(roots=("/ckpt",), default_roots=False), defaults)
    assert pairs(replaced.roots) == [("/ckpt", CONFIGURED)] and replaced.passed_over == ()
    assert replaced.local_roots(paths) == [str(tmp_path / "ckpt")]
    nothing = search_plan(paths, CheckpointsConfig(default_roots=False), defaults)
    assert nothing.nowhere().endswith(
        "checkpoints.default_roots is false, checkpoints.roots is empty and this node has no kubelet pod volumes; "
        "name the directories to search in checkpoints.roots"
    )


def test_an_unreadable_mount_table_leaves_the_defaults_unchosen_and_says_so(tmp_path: Path) -> None:
    (tmp_path / "proc").mkdir()
    (tmp_path / "root").mkdir()
    ctx = context(tmp_path / "proc", tmp_path / "root", "generic")
    plan = checkpoint_plan(ctx, CheckpointsConfig(roots=("/ckpt",)))
    assert pairs(plan.roots) == [("/ckpt", CONFIGURED)]
    assert plan.pending is not None and "cannot read the mount table" in plan.pending
    assert "the default places could not be chosen (cannot read the mount table" in (
        search_plan(ctx.paths, CheckpointsConfig(), None, plan.pending).nowhere()
    )


def test_the_source_searches_the_plan_and_reports_it_and_a_reload_replans(tmp_path: Path, make_source: Any) -> None:
    proc, root = node_tree(tmp_path, "k8s-node")
    (root / "home/alice/run1").mkdir(parents=True)
    torch_like_zip(root / "home/alice/run1/step-100.pt")
    ctx = context(proc, root, "together-k8s")
    source: CheckpointSource = make_source((), plan=lambda s: checkpoint_plan(ctx, s), paths=ctx.paths,
                                           mountpoints=lambda: [], deep_per_scan=0)  # fmt: skip
    facts = wait_for_runs(source)
    assert [(r.root, r.path) for r in facts.runs] == [(str(root / "home"), str(root / "home/alice/run1"))]
    assert facts.plan is not None and facts.plan.roots[0].path == "/home"
    assert facts.roots == tuple(facts.plan.local_roots(ctx.paths))
    assert source.off_reason is None

    source.configure(CheckpointsConfig(default_roots=False, kubelet=False, deep_per_scan=0))
    facts = source.collect()
    assert facts.runs == () and facts.roots == ()
    assert facts.plan == SearchPlan((), (), defaults=False)
    assert source.off_reason == facts.plan.nowhere()


def wait_for_runs(source: CheckpointSource) -> CheckpointFacts:
    deadline = time.monotonic() + 30
    facts = source.collect()
    while (source.waiting or not facts.runs) and time.monotonic() < deadline:
        time.sleep(0.05)
        facts = source.collect()
    return facts


# -- how it is said: /status, /api/status, scan


class ElementText(HTMLParser):
    """The text and class of the element with a given id (and of everything inside it)."""

    def __init__(self, element_id: str) -> None:
        super().__init__(convert_charrefs=True)
        self.element_id = element_id
        self.cls: str | None = None
        self.found = False
        self._depth = 0
        self._text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if self._depth:
            self._depth += 1
        elif dict(attrs).get("id") == self.element_id:
            self.found, self._depth, self.cls = True, 1, dict(attrs).get("class")

    def handle_endtag(self, tag: str) -> None:
        if self._depth:
            self._depth -= 1

    def handle_data(self, data: str) -> None:
        if self._depth:
            self._text.append(data)

    @property
    def text(self) -> str:
        return " ".join("".join(self._text).split())


def element(page: str, element_id: str) -> ElementText:
    parser = ElementText(element_id)
    parser.feed(page)
    parser.close()
    assert parser.found, f"no element #{element_id}"
    return parser


def render(facts: CheckpointFacts | None, collectors: tuple[CollectorStatus, ...] = ()) -> tuple[dict[str, Any], str]:
    from storwatch.analysis.view import View
    from storwatch.web import render_status_page

    view = View(Snapshot(1000.0, collectors=collectors, checkpoints=facts), Platform("together-k8s", "test"))
    data = view_to_dict(view)
    return data, render_status_page(data)


K8S_PLAN = SearchPlan(
    (SearchRoot("/home", PRESETS["together-k8s"][1][0][1]), SearchRoot("/var/lib/kubelet/pods", KUBELET_WHY)),
    (SearchRoot("/storage", "shared storage; nfs4 survives losing this node"),),
)


def test_an_empty_node_names_where_it_looked() -> None:
    facts = CheckpointFacts(1000.0, (), False, None, 0.1, ("/home", "/var/lib/kubelet/pods"), plan=K8S_PLAN)
    data, page = render(facts, (CollectorStatus("checkpoints", True, 0.1, 1000.0),))
    assert data["checkpoint_search"] == {
        "searched": [
            {"path": "/home", "why": "home directories, node-local on together-k8s: ext4 on /dev/nvme0n1p1"},
            {"path": "/var/lib/kubelet/pods", "why": "the kubelet's pod volumes"},
        ],
        "passed_over": [{"path": "/storage", "why": "shared storage; nfs4 survives losing this node"}],
        "default_roots": True,
        "pending": None,
        "nowhere": None,
        "stopped_at_limit": None,
    }
    assert element(page, "findings").cls == "none"
    assert element(page, "searched").text == (
        "Searched /home (home directories, node-local on together-k8s: ext4 on /dev/nvme0n1p1); "
        "/var/lib/kubelet/pods (the kubelet's pod volumes): nothing important found on storage that is lost with "
        "this node."
    )
    assert element(page, "search-caveats").text == (
        "Not searched: /storage (shared storage; nfs4 survives losing this node)."
    )


def test_a_node_searched_nowhere_never_says_nothing_found() -> None:
    plan = SearchPlan((), (SearchRoot("/home", SLURM_HOME),))
    facts = CheckpointFacts(1000.0, (), False, None, 0.0, (), plan=plan)
    _, page = render(facts, (CollectorStatus("checkpoints", False, 0.0, None, None, off_reason=plan.nowhere()),))
    panel = element(page, "findings")
    assert panel.cls == "unsearched"
    assert "Nothing important found" not in panel.text and "nothing important found" not in panel.text
    assert element(page, "searched").text == (
        "No place searched for checkpoints, so nothing is known of what this node would lose: checkpoints.roots is "
        "empty, and this node has no node-local home directories, scratch or data mounts and no kubelet pod volumes "
        f"(not searched: /home: {SLURM_HOME}); name the directories to search in checkpoints.roots."
    )


@pytest.mark.parametrize(
    ("facts", "collectors", "said"),
    [
        pytest.param(None, (), "The checkpoint scan has not reported yet: nothing is known yet of what", id="not-yet"),
        pytest.param(
            None,
            (CollectorStatus("checkpoints", False, 0.0, None, "cannot start the helper"),),
            "The checkpoint scan failed (cannot start the helper): nothing is known of what this node would lose.",
            id="failed",
        ),
    ],
)
def test_without_facts_it_says_nothing_is_known(
    facts: CheckpointFacts | None, collectors: tuple[CollectorStatus, ...], said: str
) -> None:
    _, page = render(facts, collectors)
    assert element(page, "findings").cls == "unsearched"
    assert element(page, "searched").text.startswith(said)


def test_a_walk_cut_short_is_not_called_safe() -> None:
    facts = CheckpointFacts(1000.0, (), True, "max_entries (200000)", 0.1, ("/home",), plan=K8S_PLAN)
    _, page = render(facts)
    assert element(page, "findings").cls == "unsure"
    assert "The walk stopped at a limit (max_entries (200000)): what lies past it was not seen." in (
        element(page, "search-caveats").text
    )


def test_findings_say_where_the_scan_looked_too(tmp_path: Path) -> None:
    from storwatch.analysis.build import build_view
    from storwatch.web import render_status_page

    proc, root = node_tree(tmp_path, "k8s-node")
    (root / "home/alice/run1").mkdir(parents=True)
    torch_like_zip(root / "home/alice/run1/step-100.pt")
    ctx = context(proc, root, "together-k8s")
    source = CheckpointSource((), CheckpointsConfig(deep_per_scan=0), plan=lambda s: checkpoint_plan(ctx, s),
                              paths=ctx.paths, mountpoints=lambda: [])  # fmt: skip
    try:
        facts = wait_for_runs(source)
    finally:
        source.close()
    mounts = tuple(node_mounts("k8s-node"))
    view = build_view(
        Snapshot(time.time(), mounts=mounts, checkpoints=facts),
        Classifier("together-k8s"),
        Platform("together-k8s", "test"),
        paths=ctx.paths,
    )
    page = render_status_page(view_to_dict(view))
    assert "alice/run1" in element(page, "findings").text
    assert element(page, "searched").text.startswith(
        "Searched /home (home directories, node-local on together-k8s: ext4 on /dev/nvme0n1p1)"
    )


# -- a real agent with no checkpoints section, on each preset's node


def agent_config(tmp_path: Path, proc: Path, root: Path, platform: str) -> Path:
    cfg = tmp_path / "storwatch.yaml"
    cfg.write_text(
        f"platform: {platform}\n"
        f"paths: {{procfs: {proc}, sysfs: {FIXTURES / 'gpu-node' / 'sys'}, rootfs: {root}}}\n"
        "gpu: {enabled: false}\nkube: {enabled: false}\n"
    )
    assert "checkpoints" not in cfg.read_text()
    return cfg


def status(agent: AgentProcess) -> dict[str, Any] | None:
    resp = agent.fetch("/api/status")
    return json.loads(resp.body) if resp.status == 200 else None  # type: ignore[no-any-return]


@pytest.fixture
def agents() -> Iterator[list[AgentProcess]]:
    """Agents started together (so that their start-ups overlap), stopped at the end."""
    started: list[AgentProcess] = []
    with ExitStack() as stack:
        stack.callback(lambda: [a.stop() for a in started])
        yield started


@pytest.mark.parametrize("platform", list(PRESETS))
def test_an_agent_with_no_configuration_finds_a_checkpoint_in_a_node_local_home_and_lists_where_it_looked(
    tmp_path: Path, platform: str, agents: list[AgentProcess]
) -> None:
    node, searched, passed = PRESETS[platform]
    run_dir, label = HOME_RUN[platform]
    with_run, empty = tmp_path / "with-run", tmp_path / "empty"
    configs = []
    for base in (with_run, empty):
        base.mkdir()
        proc, root = node_tree(base, node)
        configs.append(agent_config(base, proc, root, platform))
    run = with_run / "root" / run_dir.lstrip("/")
    run.mkdir(parents=True)
    torch_like_zip(run / "step-100.pt")
    for cfg in configs:
        agents.append(start_agent("--config", str(cfg), "--listen", "127.0.0.1:0", env=NO_CLUSTER))
    for agent in agents:
        agent.wait_serving(timeout=30)
    finder, quiet = agents

    # The finding, from no configuration at all.
    found = wait_until(
        lambda: [f for f in (status(finder) or {}).get("findings", []) if f.get("run") == label],
        timeout=60,
        what=f"a finding for {label}",
    )
    assert found[0]["kind"] == "checkpoint", found
    page = finder.fetch("/status").body.decode()
    assert label in element(page, "findings").text
    said = element(page, "searched").text
    assert said.startswith("Searched " + "; ".join(f"{p} ({why})" for p, why in searched)), said

    # The empty node: /status names every place it searched, and why, and only then says nothing was found.
    def ready() -> dict[str, Any] | None:
        data = status(quiet)
        return data if data is not None and data["ready"] and data["checkpoint_search"] is not None else None

    data = wait_until(ready, timeout=60, what="the empty node's first checkpoint scan")
    assert [(s["path"], s["why"]) for s in data["checkpoint_search"]["searched"]] == searched
    assert [(s["path"], s["why"]) for s in data["checkpoint_search"]["passed_over"]] == passed
    assert data["findings"] == [] and data["checkpoints"] == []
    assert {c["name"]: c["state"] for c in data["collectors"]}["checkpoints"] == "ok"
    page = quiet.fetch("/status").body.decode()
    assert element(page, "findings").cls == "none"
    listed = "; ".join(f"{p} ({why})" for p, why in searched)
    assert element(page, "searched").text == (
        f"Searched {listed}: nothing important found on storage that is lost with this node."
    )


def test_an_agent_on_a_node_with_nowhere_to_look_says_so_and_how_to_name_a_place(
    tmp_path: Path, agents: list[AgentProcess]
) -> None:
    proc, root = node_tree(tmp_path, "slurm-node")
    shutil.rmtree(root / "scratch")
    (root / "tmp").rmdir()
    agents.append(start_agent("--config", str(agent_config(tmp_path, proc, root, "together-slurm")), "--listen",
                              "127.0.0.1:0", env=NO_CLUSTER))  # fmt: skip
    agents[0].wait_serving(timeout=30)

    def off() -> dict[str, Any] | None:
        data = status(agents[0])
        checkpoints = {c["name"]: c for c in (data or {}).get("collectors", [])}.get("checkpoints")
        return data if checkpoints is not None and checkpoints["state"] == "off" else None

    data = wait_until(off, timeout=60, what="the checkpoint collector off")
    reason = {c["name"]: c for c in data["collectors"]}["checkpoints"]["off_reason"]
    assert reason.startswith("no place searched for checkpoints, so nothing is known of what this node would lose")
    assert data["checkpoint_search"]["searched"] == [] and data["checkpoint_search"]["nowhere"] == reason
    page = agents[0].fetch("/status").body.decode()
    assert element(page, "findings").cls == "unsearched"
    said = element(page, "searched").text
    assert "nothing important found" not in said.lower()
    assert f"(not searched: /home: {SLURM_HOME})" in said
    assert said.endswith("name the directories to search in checkpoints.roots.")


# -- storwatch scan says it too


def run_scan(proc: Path, root: Path, platform: str, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "storwatch", "scan", "--path.procfs", str(proc), "--path.rootfs", str(root),
         "--platform", platform, "--timeout", "1", *extra],
        capture_output=True, text=True, timeout=120, cwd=Path(__file__).resolve().parents[1],
        env={**os.environ, "KUBECONFIG": "", "KUBERNETES_SERVICE_HOST": ""}, check=False,
    )  # fmt: skip


def test_scan_with_no_configuration_walks_the_default_places_and_says_where(tmp_path: Path) -> None:
    proc, root = node_tree(tmp_path, "slurm-node")
    (root / "scratch/alice/run1").mkdir(parents=True)
    torch_like_zip(root / "scratch/alice/run1/step-100.pt")
    table = run_scan(proc, root, "together-slurm")
    assert table.returncode == 0, table.stderr
    (line,) = [x for x in table.stdout.splitlines() if x.startswith("checkpoints: ")]
    assert line == (
        "checkpoints: 1 checkpoint run, 1 finding (listed by --json). Searched /scratch (scratch space, node-local on "
        "together-slurm: xfs on /dev/nvme1n1); /tmp (temporary files, node-local on together-slurm: ext4 on "
        f"/dev/nvme0n1p1). Not searched: /home ({SLURM_HOME})."
    )
    data = json.loads(run_scan(proc, root, "together-slurm", "--json").stdout)
    assert [f["run"] for f in data["findings"]] == ["alice/run1"]
    assert [s["path"] for s in data["checkpoint_search"]["searched"]] == ["/scratch", "/tmp"]


def test_scan_on_a_node_with_nowhere_to_look_says_so(tmp_path: Path) -> None:
    proc, root = node_tree(tmp_path, "slurm-node")
    shutil.rmtree(root / "scratch")
    (root / "tmp").rmdir()
    table = run_scan(proc, root, "together-slurm")
    assert table.returncode == 0, table.stderr
    (line,) = [x for x in table.stdout.splitlines() if x.startswith("checkpoints: ")]
    assert line.startswith("checkpoints: No place searched for checkpoints, so nothing is known of what this node")
    assert line.endswith("name the directories to search in checkpoints.roots.")
