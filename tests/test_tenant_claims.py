"""What tenants' files claim, checked before use: event-log numbers against the file they name, writer PIDs against
the processes' open files, and what the agent could not read at all. Parser tables first, then the running agent
against a real process of another uid holding a (fake NVML) GPU, and the agent run with every capability dropped."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import threading
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from storwatch.checkpoints.events import SKEW_SECONDS, FileTimes, SaveRecord, judge, parse_lines
from tests.agentproc import REPO_ROOT, AgentProcess, running_agent, wait_until
from tests.nvml import FakeNVMLUnavailable, build_fake_nvml

NOW = 1_800_000_000.0
FILE = FileTimes(size_bytes=1000, mtime=NOW - 100.0, birth=NOW - 110.0, ctime=NOW - 99.8)
UNBORN = FileTimes(size_bytes=1000, mtime=NOW - 100.0, birth=None)


def line(**fields: Any) -> dict[str, Any]:
    return {"path": "step-1.pt", "start": NOW - 110.5, "end": NOW - 99.5, "bytes": 1000, "pid": 4242, **fields}


@pytest.mark.parametrize(
    ("rec", "file", "expected"),
    [
        pytest.param(line(), FILE, SaveRecord(NOW - 110.5, NOW - 99.5, 1000, 4242), id="a-true-line"),
        pytest.param(line(pid=True), FILE, SaveRecord(NOW - 110.5, NOW - 99.5, 1000, None), id="a-bool-is-no-pid"),
        pytest.param(line(pid=1 << 22), FILE, SaveRecord(NOW - 110.5, NOW - 99.5, 1000, None), id="pid-past-max"),
        pytest.param(line(end=math.inf), FILE, "not_finite", id="end-1e999"),
        pytest.param(line(bytes=math.nan), FILE, "not_finite", id="bytes-nan"),
        pytest.param(line(start="100"), FILE, "not_finite", id="a-string"),
        pytest.param(line(start=10**400), FILE, "not_finite", id="an-int-past-float"),
        pytest.param(line(start=-1.7e308), FILE, "span", id="start-before-the-epoch"),
        pytest.param(line(start=NOW - 90.0), FILE, "span", id="start-after-end"),
        pytest.param(line(end=NOW + 365 * 86400.0), FILE, "future", id="end-a-year-ahead"),
        pytest.param(line(end=NOW + SKEW_SECONDS / 2), FILE, "file_life", id="a-span-stretched-past-the-rename"),
        pytest.param(line(end=NOW - 50.0), FILE, "file_life", id="a-span-stretched-past-the-rename"),
        pytest.param(line(start=NOW - 120.0, end=NOW - 115.0), FILE, "file_life", id="written-after-the-span"),
        pytest.param(line(start=NOW - 3000.0), FILE, "file_life", id="born-long-after-the-span-began"),
        pytest.param(line(start=NOW - 3000.0), UNBORN, SaveRecord(NOW - 3000.0, NOW - 99.5, 1000, 4242), id="no-btime"),
        pytest.param(line(start=NOW - 200_000.0), UNBORN, "span", id="no-btime-longer-than-a-day"),
        pytest.param(line(bytes=-9e18), FILE, "bytes", id="negative-bytes"),
        pytest.param(line(bytes=10**12), FILE, "bytes", id="far-more-bytes-than-the-file"),
        pytest.param({"path": "step-1.pt", "start": 1.0}, FILE, "malformed", id="fields-missing"),
    ],
)
def test_an_event_line_is_judged_against_its_file(rec: dict[str, Any], file: FileTimes, expected: Any) -> None:
    assert judge(rec, file, NOW) == expected


def test_lines_naming_other_directories_or_gone_files_are_not_taken_and_bad_ones_are_reported() -> None:
    good = json.dumps(line()).encode()
    elsewhere = json.dumps(line(path="../../victim/step-1.pt", start=NOW - 110.2)).encode()  # basename: this run's
    gone = json.dumps(line(path="step-0.pt")).encode()  # removed since: history, not a claim
    lines = [b"not json", b"[1, 2]", b'{"path": 5}', good, gone, json.dumps(line(end=math.inf)).encode(), elsewhere]

    def target(named: str) -> str:
        return "/run/" + os.path.basename(named)

    records, dropped = parse_lines(lines, target, {"/run/step-1.pt": FILE}.get, NOW)
    assert records == {"/run/step-1.pt": SaveRecord(NOW - 110.2, NOW - 99.5, 1000, 4242)}  # the last good line
    assert [reason for _, reason in dropped] == ["malformed", "malformed", "malformed", "not_finite"]


# ---- the running agent --------------------------------------------------------------------------------------------

_SAVER = """
import os, sys, time
from storwatch import training

def write(f):  # a save of 1.5 s: written to, and held open for writing, all along
    for _ in range(6):
        f.write(b"x" * 4096)
        f.flush()
        time.sleep(0.25)

print("saving", flush=True)
step = 0
while True:
    step += 1
    path = os.path.join(sys.argv[1], f"step-{step}.pt")
    start = time.time()
    size = training._atomic_write(path, write)
    event = training.SaveEvent(path, start, time.time(), size, step, os.getpid())
    training.append_event(event, os.path.join(sys.argv[1], training.EVENT_LOG_NAME))
    time.sleep(1.0)
"""


def _tenant_uid() -> int:
    return 64123  # no account needed: the kernel only compares numbers


def _metrics(agent: AgentProcess) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(agent.fetch("/metrics").text()):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def _watch(agent: AgentProcess, started: float) -> tuple[dict[str, Any], Any]:
    """Scrape as Prometheus would until GPU time has settled well past the first forged saves, with the real
    writer's GPU charged for its save (so attribution works here); the last status and metrics."""

    def settled() -> tuple[dict[str, Any], Any] | None:
        d = _strict(agent.fetch("/api/status").text())
        m = _metrics(agent)
        honest = any(
            name == "storwatch_gpu_stall_seconds_total" and dict(labels)["gpu"] == "1" and v > 0
            for (name, labels), v in m.items()
        )
        late = d.get("stalls") and time.time() - started > d["stalls"]["settle_seconds"] + 5
        return (d, m) if honest and late else None

    return wait_until(settled, 90, interval=1.0, what="GPU time settled, the real writer's GPU charged")


def _strict(text: str) -> Any:
    def refuse(constant: str) -> None:
        raise ValueError(f"{constant} is not JSON")

    return json.loads(text, parse_constant=refuse)


def _zip_checkpoint(path: Path) -> None:
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("archive/data.pkl", b"\x80\x02}q\x00.")
        z.writestr("archive/version", b"3\n")


@pytest.fixture
def processes() -> Iterator[list[subprocess.Popen[str]]]:
    started: list[subprocess.Popen[str]] = []
    yield started
    for p in started:
        p.kill()
        p.wait(10)


@pytest.mark.realpart
def test_forged_writers_and_numbers_charge_no_gpu_and_break_no_figure(
    tmp_path: Path, processes: list[subprocess.Popen[str]]
) -> None:
    """A tenant's run names another tenant's idle GPU process as its writer, in an event line and in a temporary's
    name, and writes absurd numbers and a date a century ahead: that GPU gets no stall seconds and is not counted at
    risk, every exported timing is finite and >= 0, and /api/status is strict JSON. A real writer (a process holding
    its temporary open for writing) beside it is still tied to its GPU, so the check can tell the two apart."""
    if shutil.which("setpriv") is None:
        pytest.skip("setpriv (util-linux) is needed to run a process as another uid")
    try:
        lib = build_fake_nvml(tmp_path / "nvml")
    except FakeNVMLUnavailable as err:
        pytest.skip(str(err))
    uid = _tenant_uid()
    # The victim: another tenant's process holding GPU 0's memory, idle.
    victim = subprocess.Popen(
        ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "sleep", "600"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    processes.append(victim)
    root = tmp_path / "ckpt"
    forged, honest, numbers = root / "tenant", root / "honest", root / "numbers"
    for d in (forged, honest, numbers):
        d.mkdir(parents=True)
    # The real writer on GPU 1: saves of 1.5 s each, its temporary held open for writing while it saves.
    writer = subprocess.Popen(
        [sys.executable, "-c", _SAVER, str(honest)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
    )
    processes.append(writer)
    assert writer.stdout is not None and writer.stdout.readline().strip()

    # The forged run: a fresh temporary whose name carries the victim's PID, and "saves" every second, each a real
    # checkpoint with an event line that agrees with it in every number but names the victim as its writer.
    (forged / f".x.safetensors.tmp-{victim.pid}-{'ab' * 8}").write_bytes(b"y" * 100)
    stop_forging = threading.Event()

    def forge() -> None:
        step = 0
        while not stop_forging.wait(1.0):
            step += 1
            start = time.time()
            part = forged / f"part-{step}"
            _zip_checkpoint(part)
            final = forged / f"step-{step}.pt"
            os.replace(part, final)
            line = {
                "path": str(final),
                "start": start,
                "end": time.time() + 0.05,
                "bytes": final.stat().st_size,
                "step": step,
                "pid": victim.pid,
            }
            with open(forged / ".storwatch-events.jsonl", "a") as f:
                f.write(json.dumps(line) + "\n")

    forger = threading.Thread(target=forge, daemon=True)
    # Absurd numbers, and a checkpoint dated a century ahead.
    bad = numbers / "step-1.pt"
    _zip_checkpoint(bad)
    lines = [
        {"path": str(bad), "start": time.time() - 5, "end": 1e999, "bytes": 10},
        {"path": str(bad), "start": -1.7e308, "end": time.time(), "bytes": 10},
        {"path": str(bad), "start": time.time() - 5, "end": time.time(), "bytes": float("nan")},
        {"path": str(bad), "start": time.time() - 5, "end": time.time(), "bytes": -9e18},
    ]
    (numbers / ".storwatch-events.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    ahead = time.time() + 100 * 365 * 86400
    future = numbers / "step-2.pt"
    _zip_checkpoint(future)
    os.utime(future, (ahead, ahead))

    script = tmp_path / "nvml-script.txt"
    script.write_text(
        "gpu 0 uuid=GPU-victim-0000 name=Fake util=0 mem_used=4294967296 mem_total=85899345920\n"
        f"proc 0 pid={victim.pid} used=4294967296\n"
        "gpu 1 uuid=GPU-writer-0001 name=Fake util=0 mem_used=4294967296 mem_total=85899345920\n"
        f"proc 1 pid={writer.pid} used=4294967296\n"
    )
    cfg = tmp_path / "storwatch.yaml"
    cfg.write_text(
        "tick_seconds: 0.2\nplatform: generic\nkube: {enabled: false}\n"
        "gpu: {interval_seconds: 0.2, samples_interval_seconds: 0}\n"
        f"checkpoints: {{roots: [{json.dumps(str(root))}], interval_seconds: 0.5, kubelet: false, deep_per_scan: 0}}\n"
    )
    env = {"LD_LIBRARY_PATH": str(lib.parent), "FAKE_NVML_SCRIPT": str(script)}
    started = time.time()
    forger.start()
    try:
        with running_agent("--config", str(cfg), "--listen", "127.0.0.1:0", env=env, timeout=30) as agent:
            status, metrics = _watch(agent, started)
    finally:
        stop_forging.set()
        forger.join()

    honest_risk = ("storwatch_gpu_seconds_at_risk", (("run", "honest"),))
    stalls = {k: v for k, v in metrics.items() if k[0] == "storwatch_gpu_stall_seconds_total"}
    charged = [
        v
        for (_, labels), v in stalls.items()
        if dict(labels)["gpu"] == "0" and dict(labels)["cause"] == "checkpoint_write"
    ]
    assert not any(v > 0 for v in charged), stalls
    # (GPU 0 may wait on a slow mount its process has files open on, as any GPU may: none of it is the forged run's)
    assert not [c for c in status["stalls"]["current"] if c["gpu"] == "0" and c["cause"] == "checkpoint_write"]
    assert not [c for c in status["stalls"]["current"] if c["run"] == "tenant"]
    assert ("storwatch_gpu_seconds_at_risk", (("run", "tenant"),)) not in metrics
    assert metrics[honest_risk] == math.inf  # GPU 1's run: on node storage, nothing survives the node
    rejected = {
        dict(k[1])["reason"]: v for k, v in metrics.items() if k[0] == "storwatch_checkpoint_claims_rejected_total"
    }
    assert rejected["not_writer"] >= 1 and rejected["not_finite"] == 2 and rejected["span"] == 1
    assert rejected["bytes"] == 1, rejected
    # Timings from what tenants wrote are finite and >= 0; the recovery point (and so the GPU-seconds at risk) is
    # +Inf only where docs/metrics.md says so: no checkpoint of the run survives losing the node.
    may_be_inf = ("storwatch_recovery_point_seconds", "storwatch_gpu_seconds_at_risk")
    for (name, labels), value in metrics.items():
        if name.startswith(("storwatch_checkpoint_", "storwatch_recovery_", "storwatch_gpu_seconds_at_risk")):
            assert value >= 0 and (math.isfinite(value) or name in may_be_inf), (name, labels, value)
    runs = {r["run"]: r for r in status["checkpoints"]}
    assert runs["tenant"]["workload"] is None
    assert any(c["write_timed_by"] == "event_log" for c in runs["tenant"]["checkpoints"])  # timed, just not charged
    for c in runs["numbers"]["checkpoints"]:
        # no figure from the rejected lines (the file's own birth and mtime may still time it)
        assert c["write_timed_by"] != "event_log" and (c["age_seconds"] is None or c["age_seconds"] >= 0)
    assert any(c["age_seconds"] is None for c in runs["numbers"]["checkpoints"])  # the one dated 2126


@pytest.mark.realpart
def test_without_capabilities_a_closed_home_is_reported_not_silently_empty(tmp_path: Path) -> None:
    """Run as the DaemonSet runs it (every capability dropped): root cannot enter a tenant's 0700 home, and the
    checkpoints collector says so, naming the path, instead of reporting a node with nothing on it."""
    if shutil.which("setpriv") is None:
        pytest.skip("setpriv (util-linux) is needed to drop capabilities")
    root = tmp_path / "home"
    home = root / "alice"
    (home / "run").mkdir(parents=True)
    _zip_checkpoint(home / "run" / "step-1.pt")
    (root / "open" / "run").mkdir(parents=True)
    _zip_checkpoint(root / "open" / "run" / "step-1.pt")
    uid = _tenant_uid()
    for p in (home, home / "run", home / "run" / "step-1.pt"):
        os.chown(p, uid, uid)
    home.chmod(0o700)
    cfg = tmp_path / "storwatch.yaml"
    cfg.write_text(
        "tick_seconds: 0.2\nkube: {enabled: false}\n"
        f"checkpoints: {{roots: [{json.dumps(str(root))}], interval_seconds: 0.5, kubelet: false}}\n"
    )
    with running_agent(
        "--config", str(cfg), "--listen", "127.0.0.1:0", prefix=("setpriv", "--bounding-set=-all"), timeout=30
    ) as agent:

        def reported() -> dict[str, Any] | None:
            d = _strict(agent.fetch("/api/status").text())
            c = {x["name"]: x for x in d["collectors"]}["checkpoints"]
            return d if c["error"] and d["checkpoints"] else None

        status = wait_until(reported, 20, what="the checkpoints collector's report")
        metrics = _metrics(agent)
    collector = {x["name"]: x for x in status["collectors"]}["checkpoints"]
    assert collector["success"] is False
    assert str(home) in collector["error"] and "permission denied" in collector["error"]
    assert len(status["checkpoints"]) == 1  # what it can read is still there
    assert status["checkpoints"][0]["path"] == str(root / "open" / "run")
    assert metrics[("storwatch_checkpoint_unreadable_entries", (("root", str(root)),))] == 1


def test_a_writer_is_believed_once_the_kernel_shows_it_writing_there(tmp_path: Path) -> None:
    """sources/writers.py against real processes: one holding a checkpoint's file (or a temporary of one) open for
    writing under the run is its writer, and stays so after it exits (its last event line comes then); one that only
    reads there, writes elsewhere, or writes a log under the run (a shared directory made a run, naming a victim whose
    log lies there) is not; a PID of no process was never seen."""
    from storwatch.sources.writers import GONE, WriterCheck

    run, elsewhere = tmp_path / "run", tmp_path / "elsewhere"
    run.mkdir()
    elsewhere.mkdir()
    (run / "data").write_bytes(b"d")
    hold = "import sys, time\nf = open(sys.argv[1], sys.argv[2])\nprint('open', flush=True)\ntime.sleep(600)\n"

    def holding(path: Path, mode: str) -> subprocess.Popen[str]:
        p = subprocess.Popen([sys.executable, "-c", hold, str(path), mode], stdout=subprocess.PIPE, text=True)
        assert p.stdout is not None and p.stdout.readline().strip() == "open"
        return p

    check = WriterCheck()
    writer = holding(run / ".step-1.pt.tmp", "wb")
    reader = holding(run / "data", "rb")
    other = holding(elsewhere / "model.pt", "wb")
    logger = holding(run / "train.log", "ab")
    try:
        assert check.look(writer.pid, str(run)) is None
        assert check.look(reader.pid, str(run)) == "not_writer"
        assert check.look(other.pid, str(run)) == "not_writer"
        assert check.look(other.pid, str(elsewhere)) is None
        assert check.look(logger.pid, str(run)) == "not_writer"
    finally:
        for p in (writer, reader, other, logger):
            p.kill()
            p.wait(10)
    check.forget_reused()
    assert check.look(writer.pid, str(run)) is None  # seen writing there while it lived
    assert check.look(reader.pid, str(run)) == GONE
