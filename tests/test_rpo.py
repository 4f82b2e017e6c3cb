"""Recovery points and recommended checkpoint intervals (analysis/rpo.py): exact under an injected time, and the
formulas against figures worked by hand."""

from __future__ import annotations

import math

import pytest

from storwatch.analysis.rpo import daly_interval, recoveries, run_recovery, young_interval
from storwatch.analysis.view import MountView, RunView, View
from storwatch.exporter import ExportState, render_text
from storwatch.exporter import checkpoints as checkpoints_area
from storwatch.snapshot import Snapshot
from storwatch.sources.checkpoints import RunState
from storwatch.vocabulary import Durability, Mount, Platform, Verdict
from tests.builders import NOW, ckpt, on, run


def test_young_and_daly_against_figures_worked_by_hand() -> None:
    # C = 60 s, M = 86,400 s: sqrt(2 * 60 * 86400) = sqrt(10,368,000) = 3219.94 s
    assert young_interval(60.0, 86_400.0) == pytest.approx(3219.9379, abs=1e-3)
    # Daly: 3219.94 * (1 + sqrt(60 / 172800) / 3 + 60 / 1,555,200) - 60
    #     = 3219.94 * (1 + 0.0062113 + 0.0000386) - 60 = 3240.06 - 60 = 3180.06
    assert daly_interval(60.0, 86_400.0) == pytest.approx(3180.0617, abs=1e-3)
    assert daly_interval(300.0, 100.0) == 100.0  # a write longer than twice the MTBF: checkpoint every MTBF
    assert daly_interval(1.0, 1e9) < young_interval(1.0, 1e9)  # the correction takes the write time off


def test_recovery_point_counts_only_checkpoints_that_survive_the_node() -> None:
    durable = run("durable", on(Durability.CLUSTER), ckpt(3600.0), ckpt(600.0, write_seconds=45.0))
    local = run("local", on(Durability.NODE, "/scratch"), ckpt(1800.0), ckpt(120.0, write_seconds=12.0))
    unplaced = run("unplaced", None, ckpt(60.0))
    nothing = run("nothing", on(Durability.REGION), ckpt(30.0, "incomplete"))
    d, loc, u, n = recoveries([durable, local, unplaced, nothing], NOW, mtbf_seconds=86_400.0)
    assert (d.recovery_point_seconds, d.newest_age_seconds) == (600.0, 600.0)
    assert d.write_cost_seconds == 45.0
    assert d.overhead_ratio == 45.0 / 3000.0  # write time over the interval between the two newest
    assert d.recommended_interval_seconds == daly_interval(45.0, 86_400.0)
    assert math.isinf(loc.recovery_point_seconds) and loc.newest_age_seconds == 120.0  # only on node-local disk
    assert math.isinf(u.recovery_point_seconds)
    assert u.write_cost_seconds is None and u.recommended_interval_seconds is None and u.overhead_ratio is None
    assert math.isinf(n.recovery_point_seconds) and n.newest_age_seconds is None


def test_the_recovery_point_moves_with_the_injected_time() -> None:
    rv = run("r", on(Durability.CLUSTER), ckpt(100.0))
    assert run_recovery(rv, NOW).recovery_point_seconds == 100.0
    assert run_recovery(rv, NOW + 50.5).recovery_point_seconds == 150.5


def test_the_metrics() -> None:
    runs = (
        run("durable", on(Durability.CLUSTER), ckpt(3600.0), ckpt(600.0, write_seconds=45.0)),
        run("local", on(Durability.NODE, "/scratch"), ckpt(120.0)),
    )
    view = View(Snapshot(NOW), Platform("generic", "test"), checkpoints=runs, recovery=recoveries(runs, NOW, 86_400.0))
    lines = set(render_text(checkpoints_area.families(view, ExportState())).decode().splitlines())
    assert 'storwatch_recovery_point_seconds{run="durable"} 600.0' in lines
    assert 'storwatch_recovery_point_seconds{run="local"} +Inf' in lines
    assert 'storwatch_checkpoint_overhead_ratio{run="durable"} 0.015' in lines
    recommended = (
        f'storwatch_checkpoint_recommended_interval_seconds{{run="durable"}} {daly_interval(45.0, 86_400.0)!r}'
    )
    assert recommended in lines
    assert not any(line.startswith('storwatch_checkpoint_recommended_interval_seconds{run="local"}') for line in lines)


def test_the_report_gives_null_for_no_durable_checkpoint() -> None:
    import json

    from storwatch.report import view_to_dict

    runs = (
        run("durable", on(Durability.CLUSTER), ckpt(3600.0), ckpt(600.0, write_seconds=45.0)),
        run("local", on(Durability.NODE, "/scratch"), ckpt(120.0)),
    )
    view = View(Snapshot(NOW), Platform("generic", "test"), checkpoints=runs, recovery=recoveries(runs, NOW, 86_400.0))
    data = json.loads(json.dumps(view_to_dict(view), allow_nan=False))  # valid JSON: no Infinity
    by_run = {r["run"]: r for r in data["checkpoints"]}
    assert by_run["durable"]["recovery_point_seconds"] == 600.0
    assert by_run["durable"]["write_cost_seconds"] == 45.0
    assert by_run["durable"]["recommended_interval_seconds"] == daly_interval(45.0, 86_400.0)
    assert by_run["local"]["recovery_point_seconds"] is None


def test_gpu_seconds_at_risk_count_the_gpus_of_the_pod_the_run_writes_into() -> None:
    from storwatch.analysis.pods import ProcessPod
    from storwatch.sources.gpu import GPUFacts, GPUProcess, GPUState

    trainer, other = "0b5c6f3e-1c9a-4a5e-9c1f-2b7d8e9f0a1b", "17fdde9d-3dd3-4c7b-a4cb-601d19e3597e"
    pvc = f"/var/lib/kubelet/pods/{trainer}/volumes/kubernetes.io~csi/pvc-ckpt/mount"
    scratch = f"/var/lib/kubelet/pods/{trainer}/volumes/kubernetes.io~empty-dir/scratch"

    def pod_run(label: str, volume: str, durability: Durability) -> RunView:
        state = RunState(f"{volume}/{label}", volume, (ckpt(900.0), ckpt(300.0, write_seconds=20.0)))
        return RunView(state, label, on(durability, volume))

    gpus = GPUFacts(
        NOW,
        True,
        "550",
        None,
        tuple(GPUState(i, f"GPU-{i}", "H100", True, processes=(GPUProcess(100 + i, 1 << 30, None),)) for i in range(3)),
    )
    pods = {
        100: ProcessPod("c" * 64, "containerd", trainer),
        101: ProcessPod("c" * 64, "containerd", trainer),
        102: ProcessPod("d" * 64, "containerd", other),
    }
    durable, local, outside = recoveries(
        [
            pod_run("durable", pvc, Durability.CLUSTER),
            pod_run("local", scratch, Durability.NODE),
            run("outside", on(Durability.CLUSTER), ckpt(60.0)),
        ],
        NOW,
        gpus=gpus,
        pods=pods,
    )
    assert (durable.gpus, durable.gpu_seconds_at_risk) == (2, 600.0)  # 300 s of work on each of 2 GPUs
    assert local.gpus == 2 and local.gpu_seconds_at_risk == math.inf  # nothing survives the node
    assert outside.gpus is None and outside.gpu_seconds_at_risk is None  # tied to no process: unknown, not 0
    runs = (pod_run("durable", pvc, Durability.CLUSTER),)
    view = View(Snapshot(NOW), Platform("generic", "test"), checkpoints=runs, recovery=(durable,))
    lines = set(render_text(checkpoints_area.families(view, ExportState())).decode().splitlines())
    assert 'storwatch_gpu_seconds_at_risk{run="durable"} 600.0' in lines


def test_headroom_says_whether_the_next_checkpoint_fits() -> None:
    from storwatch.vocabulary import FsUsage

    def mounted(avail: int) -> MountView:
        usage = FsUsage(size_bytes=10 << 30, free_bytes=avail, avail_bytes=avail, files=1000, files_free=900)
        mount = Mount(1, "/data", "dev", "ext4", "/", 8, 1, False, (), (), usage, False, 0.0)
        return MountView(mount, Verdict(Durability.NODE, "test", ()))

    gib = 1 << 30  # the newest checkpoint's size (ckpt() writes 1 GiB)
    roomy, tight = recoveries([run("roomy", mounted(3 * gib), ckpt(60.0)), run("tight", mounted(gib), ckpt(60.0))], NOW)
    assert roomy.headroom_bytes == 3 * gib - gib * 5 // 4
    assert tight.headroom_bytes == -(gib // 4)  # 1 GiB left, 1.25 GiB needed
    (unknown,) = recoveries([run("unknown", on(Durability.NODE), ckpt(60.0))], NOW)  # no statvfs figure
    assert unknown.headroom_bytes is None
    view = View(Snapshot(NOW), Platform("generic", "test"), recovery=(roomy, tight, unknown))
    lines = set(render_text(checkpoints_area.families(view, ExportState())).decode().splitlines())
    assert 'storwatch_checkpoint_headroom_bytes{run="tight"} -268435456.0' in lines
    assert not any('headroom_bytes{run="unknown"}' in line for line in lines)


def test_write_cost_per_tier_and_who_writes_the_run() -> None:
    import dataclasses

    from storwatch.analysis.pods import ProcessPod
    from storwatch.procfs.cgroup import SlurmJob

    fast = dataclasses.replace(ckpt(600.0, write_seconds=2.0), writer_pid=77)  # 1 GiB in 2 s on node storage
    slow = ckpt(300.0, write_seconds=16.0)  # 1 GiB in 16 s on cluster storage
    local = run("local", on(Durability.NODE, "/scratch"), fast)
    shared = run("shared", on(Durability.CLUSTER, "/nfs"), slow)
    pod_uid = "0b5c6f3e-1c9a-4a5e-9c1f-2b7d8e9f0a1b"
    in_pod = RunView(
        RunState(f"/var/lib/kubelet/pods/{pod_uid}/volumes/kubernetes.io~csi/pvc/mount/r", "/", (ckpt(30.0),)),
        "pod-run",
        on(Durability.CLUSTER, "/pvc"),
    )
    pods = {5: ProcessPod("c1", None, pod_uid, "ml", "trainer-0")}
    jobs = {77: SlurmJob(4242, "0", 1000)}
    loc, sh, pod = recoveries([local, shared, in_pod], NOW, pods=pods, jobs=jobs)
    # each run's newest checkpoint (1 GiB) at each tier's median rate here
    assert loc.tier_write_seconds == {"node": pytest.approx(2.0), "cluster": pytest.approx(16.0)}
    assert sh.tier_write_seconds == loc.tier_write_seconds
    assert (loc.workload, sh.workload, pod.workload) == ("job:4242", None, "ml/trainer-0")
    text = render_text(
        list(
            checkpoints_area.families(
                View(Snapshot(NOW), Platform("generic", "t"), checkpoints=(local,), recovery=(loc,)), ExportState()
            )
        )
    ).decode()
    assert 'storwatch_checkpoint_tier_write_seconds{durability="cluster",run="local"} 16.0' in text


def test_headroom_counts_the_space_a_checkpoint_takes_not_the_size_a_sparse_file_claims() -> None:
    import dataclasses

    from storwatch.vocabulary import FsUsage

    usage = FsUsage(size_bytes=64 << 20, free_bytes=60 << 20, avail_bytes=60 << 20, files=1000, files_free=900)
    mount = Mount(1, "/data", "tmpfs", "tmpfs", "/", 0, 40, False, (), (), usage, False, 0.0)
    sparse = dataclasses.replace(ckpt(60.0), size_bytes=5 << 40, allocated_bytes=1 << 20)  # 5 TiB claimed, 1 MiB used
    (r,) = recoveries([run("sparse", MountView(mount, Verdict(Durability.VOLATILE, "test", ())), sparse)], NOW)
    assert r.headroom_bytes == (60 << 20) - (5 << 20) // 4


def test_a_checkpoint_dated_in_the_future_has_no_age_and_no_negative_figure() -> None:
    """A file dated in 2125 (touch -d, or a clock stepped back): its age, the recovery point and the GPU-seconds at
    risk are unknown, with the reason, never negative."""
    future = ckpt(-3.1e9)  # dated 98 years ahead
    (r,) = recoveries([run("ahead", on(Durability.CLUSTER), future)], NOW)
    assert r.recovery_point_seconds is None and r.newest_age_seconds is None
    assert r.unknown_reason is not None and "in the future" in r.unknown_reason
    assert r.gpu_seconds_at_risk is None
    # a second within the skew is now, not the future
    (close,) = recoveries([run("close", on(Durability.CLUSTER), ckpt(-1.0))], NOW)
    assert close.recovery_point_seconds == 0.0
    # on ephemeral storage nothing survives the node whatever the date says
    (local,) = recoveries([run("local", on(Durability.NODE), future)], NOW)
    assert local.recovery_point_seconds == math.inf
    view = View(Snapshot(NOW), Platform("generic", "test"), recovery=(r, close))
    lines = render_text(checkpoints_area.families(view, ExportState())).decode().splitlines()
    assert not any(line.startswith('storwatch_recovery_point_seconds{run="ahead"}') for line in lines)
    assert all(float(line.rsplit(" ", 1)[1]) >= 0 for line in lines if line.startswith("storwatch_recovery_point"))


def test_a_tier_rate_takes_one_value_per_run() -> None:
    """One run saving often at an absurd rate moves a tier's median no more than any other run does."""
    from storwatch.analysis.rpo import tier_rates

    honest = [run(f"r{i}", on(Durability.CLUSTER, "/nfs"), ckpt(60.0, write_seconds=10.0)) for i in range(2)]
    noisy = run("noisy", on(Durability.CLUSTER, "/nfs"), *(ckpt(float(a), write_seconds=1e-6) for a in range(1, 50)))
    assert tier_rates([*honest, noisy]) == {"cluster": pytest.approx((1 << 30) / 10.0)}
