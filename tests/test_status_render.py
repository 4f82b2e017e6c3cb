"""The /status page's content on a fixture Kubernetes node: what each table says, and what an empty one says.

The page as Chromium renders it from a running agent is tested in test_status_page.py; here the same renderer is fed
a View built from tests/fixtures/k8s-node and the objects of tests/kubeapi.py, so every case is there every run.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from storwatch.analysis.build import build_view
from storwatch.analysis.view import View
from storwatch.classify import Classifier
from storwatch.paths import HostPaths
from storwatch.report import view_to_dict
from storwatch.snapshot import Snapshot
from storwatch.sources.checkpoints import CheckpointFacts, RunState
from storwatch.sources.gpu import GPUFacts
from storwatch.sources.kube import pod_info, pv_info, pvc_info, storage_class_info
from storwatch.sources.kubevolumes import ClusterObjects, KubeFacts, KubeVolumeEvidence
from storwatch.sources.mounts import PSEUDO_FSTYPES
from storwatch.vocabulary import FsUsage, Platform
from storwatch.web import render_status_page
from tests.browser import TableParser
from tests.builders import ckpt, fixture_mounts
from tests.kubeapi import PV_NFS, TRAINER_UID, k8s_node_objects

T = 1_800_000_000.0
NFS_PVC = f"/var/lib/kubelet/pods/{TRAINER_UID}/volumes/kubernetes.io~csi/{PV_NFS}/mount"


def kube_facts() -> KubeFacts:
    objects = k8s_node_objects()
    of = {kind: [o for o in objects if o["kind"] == kind] for kind in {o["kind"] for o in objects}}
    cluster = ClusterObjects.of(
        pods=[pod_info(o) for o in of["Pod"] if o["spec"].get("nodeName") == "gpu-node-1"],
        pvcs=[pvc_info(o) for o in of["PersistentVolumeClaim"]],
        pvs=[pv_info(o) for o in of["PersistentVolume"]],
        storage_classes=[storage_class_info(o) for o in of["StorageClass"]],
    )
    return KubeFacts(enabled=True, api_up=True, cluster=cluster, timestamp=T)


def fixture_view(
    gpus: GPUFacts | None = None, checkpoints: CheckpointFacts | None = None, paths: HostPaths | None = None
) -> View:
    # As the mount source keeps them: proc and sysfs themselves are dropped by type, /sys/fs/cgroup (tmpfs) is not.
    mounts = {mp: m for mp, m in fixture_mounts().items() if m.fstype not in PSEUDO_FSTYPES}
    # / as df would show it: 4 KiB blocks, 1000 of them, 100 free of which 40 are available to users.
    mounts["/"] = dataclasses.replace(mounts["/"], usage=FsUsage(4096 * 1000, 4096 * 100, 4096 * 40, 10, 5))
    facts = kube_facts()
    evidence = KubeVolumeEvidence(facts)
    classifier = Classifier("together-k8s")
    classifier.add_provider(evidence)
    snap = Snapshot(T, tuple(mounts.values()), gpus=gpus, checkpoints=checkpoints, kube=facts)
    return build_view(snap, classifier, Platform("together-k8s", "test"), paths=paths)


def table(page: str, table_id: str) -> tuple[list[str], list[list[str]]]:
    parser = TableParser(table_id)
    parser.feed(page)
    parser.close()
    assert parser.found, table_id
    (header,) = parser.head_rows
    return header, parser.body_rows


def column(header: list[str], rows: list[list[str]], name: str) -> dict[str, str]:
    i = header.index(name)
    return {row[0]: row[i] for row in rows}


def test_mounts_table_shows_kubernetes_objects_df_usage_and_hides_kernel_interfaces() -> None:
    data = view_to_dict(fixture_view())
    page = render_status_page(data)
    header, rows = table(page, "mounts")
    shown = [row[0] for row in rows]
    # /sys/fs/cgroup is a tmpfs where the kernel shows cgroups: not storage, named under the table instead.
    assert "/sys/fs/cgroup" not in shown
    assert [m["mountpoint"] for m in data["mounts"] if m["pseudo"]] == ["/sys/fs/cgroup"]
    assert "Not shown: /sys/fs/cgroup under /proc and /sys" in " ".join(page.split())
    assert shown == [m["mountpoint"] for m in data["mounts"] if not m["pseudo"]]
    assert f'<b id="mount-count">{len(shown)}</b>' in page

    kube = column(header, rows, "Kubernetes")
    assert kube[NFS_PVC] == (
        f"train/trainer-0, pvc shared, PVC ckpt-shared -> PV {PV_NFS}, StorageClass nfs (nfs.csi.k8s.io)"
    )
    assert kube["/fsx"] == "train/trainer-0, hostPath fsx"
    assert kube["/"] == "-"
    durability = column(header, rows, "Durability")
    assert durability["/fsx"] == durability["/shared"] == "cluster"
    # used 900 blocks, available 40: df says ceil(900 / 940) = 96%, not 900 / 1000.
    assert column(header, rows, "Used")["/"] == "96%"


def test_the_page_says_what_ephemeral_means() -> None:
    data = view_to_dict(fixture_view())
    page = " ".join(render_status_page(data).split())
    ephemeral = sum(1 for m in data["mounts"] if m["ephemeral"] and not m["pseudo"])
    assert f'ephemeral (volatile or node): <b id="ephemeral-count">{ephemeral}</b>' in page
    assert "Ephemeral</b> means volatile or node: data there is gone when this node is" in page
    for cls in ("volatile", "node", "cluster", "region"):
        assert f'<span class="d-{cls}">{cls}</span>' in page


@pytest.mark.parametrize(
    ("gpus", "line"),
    [
        pytest.param(
            GPUFacts(T, False, None, "nvmlInit: NVML Shared Library Not Found", ()),
            "no GPUs: NVML not available (nvmlInit: NVML Shared Library Not Found)",
            id="no-nvml",
        ),
        pytest.param(GPUFacts(T, True, "550.54", None, ()), "no GPUs: NVML answers but lists none", id="none-listed"),
    ],
)
def test_an_empty_gpu_table_says_why(gpus: GPUFacts, line: str) -> None:
    _, rows = table(render_status_page(view_to_dict(fixture_view(gpus=gpus))), "gpus")
    assert rows == [[line]]


@pytest.mark.parametrize(
    ("roots", "line"),
    [
        pytest.param(None, "no checkpoints: the checkpoint scan has not reported yet", id="not-yet"),
        pytest.param((), "no checkpoints: no place searched for checkpoints; name the directories", id="nowhere"),
        pytest.param(
            ("/host/ckpt", "/host/var/lib/kubelet/pods"),
            "no checkpoints under /ckpt; /var/lib/kubelet/pods.",
            id="roots-as-the-host-names-them",
        ),
    ],
)
def test_an_empty_checkpoint_table_says_where_it_looked(roots: tuple[str, ...] | None, line: str) -> None:
    facts = None if roots is None else CheckpointFacts(T, (), False, None, 0.1, roots)
    data: dict[str, Any] = view_to_dict(fixture_view(checkpoints=facts, paths=HostPaths(rootfs="/host")))
    _, rows = table(render_status_page(data), "checkpoints")
    (row,) = rows
    assert row[0].startswith(line), row


def test_an_empty_latency_table_says_why() -> None:
    _, rows = table(render_status_page(view_to_dict(fixture_view())), "latency")
    assert rows == [["no latency: no mount did I/O in the last hour, and no probe ran"]]


def test_each_finding_and_checkpoint_row_names_its_run_and_path_escaped() -> None:
    """Two runs on one mount are two lines, each with its run and directory; a directory name holding a newline and
    a right-to-left override (a tenant's) is shown escaped, in the findings and in the checkpoint table."""
    root = "/mnt/local-nvme/ckpt"
    names = ("plain", "trainer/plain", "evil\n\u202etp.exe")
    runs = tuple(
        RunState(f"{root}/{name}", root, (dataclasses.replace(ckpt(60.0 * (i + 1)), path=f"{root}/{name}/s.pt"),))
        for i, name in enumerate(names)
    )
    facts = CheckpointFacts(T, runs, False, None, 0.1, (root,))
    page = render_status_page(view_to_dict(fixture_view(checkpoints=facts)))
    panel = page.split("<section id='findings'>", 1)[1].split("</section>", 1)[0]
    lines = [li.split("</li>", 1)[0] for li in panel.split("<li ")[1:]]
    assert len(lines) == 3 and len(set(lines)) == 3
    escaped = "evil\\x0a\\u202etp.exe"
    for name in ("plain", "trainer/plain", escaped):
        (line,) = [line for line in lines if f"<span class='sentence'>{name} ({root}/{name}): " in line]
        assert "1 checkpoint, 1.0 GiB, newest " in line and "copy them to /fsx" in line, line
    assert "\n\u202e" not in page and "\u202e" not in page
    header, rows = table(page, "checkpoints")
    paths = column(header, rows, "Path")
    assert paths == {"plain": f"{root}/plain", "trainer/plain": f"{root}/trainer/plain", escaped: f"{root}/{escaped}"}


def test_mount_names_holding_a_newline_or_a_space_are_told_apart() -> None:
    from storwatch.printable import printable
    from tests.builders import mount

    view = fixture_view()
    odd = ("/mnt/a\nb", "/mnt/a b")
    extra = tuple(dataclasses.replace(mount(mp, "tmpfs", "tmpfs"), mount_id=900 + i) for i, mp in enumerate(odd))
    snap = Snapshot(T, (*(mv.mount for mv in view.mounts), *extra))
    data = view_to_dict(build_view(snap, Classifier("generic"), Platform("generic", "test")))
    _, rows = table(render_status_page(data), "mounts")
    names = [row[0] for row in rows]
    assert printable(odd[0]) in names and odd[1] in names and printable(odd[0]) != odd[1], names
