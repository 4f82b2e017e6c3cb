"""A View holding one of everything the exporter renders (mounts, disks, checkpoints, GPUs, Kubernetes, access,
Lustre), at a fixed time: for the metric catalog's checks and the policy schema's."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from storwatch.analysis.build import build_view
from storwatch.analysis.io import WindowFeeder
from storwatch.analysis.latency import LatencyWindows
from storwatch.analysis.stalls import StallState
from storwatch.analysis.view import View
from storwatch.checkpoints.manifest import FoundCopy
from storwatch.checkpoints.scan import DatasetDir
from storwatch.classify import Classifier
from storwatch.procfs.cgroup import ContainerRef, SlurmJob
from storwatch.procfs.diskstats import parse_diskstats
from storwatch.procfs.lustre import parse_llite_stats
from storwatch.procfs.pidio import ProcessIO
from storwatch.registry import SOURCES
from storwatch.snapshot import Snapshot
from storwatch.sources.access import ACCESS, AccessFacts, WorkloadAccess
from storwatch.sources.checkpoints import (
    CHECK_ERROR_REASONS,
    CLAIM_REJECT_REASONS,
    Checkpoint,
    CheckpointFacts,
    RunState,
    StuckRoot,
    Unreadable,
)
from storwatch.sources.copies import COPIES, CopiesFacts
from storwatch.sources.diskio import DiskIO
from storwatch.sources.gpu import GPUFacts, GPUProcess, GPUState
from storwatch.sources.kubevolumes import ClusterObjects, KubeFacts, NodeInfo, PodInfo
from storwatch.sources.lustre import LUSTRE, LustreClient, LustreFacts
from storwatch.sources.mountstats_reader import MountStatsReader
from storwatch.sources.nfs import NFSStats
from storwatch.sources.pressure import PRESSURE, PressureFacts
from storwatch.sources.probe import Histogram, ProbeResult
from storwatch.sources.processes import CONTAINERS, ProcessFacts
from storwatch.vocabulary import CollectorStatus, FsUsage, Mount, MountDevice, Platform

REPO_ROOT = Path(__file__).resolve().parents[1]
FIXTURES = Path(__file__).parent / "fixtures"
GOLDEN = FIXTURES / "gpu-node" / "golden.prom"
NFSV3 = FIXTURES / "mountstats" / "nfsv3"
LLITE = FIXTURES / "lustre" / "v2.15" / "sys" / "kernel" / "debug" / "lustre" / "llite"

NOW = 1_800_000_000.0
GiB = 1 << 30
POD_UID = "81742e8f-be31-4219-bac3-e2ed48dd4123"
TRAINER, LOADER, SLURM_JOB = 4242, 4343, 5151
"""GPU processes: one in a pod, one in no container and no job, one in a Slurm job."""


# -- a View with facts for every area


def _mount(mount_id: int, mountpoint: str, device: str, fstype: str, block: MountDevice | None = None) -> Mount:
    usage = FsUsage(1000 * GiB, 400 * GiB, 380 * GiB, 1_000_000, 900_000)
    return Mount(
        mount_id, mountpoint, device, fstype, "/", 259, mount_id, False, (), (), usage, False, 0.0, None, block
    )


MOUNTS = (
    _mount(1, "/", "/dev/nvme0n1p1", "ext4", MountDevice("nvme0n1p1", ("nvme0n1",), partition=True)),
    _mount(2, "/scratch", "/dev/nvme1n1", "ext4", MountDevice("nvme1n1", ("nvme1n1",))),
    _mount(3, "/mnt/datasets", "10.0.0.5:/export/datasets", "nfs"),  # an NFS mount of the nfsv3 fixture
    _mount(4, "/dev/shm", "tmpfs", "tmpfs"),
    _mount(5, "/lustre", "10.0.0.9@tcp:/scratch", "lustre"),
    dataclasses.replace(_mount(6, "/home", "nfs:/home", "nfs4"), usage=None, stuck=True, stuck_seconds=12.5),
)
DISKSTATS = (
    " 259 0 nvme0n1 9000 10 720000 3000 8000 20 640000 4000 0 5000 7000 100 0 800 5 50 60\n"
    " 259 1 nvme0n1p1 8000 10 640000 2500 7000 20 560000 3500 0 4000 6000 90 0 700 0 0 0\n"
    " 259 2 nvme1n1 90000 100 7200000 30000 80000 200 6400000 40000 3 50000 70000 1000 0 8000 50 500 600\n"
)


def _checkpoint(path: str, age: float, write_seconds: float | None = None, fmt: str = "torch-zip") -> Checkpoint:
    return Checkpoint(
        path=path,
        format=fmt,
        verdict="complete",
        reason="complete",
        size_bytes=2 * GiB,
        allocated_bytes=2 * GiB,
        mtime=NOW - age,
        deep_checked=False,
        first_seen=NOW - age,
        write_seconds=write_seconds,
        write_bytes_per_second=None if write_seconds is None else 2 * GiB / write_seconds,
    )


def _checkpoint_facts() -> CheckpointFacts:
    llama = RunState(
        "/scratch/llama",
        "/scratch",
        (
            _checkpoint("/scratch/llama/step-100", 3600.0, 20.0),
            _checkpoint("/scratch/llama/step-200", 600.0, 18.0),
            dataclasses.replace(_checkpoint("/scratch/llama/step-300", 5.0), verdict="incomplete"),
        ),
        orphaned_temps=1,
        orphaned_temp_bytes=GiB,
    )
    weights = RunState(
        "/scratch/models/llama-weights",
        "/scratch",
        (_checkpoint("/scratch/models/llama-weights/model.safetensors", 7200.0, fmt="safetensors"),),
    )
    bert = RunState(
        "/mnt/datasets/ckpt/bert",
        "/mnt/datasets",
        (
            _checkpoint("/mnt/datasets/ckpt/bert/step-1", 1800.0, 60.0),
            dataclasses.replace(_checkpoint("/mnt/datasets/ckpt/bert/step-2", 300.0, 55.0), writer_pid=SLURM_JOB),
        ),
    )
    return CheckpointFacts(
        NOW,
        runs=(llama, weights, bert),
        truncated=False,
        truncated_reason=None,
        scan_seconds=0.25,
        roots=("/scratch", "/mnt/datasets", "/home"),
        stuck_roots=(StuckRoot("/home", 40.0, "statvfs past its deadline"),),
        check_errors={**dict.fromkeys(CHECK_ERROR_REASONS, 0), "os_error": 2},
        claims_rejected={**dict.fromkeys(CLAIM_REJECT_REASONS, 0), "not_writer": 1, "future": 3},
        unreadable=(Unreadable("/mnt/datasets", 3, ("/mnt/datasets/private",)),),
        datasets=(DatasetDir("/scratch/data/shards", 400, 100 * GiB, NOW - 100),),
    )


def _gpus() -> GPUFacts:
    def gpu(index: int, processes: tuple[GPUProcess, ...], throttle: int) -> GPUState:
        return GPUState(
            index,
            f"GPU-{index:08d}-aaaa-bbbb-cccc-dddddddddddd",
            "NVIDIA H100 80GB HBM3",
            True,
            utilization_ratio=0.12,
            memory_utilization_ratio=0.05,
            memory_used_bytes=40 * GiB,
            memory_total_bytes=80 * GiB,
            power_watts=310.5,
            temperature_celsius=54.0,
            throttle_reasons=throttle,
            xid_counts={79: 1} if index == 0 else {},
            processes=processes,
        )

    return GPUFacts(
        NOW,
        nvml_up=True,
        driver_version="550.54.15",
        error=None,
        gpus=(
            gpu(0, (GPUProcess(TRAINER, 30 * GiB, None), GPUProcess(LOADER, 2 * GiB, None)), 0x4),
            gpu(1, (GPUProcess(SLURM_JOB, 20 * GiB, None),), 0x1),
            GPUState(2, "GPU-00000002-aaaa-bbbb-cccc-dddddddddddd", "NVIDIA H100 80GB HBM3", False, error="GPU lost"),
        ),
    )


def rich_kube() -> KubeFacts:
    pod = PodInfo(POD_UID, "trainer-0", "ml", "node-1", deletion_timestamp=NOW + 20, grace_seconds=30)
    node = NodeInfo(
        "node-1",
        cordoned=True,
        taints=(("ToBeDeletedByClusterAutoscaler", "NoSchedule"),),
        removal_taints=("ToBeDeletedByClusterAutoscaler",),
    )
    return KubeFacts(True, True, cluster=ClusterObjects(pods={POD_UID: pod}), node=node, timestamp=NOW)


def _access() -> AccessFacts:
    def workload(pid: int) -> WorkloadAccess:
        return WorkloadAccess(
            pid,
            3,
            ProcessIO(read_bytes=1 << 20, write_bytes=2 << 20, rchar=3 << 20, wchar=4 << 20, syscr=10, syscw=20),
            comm="python3",
            mounts_read=("/mnt/datasets",),
            mounts_written=("/scratch",),
        )

    return AccessFacts(NOW, {pid: workload(pid) for pid in (TRAINER, LOADER, SLURM_JOB)})


def rich_view(kube: KubeFacts | None = None) -> View:
    """One View with facts for every area of the exporter: mounts with devices, NFS, a probe, GPUs in a pod, a Slurm
    job and neither, checkpoint runs on node and cluster storage with findings, the Kubernetes node being drained,
    a Lustre client, GPU workloads' I/O, and stalls. ``kube``: other Kubernetes facts than rich_kube()'s."""
    disks, errors = parse_diskstats(DISKSTATS)
    assert errors == []
    nfs_mounts, nfs_errors = MountStatsReader(lambda errors: None).read(NFSV3.read_bytes())
    assert nfs_errors == []
    histogram = Histogram((0, 0, 0, 0, 3, 17, 19, 19, 19, 19, 19, 20, 20, 20, 20, 20, 20), 0.375, 20)
    probe = ProbeResult(
        "/scratch", NOW - 3, {"write": 0.004, "fsync": 0.012, "read": 0.0008}, False, 0.0, None, {"write": histogram}
    )
    llite = LLITE / "scratch-ffff9bc043537800" / "stats"
    stats, llite_errors = parse_llite_stats(llite.read_bytes())
    assert llite_errors == []
    collectors = tuple(
        CollectorStatus(spec.name, True, 0.01, NOW, parse_errors=0)
        if spec.name != "probe"
        else CollectorStatus(spec.name, False, 0.0, None, off_reason="no probe chosen")
        for spec in SOURCES
    )
    snapshot = Snapshot(
        NOW,
        mounts=MOUNTS,
        collectors=collectors,
        disks=DiskIO(NOW, {d.name: d for d in disks}, {}),
        nfs=NFSStats(NOW, {m.mountpoint: m for m in nfs_mounts}, {}),
        probes=(probe,),
        gpus=_gpus(),
        checkpoints=_checkpoint_facts(),
        kube=kube or rich_kube(),
        facts={
            CONTAINERS.name: ProcessFacts(
                {
                    TRAINER: ContainerRef("containerd", "c0ffee" * 10 + "abcd", POD_UID, "guaranteed", "/kubepods"),
                    LOADER: None,
                    SLURM_JOB: None,
                },
                jobs={SLURM_JOB: SlurmJob(77, "0", 1000)},
            ),
            LUSTRE.name: LustreFacts(NOW, (LustreClient("scratch-ffff9bc043537800", "scratch", "/lustre", stats),)),
            PRESSURE.name: PressureFacts(NOW, 1253.835416, 472.564085),
            ACCESS.name: _access(),
            COPIES.name: CopiesFacts(
                (
                    FoundCopy(
                        "/mnt/datasets/durable/llama/step-100",
                        "/scratch/llama/step-100",
                        "/scratch/llama",
                        NOW - 3600.0,
                        NOW - 3000.0,
                        20 * GiB,
                        4,
                    ),
                ),
                ("/mnt/datasets/durable",),
            ),
        },
    )
    windows = LatencyWindows()
    WindowFeeder(windows).feed(snapshot)
    view = build_view(snapshot, Classifier("generic"), Platform("generic", "configured"), windows=windows)
    stalls = StallState(totals={("0", "/scratch", "checkpoint_write"): 30.0, ("1", "/mnt/datasets", "data_read"): 4.0})
    return dataclasses.replace(view, stalls=stalls)
