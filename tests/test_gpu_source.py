"""GPUSource through the real nvidia-ml-py bindings, on a fake libnvidia-ml.so.1 built from C (tests/nvml).

Each test runs the source in a subprocess (tests/nvml/gpu_source_driver.py) whose LD_LIBRARY_PATH names the fake, and
scripts the fake's answers; a test can rewrite the script between collects. The backoff is also tested in-process,
without the library (the deadline worker the source runs on: tests/test_deadline_worker.py).
"""

from __future__ import annotations

import ctypes.util
import itertools
import os
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from storwatch.pace import Backoff
from storwatch.sources import gpu
from tests.nvml import FakeNVML, FakeNVMLUnavailable, GPUSourceProcess, build_fake_nvml

GIB = 1 << 30

# Eight GPUs of a training node, every value distinct, so a value read from the wrong GPU or field shows.
EIGHT_GPUS = "\n".join(
    [
        "driver 550.54.15",
        *(
            f"gpu {i} uuid=GPU-{i:08x}-aaaa-bbbb-cccc-{i:012x} name=NVIDIA_H100_80GB_HBM3 util={70 + i} "
            f"mem_util={40 + i} mem_used={(10 + i) * GIB} mem_reserved={GIB // 2} mem_total={80 * GIB} "
            f"power_mw={300000 + i * 1111} temp={50 + i} throttle={1 << i}"
            for i in range(8)
        ),
        "gpu 2 uuid=GPU-00000002-aaaa-bbbb-cccc-000000000002 name=NVIDIA_H100_80GB_HBM3 util=72 mem_util=42 "
        f"mem_used={12 * GIB} mem_reserved={GIB // 2} mem_total={80 * GIB} power_mw=302222 temp=52 throttle=4 "
        "xid=79:1,48:2",
        "gpu 5 uuid=GPU-00000005-aaaa-bbbb-cccc-000000000005 name=NVIDIA_H100_80GB_HBM3 util=75 mem_util=45 "
        f"mem_used={15 * GIB} mem_reserved={GIB // 2} mem_total={80 * GIB} power_mw=305555 temp=55 throttle=32 "
        "samples=1700000000000000:50,1700000000166666:60,1700000000333333:100",
        "gpu 7 uuid=GPU-00000007-aaaa-bbbb-cccc-000000000007 name=NVIDIA_H100_80GB_HBM3 util=77 mem_util=47 "
        f"mem_used={17 * GIB} mem_reserved={GIB // 2} mem_total={80 * GIB} power_mw=307777 temp=57 throttle=128",
        f"proc 0 pid=4242 used={9 * GIB} sm=55",
        f"proc 0 pid=4243 used={GIB}",
        "proc 3 pid=777 used=na sm=12",
        f"mig 7 slot=0 uuid=MIG-aaaa-0 mem_used={GIB} mem_total={10 * GIB}",
        f"mig 7 slot=3 uuid=MIG-aaaa-3 mem_used={2 * GIB} mem_total={20 * GIB}",
        "",
    ]
)


@pytest.fixture(scope="module")
def fake_nvml_lib(tmp_path_factory: pytest.TempPathFactory) -> Path:
    try:
        return build_fake_nvml(tmp_path_factory.mktemp("fake-nvml")).parent
    except FakeNVMLUnavailable as err:
        pytest.skip(str(err))


@pytest.fixture
def nvml(fake_nvml_lib: Path, tmp_path: Path) -> FakeNVML:
    return FakeNVML(fake_nvml_lib, tmp_path)


@pytest.fixture
def run_source(nvml: FakeNVML) -> Iterator[Any]:
    """Start GPUSource processes on the fake (torn down at the end of the test)."""
    started: list[GPUSourceProcess] = []

    def start(*args: str) -> GPUSourceProcess:
        proc = GPUSourceProcess(nvml.env(), args)
        started.append(proc)
        return proc

    yield start
    for proc in started:
        proc.stop()


def facts(answer: dict[str, Any]) -> dict[str, Any]:
    f: dict[str, Any] = answer["facts"]
    return f


def by_index(answer: dict[str, Any]) -> dict[int, dict[str, Any]]:
    return {g["index"]: g for g in facts(answer)["gpus"]}


def wait_for(probe: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = probe()
        if got:
            return got
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


# -- without the library or the bindings: these need no compiler


def test_no_library_reports_nvml_down_and_does_not_raise(tmp_path: Path) -> None:
    if ctypes.util.find_library("nvidia-ml"):
        pytest.skip("this machine has a real libnvidia-ml: cannot test its absence")
    with GPUSourceProcess({"LD_LIBRARY_PATH": str(tmp_path)}) as proc:
        first = proc.collect()
        again = proc.collect()
        log = proc.stop()
    for answer in (first, again):
        f = facts(answer)
        assert f["nvml_up"] is False
        assert f["gpus"] == []
        assert "libnvidia-ml.so.1 not found" in f["error"]
        # No library: the source has no GPU to report, and says so as its failure (collector_success 0).
        assert answer["failure"] == f["error"]
    # The same words on every tick, so the collector sees one failure going on, not a new one each second.
    assert facts(again)["error"] == facts(first)["error"] and "retried with backoff" in f["error"]
    assert log.count("NVML unavailable") == 1


def test_no_library_through_the_collector_backs_off_and_logs_a_bounded_number_of_lines(tmp_path: Path) -> None:
    """A node without GPUs, 40 minutes of 1-s collections on a manual clock, through the agent's collector worker:
    nvmlInit is tried at growing intervals up to every 300 s, and the log has a line when the failure starts, then
    at growing intervals, not one per collection."""
    if ctypes.util.find_library("nvidia-ml"):
        pytest.skip("this machine has a real libnvidia-ml: cannot test its absence")
    ticks = 2400
    with GPUSourceProcess({"LD_LIBRARY_PATH": str(tmp_path)}, ["--manual-clock", "--interval", "1"]) as proc:
        answer = proc.request(f"ticks {ticks} 1")
        log = proc.stop()
    attempts = answer["init_attempts"]
    # The tick of each nvmlInit attempt (counted by the source, timed by the manual clock only).
    tried_at = [i for i, n in enumerate(attempts) if n > (attempts[i - 1] if i else 0)]
    gaps = [b - a for a, b in itertools.pairwise(tried_at)]
    assert gaps[:9] == [1, 2, 4, 8, 16, 32, 64, 128, 256]
    assert gaps[9:] and set(gaps[9:]) == {300}
    assert answer["failures"] == ticks  # every collection failed, and each is counted
    assert "libnvidia-ml.so.1 not found" in answer["error"]

    assert log.count("NVML unavailable") == 1
    assert log.count("collector gpu failed") == 1
    # Each later line says how many runs failed since the line before: 1 s doubling to 300 s, at 1 run a second.
    since = [int(n) for n in re.findall(r"collector gpu still failing \((\d+) failed runs since", log)]
    assert since[:9] == [1, 2, 4, 8, 16, 32, 64, 128, 256], log
    assert since[9:] and set(since[9:]) == {300}
    assert 1 + len(since) < ticks // 100


def test_no_bindings_reports_nvml_down(tmp_path: Path) -> None:
    with GPUSourceProcess({"LD_LIBRARY_PATH": str(tmp_path)}, ["--hide-pynvml"]) as proc:
        answer = proc.collect()
    f = facts(answer)
    assert f["nvml_up"] is False
    assert "nvidia-ml-py" in f["error"]
    assert answer["failure"] == f["error"]


def test_backoff_doubles_to_five_minutes() -> None:
    """nvmlInit's retries wait by the agent's one Backoff (storwatch/pace.py): doubling to five minutes, and from the
    first wait again after a success."""
    backoff = Backoff(gpu.INIT_BACKOFF_FIRST_SECONDS, gpu.INIT_BACKOFF_MAX_SECONDS)
    waits = [backoff.failed() for _ in range(12)]
    assert waits[:10] == [1, 2, 4, 8, 16, 32, 64, 128, 256, 300]
    assert waits[-1] == gpu.INIT_BACKOFF_MAX_SECONDS == 300
    backoff.reset()
    assert backoff.failed() == 1


# -- on the fake library


@pytest.mark.realpart
def test_zero_gpus(nvml: FakeNVML, run_source: Any) -> None:
    nvml.write_script("driver 535.183.01\n")
    f = facts(run_source().collect())
    assert f["nvml_up"] is True
    assert f["error"] is None
    assert f["driver_version"] == "535.183.01"
    assert f["gpus"] == []


@pytest.mark.realpart
def test_eight_gpus_every_value_as_scripted(nvml: FakeNVML, run_source: Any) -> None:
    nvml.write_script(EIGHT_GPUS)
    proc = run_source()
    answer = proc.collect()
    f = facts(answer)
    assert f["nvml_up"] is True and f["error"] is None and answer["failure"] is None
    assert f["driver_version"] == "550.54.15"
    gpus = by_index(answer)
    assert sorted(gpus) == list(range(8))
    for i, g in gpus.items():
        assert g["up"] is True and g["error"] is None
        assert g["uuid"] == f"GPU-{i:08x}-aaaa-bbbb-cccc-{i:012x}"
        assert g["name"] == "NVIDIA H100 80GB HBM3"
        assert g["utilization_ratio"] == pytest.approx((70 + i) / 100)
        assert g["memory_utilization_ratio"] == pytest.approx((40 + i) / 100)
        assert g["memory_used_bytes"] == (10 + i) * GIB  # nvmlMemory_v2: without the driver's reservation
        assert g["memory_total_bytes"] == 80 * GIB
        assert g["power_watts"] == pytest.approx((300000 + i * 1111) / 1000)
        assert g["temperature_celsius"] == 50 + i
        assert g["throttle_reasons"] == 1 << i
    assert gpus[2]["xid_counts"] == {"79": 1, "48": 2}
    assert all(g["xid_counts"] == {} for i, g in gpus.items() if i != 2)
    assert gpus[0]["processes"] == [
        {"pid": 4242, "used_memory_bytes": 9 * GIB, "sm_utilization": pytest.approx(0.55)},
        {"pid": 4243, "used_memory_bytes": GIB, "sm_utilization": None},
    ]
    assert gpus[3]["processes"] == [{"pid": 777, "used_memory_bytes": None, "sm_utilization": pytest.approx(0.12)}]
    assert all(gpus[i]["processes"] == [] for i in (1, 2, 4, 5, 6, 7))
    assert gpus[5]["utilization_samples"] == [
        [pytest.approx(1700000000.0), pytest.approx(0.5)],
        [pytest.approx(1700000000.166666), pytest.approx(0.6)],
        [pytest.approx(1700000000.333333), pytest.approx(1.0)],
    ]
    assert gpus[7]["mig_devices"] == [
        {"index": 0, "uuid": "MIG-aaaa-0", "memory_used_bytes": GIB, "memory_total_bytes": 10 * GIB},
        {"index": 3, "uuid": "MIG-aaaa-3", "memory_used_bytes": 2 * GIB, "memory_total_bytes": 20 * GIB},
    ]
    assert all(gpus[i]["mig_devices"] == [] for i in range(7))

    # Samples are those of the last 30 s, the newer ones added as they come (a reader that missed a collect misses
    # none of them); Xid counts are cumulative, raised by new events only.
    second = by_index(proc.collect())
    assert second[5]["utilization_samples"] == gpus[5]["utilization_samples"]
    assert second[2]["xid_counts"] == {"79": 1, "48": 2}
    nvml.write_script(
        EIGHT_GPUS.replace("xid=79:1,48:2", "xid=79:3,48:2,13:1").replace(
            "1700000000333333:100", "1700000000333333:100,1700000000500000:25"
        )
    )
    third = by_index(proc.collect())
    assert third[2]["xid_counts"] == {"79": 3, "48": 2, "13": 1}
    assert third[5]["utilization_samples"] == [
        *gpus[5]["utilization_samples"],
        [pytest.approx(1700000000.5), pytest.approx(0.25)],
    ]
    assert third[0]["utilization_ratio"] == pytest.approx(0.70)


@pytest.mark.realpart
def test_a_script_directory_lets_each_job_script_its_own_gpu(fake_nvml_lib: Path, tmp_path: Path) -> None:
    # Several training jobs on one node each drive their own GPU (tests/test_e2e_writers.py): each replaces a file of
    # its own in the directory, and the library reads every *.txt there as one script.
    scripts = tmp_path / "scripts"
    scripts.mkdir()

    def gpu_file(i: int, util: int, pid: int | None = None) -> None:
        tmp = scripts / f"gpu-{i}.txt.tmp"  # not *.txt: never read half-written
        tmp.write_text(f"gpu {i} uuid=GPU-job-{i} util={util}\n" + (f"proc {i} pid={pid} used={GIB}\n" if pid else ""))
        tmp.replace(scripts / f"gpu-{i}.txt")

    gpu_file(0, 10)
    gpu_file(1, 20)
    (scripts / "notes.md").write_text("gpu 5 util=99\n")  # not a script file
    env = {"LD_LIBRARY_PATH": str(fake_nvml_lib), "FAKE_NVML_SCRIPT": str(scripts)}
    with GPUSourceProcess(env) as proc:
        gpus = by_index(proc.collect())
        assert sorted(gpus) == [0, 1]
        assert [gpus[i]["utilization_ratio"] for i in (0, 1)] == [pytest.approx(0.1), pytest.approx(0.2)]
        assert gpus[0]["processes"] == gpus[1]["processes"] == []
        gpu_file(1, 90, pid=4321)  # one job changes its GPU; the other's stays as it was
        gpus = by_index(proc.collect())
        assert gpus[1]["utilization_ratio"] == pytest.approx(0.9)
        assert gpus[1]["processes"] == [{"pid": 4321, "used_memory_bytes": GIB, "sm_utilization": None}]
        assert gpus[0]["utilization_ratio"] == pytest.approx(0.1) and gpus[0]["processes"] == []
        gpu_file(2, 30)  # a file added
        assert sorted(by_index(proc.collect())) == [0, 1, 2]


@pytest.mark.realpart
def test_a_jobs_driver_gpu_samples_its_idle_phase_exactly(fake_nvml_lib: Path, tmp_path: Path) -> None:
    # tests/fake_gpu.py, as the end-to-end jobs drive it: the samples the source reads idle exactly as long as the job
    # was idle by its own clock, and once the job lets the GPU go, it holds no process.
    from tests.fake_gpu import DriverGPU

    scripts = tmp_path / "scripts"
    scripts.mkdir()
    env = {"LD_LIBRARY_PATH": str(fake_nvml_lib), "FAKE_NVML_SCRIPT": str(scripts)}
    gpu = DriverGPU(str(scripts / "gpu-00.txt"), 0)
    try:
        wait_for(lambda: (scripts / "gpu-00.txt").exists(), 10, "the helper's first script")
        with GPUSourceProcess(env) as proc:
            first = by_index(proc.collect())[0]
            assert [p["pid"] for p in first["processes"]] == [os.getpid()]
            proc.request("sleep 0.5")
            idle_from = time.time()
            gpu.phase(2)
            proc.request("sleep 0.7")
            gpu.phase(97)
            idle_to = time.time()
            proc.request("sleep 0.5")
            samples = by_index(proc.collect())[0]["utilization_samples"]
            assert samples[: len(first["utilization_samples"])] == first["utilization_samples"]
            idle = sum(t - prev for (prev, _), (t, ratio) in itertools.pairwise(samples) if ratio < 0.3)
            assert idle_to - idle_from - 0.01 <= idle <= idle_to - idle_from, samples
            gpu.release()
            last = by_index(proc.collect())[0]
            assert last["processes"] == [] and last["utilization_ratio"] == 0.0
    finally:
        gpu.release()


@pytest.mark.realpart
def test_made_up_samples_come_in_order_each_once_and_stay_in_later_facts(nvml: FakeNVML, run_source: Any) -> None:
    nvml.write_script("gpu 0 util=64 sample_ms=50\n")
    proc = run_source()
    proc.collect()  # nvmlInit: the driver samples from then on
    before: list[list[float]] = []
    for _ in range(4):
        proc.request("sleep 0.2")
        samples = by_index(proc.collect())[0]["utilization_samples"]
        assert len(samples) > len(before), "a sample every 50 ms, 200 ms apart: some must be new"
        assert all(ratio == pytest.approx(0.64) for _, ratio in samples)
        times = [ts for ts, _ in samples]
        assert times == sorted(set(times))  # none twice, none out of order
        assert samples[: len(before)] == before  # the earlier ones stay (all within 30 s)
        before = samples


@pytest.mark.realpart
def test_samples_older_than_30_s_leave_the_facts(nvml: FakeNVML, run_source: Any) -> None:
    nvml.write_script("gpu 0 util=50 samples=1700000000000000:10,1700000020000000:20,1700000040000000:30\n")
    proc = run_source()
    samples = by_index(proc.collect())[0]["utilization_samples"]
    # 1700000000 is 40 s older than the newest sample
    assert samples == [
        [pytest.approx(1700000020.0), pytest.approx(0.2)],
        [pytest.approx(1700000040.0), pytest.approx(0.3)],
    ]


@pytest.mark.realpart
def test_sample_buffers_are_read_every_samples_interval_and_none_is_lost(nvml: FakeNVML, run_source: Any) -> None:
    # On a real driver each read of a sample buffer costs milliseconds of CPU (scripts/gpu_node_check.py), so the
    # source reads the buffers once per samples interval; the driver keeps the samples, so a later read has them all.
    script = EIGHT_GPUS.replace("1700000000333333:100", "1700000000333333:100,1700000000500000:25")
    nvml.write_script(EIGHT_GPUS)
    proc = run_source("--samples-interval", "0.6")
    first = by_index(proc.collect())
    assert len(first[5]["utilization_samples"]) == 3
    assert first[0]["processes"][0]["sm_utilization"] == pytest.approx(0.55)

    nvml.write_script(script.replace("pid=4242 used=9663676416 sm=55", "pid=4242 used=9663676416 sm=80"))
    between = by_index(proc.collect())
    assert between[5]["utilization_samples"] == first[5]["utilization_samples"]  # the buffer is not read yet
    assert between[5]["utilization_ratio"] == pytest.approx(0.75)  # the polled reading is, every tick
    assert between[0]["processes"][0]["sm_utilization"] == pytest.approx(0.55)  # held from the last read
    assert between[0]["processes"][0]["used_memory_bytes"] == 9 * GIB

    proc.request("sleep 0.7")
    later = by_index(proc.collect())
    assert later[5]["utilization_samples"] == [
        *first[5]["utilization_samples"],
        [pytest.approx(1700000000.5), pytest.approx(0.25)],
    ]
    assert later[0]["processes"][0]["sm_utilization"] == pytest.approx(0.80)


@pytest.mark.realpart
def test_one_gpu_lost_mid_run_the_others_keep_reporting(nvml: FakeNVML, run_source: Any) -> None:
    nvml.write_script(EIGHT_GPUS)
    proc = run_source()
    assert all(g["up"] for g in facts(proc.collect())["gpus"])

    nvml.write_script(EIGHT_GPUS + "lost 3 after_calls=0\n")
    answer = proc.collect()
    assert facts(answer)["nvml_up"] is True and answer["failure"] is None
    gpus = by_index(answer)
    assert gpus[3]["up"] is False
    assert "GPU is lost" in gpus[3]["error"]
    assert gpus[3]["uuid"] == "GPU-00000003-aaaa-bbbb-cccc-000000000003"  # still named, from before
    assert gpus[3]["utilization_ratio"] is None and gpus[3]["processes"] == []
    for i in (0, 1, 2, 4, 5, 6, 7):
        assert gpus[i]["up"] is True
        assert gpus[i]["power_watts"] == pytest.approx((300000 + i * 1111) / 1000)

    # Back from a reset: it answers again, with a handle asked for afresh.
    nvml.write_script(EIGHT_GPUS)
    gpus = by_index(proc.collect())
    assert gpus[3]["up"] is True and gpus[3]["temperature_celsius"] == 53


@pytest.mark.realpart
def test_lost_after_some_calls(nvml: FakeNVML, run_source: Any) -> None:
    nvml.write_script(EIGHT_GPUS + "lost 6 after_calls=40\n")
    proc = run_source()
    states = [by_index(proc.collect())[6]["up"] for _ in range(6)]
    assert states[0] is True
    assert states[-1] is False
    assert states == sorted(states, reverse=True)  # up, then down for good


@pytest.mark.realpart
def test_unknown_error_marks_only_that_gpu_and_other_errors_only_that_value(nvml: FakeNVML, run_source: Any) -> None:
    nvml.write_script(
        EIGHT_GPUS
        + "error nvmlDeviceGetPowerUsage code=999 gpu=5\n"  # NVML_ERROR_UNKNOWN
        + "error nvmlDeviceGetTemperatureV code=2 gpu=1\n"  # NVML_ERROR_INVALID_ARGUMENT
        + "error nvmlDeviceGetTemperature code=2 gpu=1\n"
    )
    proc = run_source()
    gpus = by_index(proc.collect())
    assert gpus[5]["up"] is False and "Unknown Error" in gpus[5]["error"]
    assert gpus[1]["up"] is True and gpus[1]["temperature_celsius"] is None
    assert gpus[1]["power_watts"] == pytest.approx(301.111)
    assert all(gpus[i]["up"] for i in range(8) if i != 5)


@pytest.mark.realpart
def test_not_supported_gives_none_and_is_logged_once(nvml: FakeNVML, run_source: Any) -> None:
    nvml.write_script(
        EIGHT_GPUS
        + "notsupported nvmlDeviceGetPowerUsage\n"
        + "notsupported nvmlDeviceGetSamples\n"
        + "notsupported nvmlDeviceGetProcessUtilization\n"
        + "notsupported nvmlDeviceGetCurrentClocksEventReasons\n"
        + "notsupported nvmlDeviceGetCurrentClocksThrottleReasons\n"
        + "missing nvmlDeviceGetTemperatureV\n"  # an older driver: the older function answers
        + "missing nvmlDeviceGetMemoryInfo_v2\n"
        + "notsupported nvmlDeviceRegisterEvents\n"
        + "notsupported nvmlDeviceGetMigMode\n"
    )
    proc = run_source()
    answers = [proc.collect() for _ in range(5)]
    log = proc.stop()
    for n, answer in enumerate(answers, 1):
        assert facts(answer)["nvml_up"] is True
        gpus = by_index(answer)
        for i, g in gpus.items():
            assert g["up"] is True
            assert g["power_watts"] is None
            assert g["throttle_reasons"] is None
            assert g["temperature_celsius"] == 50 + i
            assert g["memory_used_bytes"] == (10 + i) * GIB + GIB // 2  # v1's used includes the reservation
            assert g["mig_devices"] == []
            assert g["xid_counts"] == {}
            # Without nvmlDeviceGetSamples, the polled utilisation is a sample, one more each read.
            assert [ratio for _, ratio in g["utilization_samples"]] == [pytest.approx(g["utilization_ratio"])] * n
        assert gpus[0]["processes"][0]["sm_utilization"] is None
    for fn in (
        "nvmlDeviceGetPowerUsage",
        "nvmlDeviceGetSamples",
        "nvmlDeviceGetProcessUtilization",
        "nvmlDeviceGetCurrentClocksThrottleReasons",
        "nvmlDeviceRegisterEvents",
        "nvmlDeviceGetMigMode",
    ):
        assert log.count(f"NVML {fn} unavailable") == 1, (fn, log)
    # A newer function with an older one to fall back on is not worth a warning.
    for fn in ("nvmlDeviceGetTemperatureV", "nvmlDeviceGetMemoryInfo_v2", "nvmlDeviceGetCurrentClocksEventReasons"):
        assert fn not in log


@pytest.mark.realpart
def test_binding_missing_from_older_nvidia_ml_py(nvml: FakeNVML, run_source: Any) -> None:
    nvml.write_script(EIGHT_GPUS)
    proc = run_source("--drop-binding", "nvmlDeviceGetSamples", "--drop-binding", "nvmlDeviceGetPowerUsage")
    answers = [proc.collect() for _ in range(3)]
    log = proc.stop()
    for answer in answers:
        gpus = by_index(answer)
        assert all(g["up"] and g["power_watts"] is None for g in gpus.values())
        assert gpus[5]["utilization_samples"][0][1] == pytest.approx(0.75)
    assert log.count("NVML nvmlDeviceGetPowerUsage unavailable") == 1
    assert "not in the installed nvidia-ml-py" in log


@pytest.mark.realpart
def test_mig_errors_never_break_the_source(nvml: FakeNVML, run_source: Any) -> None:
    nvml.write_script(EIGHT_GPUS + "error nvmlDeviceGetMigDeviceHandleByIndex code=999 gpu=7\n")
    gpus = by_index(run_source().collect())
    assert gpus[7]["up"] is True
    assert gpus[7]["mig_devices"] == []
    assert gpus[7]["memory_used_bytes"] == 17 * GIB


@pytest.mark.realpart
def test_hung_call_is_given_up_at_the_deadline_and_starts_no_second_sampling(nvml: FakeNVML, run_source: Any) -> None:
    nvml.write_script(EIGHT_GPUS)
    proc = run_source("--call-timeout", "0.5")
    first = proc.collect()
    assert all(g["up"] for g in facts(first)["gpus"])
    threads = first["threads"]

    # The call sleeps far longer than its deadline: collect() returns while it is still in the library.
    nvml.write_script(EIGHT_GPUS + "slow nvmlDeviceGetPowerUsage ms=8000 gpu=4 times=1\n")
    stuck = proc.collect()
    assert (nvml.counts()["slow_entered"], nvml.counts()["slow_returned"]) == (1, 0)
    f = facts(stuck)
    assert f["stuck"] is True and f["nvml_up"] is False
    assert "nvmlDeviceGetPowerUsage on GPU 4 has not returned" in f["error"]
    assert stuck["failure"] == f["error"]
    assert len(f["gpus"]) == 8
    for g in f["gpus"]:
        assert g["up"] is False and "stuck" in g["error"]
        assert g["uuid"] is not None  # known GPUs, unknown values
        assert g["utilization_ratio"] is None and g["power_watts"] is None

    # Still stuck: the next collects return while the call is in the library, and start no sampling and no thread.
    for _ in range(3):
        again = proc.collect()
        assert nvml.counts()["slow_returned"] == 0
        assert facts(again)["stuck"] is True
        assert facts(again)["stuck_seconds"] >= facts(stuck)["stuck_seconds"]
        assert again["threads"] == threads
    assert nvml.counts()["slow_entered"] == 1

    # Once the call returns, sampling resumes (the slow rule was for one time only).
    wait_for(lambda: nvml.counts()["slow_returned"] == 1, 30, "the slow call to return")
    answer = wait_for(lambda: (a := proc.collect()) and not facts(a)["stuck"] and a, 30, "sampling to resume")
    assert facts(answer)["nvml_up"] is True
    assert all(g["up"] for g in facts(answer)["gpus"])
    assert answer["threads"] == threads


@pytest.mark.realpart
def test_samples_read_by_a_sampling_that_returned_late_come_with_the_next_facts(
    nvml: FakeNVML, run_source: Any
) -> None:
    # A sampling that passes its deadline has still read the driver's sample buffer, and the driver answers a later
    # read only with newer samples: had they gone with the late sampling's facts, that GPU time would be lost to the
    # stall join.
    nvml.write_script(EIGHT_GPUS)
    proc = run_source("--call-timeout", "0.5")
    assert len(by_index(proc.collect())[5]["utilization_samples"]) == 3
    newer = EIGHT_GPUS.replace("1700000000333333:100", "1700000000333333:100,1700000000500000:5,1700000000666666:7")
    nvml.write_script(newer + "slow nvmlDeviceGetPowerUsage ms=1500 gpu=5 times=1\n")
    assert facts(proc.collect())["stuck"] is True  # past its deadline after reading GPU 5's samples
    wait_for(lambda: nvml.counts()["slow_returned"] == 1, 30, "the slow call to return")
    nvml.write_script(newer.replace("1700000000666666:7", "1700000000666666:7,1700000000833333:9"))
    answer = by_index(proc.collect())
    assert answer[5]["utilization_samples"][3:] == [
        [pytest.approx(1700000000.5), pytest.approx(0.05)],
        [pytest.approx(1700000000.666666), pytest.approx(0.07)],
        [pytest.approx(1700000000.833333), pytest.approx(0.09)],
    ]


@pytest.mark.realpart
def test_slow_nvml_init_is_not_stuck_until_its_own_timeout(nvml: FakeNVML, run_source: Any) -> None:
    # Without persistence mode nvmlInit wakes every GPU and can take seconds: that is not a hung call.
    nvml.write_script(EIGHT_GPUS + "slow nvmlInitWithFlags ms=6000 times=1\n")
    proc = run_source("--call-timeout", "0.3")
    answer = proc.collect()
    assert nvml.counts()["slow_returned"] == 0  # answered while nvmlInit sleeps, far past the call timeout
    f = facts(answer)
    assert f["nvml_up"] is False and f["stuck"] is False
    assert "nvmlInit in progress" in f["error"]
    assert answer["failure"] == f["error"]  # no GPU seen yet: not a success, though not stuck either
    answer = wait_for(lambda: (a := proc.collect()) and facts(a)["nvml_up"] and a, 30, "nvmlInit to finish")
    assert len(facts(answer)["gpus"]) == 8
    assert nvml.counts()["init"] == 1


@pytest.mark.realpart
def test_close_calls_nvml_shutdown(nvml: FakeNVML, run_source: Any) -> None:
    nvml.write_script(EIGHT_GPUS)
    proc = run_source()
    proc.collect()
    proc.collect()
    assert nvml.counts()["init"] == 1 and nvml.counts()["shutdown"] == 0
    proc.close()
    assert nvml.counts()["shutdown"] == 1
    after = facts(proc.collect())
    assert after["nvml_up"] is False and after["error"] == "source closed"
    assert nvml.counts()["init"] == 1


@pytest.mark.realpart
def test_close_while_stuck_does_not_wait_or_shut_down_under_the_call(nvml: FakeNVML, run_source: Any) -> None:
    nvml.write_script(EIGHT_GPUS + "slow nvmlDeviceGetUtilizationRates ms=8000 gpu=0\n")
    proc = run_source("--call-timeout", "0.3")
    assert facts(proc.collect())["stuck"] is True
    proc.close()
    assert nvml.counts()["slow_returned"] == 0  # closed while the call is still in the library: not waited for
    assert nvml.counts()["shutdown"] == 0
    assert "not calling nvmlShutdown" in proc.stop()


@pytest.mark.realpart
def test_init_failure_retries_with_backoff_then_comes_up(nvml: FakeNVML, run_source: Any) -> None:
    nvml.write_script(EIGHT_GPUS + "init error=9\n")  # NVML_ERROR_DRIVER_NOT_LOADED
    # Collects never hurry a retry: with an hour's backoff, twenty collects make one attempt.
    waiting = run_source("--init-backoff", "3600")
    for i in range(20):
        answer = waiting.collect()
        f = facts(answer)
        assert f["nvml_up"] is False and "kernel driver is not loaded" in f["error"]
        assert answer["failure"] == f["error"]  # no driver: the collector fails, with the reason
        # and its worker sleeps until the retry is due rather than every --interval (1 s). The interval counts from
        # the collection's start, as the worker does: after the one that tried nvmlInit, the whole backoff or more
        # (counted from the end, the worker would wake early by the collection's length and fail once more).
        assert (3600 <= answer["interval"] < 3660) if i == 0 else (3000 < answer["interval"] < 3660)
    assert nvml.counts()["init_attempts"] == 1
    waiting.stop()

    # With a short backoff it tries again, and comes up once the driver is there.
    proc = run_source("--init-backoff", "0.25")
    assert facts(proc.collect())["nvml_up"] is False
    nvml.write_script(EIGHT_GPUS)
    answer = wait_for(lambda: (a := proc.collect()) and facts(a)["nvml_up"] and a, 30, "NVML to come up")
    assert len(facts(answer)["gpus"]) == 8
    assert answer["interval"] == 1.0  # up: the configured pace again
    counts = nvml.counts()
    assert counts["init"] == 1 and counts["init_attempts"] >= 2
    assert proc.stop().count("NVML unavailable") == 1


@pytest.mark.realpart
def test_nvml_gone_mid_run_is_released_and_initialised_again(nvml: FakeNVML, run_source: Any) -> None:
    # nvmlInit works but the next call fails: released, and initialised again after a backoff, not on every collect
    # (with an hour's backoff, twenty collects initialise nothing more).
    nvml.write_script(EIGHT_GPUS)
    waiting = run_source("--init-backoff", "3600")
    assert facts(waiting.collect())["nvml_up"] is True
    nvml.write_script(EIGHT_GPUS + "error nvmlDeviceGetCount_v2 code=18\n")  # NVML_ERROR_LIB_RM_VERSION_MISMATCH
    for _ in range(20):
        f = facts(waiting.collect())
        assert f["nvml_up"] is False and "nvmlDeviceGetCount_v2" in f["error"]
    assert (nvml.counts()["init"], nvml.counts()["shutdown"]) == (1, 1)  # released, so a driver upgrade can unload
    waiting.stop()

    nvml.write_script(EIGHT_GPUS)
    proc = run_source("--init-backoff", "0.25")
    assert facts(proc.collect())["nvml_up"] is True
    nvml.write_script(EIGHT_GPUS + "error nvmlDeviceGetCount_v2 code=18\n")
    wait_for(lambda: not facts(proc.collect())["nvml_up"] and nvml.counts()["init"] >= 3, 30, "two more inits")
    counts = nvml.counts()
    assert counts["shutdown"] == counts["init"]  # each released

    nvml.write_script(EIGHT_GPUS)
    answer = wait_for(lambda: (a := proc.collect()) and facts(a)["nvml_up"] and a, 30, "NVML to come back")
    assert all(g["up"] for g in facts(answer)["gpus"])
    counts = nvml.counts()
    assert counts["shutdown"] == counts["init"] - 1  # every earlier one released, the live one kept
    assert proc.stop().count("NVML stopped answering") == 1
