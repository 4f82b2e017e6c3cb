"""The sync action on the real copy engine (storwatch/actions/sync_engine.py over storwatch.sync's SyncWorker, its
helper processes and real files): sync.destinations reached below the host root, a field that would lead out refused
with nothing written, a copy verified and counted, a copy past its pod's time stopped with nothing left at its path,
a newer checkpoint of a run superseding an older one's copy (each end counted by its result), the action's deadline
from the pod's time left, its rescan while it waits for the checkpoint it asked for; and the collectors'
collect_soon."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from storwatch.actions.base import ActionRequest, Entity
from storwatch.actions.checkpoint_request import AskedRuns
from storwatch.actions.checkpoint_sync import SyncAction, run_name, template_fields
from storwatch.actions.sync_engine import SyncEngine
from storwatch.actions.sync_jobs import SyncJob
from storwatch.agent.collectors import Collectors, SourceState
from storwatch.config import SyncConfig
from storwatch.paths import HostPaths
from storwatch.sources import FactsKey
from storwatch.sources.kubevolumes import volume_directory
from tests.agentproc import wait_until

WAIT = 60.0
POD_DIR = "/var/lib/kubelet/pods/5a1e7c3b-2f4d-4e8a-9b6c-0d1e2f3a4b5c/volumes"
VOLUME = f"{POD_DIR}/kubernetes.io~empty-dir/scratch"
"""The pod's emptyDir the run is in, as the host names it."""


class Clock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def host(tmp_path: Path) -> Path:
    """The host's root as the agent reaches it (--path.rootfs), with a durable root and a run's checkpoint."""
    root = tmp_path / "root"
    (root / "durable").mkdir(parents=True)
    run = root / VOLUME.lstrip("/") / "run1"
    run.mkdir(parents=True)
    (run / "step-100.pt").write_bytes(bytes(range(256)) * 4096)
    return root


@pytest.fixture
def engines() -> Iterator[list[SyncEngine]]:
    made: list[SyncEngine] = []
    yield made
    for e in made:
        e.close()


def _engine(engines: list[SyncEngine], host: Path, clock: Clock, **section: Any) -> SyncEngine:
    engine = SyncEngine(SyncConfig(**{"destinations": ("/durable",), **section}), HostPaths(rootfs=str(host)), clock)
    engines.append(engine)
    return engine


def _done(engine: SyncEngine, job_id: int) -> SyncJob:
    def finished() -> SyncJob | None:
        job = next(j for j in engine.jobs.jobs() if j.job_id == job_id)
        return job if job.state in ("done", "failed") else None

    return wait_until(finished, timeout=WAIT, interval=0.05, what=f"job {job_id} to finish")


def _run(host: Path, **fields: Any) -> Entity:
    ckpt = host / VOLUME.lstrip("/") / "run1" / "step-100.pt"
    base: dict[str, Any] = {
        "run": "run1",
        "path": f"{POD_DIR}/kubernetes.io~empty-dir/scratch/run1",
        "namespace": "train",
        "pod": "trainer-0",
        "checkpoint": ckpt.name,
        "ephemeral": True,
        "pod_seconds_left": None,
    }
    return Entity(
        "run",
        "run1",
        {**base, **fields},
        run_dir=str(ckpt.parent),
        run_root=str(host / "var/lib/kubelet/pods"),
        checkpoint_path=str(ckpt),
        checkpoint_mtime=ckpt.stat().st_mtime,
    )


def _request(entity: Entity, transition: Any = "firing", **params: Any) -> ActionRequest:
    return ActionRequest("leaving", "sync", params, entity, "critical", "the node drains", transition=transition)


@pytest.mark.parametrize(
    "path, label, expected",
    [
        (f"{POD_DIR}/kubernetes.io~empty-dir/scratch/run1", "x", "scratch/run1"),
        (f"{POD_DIR}/kubernetes.io~empty-dir/scratch", "x", "scratch"),
        (f"{POD_DIR}/kubernetes.io~csi/pvc-1/mount/ckpt/llama", "x", "pvc-1/ckpt/llama"),
        (f"{POD_DIR}/kubernetes.io~local-volume/pvc-2/run", "x", "pvc-2/run"),
        ("/home/alice/run1", "alice/run1", "alice/run1"),
        # A tenant's directory named like a kubelet path, anywhere but below the kubelet's own: no pod's volume.
        (f"/data/them{POD_DIR}/kubernetes.io~empty-dir/scratch/run1", "them/var/lib/x", "them/var/lib/x"),
        (f"/var/lib/kubelet/pods/x{POD_DIR}/kubernetes.io~empty-dir/scratch/run1", "y", "y"),
        (f"{POD_DIR}/kubernetes.io~csi/pvc-1/vol_data.json", "z", "z"),
    ],
    ids=[
        "empty-dir",
        "volume-root",
        "csi-mount",
        "local-volume",
        "not-a-pod-volume",
        "named-like-one",
        "not-a-uid",
        "csi-not-mount",
    ],
)
def test_run_names_a_pod_volume_run_by_its_volume(path: str, label: str, expected: str) -> None:
    volume = volume_directory("/var/lib/kubelet/pods", path)
    assert run_name(Entity("run", label, {"run": label, "path": path}, run_dir=path), volume) == expected


def test_a_copy_goes_below_the_root_as_reached_verified_and_counted(
    host: Path, engines: list[SyncEngine], tmp_path: Path
) -> None:
    clock = Clock()
    engine = _engine(engines, host, clock)
    action = SyncAction(
        engine.resolver, engine.jobs, AskedRuns(clock), "gpu-node-1", clock, paths=engine.resolver.paths
    )
    result = action.run(_request(_run(host)), 10.0)
    assert result.outcome == "ok", result
    (job,) = engine.jobs.jobs()
    dest = host / "durable" / "train" / "trainer-0" / "scratch%2Frun1" / "step-100.pt"
    assert job.destination == str(dest)
    done = _done(engine, job.job_id)
    assert done.state == "done" and done.detail.startswith("verified: 1 files"), done
    assert dest.read_bytes() == (host / VOLUME.lstrip("/") / "run1" / "step-100.pt").read_bytes()
    metrics = engine.jobs.metrics()
    assert metrics.bytes_total == dest.stat().st_size and metrics.in_progress == 0
    assert list(metrics.last_success) == ["run1"]
    assert metrics.copies == {"verified": 1, "failed": 0, "superseded": 0}
    # Asked again for the same checkpoint: nothing is copied again.
    again = action.run(_request(_run(host), transition="repeat"), 10.0)
    assert again.outcome == "skipped" and "already done" in again.detail, again
    assert not (tmp_path / "durable").exists()  # the host's path, never the agent's own


@pytest.mark.parametrize(
    "fields, params, why",
    [
        ({"namespace": "../etc"}, {}, "field 'namespace' holds '/'"),
        ({"pod": ".."}, {}, "field 'pod' is '..'"),
        ({"checkpoint": "a\x00b"}, {}, "control character"),
        ({}, {"destination": "/elsewhere"}, "params.destination: /elsewhere is not one of sync.destinations"),
    ],
    ids=["dotdot-slash", "dotdot", "nul", "outside-the-allowlist"],
)
def test_a_destination_that_would_leave_its_root_is_refused_and_nothing_written(
    host: Path, engines: list[SyncEngine], fields: dict[str, Any], params: dict[str, Any], why: str
) -> None:
    clock = Clock()
    engine = _engine(engines, host, clock)
    action = SyncAction(
        engine.resolver, engine.jobs, AskedRuns(clock), "gpu-node-1", clock, paths=engine.resolver.paths
    )
    result = action.run(_request(_run(host, **fields), **params), 10.0)
    assert result.outcome == "failed" and why in result.detail, result
    assert engine.jobs.jobs() == [] and list((host / "durable").iterdir()) == []


def test_a_reload_changes_the_roots_for_the_next_copy(host: Path, engines: list[SyncEngine]) -> None:
    clock = Clock()
    engine = _engine(engines, host, clock)
    (host / "fsx").mkdir()
    engine.configure(SyncConfig(destinations=("/fsx",), template="{pod}/{checkpoint}"))
    assert engine.resolver.roots == ("/fsx",)
    action = SyncAction(engine.resolver, engine.jobs, AskedRuns(clock), "n", clock, paths=engine.resolver.paths)
    assert action.check({"destination": "/durable"}) == ["params.destination: /durable is not one of sync.destinations"]
    assert action.run(_request(_run(host)), 10.0).outcome == "ok"
    (job,) = engine.jobs.jobs()
    assert _done(engine, job.job_id).state == "done"
    assert (host / "fsx" / "trainer-0" / "step-100.pt").is_file()
    engine.configure(SyncConfig())
    skipped = action.run(_request(_run(host), transition="repeat"), 10.0)
    assert skipped.outcome == "skipped" and "sync.destinations is empty" in skipped.detail


def test_a_copy_still_going_when_its_pod_is_killed_is_stopped_and_leaves_nothing(
    host: Path, engines: list[SyncEngine]
) -> None:
    clock = Clock()
    # 1 MiB at 64 KiB/s: the copy runs far longer than the pod's time below.
    engine = _engine(engines, host, clock, bandwidth_bytes_per_second=64 << 10)
    action = SyncAction(engine.resolver, engine.jobs, AskedRuns(clock), "n", clock, paths=engine.resolver.paths)
    # The node drains; the pod is not being deleted yet: the copy has sync.deadline_seconds.
    assert action.run(_request(_run(host)), 10.0).outcome == "ok"
    (job,) = engine.jobs.jobs()
    assert job.deadline_at == clock.now + 3600.0
    wait_until(lambda: next(j for j in engine.jobs.jobs()).state == "copying", timeout=WAIT, what="the copy to start")
    # Then its pod is deleted with 8 s left: the repeat brings the copy's deadline forward.
    repeat = action.run(_request(_run(host, pod_seconds_left=8.0), transition="repeat"), 10.0)
    assert repeat.outcome == "skipped" and "already copying" in repeat.detail, repeat
    assert engine.jobs.jobs()[0].deadline_at == clock.now + 8.0
    clock.now += 9.0
    done = _done(engine, job.job_id)
    assert done.state == "failed" and "past its deadline" in done.detail, done
    assert engine.jobs.metrics().copies == {"verified": 0, "failed": 1, "superseded": 0}
    dest_dir = host / "durable" / "train" / "trainer-0" / "scratch%2Frun1"
    wait_until(lambda: not any(dest_dir.iterdir()), timeout=WAIT, what="the copy's temporaries to go")
    # Asked again once the pod's time is up: no copy is started.
    late = action.run(_request(_run(host, pod_seconds_left=-1.0), transition="repeat"), 10.0)
    assert late.outcome == "skipped" and "grace period is over" in late.detail, late


def test_a_new_copy_is_held_to_the_pods_time_left(host: Path, engines: list[SyncEngine]) -> None:
    clock = Clock()
    engine = _engine(engines, host, clock)
    action = SyncAction(engine.resolver, engine.jobs, AskedRuns(clock), "n", clock, paths=engine.resolver.paths)
    result = action.run(_request(_run(host, pod_seconds_left=12.5)), 10.0)
    assert result.outcome == "ok" and result.detail.endswith("within 12 s"), result
    (job,) = engine.jobs.jobs()
    assert job.deadline_at == clock.now + 12.5
    worker = engine.jobs.worker
    (seen,) = worker.status()  # type: ignore[attr-defined]
    assert seen.deadline_seconds == 12.5


def test_a_newer_checkpoint_supersedes_the_copy_of_an_older_one(host: Path, engines: list[SyncEngine]) -> None:
    clock = Clock()
    engine = _engine(engines, host, clock, bandwidth_bytes_per_second=64 << 10)
    action = SyncAction(engine.resolver, engine.jobs, AskedRuns(clock), "n", clock, paths=engine.resolver.paths)
    old = _run(host)
    assert action.run(_request(old), 10.0).outcome == "ok"
    wait_until(lambda: engine.jobs.jobs()[0].state == "copying", timeout=WAIT, what="the old copy to start")
    newer = host / VOLUME.lstrip("/") / "run1" / "step-200.pt"
    newer.write_bytes(b"newer" * 100)
    entity = Entity(
        "run",
        old.key,
        {**old.fields, "checkpoint": newer.name},
        run_dir=old.run_dir,
        run_root=old.run_root,
        checkpoint_path=str(newer),
        checkpoint_mtime=old.checkpoint_mtime + 1 if old.checkpoint_mtime else None,
    )
    assert action.run(_request(entity, transition="repeat"), 10.0).outcome == "ok"
    second, first = engine.jobs.jobs()
    assert _done(engine, first.job_id).state == "failed"
    assert "superseded" in _done(engine, first.job_id).detail
    assert _done(engine, second.job_id).state == "done"
    dest_dir = host / "durable" / "train" / "trainer-0" / "scratch%2Frun1"
    assert (dest_dir / "step-200.pt").read_bytes() == newer.read_bytes()
    assert not (dest_dir / "step-100.pt").exists()
    # The older copy's end is no failure: it gave way to the newer checkpoint.
    assert engine.jobs.metrics().copies == {"verified": 1, "failed": 0, "superseded": 1}


def test_waiting_for_the_checkpoint_asked_for_asks_for_a_scan(host: Path, engines: list[SyncEngine]) -> None:
    clock = Clock()
    engine = _engine(engines, host, clock)
    asked = AskedRuns(clock)
    scans: list[float] = []
    action = SyncAction(
        engine.resolver,
        engine.jobs,
        asked,
        "n",
        clock,
        rescan=lambda: scans.append(clock.now),
        paths=engine.resolver.paths,
    )
    entity = _run(host, pod_seconds_left=25.0)
    clock.now = (entity.checkpoint_mtime or 0) + 100
    asked.asked(entity.run_dir or "")
    waiting = action.run(_request(entity, wait_for_requested_seconds=20), 10.0)
    assert waiting.outcome == "skipped" and waiting.detail.startswith("waiting for the checkpoint"), waiting
    assert scans == [clock.now] and engine.jobs.jobs() == []
    clock.now += 21  # waited long enough: the newest there is is copied, and no scan is asked for
    assert action.run(_request(entity, transition="repeat", wait_for_requested_seconds=20), 10.0).outcome == "ok"
    assert len(scans) == 1


class CountingSource:
    name = "counting"
    interval_seconds = 3600.0

    def __init__(self) -> None:
        self.collections = 0

    def collect(self) -> int:
        self.collections += 1
        return self.collections

    def close(self) -> None:
        pass


def test_collect_soon_has_a_source_collect_again_before_its_interval() -> None:
    source = CountingSource()
    stop = threading.Event()
    state = SourceState(source, FactsKey("counting"))  # type: ignore[arg-type]
    collectors = Collectors([state], None, lambda: 0.0, stop, lambda: None)  # type: ignore[arg-type]
    (thread,) = collectors.start()
    try:
        wait_until(lambda: source.collections == 1, timeout=WAIT, what="the first collection")
        assert collectors.collect_soon("counting") and not collectors.collect_soon("nothing-of-that-name")
        wait_until(lambda: source.collections == 2, timeout=WAIT, what="the collection asked for")
    finally:
        stop.set()
        collectors.close()
    thread.join(WAIT)
    assert not thread.is_alive()
    assert source.collections == 2


def test_template_fields_use_the_run_name() -> None:
    path = f"{POD_DIR}/kubernetes.io~empty-dir/scratch/a%b"
    entity = Entity("run", "k", {"run": "k", "path": path}, run_dir=path)
    assert template_fields(entity, "n", volume_directory("/var/lib/kubelet/pods", path))["run"] == "scratch%2Fa%25b"
