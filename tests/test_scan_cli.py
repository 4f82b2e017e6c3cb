"""``storwatch scan``: what a user reads in the table and in ``--json``, checked against df and real mounts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from contextlib import AbstractContextManager as ContextManager
from pathlib import Path
from typing import Any, TypeVar

import pytest

from tests.realmounts import loop_ext4_mount

T = TypeVar("T")
Enter = Callable[[ContextManager[T]], T]

REPO_ROOT = Path(__file__).resolve().parents[1]


def run_scan(*args: str, env: dict[str, str] | None = None, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "storwatch", "scan", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO_ROOT,
        env={**os.environ, **(env or {})},
        check=False,
    )


def df_percent(path: Path) -> str:
    out = subprocess.run(["df", "--output=pcent", str(path)], capture_output=True, text=True, check=True, timeout=30)
    return out.stdout.splitlines()[-1].strip()


@pytest.mark.realpart
def test_used_percent_is_dfs_with_reserved_space_apart(real_mounts: Enter[Any], tmp_path: Path) -> None:
    # 20% of the blocks reserved for root, about a third of the rest written: counting the reserved blocks in the
    # size (as storwatch did) shows about 27%, df shows about 34%.
    mount = real_mounts(loop_ext4_mount(tmp_path / "mnt", size_mb=64, mkfs_args=("-m", "20")))
    with open(mount.mountpoint / "data", "wb") as f:
        f.write(os.urandom(16 << 20))
        os.fsync(f.fileno())
    st = os.statvfs(mount.mountpoint)
    mp = str(mount.mountpoint)

    scan = run_scan("--json", "--timeout", "2")
    assert scan.returncode == 0, scan.stderr
    (m,) = [m for m in json.loads(scan.stdout)["mounts"] if m["mountpoint"] == mp]
    used, avail = (st.f_blocks - st.f_bfree) * st.f_frsize, st.f_bavail * st.f_frsize
    assert (m["used_bytes"], m["avail_bytes"]) == (used, avail)
    assert m["reserved_bytes"] == (st.f_bfree - st.f_bavail) * st.f_frsize > 0.15 * m["size_bytes"]
    assert m["used_ratio"] == pytest.approx(used / (used + avail))

    table = run_scan("--timeout", "2")
    assert table.returncode == 0, table.stderr
    header, *rows = [line for line in table.stdout.splitlines() if line.startswith(("MOUNTPOINT", mp + " "))]
    (row,) = rows
    used_column = header.index("USED")
    shown = row[used_column : used_column + 4].strip()
    assert shown == df_percent(mount.mountpoint)
    assert 30 <= int(shown.rstrip("%")) <= 45


@pytest.mark.parametrize(
    ("used", "avail", "shown"),
    [
        pytest.param(0, 100, "0%", id="empty"),
        pytest.param(1, 999, "1%", id="rounded-up-as-df"),
        pytest.param(250, 750, "25%", id="exact"),
        pytest.param(100, 0, "100%", id="full"),
        pytest.param(0, 0, "-", id="no-space"),
        pytest.param(None, None, "-", id="no-answer"),
    ],
)
def test_usage_percent_rounds_up_like_df(used: int | None, avail: int | None, shown: str) -> None:
    from storwatch.report import usage_percent

    assert usage_percent({"used_bytes": used, "avail_bytes": avail, "size_bytes": 4096}) == shown


# -- arguments


@pytest.mark.parametrize(
    ("args", "message"),
    [
        pytest.param(
            ["--sample", "-1"], "argument --sample: must be a number of seconds 0 to 3600, got '-1'", id="s-1"
        ),
        pytest.param(["--sample", "inf"], "argument --sample: must be a number of seconds 0 to 3600", id="s-inf"),
        pytest.param(["--sample", "nan"], "argument --sample: must be a number of seconds 0 to 3600", id="s-nan"),
        pytest.param(["--timeout", "0"], "argument --timeout: must be a number of seconds greater than 0", id="t-0"),
        pytest.param(["--timeout", "-0.5"], "argument --timeout: must be a number of seconds greater than 0", id="t-"),
        pytest.param(
            ["--timeout", "1e9"], "argument --timeout: must be a number of seconds greater than 0", id="t-big"
        ),
        pytest.param(["--timeout", "soon"], "argument --timeout: must be a number of seconds", id="t-word"),
    ],
)
def test_scan_rejects_impossible_seconds(args: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    from storwatch.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(["scan", *args])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "storwatch scan: error: " + message in err, err


def test_top_level_help_names_every_command(capsys: pytest.CaptureFixture[str]) -> None:
    import argparse

    from storwatch.cli import build_parser, main

    parser = build_parser()
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    with pytest.raises(SystemExit) as exit_:
        main(["--help"])
    assert exit_.value.code == 0
    description = capsys.readouterr().out.split("positional arguments:")[0]
    named = " ".join(description.split("\n", 1)[1].split())  # past the usage line, which lists them too
    assert sorted(sub.choices) == ["agent", "plan", "policy", "scan", "sync", "verify"]
    for command in sub.choices:
        assert command in named, named


# -- fixture nodes


def fixture_tree(tmp_path: Path, node: str) -> tuple[Path, Path]:
    import shutil

    proc = tmp_path / "proc"
    shutil.copytree(REPO_ROOT / "tests" / "fixtures" / node / "proc", proc)
    (tmp_path / "root").mkdir()
    return proc, tmp_path / "root"


def test_sample_is_labelled_as_one_interval_not_as_the_agents_windows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import shutil

    from storwatch.commands import main
    from storwatch.commands import scan as scan_command

    proc, root = fixture_tree(tmp_path, "gpu-node")
    later = REPO_ROOT / "tests" / "fixtures" / "gpu-node" / "10s-later"
    slept: list[float] = []
    real_sleep = time.sleep

    def sleep(seconds: float) -> None:
        if seconds != 1.5:  # time.sleep is the module's: other waits (the helper process's) go on as they were
            real_sleep(seconds)
            return
        # Between the two reads of --sample: the kernel's counters move on as in the golden scrape's second read.
        slept.append(seconds)
        shutil.copy(later / "diskstats", proc / "diskstats")
        shutil.copy(later / "mountstats", proc / "1" / "mountstats")

    monkeypatch.setattr(scan_command.time, "sleep", sleep)
    sysfs = REPO_ROOT / "tests" / "fixtures" / "gpu-node" / "sys"
    common = ["--path.procfs", str(proc), "--path.sysfs", str(sysfs), "--path.rootfs", str(root)]
    config = tmp_path / "c.yaml"
    config.write_text("gpu: {enabled: false}\nkube: {enabled: false}\n")
    assert main(["scan", "--config", str(config), *common, "--sample", "1.5", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert slept == [1.5]
    assert (data["latency_windows"], data["sample_seconds"]) == (["sample"], 1.5)
    busy = [m for m in data["mounts"] if m["io"]["latency"]]
    assert busy, "no mount did I/O between the fixture's two reads"
    for m in busy:
        for op, windows in m["io"]["latency"].items():
            assert list(windows) == ["sample"], (m["mountpoint"], op)
            assert windows["sample"]["samples"] == 1

    shutil.copytree(REPO_ROOT / "tests" / "fixtures" / "gpu-node" / "proc", proc, dirs_exist_ok=True)
    assert main(["scan", "--config", str(config), *common, "--sample", "1.5"]) == 0
    table = capsys.readouterr().out
    assert "latency: the average of one 1.5 s interval, in milliseconds" in table
    assert "READ ms" in table and "1m" not in table and "p50" not in table


def test_scan_does_not_promise_an_nvml_retry(tmp_path: Path) -> None:
    # A one-shot scan never retries NVML; the GPU source's "retrying with backoff" is an agent's line.
    from tests.nvml import FakeNVML, FakeNVMLUnavailable, build_fake_nvml

    try:
        lib = build_fake_nvml(tmp_path / "nvml")
    except FakeNVMLUnavailable as err:
        pytest.skip(str(err))
    fake = FakeNVML(lib.parent, tmp_path)
    fake.write_script("init error=9\n")  # NVML_ERROR_DRIVER_NOT_LOADED
    proc, root = fixture_tree(tmp_path, "gpu-node")
    common = ["--path.procfs", str(proc), "--path.rootfs", str(root), "--timeout", "1"]
    scan = run_scan(*common, env={**fake.env(), "KUBECONFIG": "", "HOME": str(tmp_path)})
    assert scan.returncode == 0, scan.stderr
    assert "retry" not in scan.stderr + scan.stdout and "next try" not in scan.stderr + scan.stdout
    assert scan.stdout.splitlines()[-1].startswith("no GPUs: NVML not available (nvmlInit"), scan.stdout

    fake.write_script("gpu 0 uuid=GPU-0 name=H100 util=50 mem_total=1000\ngpu 1 uuid=GPU-1 name=H100\n")
    scan = run_scan(*common, env={**fake.env(), "KUBECONFIG": "", "HOME": str(tmp_path)})
    assert scan.returncode == 0, scan.stderr
    assert scan.stdout.splitlines()[-1].startswith("GPUs: 2"), scan.stdout


@pytest.mark.slow
def test_scan_maps_mounts_to_kubernetes_objects_and_leaves_kernel_interfaces_out(tmp_path: Path) -> None:
    from tests.kubeapi import NODE, PV_NFS, TRAINER_UID, fake_kube_api, k8s_node_objects

    proc, root = fixture_tree(tmp_path, "k8s-node")
    common = ["--path.procfs", str(proc), "--path.rootfs", str(root), "--timeout", "1", "--platform", "together-k8s"]
    with fake_kube_api() as api:
        for obj in k8s_node_objects():
            api.add(obj)
        env = {"KUBECONFIG": str(api.kubeconfig(tmp_path)), "NODE_NAME": NODE, "KUBERNETES_SERVICE_HOST": ""}
        scan = run_scan(*common, "--json", env=env)
        table = run_scan(*common, env=env)
    assert scan.returncode == 0, scan.stderr
    mounts = {m["mountpoint"]: m for m in json.loads(scan.stdout)["mounts"]}
    nfs = mounts[f"/var/lib/kubelet/pods/{TRAINER_UID}/volumes/kubernetes.io~csi/{PV_NFS}/mount"]
    assert nfs["kube"] == {
        "namespace": "train",
        "pod": "trainer-0",
        "pod_uid": TRAINER_UID,
        "volume": "shared",
        "volume_kind": "pvc",
        "pvc": "ckpt-shared",
        "pv": PV_NFS,
        "storage_class": "nfs",
        "provisioner": "nfs.csi.k8s.io",
    }
    # The scan classifies with the same Kubernetes evidence as the agent.
    assert nfs["evidence"][0]["source"] == "kubernetes" and "ckpt-shared" in nfs["reason"]
    assert mounts["/fsx"]["durability"] == "cluster" and mounts["/fsx"]["kube"]["volume"] == "fsx"
    assert mounts["/"]["kube"] is None and "storwatch" not in mounts["/"]["reason"]
    assert mounts["/sys/fs/cgroup"]["pseudo"] is True
    assert [mp for mp, m in mounts.items() if m["pseudo"]] == ["/sys/fs/cgroup"]

    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert not [line for line in lines if line.startswith("/sys/fs/cgroup")]
    assert "not shown: /sys/fs/cgroup (kernel interfaces, not storage; listed by --json)" in lines
    assert f"{len(mounts) - 1} mounts, " in table.stdout


@pytest.mark.slow
def test_scan_without_an_api_server_says_so_and_maps_from_the_kubelet_paths(tmp_path: Path) -> None:
    import socket

    from tests.kubeapi import NODE, TRAINER_UID, write_kubeconfig

    with socket.socket() as closed:  # a port nothing listens on once this socket is closed
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", f"http://127.0.0.1:{port}")
    proc, root = fixture_tree(tmp_path, "k8s-node")
    env = {"KUBECONFIG": str(kubeconfig), "NODE_NAME": NODE, "KUBERNETES_SERVICE_HOST": ""}
    scan = run_scan("--path.procfs", str(proc), "--path.rootfs", str(root), "--timeout", "1", "--json", env=env)
    assert scan.returncode == 0, scan.stderr
    assert "the Kubernetes API did not answer within 5 s" in scan.stderr
    assert "mounts are shown without their pods" in scan.stderr
    mounts = {m["mountpoint"]: m for m in json.loads(scan.stdout)["mounts"]}
    dshm = mounts[f"/var/lib/kubelet/pods/{TRAINER_UID}/volumes/kubernetes.io~empty-dir/dshm"]
    assert (dshm["kube"]["pod_uid"], dshm["kube"]["pod"], dshm["kube"]["volume"]) == (TRAINER_UID, None, "dshm")


def test_scan_with_a_config_lists_the_checkpoints_and_findings_the_agent_does(tmp_path: Path) -> None:
    """`scan --json --config FILE` walks the configured checkpoint roots once (the agent's helper and limits) and
    reports the runs and findings the running agent serves in /api/status for the same file."""
    from storwatch.report import view_to_dict  # noqa: F401  (the shape both answers have)
    from tests.agentproc import running_agent, wait_until
    from tests.builders import torch_like_zip

    root = tmp_path / "ckpt"
    for run in ("a", "b/nested"):
        (root / run).mkdir(parents=True)
        torch_like_zip(root / run / "step-1.pt")
        torch_like_zip(root / run / "step-2.pt")
    config = tmp_path / "storwatch.yaml"
    config.write_text(
        f"kube: {{enabled: false}}\ngpu: {{enabled: false}}\ncheckpoints: {{roots: [{json.dumps(str(root))}], "
        "kubelet: false, interval_seconds: 0.5}\n"
    )
    out = run_scan("--json", "--config", str(config))
    assert out.returncode == 0, out.stderr
    scanned = json.loads(out.stdout)
    runs = {r["path"]: r["kept"] for r in scanned["checkpoints"]}
    assert runs == {str(root / "a"): 2, str(root / "b" / "nested"): 2}
    assert {c["name"]: c["success"] for c in scanned["collectors"]}["checkpoints"] is True

    with running_agent("--config", str(config), "--listen", "127.0.0.1:0", timeout=30) as agent:

        def served() -> dict[str, Any] | None:
            data = json.loads(agent.fetch("/api/status").text())
            return data if len(data["checkpoints"]) == 2 else None

        status = wait_until(served, 30, what="the agent's first checkpoint scan")
    assert {r["path"]: r["kept"] for r in status["checkpoints"]} == runs
    assert sorted(f["id"] for f in scanned["findings"]) == sorted(f["id"] for f in status["findings"])
    assert scanned["findings"]  # checkpoints on the test's own disk: only on node storage


@pytest.mark.parametrize(
    ("args", "config", "named"),
    [
        pytest.param(
            ("--path.procfs", "{tmp}/gone"),
            None,
            "command line: --path.procfs: '{tmp}/gone' cannot be read as procfs: No such file or directory",
            id="missing",
        ),
        pytest.param(
            ("--path.procfs", "{tmp}/c.yaml"),
            "",
            "command line: --path.procfs: '{tmp}/c.yaml' cannot be read as procfs: Not a directory",
            id="a-file",
        ),
        pytest.param(
            (),
            "paths: {{procfs: {tmp}/gone}}\n",
            "{tmp}/c.yaml: paths.procfs: '{tmp}/gone' cannot be read as procfs: No such file or directory",
            id="from-the-config-file",
        ),
    ],
)
def test_a_procfs_that_is_not_there_is_a_usage_error(
    args: tuple[str, ...], config: str | None, named: str, tmp_path: Path
) -> None:
    """Not a node without mounts (0 mounts, exit 0, as it was): a usage error naming the path, and no table."""
    if config is not None:
        (tmp_path / "c.yaml").write_text(config.format(tmp=tmp_path))
    given = [a.format(tmp=tmp_path) for a in args] + (["--config", str(tmp_path / "c.yaml")] if config else [])
    scan = run_scan(*given)
    assert scan.returncode == 2, scan.stdout + scan.stderr
    assert scan.stderr.splitlines() == ["storwatch: configuration error:", named.format(tmp=tmp_path)]
    assert scan.stdout == ""
