"""Real kernel latency: ext4 on loop devices whose backing images sit on a FUSE filesystem that sleeps in write.

What storwatch reports for the loop mount must follow the injected delay, and agree with node_exporter reading the
same device over the same window.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.agentproc import running_agent
from tests.realmounts import fuse_mount, loop_ext4_mount, tmpfs_mount

pytestmark = pytest.mark.realpart

NODE_EXPORTER = "prometheus-node-exporter"
DELAY_MS = 20


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _scrape(url: str) -> dict[str, float]:
    with urllib.request.urlopen(url, timeout=30) as resp:
        text = resp.read().decode()
    samples = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            samples[name] = float(value)
    return samples


@contextmanager
def node_exporter() -> Iterator[str]:
    binary = shutil.which(NODE_EXPORTER)
    if binary is None:
        pytest.skip(f"{NODE_EXPORTER} is not installed (Debian package prometheus-node-exporter)")
    port = _free_port()
    proc = subprocess.Popen(
        [
            binary,
            f"--web.listen-address=127.0.0.1:{port}",
            "--collector.disable-defaults",
            "--collector.diskstats",
            # node_exporter 1.5 excludes loop devices by default, and include and exclude may not both be set.
            "--collector.diskstats.device-exclude=^$",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}/metrics"
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                _scrape(url)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        proc.wait(5)


def _write(mountpoint: Path, name: str, blocks: int) -> None:
    # O_DIRECT 64 KiB writes and an fsync: every block reaches the loop device, none sits in the page cache.
    subprocess.run(
        ["dd", "if=/dev/zero", f"of={mountpoint / name}", "bs=64k", f"count={blocks}", "oflag=direct", "conv=fsync"],
        check=True,
        capture_output=True,
        timeout=120,
    )


def _loop_on_fuse(real_mounts, base: Path, name: str, delay_ms: int):  # type: ignore[no-untyped-def]
    fuse = real_mounts(fuse_mount(base / f"{name}-fuse", write_delay_ms=delay_ms))
    # No lazy initialisation: no background writes of ext4's own to muddy the device's counters.
    return real_mounts(
        loop_ext4_mount(
            base / f"{name}-ext4",
            size_mb=32,
            image_dir=fuse.mountpoint,
            mkfs_args=["-E", "lazy_itable_init=0,lazy_journal_init=0"],
        )
    )


def _wait_for_diskstats_round(agent_url: str) -> None:
    before = _scrape(agent_url).get('storwatch_collector_last_success_timestamp_seconds{collector="diskstats"}')
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        now = _scrape(agent_url).get('storwatch_collector_last_success_timestamp_seconds{collector="diskstats"}')
        if now is not None and now != before:
            return
        time.sleep(0.1)
    raise AssertionError("the diskstats collector did not run within 5 s")


def test_loop_write_latency_follows_the_fuse_delay_and_agrees_with_node_exporter(tmp_path: Path, real_mounts) -> None:  # type: ignore[no-untyped-def]
    fast = _loop_on_fuse(real_mounts, tmp_path, "fast", 0)
    slow = _loop_on_fuse(real_mounts, tmp_path, "slow", DELAY_MS)
    config = tmp_path / "storwatch.yaml"
    config.write_text("tick_seconds: 0.25\nmounts:\n  interval_seconds: 1\ndiskio:\n  interval_seconds: 0.5\n")
    with (
        node_exporter() as ne_url,
        running_agent("--config", str(config), "--listen", "127.0.0.1:0") as agent,
    ):
        sw_url = agent.url("/metrics")
        _wait_for_diskstats_round(sw_url)
        _wait_for_diskstats_round(sw_url)
        ne0, sw0 = _scrape(ne_url), _scrape(sw_url)
        _write(fast.mountpoint, "f", 64)
        _write(slow.mountpoint, "f", 64)
        _wait_for_diskstats_round(sw_url)
        _wait_for_diskstats_round(sw_url)
        ne1, sw1 = _scrape(ne_url), _scrape(sw_url)
        status = json.loads(urllib.request.urlopen(agent.url("/api/status"), timeout=5).read())

    def ratio(a: dict[str, float], b: dict[str, float], time_key: str, ops_key: str) -> float:
        ops = b[ops_key] - a[ops_key]
        assert ops > 0, f"no writes seen in {ops_key}"
        return (b[time_key] - a[time_key]) / ops

    mounts = {m["mountpoint"]: m for m in status["mounts"]}
    reported = {}
    for lm in (fast, slow):
        dev = lm.loop_name
        ne = ratio(
            ne0,
            ne1,
            f'node_disk_write_time_seconds_total{{device="{dev}"}}',
            f'node_disk_writes_completed_total{{device="{dev}"}}',
        )
        sw_counters = ratio(
            sw0,
            sw1,
            f'storwatch_disk_write_time_seconds_total{{device="{dev}"}}',
            f'storwatch_disk_writes_completed_total{{device="{dev}"}}',
        )
        entry = mounts[str(lm.mountpoint)]
        assert entry["io"]["device"] == dev
        window = entry["io"]["latency"]["write"]["1m"]
        sw_window = window["mean_seconds"]
        assert sw_window is not None and window["samples"] >= 1
        # The same device over the same window: storwatch's counters and its own minute window match node_exporter.
        assert sw_counters == pytest.approx(ne, rel=0.10), (dev, sw_counters, ne)
        assert sw_window == pytest.approx(ne, rel=0.10), (dev, sw_window, ne)
        reported[dev] = sw_window
        print(
            f"{dev}: storwatch window mean {sw_window * 1000:.2f} ms, counters {sw_counters * 1000:.2f} ms, "
            f"node_exporter {ne * 1000:.2f} ms"
        )
    fast_latency, slow_latency = reported[fast.loop_name], reported[slow.loop_name]
    # What is reported, not how fast anything ran: the delayed device reads slower than the other, and at least the
    # delay the FUSE layer adds to each of its writes (load can only add to it).
    assert slow_latency > fast_latency, (slow_latency, fast_latency)
    assert slow_latency >= DELAY_MS / 1000 * 0.9


def test_probe_measures_a_mount_and_a_hung_probe_marks_it_stuck(tmp_path: Path, real_mounts) -> None:  # type: ignore[no-untyped-def]

    tmpfs = real_mounts(tmpfs_mount(tmp_path / "fast"))
    slow_fuse = real_mounts(fuse_mount(tmp_path / "slow", write_delay_ms=DELAY_MS))
    readonly = real_mounts(tmpfs_mount(tmp_path / "ro"))
    subprocess.run(["mount", "-o", "remount,ro", str(readonly.mountpoint)], check=True, timeout=10)
    config = tmp_path / "storwatch.yaml"
    config.write_text(
        "tick_seconds: 0.2\n"
        "mounts:\n  interval_seconds: 0.5\n"
        "probes:\n"
        f"  mountpoints: ['{tmpfs.mountpoint}', '{slow_fuse.mountpoint}', '{readonly.mountpoint}']\n"
        "  interval_seconds: 0.5\n  timeout_seconds: 0.3\n"
    )
    with running_agent("--config", str(config), "--listen", "127.0.0.1:0") as agent:
        url = agent.url("/metrics")
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            m = _scrape(url)
            if m.get(f'storwatch_probe_duration_seconds_count{{mountpoint="{tmpfs.mountpoint}",op="fsync"}}', 0) >= 2:
                break
            time.sleep(0.2)
        m = _scrape(url)
        assert m[f'storwatch_probe_success{{mountpoint="{tmpfs.mountpoint}"}}'] == 1
        # FUSE sleeps 20 ms per write and the probe's 4 KiB write goes through: more than the 0.3 s deadline? No:
        # 20 ms is well within it, so the probe succeeds and its write+fsync shows the delay.
        slow_write = f'storwatch_probe_duration_seconds_sum{{mountpoint="{slow_fuse.mountpoint}",op="fsync"}}'
        slow_count = f'storwatch_probe_duration_seconds_count{{mountpoint="{slow_fuse.mountpoint}",op="fsync"}}'
        assert m[slow_count] >= 1
        # Never on a read-only mount.
        assert not any(k.startswith("storwatch_probe") and str(readonly.mountpoint) in k for k in m)
        # The scratch directory stays inside the mount; the probe file is removed.
        assert os.listdir(tmpfs.mountpoint / ".storwatch-probe") == []
        fsync_mean = m[slow_write] / m[slow_count]
        assert (
            fsync_mean >= DELAY_MS / 1000 * 0.5
            or m[f'storwatch_probe_duration_seconds_sum{{mountpoint="{slow_fuse.mountpoint}",op="write"}}']
            >= DELAY_MS / 1000 * 0.5
        )

        # Now the FUSE daemon stops answering statfs... it is the write path we probe: stop the daemon entirely.
        os.kill(slow_fuse.proc.pid, 19)  # SIGSTOP: every request to the mount now waits, as on a dead server
        try:
            stuck_key = f'storwatch_probe_stuck{{mountpoint="{slow_fuse.mountpoint}"}}'
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and _scrape(url).get(stuck_key) != 1:
                time.sleep(0.2)
            assert _scrape(url)[stuck_key] == 1
            assert _scrape(url)[f'storwatch_mount_stuck{{mountpoint="{slow_fuse.mountpoint}"}}'] == 1
            # Scrapes are answered while every request to the mount waits on the stopped daemon: none waits with them.
            for _ in range(50):
                assert _scrape(url)[stuck_key] == 1
        finally:
            os.kill(slow_fuse.proc.pid, 18)  # SIGCONT, so teardown can release the mount
