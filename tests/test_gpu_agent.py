"""The GPU source inside the real agent: /metrics against a scripted fake libnvidia-ml.so.1 loaded by pynvml.

The agent runs as a subprocess with LD_LIBRARY_PATH naming the fake, so every NVML call takes the path it takes on
a GPU node. Its procfs is a fixture tree whose <pid>/cgroup files come from tests/fixtures/cgroup, so the GPU
processes the fake reports map to containers and pods exactly as on a Kubernetes node.
"""

from __future__ import annotations

import json
import math
import re
import shutil
import time
import urllib.request
from pathlib import Path

import pytest

from tests.agentproc import running_agent
from tests.nvml import FakeNVML, FakeNVMLUnavailable, build_fake_nvml

pytestmark = pytest.mark.realpart

FIXTURES = Path(__file__).parent / "fixtures"
# PID -> cgroup fixture: the container and pod each GPU process must be attributed to.
PROCESSES = {
    4101: "containerd-systemd-v2",
    4102: "crio-systemd-v2",
    4103: "containerd-cgroupfs-v1",
    4104: "host-process",
}


def _gpu_line(i: int) -> str:
    return (
        f"gpu {i} uuid=GPU-{i:08d}-aaaa-bbbb-cccc-0000000000{i:02d} name=NVIDIA_H100_80GB_HBM3 util={10 + i * 11} "
        f"mem_util={5 + i * 7} mem_used={(i + 1) * 1024**3} mem_total={80 * 1024**3} power_mw={100000 + i * 12345} "
        f"temp={40 + i} throttle={0x4 if i % 2 else 0x1} xid={'79:1' if i == 5 else '13:0'}"
    )


SCRIPT_8 = "driver 550.54.15\n" + "\n".join(_gpu_line(i) for i in range(8)) + "\n"
SCRIPT_8 += "proc 0 pid=4101 used=2147483648\nproc 0 pid=4104 used=1073741824\nproc 1 pid=4102 used=3221225472\n"
SCRIPT_8 += "proc 1 pid=4103 used=1073741824\n"


@pytest.fixture(scope="module")
def fake_lib(tmp_path_factory: pytest.TempPathFactory) -> Path:
    try:
        return build_fake_nvml(tmp_path_factory.mktemp("fake-nvml"))
    except FakeNVMLUnavailable as err:
        pytest.skip(str(err))


def _procfs(tmp_path: Path) -> Path:
    proc = tmp_path / "proc"
    (proc / "1").mkdir(parents=True)
    shutil.copy(FIXTURES / "gpu-node" / "proc" / "1" / "mountinfo", proc / "1" / "mountinfo")
    shutil.copy(FIXTURES / "gpu-node" / "proc" / "diskstats", proc / "diskstats")
    for pid, fixture in PROCESSES.items():
        (proc / str(pid)).mkdir()
        shutil.copy(FIXTURES / "cgroup" / fixture, proc / str(pid) / "cgroup")
    return proc


def _config(tmp_path: Path) -> Path:
    proc = _procfs(tmp_path)
    (tmp_path / "root").mkdir()
    cfg = tmp_path / "storwatch.yaml"
    cfg.write_text(
        "tick_seconds: 0.2\n"
        f"paths: {{procfs: {proc}, sysfs: {FIXTURES / 'gpu-node' / 'sys'}, rootfs: {tmp_path / 'root'}}}\n"
        "mounts: {interval_seconds: 5, statvfs_timeout_seconds: 0.2}\n"
        "gpu: {interval_seconds: 0.2, call_timeout_seconds: 1.0}\n"
    )
    return cfg


def _key(series: str) -> str:
    """A series as ``name{a="x",b="y"}`` with its labels sorted, whatever order the exposition used."""
    name, _, rest = series.partition("{")
    if not rest:
        return name
    labels = sorted(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', rest))
    return name + "{" + ",".join(f'{k}="{v}"' for k, v in labels) + "}"


def _samples(url: str) -> dict[str, float]:
    text = urllib.request.urlopen(url, timeout=5).read().decode()
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            out[_key(key)] = float(value)
    return out


def _series(metric: str, gpu: int, **labels: str) -> str:
    uuid = f"GPU-{gpu:08d}-aaaa-bbbb-cccc-0000000000{gpu:02d}"
    return _key(
        metric + "{" + ",".join(f'{k}="{v}"' for k, v in {"gpu": str(gpu), "uuid": uuid, **labels}.items()) + "}"
    )


def _wait(url: str, predicate, timeout: float = 15.0) -> dict[str, float]:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while True:
        samples = _samples(url)
        if predicate(samples):
            return samples
        if time.monotonic() > deadline:
            raise AssertionError("timed out; last scrape: " + repr({k: v for k, v in samples.items() if "gpu" in k}))
        time.sleep(0.2)


def test_eight_gpus_export_exactly_the_scripted_values(tmp_path: Path, fake_lib: Path) -> None:
    fake = FakeNVML(fake_lib.parent, tmp_path)
    fake.write_script(SCRIPT_8)
    with running_agent("--config", str(_config(tmp_path)), "--listen", "127.0.0.1:0", env=fake.env()) as agent:
        url = agent.url("/metrics")
        # The processes source attributes PIDs after the GPU source has listed them: wait for both.
        m = _wait(
            url,
            lambda s: (
                s.get("storwatch_nvml_up") == 1
                and sum(k.startswith("storwatch_gpu_pod_memory_used_bytes") for k in s) == 4
            ),
        )
        for i in range(8):
            assert m[_series("storwatch_gpu_info", i, name="NVIDIA H100 80GB HBM3")] == 1
            assert m[_series("storwatch_gpu_up", i)] == 1
            assert m[_series("storwatch_gpu_utilization_ratio", i)] == pytest.approx((10 + i * 11) / 100)
            assert m[_series("storwatch_gpu_memory_utilization_ratio", i)] == pytest.approx((5 + i * 7) / 100)
            assert m[_series("storwatch_gpu_memory_used_bytes", i)] == (i + 1) * 1024**3
            assert m[_series("storwatch_gpu_memory_total_bytes", i)] == 80 * 1024**3
            assert m[_series("storwatch_gpu_power_watts", i)] == pytest.approx((100000 + i * 12345) / 1000)
            assert m[_series("storwatch_gpu_temperature_celsius", i)] == 40 + i
            assert m[_series("storwatch_gpu_clock_throttled", i, reason="sw_power_cap")] == (1 if i % 2 else 0)
            assert m[_series("storwatch_gpu_clock_throttled", i, reason="gpu_idle")] == (0 if i % 2 else 1)
        assert m[_series("storwatch_gpu_xid_errors_total", 5, xid="79")] == 1
        assert m[_series("storwatch_gpu_processes", 0)] == 2
        assert m[_series("storwatch_gpu_processes", 2)] == 0
        # Per-pod GPU memory: each process's cgroup names its pod; the host process has no pod.
        pods = {k: v for k, v in m.items() if k.startswith("storwatch_gpu_pod_memory_used_bytes")}
        assert len(pods) == 4, pods
        assert sorted(pods.values()) == sorted([2147483648, 1073741824, 3221225472, 1073741824])
        assert pods[_series("storwatch_gpu_pod_memory_used_bytes", 0, pod_uid="", namespace="", pod="")] == 1073741824
        status = agent.fetch("/api/status").body.decode()
        assert '"nvml_up": true' in status and '"driver_version": "550.54.15"' in status


def test_pids_map_to_their_container_and_pod(tmp_path: Path, fake_lib: Path) -> None:
    from storwatch.procfs.cgroup import container_of, parse_cgroup

    fake = FakeNVML(fake_lib.parent, tmp_path)
    fake.write_script(SCRIPT_8)
    with running_agent("--config", str(_config(tmp_path)), "--listen", "127.0.0.1:0", env=fake.env()) as agent:
        _wait(agent.url("/metrics"), lambda s: _series("storwatch_gpu_processes", 0) in s)
        deadline = time.monotonic() + 60  # a bound against hanging, not a speed
        while True:
            gpus = json.loads(agent.fetch("/api/status").body)["gpus"]
            procs = {p["pid"]: p for g in gpus for p in g["processes"]}
            if all(p["container_id"] or pid == 4104 for pid, p in procs.items()) and len(procs) == 4:
                break
            assert time.monotonic() < deadline, procs
            time.sleep(0.2)
    for pid, fixture in PROCESSES.items():
        expected = container_of(parse_cgroup((FIXTURES / "cgroup" / fixture).read_bytes())[0])
        got = procs[pid]
        assert got["pod_uid"] == (expected.pod_uid if expected else None), fixture
        assert got["container_id"] == (expected.container_id if expected else None), fixture
    assert procs[4104]["pod_uid"] is None
    assert procs[4101]["pod_uid"] and "-" in procs[4101]["pod_uid"]


def test_no_library_agent_serves_with_nvml_down(tmp_path: Path) -> None:
    empty = tmp_path / "no-nvml"
    empty.mkdir()
    started = time.monotonic()
    with running_agent(
        "--config", str(_config(tmp_path)), "--listen", "127.0.0.1:0", env={"LD_LIBRARY_PATH": str(empty)}
    ) as agent:
        m = _wait(agent.url("/metrics"), lambda s: "storwatch_nvml_up" in s)
        assert m["storwatch_nvml_up"] == 0
        # No library: the collector has no GPU to report, and fails with the reason (gpu.enabled: false turns it off).
        assert m[_key('storwatch_collector_success{collector="gpu"}')] == 0
        assert m[_key('storwatch_collector_success{collector="mounts"}')] == 1
        [gpu] = [c for c in json.loads(agent.fetch("/api/status").body)["collectors"] if c["name"] == "gpu"]
        assert gpu["success"] is False and "libnvidia-ml.so.1" in gpu["error"]
        page = agent.fetch("/status").body.decode()
        assert "gpu: FAILED nvmlInit" in page and "gpu: ok" not in page
        assert "no GPUs: NVML not available (nvmlInit" in page  # the empty table says why
        # Every failed run counted, and the runs come at nvmlInit's retry pace (1, 2, 4, 8... s apart), not every
        # interval_seconds (0.2 here): a node without GPUs has nothing to sample until a retry is due. The log has
        # the failure once, then lines at a backoff.
        failures = _key('storwatch_collector_failures_total{collector="gpu"}')
        m = _wait(agent.url("/metrics"), lambda s: s.get(failures, 0) >= 4, timeout=60.0)
        elapsed = time.monotonic() - started
        assert agent.proc.poll() is None  # no crash, no restart
        assert m["storwatch_nvml_up"] == 0
        assert m[_key('storwatch_collector_failures_total{collector="mounts"}')] == 0
        # Tries at 0, 1, 3, 7, 15... s: at most 2 + log2(elapsed + 1) runs (every 0.2 s would be elapsed / 0.2).
        assert m[failures] <= 2 + math.log2(elapsed + 1), (m[failures], elapsed)
        log = agent.stderr_text()
        assert log.count("collector gpu failed") == 1
        assert log.count("NVML unavailable") == 1
        # A line per failed run at most (the counter is exported at the next tick, so it is read after the log).
        lines = log.count("collector gpu failed") + log.count("collector gpu still failing")
        _wait(agent.url("/metrics"), lambda s: s.get(failures, 0) >= lines, timeout=30.0)


def test_stuck_nvml_call_fails_the_collector_until_it_returns(tmp_path: Path, fake_lib: Path) -> None:
    fake = FakeNVML(fake_lib.parent, tmp_path)
    fake.write_script(SCRIPT_8)
    success = _key('storwatch_collector_success{collector="gpu"}')
    with running_agent("--config", str(_config(tmp_path)), "--listen", "127.0.0.1:0", env=fake.env()) as agent:
        url = agent.url("/metrics")
        _wait(url, lambda s: s.get("storwatch_nvml_up") == 1 and s.get(success) == 1)
        # A GPU that stops answering: one power reading hangs past call_timeout_seconds (1 s), then returns.
        fake.write_script(SCRIPT_8 + "slow nvmlDeviceGetPowerUsage ms=6000 gpu=2 times=1\n")
        m = _wait(url, lambda s: s.get(success) == 0)
        assert m["storwatch_nvml_up"] == 0
        assert all(m[_series("storwatch_gpu_up", i)] == 0 for i in range(8))
        [gpu] = [c for c in json.loads(agent.fetch("/api/status").body)["collectors"] if c["name"] == "gpu"]
        assert gpu["success"] is False
        assert "nvmlDeviceGetPowerUsage on GPU 2 has not returned" in gpu["error"]
        page = agent.fetch("/status").body.decode()
        assert "gpu: FAILED nvmlDeviceGetPowerUsage on GPU 2 has not returned" in page
        assert "NVML is not answering: nvmlDeviceGetPowerUsage on GPU 2" in page
        # Once the call returns, the next sampling succeeds.
        m = _wait(url, lambda s: s.get(success) == 1 and s.get("storwatch_nvml_up") == 1)
        assert fake.counts()["slow_returned"] == 1


def test_one_gpu_lost_the_other_seven_keep_reporting(tmp_path: Path, fake_lib: Path) -> None:
    fake = FakeNVML(fake_lib.parent, tmp_path)
    fake.write_script(SCRIPT_8)
    with running_agent("--config", str(_config(tmp_path)), "--listen", "127.0.0.1:0", env=fake.env()) as agent:
        url = agent.url("/metrics")
        _wait(url, lambda s: s.get(_series("storwatch_gpu_up", 3)) == 1)
        fake.write_script(SCRIPT_8 + "lost 3 after_calls=0\n")
        m = _wait(url, lambda s: s.get(_series("storwatch_gpu_up", 3)) == 0)
        for i in (0, 1, 2, 4, 5, 6, 7):
            assert m[_series("storwatch_gpu_up", i)] == 1
            assert m[_series("storwatch_gpu_utilization_ratio", i)] == pytest.approx((10 + i * 11) / 100)
        assert _series("storwatch_gpu_utilization_ratio", 3) not in m
        assert m["storwatch_nvml_up"] == 1


def test_agent_releases_the_driver_on_reload_and_on_sigterm(tmp_path: Path, fake_lib: Path) -> None:
    """gpu.enabled: false + SIGHUP shuts NVML down (driver upgrades); true starts it again; SIGTERM shuts it down."""
    import signal

    fake = FakeNVML(fake_lib.parent, tmp_path)
    fake.write_script(SCRIPT_8)
    cfg = _config(tmp_path)
    text = cfg.read_text()
    with running_agent("--config", str(cfg), "--listen", "127.0.0.1:0", env=fake.env()) as agent:
        url = agent.url("/metrics")
        _wait(url, lambda s: s.get("storwatch_nvml_up") == 1)
        assert fake.counts()["shutdown"] == 0
        cfg.write_text(text.replace("gpu: {interval_seconds", "gpu: {enabled: false, interval_seconds"))
        agent.proc.send_signal(signal.SIGHUP)
        _wait(url, lambda s: "storwatch_nvml_up" not in s)
        assert fake.counts()["shutdown"] == 1
        inits = fake.counts()["init"]
        time.sleep(1.5)
        assert fake.counts()["init"] == inits  # released means released: no retry behind our back
        cfg.write_text(text)
        agent.proc.send_signal(signal.SIGHUP)
        _wait(url, lambda s: s.get("storwatch_nvml_up") == 1)
        assert fake.counts()["init"] == inits + 1
        agent.proc.send_signal(signal.SIGTERM)
        assert agent.proc.wait(timeout=5) == 0
    assert fake.counts()["shutdown"] == 2
