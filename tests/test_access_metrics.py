"""The workload metrics (exporter/access.py) as Prometheus reads them: real processes writing to files, read
through the real /proc by the access source, rendered in a full scrape with the rest of the exporter. No series
carries a PID; the I/O families are ``_total`` counters by workload (a pod's two GPU processes summed into one, a bare
process named by its command) that do not go down while a workload goes on, whether a worker exits and is reaped by
its parent (the kernel moves its counters into the parent's) or its counters are lost (a child no one reaps); a
workload whose processes are all new starts again from its own sum. The number of workloads and of mounts per
workload is capped and what is left out is counted; the scrape passes ``promtool check metrics``."""

from __future__ import annotations

import dataclasses
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from storwatch.analysis.pods import ProcessPod
from storwatch.analysis.view import View
from storwatch.exporter import Exporter, ExportState, render_text
from storwatch.exporter import access as access_area
from storwatch.paths import HostPaths
from storwatch.procfs.cgroup import SlurmJob
from storwatch.procfs.pidio import ProcessIO, summed
from storwatch.registry import exporter_areas
from storwatch.snapshot import Snapshot
from storwatch.sources.access import ACCESS, AccessConfig, AccessFacts, AccessSource, WorkloadAccess
from storwatch.sources.processes import CONTAINERS, ProcessFacts
from storwatch.vocabulary import Platform

WRITER = textwrap.dedent(
    """
    import os, signal, sys, time
    path, comm, mode = sys.argv[1], sys.argv[2], sys.argv[3]
    with open("/proc/self/comm", "w") as f:   # the command name a bare process is exported under
        f.write(comm)
    if mode == "autoreap":
        signal.signal(signal.SIGCHLD, signal.SIG_IGN)   # children are reaped by the kernel, their counters lost
    out = open(path, "ab", buffering=0)
    print("ready", flush=True)
    if mode == "steady":                           # 64 KiB writes, again and again
        while True:
            out.write(b"w" * 65536)
            time.sleep(0.01)
    # "reap" / "autoreap": a worker that writes 1 MiB and waits, then exits when told; the parent writes nothing
    for line in sys.stdin:
        if line.strip() == "spawn":
            r, w = os.pipe()
            child = os.fork()
            if child == 0:
                os.close(w)
                for _ in range(16):
                    out.write(b"c" * 65536)
                print("child", os.getpid(), flush=True)   # its writes done
                os.read(r, 1)                      # until the parent closes its end
                os._exit(0)
            os.close(r)
        elif line.strip() == "end":
            os.close(w)
            if mode == "reap":
                os.waitpid(child, 0)
            else:
                while os.path.exists(f"/proc/{child}"):
                    time.sleep(0.01)
            print("ended", flush=True)
    """
)

POD_UID = "0d3e8b1c-5c51-4a7e-9a55-1b2f1a0c7e11"
TRAINER_POD = ProcessPod("c" * 64, None, POD_UID, "team", "trainer-0", "StatefulSet/trainer")
Start = Callable[..., "subprocess.Popen[str]"]


@pytest.fixture
def start(tmp_path: Path) -> Iterator[Start]:
    """Start a writer (WRITER) on a file under tmp_path; every one is killed at the end."""
    started: list[subprocess.Popen[str]] = []

    def run(comm: str, mode: str = "steady") -> subprocess.Popen[str]:
        proc = subprocess.Popen(
            [sys.executable, "-c", WRITER, str(tmp_path / f"{comm}-{len(started)}.bin"), comm, mode],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        started.append(proc)
        assert proc.stdout is not None and proc.stdout.readline().split() == ["ready"]
        return proc

    yield run
    for proc in started:
        proc.send_signal(signal.SIGKILL)
        proc.wait()


def tell(proc: subprocess.Popen[str], line: str) -> list[str]:
    """Send a writer a command; its answer."""
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(line + "\n")
    proc.stdin.flush()
    return proc.stdout.readline().split()


def view_of(facts: AccessFacts, pods: Mapping[int, ProcessPod], jobs: Mapping[int, SlurmJob] | None = None) -> View:
    by_name = {ACCESS.name: facts, CONTAINERS.name: ProcessFacts({}, dict(jobs or {}))}
    snapshot = Snapshot(facts.timestamp, facts=by_name)
    return View(snapshot, Platform("generic", "test"), pods=pods)


def scrape(exporter: Exporter, view: View) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """The whole exposition parsed: sample name -> label set -> value; every family's type checked on the way."""
    text = exporter.render(view).decode()
    out: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            assert "pid" not in sample.labels, sample  # no PID in any series, of any area
            if sample.name.startswith("storwatch_workload_") and sample.name.endswith("_total"):
                assert family.type == "counter", family
            out.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return out


def workload_values(samples: dict[str, dict[tuple[tuple[str, str], ...], float]], workload: str) -> dict[str, float]:
    """Every storwatch_workload_*_total counter of one workload."""
    key = (("workload", workload),)
    return {name: rows[key] for name, rows in samples.items() if name.endswith("_total") and key in rows}


def expected(io: ProcessIO) -> dict[str, float]:
    return {d.name: float(getattr(io, field)) for d, field in access_area.COUNTERS}


def wait_for_growth(source: AccessSource, pids: list[int], before: AccessFacts) -> AccessFacts:
    """Collect until every one of ``pids`` has written more than it had in ``before`` (the writers write steadily)."""
    deadline = time.monotonic() + 30
    while True:
        facts = source.collect()
        if all(facts.workloads[p].io.wchar > before.workloads[p].io.wchar for p in pids):
            return facts
        assert time.monotonic() < deadline, "the writers' counters did not grow"
        time.sleep(0.05)


def test_a_full_scrape_has_counters_by_workload_and_no_pid(start: Start) -> None:
    rank0, rank1, bare = start("rank0"), start("rank1"), start("loader")
    pids = [rank0.pid, rank1.pid, bare.pid]
    source = AccessSource(HostPaths(), AccessConfig(), lambda: pids, lambda: (), time.time)
    pods = {rank0.pid: TRAINER_POD, rank1.pid: TRAINER_POD}
    exporter = Exporter(exporter_areas(), process_metrics=False)
    first = source.collect()
    one = scrape(exporter, view_of(first, pods))
    # the pod's two GPU processes are one workload, their counters summed; the bare process is named by its command
    pod_io = summed((first.workloads[rank0.pid].io, first.workloads[rank1.pid].io))
    assert workload_values(one, "team/trainer-0") == expected(pod_io)
    assert workload_values(one, "process:loader") == expected(first.workloads[bare.pid].io)
    workloads = {dict(k)["workload"] for k in one["storwatch_workload_write_calls_total"]}
    assert workloads == {"team/trainer-0", "process:loader"}
    assert one["storwatch_workload_series_dropped"] == {(("label", "workload"),): 0.0, (("label", "mountpoint"),): 0.0}
    # a later collection: every counter of every workload is where it was or above, and the writes went up
    two = scrape(exporter, view_of(wait_for_growth(source, pids, first), pods))
    for workload in workloads:
        before, after = workload_values(one, workload), workload_values(two, workload)
        assert set(before) == set(after) == {d.name for d, _ in access_area.COUNTERS}
        assert all(after[name] >= before[name] for name in before), (workload, before, after)
        assert after["storwatch_workload_write_call_bytes_total"] > before["storwatch_workload_write_call_bytes_total"]


def test_a_worker_reaped_by_its_parent_keeps_its_counters_in_the_workload(start: Start) -> None:
    trainer = start("trainer", "reap")
    child = int(tell(trainer, "spawn")[1])
    source = AccessSource(HostPaths(), AccessConfig(), lambda: [trainer.pid], lambda: (), time.time)
    state = ExportState()
    pods = {trainer.pid: TRAINER_POD}
    with_child = source.collect()
    assert with_child.workloads[trainer.pid].processes == 2 and with_child.workloads[trainer.pid].io.wchar >= 1 << 20
    before = parse_counters(state, view_of(with_child, pods))
    assert tell(trainer, "end") == ["ended"]
    reaped = source.collect()
    # the child is gone, and its writes are in its parent's /proc/<pid>/io: the sum did not drop
    assert reaped.workloads[trainer.pid].processes == 1
    assert reaped.workloads[trainer.pid].io.wchar >= with_child.workloads[trainer.pid].io.wchar
    assert not Path(f"/proc/{child}").exists()
    after = parse_counters(state, view_of(reaped, pods))
    assert after == expected(reaped.workloads[trainer.pid].io)  # the sum itself, nothing held
    assert all(after[name] >= before[name] for name in before), (before, after)


def test_counters_that_leave_a_workload_hold_it_flat_and_new_processes_start_it_again(start: Start) -> None:
    trainer = start("trainer", "autoreap")
    tell(trainer, "spawn")
    source = AccessSource(HostPaths(), AccessConfig(), lambda: [trainer.pid], lambda: (), time.time)
    state = ExportState()
    pods = {trainer.pid: TRAINER_POD}
    with_child = source.collect()
    before = parse_counters(state, view_of(with_child, pods))
    assert tell(trainer, "end") == ["ended"]
    lost = source.collect()
    # the kernel reaped the child for a parent that ignores SIGCHLD: its 1 MiB of writes left the sum...
    dropped_by = with_child.workloads[trainer.pid].io.wchar - lost.workloads[trainer.pid].io.wchar
    assert dropped_by >= 1 << 20, (with_child, lost)
    # ...and the counter stays where it was instead of going down (which Prometheus would read as a reset)
    # (each counter on its own: the parent's read of "end" is a read call more, which counts)
    held = parse_counters(state, view_of(lost, pods))
    now = expected(lost.workloads[trainer.pid].io)
    assert held == {name: max(before[name], now[name]) for name in before}
    assert held["storwatch_workload_write_call_bytes_total"] == before["storwatch_workload_write_call_bytes_total"]
    # the pod's container restarted: a new GPU process, none of the old ones; its counters are its own, from low
    successor = start("trainer", "steady")
    renewed = AccessSource(HostPaths(), AccessConfig(), lambda: [successor.pid], lambda: (), time.time).collect()
    fresh = parse_counters(state, view_of(renewed, {successor.pid: TRAINER_POD}))
    assert fresh == expected(renewed.workloads[successor.pid].io)
    assert fresh["storwatch_workload_write_call_bytes_total"] < before["storwatch_workload_write_call_bytes_total"]


def parse_counters(state: ExportState, view: View) -> dict[str, float]:
    """The access area alone, rendered with ``state``: the one workload's counters."""
    text = render_text(access_area.families(view, state)).decode()
    values = {
        s.name: s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name.endswith("_total")
    }
    assert len(values) == len(access_area.COUNTERS), text
    return values


def made_facts(workloads: Mapping[int, WorkloadAccess], **limits: int) -> AccessFacts:
    return AccessFacts(1_700_000_000.0, dict(workloads), **limits)


def workload(pid: int, comm: str | None, *mounts: str, within: int | None = None) -> WorkloadAccess:
    io = ProcessIO(rchar=pid, wchar=2 * pid, syscr=3, syscw=4, read_bytes=5, write_bytes=6)
    return WorkloadAccess(pid, 1, io, comm=comm, within=within, mounts_read=mounts, mounts_written=mounts[:1])


def test_workloads_past_the_cap_are_left_out_and_counted() -> None:
    pods = {
        101: dataclasses.replace(TRAINER_POD, name="trainer-0"),
        102: dataclasses.replace(TRAINER_POD, name="trainer-1"),
        103: ProcessPod("d" * 64, None, "7c4f2b58-0a49-4a43-b0d1-8e4f1f3f9f01"),  # the API does not know it yet
    }
    jobs = {104: SlurmJob(4242, "0", None)}
    facts = {
        101: workload(101, "python", "/data", "/ckpt", "/scratch"),
        102: workload(102, "python", "/data"),
        103: workload(103, "python"),
        104: workload(104, "python"),
        105: workload(105, "loader"),
        106: workload(106, "loader"),  # a bare process of the same name: the same workload
        107: workload(107, None),  # no command name to be read
        108: workload(108, "trainer", within=101),  # a GPU process started by another: counted in that one's tree
    }
    pods[108] = pods[101]
    # everything fits
    text = render_text(access_area.families(view_of(made_facts(facts), pods, jobs), ExportState())).decode()
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
    }
    name = "storwatch_workload_write_call_bytes_total"
    calls = {dict(k)["workload"]: v for (n, k), v in samples.items() if n == name}
    assert calls == {
        "team/trainer-0": 2 * 101,  # 108's tree is in 101's
        "team/trainer-1": 2 * 102,
        f"pod:{pods[103].pod_uid}": 2 * 103,
        "job:4242": 2 * 104,
        "process:loader": 2 * (105 + 106),
        "other": 2 * 107,
    }
    assert samples[("storwatch_workload_series_dropped", (("label", "workload"),))] == 0
    # two workloads and two mounts each: the pods and jobs before the stand-ins, then by name; the rest counted
    capped = made_facts(facts, max_workloads=2, max_mounts_per_workload=2)
    text = render_text(access_area.families(view_of(capped, pods, jobs), ExportState())).decode()
    rows = [s for f in text_string_to_metric_families(text) for s in f.samples]
    written = {s.labels["workload"] for s in rows if "workload" in s.labels}
    assert written == {f"pod:{pods[103].pod_uid}", "job:4242"}, written
    dropped = {s.labels["label"]: s.value for s in rows if s.name == "storwatch_workload_series_dropped"}
    assert dropped == {"workload": 4, "mountpoint": 0}
    capped = made_facts(facts, max_workloads=3, max_mounts_per_workload=2)
    text = render_text(access_area.families(view_of(capped, pods, jobs), ExportState())).decode()
    rows = [s for f in text_string_to_metric_families(text) for s in f.samples]
    mounts = {(s.labels["mountpoint"], s.labels["mode"]) for s in rows if s.name == "storwatch_workload_mount"}
    assert mounts == {("/ckpt", "read"), ("/data", "read"), ("/data", "write")}, mounts  # /scratch left out
    dropped = {s.labels["label"]: s.value for s in rows if s.name == "storwatch_workload_series_dropped"}
    assert dropped == {"workload": 3, "mountpoint": 1}


@pytest.mark.realpart
def test_the_scrape_passes_promtool_check_metrics(start: Start) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not found on PATH (Debian package 'prometheus')")
    rank0, rank1, bare = start("rank0"), start("rank1"), start("loader")
    pids = [rank0.pid, rank1.pid, bare.pid]
    facts = AccessSource(HostPaths(), AccessConfig(), lambda: pids, lambda: (), time.time).collect()
    body = Exporter(exporter_areas(), process_metrics=False).render(
        view_of(facts, {rank0.pid: TRAINER_POD, rank1.pid: TRAINER_POD})
    )
    assert b"storwatch_workload_read_bytes_total{" in body
    result = subprocess.run(
        [promtool, "check", "metrics"], input=body.decode(), capture_output=True, text=True, timeout=30
    )
    assert (result.returncode, result.stdout, result.stderr) == (0, "", ""), body.decode()
