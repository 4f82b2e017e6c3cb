"""The /status page's content on a fixture Kubernetes node: what each table says, and what an empty one says.

The page as Chromium renders it from a running agent is tested in test_status_page.py; here the same renderer is fed
a View built from tests/fixtures/k8s-node and the objects of tests/kubeapi.py, so every case is there every run.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from storwatch.analysis.build import build_view
from storwatch.classify import Classifier
from storwatch.paths import HostPaths
from storwatch.report import view_to_dict
from storwatch.snapshot import Snapshot
from storwatch.sources.checkpoints import CheckpointFacts, RunState
from storwatch.sources.gpu import GPUFacts
from storwatch.vocabulary import Platform
from storwatch.web import render_status_page
from tests.builders import ckpt
from tests.kubeapi import PV_NFS
from tests.status_fixture import NFS_PVC, T, column, fixture_view, table


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
