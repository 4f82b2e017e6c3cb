"""Parser tables for /proc/<pid>/cgroup: raw line -> CgroupEntry or error, and each runtime/driver fixture -> the
container and pod it names."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from storwatch.procfs.cgroup import (
    CgroupEntry,
    CgroupError,
    ContainerRef,
    QoSClass,
    Runtime,
    SlurmJob,
    container_of,
    container_of_path,
    normalise_pod_uid,
    parse_cgroup,
    parse_line,
    slurm_job_of,
    slurm_job_of_path,
)

FIXTURES = Path(__file__).parent / "fixtures" / "cgroup"


def fixture(name: str) -> list[CgroupEntry]:
    entries, errors = parse_cgroup((FIXTURES / name).read_bytes())
    assert errors == []
    return entries


# fixture -> runtime, container ID, pod UID, QoS class; None where the process is in no container.
CONTAINERS = [
    pytest.param("containerd-systemd-v2", "containerd",
                 "451132b560487f8c91e58101aebe00a881ade009a28fd6ee79216f4ddd6b7562",
                 "0b5c6f3e-1c9a-4a5e-9c1f-2b7d8e9f0a1b", "burstable", id="containerd-systemd-v2"),
    pytest.param("containerd-systemd-v2-guaranteed", "containerd",
                 "85d21612fc0c40108214a22a43aac811cdad5391ffca9e51db752cf8fc467013",
                 "6b9e7b7e-b62a-42f0-9e15-ac81ead43336", "guaranteed", id="containerd-systemd-v2-guaranteed"),
    # A static pod's UID is the kubelet's MD5 of the manifest: no dashes to restore.
    pytest.param("containerd-systemd-v2-static-pod", "containerd",
                 "9e3841ea8218e354b4ec9dd4e6f38ac41ee2f1e1eab6d4b1ed4997016344a580",
                 "7636c93ca404979c35482e808195ae0f", "burstable", id="containerd-systemd-v2-static-pod"),
    pytest.param("containerd-systemd-v2-zombie", "containerd",
                 "d10e2b5b54bb903fa9f45f77aa045e2bd411cbe6ef50b85372a31c963a909870",
                 "0b5c6f3e-1c9a-4a5e-9c1f-2b7d8e9f0a1b", "burstable", id="containerd-systemd-v2-zombie"),
    pytest.param("containerd-systemd-v1-hybrid", "containerd",
                 "359698cf2dd95989590d6d7303e1d7b06442f4c9d58565fb3497acf978bf545d",
                 "acd25460-8392-42c7-b281-9747e9172aa5", "besteffort", id="containerd-systemd-v1-hybrid"),
    # The kubelet's cgroupfs layout names the container directory by its bare ID, whichever runtime made it.
    pytest.param("containerd-cgroupfs-v1", None,
                 "6c2a34e94ff73e106b43e0dc6b3e77148b7b653e4e49f900a6f0718ccb2da4a7",
                 "17fdde9d-3dd3-4c7b-a4cb-601d19e3597e", "besteffort", id="containerd-cgroupfs-v1"),
    pytest.param("containerd-cgroupfs-v2", None,
                 "5be345b3279e28a3b3d31fa195ce15c031c5d396cfc961765441c94aa4fbe704",
                 "f18bfe9a-4075-499b-a97d-869bc7b3cb9d", "burstable", id="containerd-cgroupfs-v2"),
    # Read from inside a pod's own cgroup namespace (the agent as a DaemonSet on cgroup v2): paths start with "..".
    pytest.param("containerd-systemd-v2-cgroupns-relative", "containerd",
                 "c4e1b0a9d8f7e6d5c4b3a2918f7e6d5c4b3a2918f7e6d5c4b3a2918f7e6d5c4b",
                 "02d7a3c4-8e51-4f96-b0a7-3c5e9d1f6b28", "besteffort", id="containerd-systemd-v2-cgroupns-relative"),
    # A sibling pod in the reader's own QoS directory: the class is not in the path.
    pytest.param("containerd-cgroupfs-v2-cgroupns-relative", None,
                 "e3d2c1b0a9f8e7d6c5b4a3928170f6e5d4c3b2a1908f7e6d5c4b3a29180f7e6d",
                 "9d4e2f71-5a3b-4c68-8e1f-0b7a6c5d4e32", None, id="containerd-cgroupfs-v2-cgroupns-relative"),
    pytest.param("containerd-nerdctl-systemd-v2", "containerd",
                 "e25cd3c06025ab789f288df52cebaf4e4ddd43a89ec593ecfc94d9d54d82c18a",
                 None, None, id="containerd-nerdctl-systemd-v2"),
    # crun puts the payload in a "container" child of the scope.
    pytest.param("crio-systemd-v2", "cri-o",
                 "98fc6075acf2dac9bcd0b9d829432a49bae9676d09b450aca3db6ae194aef08c",
                 "81a6df65-ec34-4584-bf4d-793aa60b37c7", "besteffort", id="crio-systemd-v2"),
    pytest.param("crio-systemd-v1-hybrid", "cri-o",
                 "cd2822bc029380789e9b3e3f719bbf3dc96cd344ab366cd8eda6fd870766e4bb",
                 "570678de-1456-4b05-8aec-aa1aa94e58d2", "guaranteed", id="crio-systemd-v1-hybrid"),
    pytest.param("crio-cgroupfs-v1", "cri-o",
                 "99c8647c99b251ad7e4a5889681ad5d78da6d4b86fa25748a1124aa608eccb02",
                 "27b6c489-30dd-4a6c-981e-0bc869b8a137", "burstable", id="crio-cgroupfs-v1"),
    pytest.param("crio-conmon", None, None, None, None, id="crio-conmon"),
    pytest.param("docker-systemd-v2", "docker",
                 "69823f5d8fd37bb8807ad52e57d3d0b5d2c828e50131390b3ae2e24c67cb2a07",
                 None, None, id="docker-systemd-v2"),
    pytest.param("docker-cgroupfs-v1", "docker",
                 "f4f0b3caffa8f2c594d1bdd814d4a065d9e517ef0b54ae9b2ff0e46432e0ece0",
                 None, None, id="docker-cgroupfs-v1"),
    pytest.param("docker-cgroupfs-v2", "docker",
                 "51ddf3f59d3b176be0b4e4f6e6d227f1313a838f091c8c9adb5621b8536ef434",
                 None, None, id="docker-cgroupfs-v2"),
    # The unified line is left at the shim's cgroup; the v1 lines name the container.
    pytest.param("docker-cgroupfs-v1-hybrid", "docker",
                 "9abb09478e30b73fa5b883196c85e88242059b1fdf2fca24f6cba60f73965e2b",
                 None, None, id="docker-cgroupfs-v1-hybrid"),
    pytest.param("dockershim-systemd-v1", "docker",
                 "865c1ed747661f09b9dfd8f21b86a15ec637e65aa226047b6cbfe8be45a6b035",
                 "6708e3ad-0b64-4b79-a5f5-163b3742d54f", "burstable", id="dockershim-systemd-v1"),
    pytest.param("dockershim-cgroupfs-v1", None,
                 "5ce4f733823cd4086e44cdca35a58bbb8735c6db7a2b63872aa9dfcac7f3c66d",
                 "f57e5632-d693-4c48-a14e-6c1f5eb229d0", "guaranteed", id="dockershim-cgroupfs-v1"),
    # Seen from the host: the pod's container inside the kind node's Docker container; the innermost wins.
    pytest.param("kind-nested", "containerd",
                 "98af7b93fc4833068ca9228cb7e1b84485595473a3c5c670b98beca9d46c1073",
                 "8939a69f-ee7f-4dfc-a2bb-7fbc1f631cb9", "besteffort", id="kind-nested"),
    pytest.param("kind-node-view", "containerd",
                 "e0f1b5a4c1d3b2a8f6e7d9c0b1a2f3e4d5c6b7a8f9e0d1c2b3a4f5e6d7c8b9a0",
                 "233cff46-9886-4165-b950-04efdf6528af", "guaranteed", id="kind-node-view"),
    # The kind node's own kubelet: in the node's container, in no pod.
    pytest.param("kind-node-kubelet", "docker",
                 "753a4bc5446ab48813b0c2ee422ec598f30e61897f9969d0e7271b97985f476b",
                 None, None, id="kind-node-kubelet"),
    pytest.param("host-process", None, None, None, None, id="host-process"),
    # Slurm jobs run in no container (their jobs: SLURM_JOBS below).
    pytest.param("slurm-v1", None, None, None, None, id="slurm-v1"),
    pytest.param("slurm-v1-multiple-slurmd", None, None, None, None, id="slurm-v1-multiple-slurmd"),
    pytest.param("slurm-v2", None, None, None, None, id="slurm-v2"),
    pytest.param("slurm-v2-batch", None, None, None, None, id="slurm-v2-batch"),
    pytest.param("slurm-v2-multiple-slurmd", None, None, None, None, id="slurm-v2-multiple-slurmd"),
    pytest.param("slurm-v2-stepd", None, None, None, None, id="slurm-v2-stepd"),
    pytest.param("host-service-v1", None, None, None, None, id="host-service-v1"),
    # A tenant's process in her own subtree (systemd delegates user@UID.service to her), in cgroups named like a job's.
    pytest.param("tenant-delegated-v2-stepd-scope", None, None, None, None, id="tenant-delegated-v2-stepd-scope"),
    pytest.param("tenant-delegated-v2-slurm", None, None, None, None, id="tenant-delegated-v2-slurm"),
    pytest.param("tenant-delegated-v1-hybrid", None, None, None, None, id="tenant-delegated-v1-hybrid"),
    pytest.param("cgroupns-root", None, None, None, None, id="cgroupns-root"),
    pytest.param("cgroupns-root-v1-hybrid", None, None, None, None, id="cgroupns-root-v1-hybrid"),
]  # fmt: skip


@pytest.mark.parametrize(("name", "runtime", "container_id", "pod_uid", "qos_class"), CONTAINERS)
def test_container_of_fixture(
    name: str, runtime: Runtime | None, container_id: str | None, pod_uid: str | None, qos_class: QoSClass | None
) -> None:
    ref = container_of(fixture(name))
    if container_id is None:
        assert ref is None
        return
    assert ref is not None
    assert (ref.runtime, ref.container_id, ref.pod_uid, ref.qos_class) == (runtime, container_id, pod_uid, qos_class)
    assert container_id in ref.cgroup_path


def test_every_fixture_is_in_the_table() -> None:
    tabled = {p.values[0] for p in CONTAINERS}
    assert tabled == {p.name for p in FIXTURES.iterdir()}


@pytest.mark.parametrize(
    ("name", "lines", "has_unified"),
    [
        ("containerd-cgroupfs-v1", 12, False),
        ("containerd-systemd-v1-hybrid", 14, True),
        ("crio-systemd-v1-hybrid", 13, True),
        ("containerd-systemd-v2", 1, True),
    ],
    ids=["v1", "hybrid-ubuntu", "hybrid-rhel", "v2"],
)
def test_fixture_shapes(name: str, lines: int, has_unified: bool) -> None:
    entries = fixture(name)
    assert len(entries) == lines
    assert any(e.unified for e in entries) is has_unified


GOOD_LINES = [
    pytest.param("0::/kubepods.slice/kubepods-pod1.slice",
                 CgroupEntry(0, (), "/kubepods.slice/kubepods-pod1.slice", False), id="v2"),
    pytest.param("0::/", CgroupEntry(0, (), "/", False), id="v2-namespace-root"),
    pytest.param("11:memory:/docker/abc", CgroupEntry(11, ("memory",), "/docker/abc", False), id="v1-one-controller"),
    pytest.param("4:cpu,cpuacct:/docker/abc", CgroupEntry(4, ("cpu", "cpuacct"), "/docker/abc", False),
                 id="v1-co-mounted-controllers"),
    pytest.param("1:name=systemd:/user.slice", CgroupEntry(1, ("name=systemd",), "/user.slice", False),
                 id="v1-named-hierarchy"),
    pytest.param("5:cpuset,name=mine:/a", CgroupEntry(5, ("cpuset", "name=mine"), "/a", False),
                 id="v1-controller-and-name"),
    # The path is not escaped: a colon in it belongs to the path.
    pytest.param("0::/system.slice/a:b.service", CgroupEntry(0, (), "/system.slice/a:b.service", False),
                 id="colon-in-path"),
    pytest.param("0::/kubepods.slice/x.scope (deleted)", CgroupEntry(0, (), "/kubepods.slice/x.scope", True),
                 id="v2-deleted"),
    # Cgroup namespaces print paths outside the reader's root relative to it.
    pytest.param("0::/../../system.slice/x.service", CgroupEntry(0, (), "/../../system.slice/x.service", False),
                 id="outside-namespace-root"),
    pytest.param("7995:name=cgrp2: (deleted)", CgroupEntry(7995, ("name=cgrp2",), "", True),
                 id="hierarchy-unmounted-while-printing"),
    pytest.param("12:pids:/a b", CgroupEntry(12, ("pids",), "/a b", False), id="space-in-path"),
]  # fmt: skip


@pytest.mark.parametrize(("line", "expected"), GOOD_LINES)
def test_parse_line(line: str, expected: CgroupEntry) -> None:
    assert parse_line(line) == expected


BAD_LINES = [
    pytest.param("", "expected HIERARCHY-ID:CONTROLLERS:PATH", id="empty"),
    pytest.param("/kubepods.slice", "expected HIERARCHY-ID:CONTROLLERS:PATH", id="no-colon"),
    pytest.param("0:/kubepods.slice", "expected HIERARCHY-ID:CONTROLLERS:PATH", id="one-colon"),
    pytest.param("x::/kubepods.slice", "hierarchy ID is not a decimal number", id="letter-id"),
    pytest.param("::/kubepods.slice", "hierarchy ID is not a decimal number", id="empty-id"),
    pytest.param("-1:memory:/", "hierarchy ID is not a decimal number", id="negative-id"),
    pytest.param(" 3:memory:/", "hierarchy ID is not a decimal number", id="space-before-id"),
    pytest.param("0::", "cgroup path is not absolute", id="empty-path"),
    pytest.param("0::kubepods.slice", "cgroup path is not absolute", id="relative-path"),
    pytest.param("0::system.slice (deleted)", "cgroup path is not absolute", id="deleted-relative-path"),
]  # fmt: skip


@pytest.mark.parametrize(("line", "message"), BAD_LINES)
def test_parse_line_errors(line: str, message: str) -> None:
    with pytest.raises(CgroupError) as excinfo:
        parse_line(line, lineno=7)
    err = excinfo.value
    assert message in str(err)
    assert err.lineno == 7
    assert str(err).startswith("line 7: ")
    assert err.line == line
    assert isinstance(err, ValueError)


def test_bad_lines_are_reported_and_good_lines_kept() -> None:
    uid = "0b5c6f3e_1c9a_4a5e_9c1f_2b7d8e9f0a1b"
    cid = "451132b560487f8c91e58101aebe00a881ade009a28fd6ee79216f4ddd6b7562"
    path = f"/kubepods.slice/kubepods-pod{uid}.slice/cri-containerd-{cid}.scope"
    text = f"12:pids:{path}\nnonsense\nx:memory:/\n1:name=systemd:{path}\n\n0::{path}\n"
    entries, errors = parse_cgroup(text)
    assert [e.hierarchy_id for e in entries] == [12, 1, 0]
    assert [e.lineno for e in errors] == [2, 3]
    ref = container_of(entries)
    assert ref is not None
    assert ref.container_id == cid


def test_non_utf8_path_round_trips_to_the_raw_bytes() -> None:
    entries, errors = parse_cgroup(b"0::/system.slice/caf\xe9.service\n")
    assert errors == []
    assert os.fsencode(entries[0].path) == b"/system.slice/caf\xe9.service"


def test_str_and_bytes_parse_alike() -> None:
    text = (FIXTURES / "crio-systemd-v1-hybrid").read_text()
    assert parse_cgroup(text) == parse_cgroup(text.encode())


DASHED = "0b5c6f3e-1c9a-4a5e-9c1f-2b7d8e9f0a1b"
CID = "451132b560487f8c91e58101aebe00a881ade009a28fd6ee79216f4ddd6b7562"


@pytest.mark.parametrize(
    "path",
    [
        f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{DASHED.replace('-', '_')}.slice/"
        f"cri-containerd-{CID}.scope",
        f"/kubepods/burstable/pod{DASHED}/{CID}",
        f"/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-burstable.slice/"
        f"kubelet-kubepods-burstable-pod{DASHED.replace('-', '_')}.slice/cri-containerd-{CID}.scope",
        f"/kubelet/kubepods/burstable/pod{DASHED}/{CID}",
        f"/kubepods/burstable/pod{DASHED.upper()}/{CID}",
    ],
    ids=["systemd", "cgroupfs", "systemd-kubelet-root", "cgroupfs-kubelet-root", "uppercase"],
)
def test_pod_uid_comes_out_with_dashes_whichever_driver_wrote_it(path: str) -> None:
    ref = container_of_path(path)
    assert ref is not None
    assert ref.pod_uid == DASHED
    assert ref.qos_class == "burstable"


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("0b5c6f3e_1c9a_4a5e_9c1f_2b7d8e9f0a1b", DASHED),
        (DASHED, DASHED),
        ("0B5C6F3E_1C9A_4A5E_9C1F_2B7D8E9F0A1B", DASHED),
        ("7636c93ca404979c35482e808195ae0f", "7636c93ca404979c35482e808195ae0f"),
    ],
    ids=["underscores", "dashes", "uppercase", "static-pod-hash"],
)
def test_normalise_pod_uid(raw: str, expected: str) -> None:
    assert normalise_pod_uid(raw) == expected


# Path shapes beyond the fixtures: what is and is not a container.
PATHS = [
    pytest.param(f"/system.slice/docker-{CID}.scope/init.scope",
                 ContainerRef("docker", CID, None, None, f"/system.slice/docker-{CID}.scope/init.scope"),
                 id="systemd-inside-docker"),
    pytest.param(f"/default/{CID}", ContainerRef(None, CID, None, None, f"/default/{CID}"),
                 id="containerd-namespace-bare-id"),
    pytest.param(f"/kubepods/besteffort/pod{DASHED}/crio-conmon-{CID}", None, id="crio-conmon-cgroupfs"),
    pytest.param(f"/system.slice/crio-conmon-{CID}.scope", None, id="crio-conmon-system-slice"),
    pytest.param(f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{DASHED}.slice", None,
                 id="pod-slice-without-container"),
    pytest.param(f"/system.slice/docker-{CID[:12]}.scope", None, id="short-id"),
    pytest.param(f"/system.slice/docker-{CID.upper()}.scope", None, id="uppercase-id"),
    pytest.param(f"/system.slice/libpod-{CID}.scope", None, id="podman-not-recognised"),
    pytest.param("/system.slice/containerd.service", None, id="runtime-daemon"),
    # Another container of the reader's own pod, seen from inside the reader's cgroup namespace.
    pytest.param(f"/../cri-containerd-{CID}.scope", ContainerRef("containerd", CID, None, None,
                 f"/../cri-containerd-{CID}.scope"), id="same-pod-from-cgroupns"),
    pytest.param("/", None, id="root"),
    pytest.param("", None, id="empty"),
    # A pod directory must sit under kubepods or a QoS directory.
    pytest.param(f"/elsewhere/pod{DASHED}/{CID}", ContainerRef(None, CID, None, None, f"/elsewhere/pod{DASHED}/{CID}"),
                 id="pod-dir-outside-kubepods"),
    # Docker-in-Docker in a pod: the inner container, in the pod that holds it.
    pytest.param(f"/kubepods/pod{DASHED}/{'a' * 64}/docker/{CID}",
                 ContainerRef("docker", CID, DASHED, "guaranteed", f"/kubepods/pod{DASHED}/{'a' * 64}/docker/{CID}"),
                 id="docker-in-docker-pod"),
]  # fmt: skip


@pytest.mark.parametrize(("path", "expected"), PATHS)
def test_container_of_path(path: str, expected: ContainerRef | None) -> None:
    assert container_of_path(path) == expected


def test_unified_line_is_preferred_over_v1() -> None:
    other = "b" * 64
    entries = [
        CgroupEntry(11, ("memory",), f"/docker/{other}", False),
        CgroupEntry(0, (), f"/system.slice/docker-{CID}.scope", False),
    ]
    ref = container_of(entries)
    assert ref is not None
    assert ref.container_id == CID


V1_PREFERENCE = [("memory",), ("pids",), ("cpu", "cpuacct"), ("name=systemd",), ("devices",)]


@pytest.mark.parametrize("preferred", V1_PREFERENCE, ids=["memory", "pids", "cpu", "name=systemd", "any-other"])
def test_v1_preference_order(preferred: tuple[str, ...]) -> None:
    # Each line names a different container (IDs "aaa...", "bbb...", ...); given the preferred line and every line
    # ranked below it, in the kernel's descending order, the preferred one wins.
    rank = V1_PREFERENCE.index(preferred)
    entries = [
        CgroupEntry(12 - i, controllers, f"/docker/{'abcde'[i] * 64}", False)
        for i, controllers in enumerate(V1_PREFERENCE)
        if i >= rank
    ]
    ref = container_of(reversed(entries))
    assert ref is not None
    assert ref.container_id == "abcde"[rank] * 64


def test_process_source_counts_bad_cgroup_lines_and_keeps_the_good_one(tmp_path: Path) -> None:
    from storwatch.paths import HostPaths
    from storwatch.sources.processes import ProcessSource

    good = (FIXTURES / "containerd-systemd-v2").read_bytes()
    for pid, extra in ((4101, b"garbage without colons\n"), (4102, b"")):
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "cgroup").write_bytes(extra + good)
    source = ProcessSource(HostPaths(procfs=str(tmp_path)), lambda: [4101, 4102, 4103])
    refs = source.collect()
    assert refs[4101] == refs[4102] == container_of(parse_cgroup(good)[0])
    assert refs[4101] is not None and refs[4103] is None  # 4103 has no cgroup file: not a parse error
    assert source.parse_errors == 1
    source.collect()
    assert source.parse_errors == 1  # a PID's cgroup is read once


# fixture -> the Slurm job its process runs in (job, step, owner's UID where the path says it).
SLURM_JOBS = [
    pytest.param("slurm-v1", SlurmJob(4242, "0", 1000), id="slurm-v1"),
    pytest.param("slurm-v1-multiple-slurmd", SlurmJob(88, "batch", 2001), id="slurm-v1-multiple-slurmd"),
    pytest.param("slurm-v2", SlurmJob(1234567, "3", None), id="slurm-v2"),
    pytest.param("slurm-v2-batch", SlurmJob(1234568, "batch", None), id="slurm-v2-batch"),
    pytest.param("slurm-v2-multiple-slurmd", SlurmJob(77, "extern", None), id="slurm-v2-multiple-slurmd"),
    pytest.param("slurm-v2-stepd", SlurmJob(1234567, "3", None), id="slurm-v2-stepd"),
]


@pytest.mark.parametrize(("name", "expected"), SLURM_JOBS)
def test_slurm_fixtures_name_their_job(name: str, expected: SlurmJob) -> None:
    entries = fixture(name)
    assert slurm_job_of(entries) == expected
    assert container_of(entries) is None  # a job's process is in no container


@pytest.mark.parametrize(
    "name",
    [
        "containerd-systemd-v2",
        "docker-cgroupfs-v1",
        "host-process",
        "host-service-v1",
        # job_4242 in cgroups the tenant made below user@1001.service: her word, not Slurm's.
        "tenant-delegated-v2-stepd-scope",
        "tenant-delegated-v2-slurm",
        "tenant-delegated-v1-hybrid",
    ],
)
def test_processes_outside_slurm_have_no_job(name: str) -> None:
    assert slurm_job_of(fixture(name)) is None


# cgroup path -> the Slurm job it names. Only Slurm's own layout from the root of the hierarchy names a job: the same
# names below a subtree someone else controls (systemd's delegation of user@UID.service to its user, a container's
# own cgroup, a pod) are that someone's choice.
SLURM_PATHS = [
    pytest.param("/slurm/uid_0/job_1", SlurmJob(1, None, 0), id="v1-job-cgroup"),
    pytest.param("/slurm/uid_1000/job_4242/step_0/task_3", SlurmJob(4242, "0", 1000), id="v1-task"),
    pytest.param("/slurm_gpu-node-017/uid_2001/job_88/step_batch/task_0", SlurmJob(88, "batch", 2001),
                 id="v1-multiple-slurmd"),
    pytest.param("/system.slice/slurmstepd.scope/job_9/step_interactive/user/task_0", SlurmJob(9, "interactive", None),
                 id="v2-interactive"),
    pytest.param("/system.slice/slurmstepd.scope/job_9", SlurmJob(9, None, None), id="v2-job-cgroup"),
    pytest.param("/system.slice/gpu-node-017_slurmstepd.scope/job_77/step_extern/user/task_special",
                 SlurmJob(77, "extern", None), id="v2-multiple-slurmd"),
    pytest.param("/system.slice/slurmstepd.scope/job_1234567/step_3/slurm", SlurmJob(1234567, "3", None),
                 id="v2-slurmstepd-of-step"),
    # Read from a cgroup namespace: the kernel climbs to the common ancestor, then names each cgroup down.
    pytest.param("/../../system.slice/slurmstepd.scope/job_9/step_2", SlurmJob(9, "2", None), id="v2-cgroupns"),
    pytest.param("/../slurm/uid_5/job_3/step_0", SlurmJob(3, "0", 5), id="v1-cgroupns"),
    pytest.param("/slurm/uid_1000/job_7/step_weird", SlurmJob(7, None, 1000), id="v1-unknown-step"),
    pytest.param("/system.slice/slurmstepd.scope/system", None, id="v2-stepd-waiting-area"),
    pytest.param("/slurm/uid_1000", None, id="v1-user-cgroup"),
    pytest.param("/slurm/uid_1000/job_99999999999/step_0", None, id="not-a-job-id"),
    pytest.param("/slurm/job_5/step_0", None, id="v1-without-uid"),
    pytest.param("/", None, id="root"),
    # A tenant's own subtree: systemd delegates user@UID.service to the user (Delegate=yes) on cgroup v2.
    pytest.param("/user.slice/user-1000.slice/job_5/step_0", None, id="job-under-user-slice"),
    pytest.param("/user.slice/user-1000.slice/user@1000.service/slurm/job_42", None, id="user-delegated-slurm"),
    pytest.param("/user.slice/user-1000.slice/user@1000.service/slurm/uid_0/job_42/step_0/task_0", None,
                 id="user-delegated-v1-layout"),
    pytest.param("/user.slice/user-1000.slice/user@1000.service/app.slice/slurmstepd.scope/job_42/step_0/user/task_0",
                 None, id="user-delegated-stepd-scope"),
    pytest.param("/user.slice/user-1000.slice/user@1000.service/system.slice/slurmstepd.scope/job_42/step_0", None,
                 id="user-delegated-system-slice"),
    pytest.param("/user.slice/user-1000.slice/session-3.scope/slurm_x/uid_1000/job_42", None, id="user-session"),
    pytest.param("/../../../user.slice/user-1000.slice/user@1000.service/app.slice/slurmstepd.scope/job_42", None,
                 id="user-delegated-from-cgroupns"),
    # Containers and pods: a container with a writable cgroup mount makes what it likes below its own cgroup.
    pytest.param("/kubepods/besteffort/pod17fdde9d-3dd3-4c7b-a4cb-601d19e3597e/slurm/job_42", None,
                 id="kubepods-slurm"),
    pytest.param("/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod0b5c6f3e_1c9a_4a5e_9c1f_2b7d8e9f0a1b"
                 ".slice/cri-containerd-451132b560487f8c91e58101aebe00a881ade009a28fd6ee79216f4ddd6b7562.scope"
                 "/system.slice/slurmstepd.scope/job_42/step_0/user/task_0", None, id="kubepods-stepd-scope"),
    pytest.param("/docker/f4f0b3caffa8f2c594d1bdd814d4a065d9e517ef0b54ae9b2ff0e46432e0ece0/slurm/uid_0/job_42", None,
                 id="docker-slurm"),
    pytest.param("/machine.slice/slurmstepd.scope/job_42", None, id="other-slice"),
    pytest.param("/system.slice/slurmd.service/slurmstepd.scope/job_42", None, id="below-a-service"),
    # Where the anchor is not said: read from /system.slice/<unit>'s namespace, or a path that climbs after a name.
    pytest.param("/../slurmstepd.scope/job_9/step_0", None, id="cgroupns-unanchored"),
    pytest.param("/system.slice/../user.slice/slurm/uid_0/job_42", None, id="dotdot-after-a-name"),
    pytest.param("/user.slice/../slurm/uid_0/job_42", None, id="dotdot-back-to-a-root-name"),
]  # fmt: skip


@pytest.mark.parametrize(("path", "expected"), SLURM_PATHS)
def test_slurm_paths(path: str, expected: SlurmJob | None) -> None:
    assert slurm_job_of_path(path) == expected


def test_gpu_processes_of_slurm_jobs_are_named_by_job_in_the_view_the_scrape_and_the_report(tmp_path: Path) -> None:
    from storwatch.analysis.view import View
    from storwatch.exporter import ExportState, render_text
    from storwatch.exporter import gpu as gpu_area
    from storwatch.paths import HostPaths
    from storwatch.report import view_to_dict
    from storwatch.snapshot import Snapshot
    from storwatch.sources.gpu import GPUS, GPUFacts, GPUProcess, GPUState
    from storwatch.sources.processes import CONTAINERS, ProcessSource
    from storwatch.vocabulary import Platform

    cgroups = {
        5001: "slurm-v2",
        5002: "slurm-v2",
        5003: "slurm-v1",
        5004: "containerd-systemd-v2",
        5005: "tenant-delegated-v2-stepd-scope",  # a tenant's own cgroup named job_4242: not the job's GPU memory
    }
    for pid, name in cgroups.items():
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "cgroup").write_bytes((FIXTURES / name).read_bytes())
    facts = ProcessSource(HostPaths(procfs=str(tmp_path)), lambda: list(cgroups)).collect()
    assert facts.jobs == {
        5001: SlurmJob(1234567, "3", None),
        5002: SlurmJob(1234567, "3", None),
        5003: SlurmJob(4242, "0", 1000),
    }
    assert facts[5001] is None and facts[5004] is not None  # the job's processes are in no container

    def proc(pid: int, used: int) -> GPUProcess:
        return GPUProcess(pid, used, None)

    gpu = GPUState(
        0,
        "GPU-0",
        "H100",
        True,
        processes=(proc(5001, 10 << 30), proc(5002, 6 << 30), proc(5003, 1 << 30), proc(5005, 2 << 30)),
    )
    snapshot = Snapshot(1000.0, facts={GPUS.name: GPUFacts(1000.0, True, "550", None, (gpu,)), CONTAINERS.name: facts})
    view = View(snapshot, Platform("together-slurm", "test"))
    text = render_text(gpu_area.families(view, ExportState())).decode().splitlines()
    assert 'storwatch_gpu_job_memory_used_bytes{gpu="0",job="1234567",uuid="GPU-0"} 1.7179869184e+10' in text
    assert 'storwatch_gpu_job_memory_used_bytes{gpu="0",job="4242",uuid="GPU-0"} 1.073741824e+09' in text
    procs = {p["pid"]: p for p in view_to_dict(view)["gpus"][0]["processes"]}
    assert (procs[5003]["slurm_job"], procs[5003]["slurm_step"]) == (4242, "0")


def test_no_slurm_job_no_job_family() -> None:
    from storwatch.analysis.view import View
    from storwatch.exporter import ExportState, render_text
    from storwatch.exporter import gpu as gpu_area
    from storwatch.snapshot import Snapshot
    from storwatch.sources.gpu import GPUS, GPUFacts, GPUProcess, GPUState
    from storwatch.vocabulary import Platform

    gpu = GPUState(0, "GPU-0", "H100", True, processes=(GPUProcess(7, 1 << 30, None),))
    view = View(
        Snapshot(1000.0, facts={GPUS.name: GPUFacts(1000.0, True, "550", None, (gpu,))}), Platform("generic", "")
    )
    text = render_text(gpu_area.families(view, ExportState())).decode()
    assert "storwatch_gpu_pod_memory_used_bytes{" in text and "storwatch_gpu_job_memory_used_bytes" not in text
