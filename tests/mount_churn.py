"""Mount churn through the agent's own code: pod volumes mounted and unmounted, many a tick, and the agent's RSS.

A fixture host (procfs, sysfs and root in a directory given with ``--root``) whose mount table changes every tick:
each cycle is one pod volume that is mounted, does I/O for two ticks and is unmounted. A third of them are NFS
(a mountstats block whose READ, WRITE and COMMIT counters move), a third ext4 on a loop device of their own (a sysfs
entry and a /proc/diskstats line that come and go with it: devices churn too), a third emptyDir tmpfs; each gets an
active probe (write, fsync, read back through the blocking-call helper) and a small safetensors checkpoint with an
event log, which the checkpoint source finds under the kubelet's pod directory (runs churn too).

Every tick the driver rewrites the fixture files, has every source of a real ``storwatch.agent.Agent`` collect once
and records it as the agent's workers do, advances the agent one tick (History, latency windows, forgetting), builds
the View, and renders /metrics, /api/status and /status. The workers themselves run on timers (the mount source
every 10 s at least): driving them directly makes 10,000 cycles take a minute rather than a day, through the same
collect / advance / View / exposition code. Real mounts would be no more honest and far slower: the agent sees
only the mount table, the counters and the directories, which the fixture gives it.

Prints one JSON object: the agent process's RSS (VmRSS, bytes) after each ``--at`` number of cycles, and more.

Usage: python -m tests.mount_churn --root DIR [--cycles 10000] [--per-tick 10] [--at 100] [--at 10000]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import struct
import sys
import time
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from storwatch.agent import Agent  # noqa: E402
from storwatch.config import parse_config  # noqa: E402
from storwatch.report import view_to_dict  # noqa: E402
from storwatch.web import render_status_page  # noqa: E402

LIFETIME_TICKS = 3
"""A volume is in the mount table for this many ticks: mounted, then I/O seen on the next two reads."""
LOOP_MAJOR = 7

BASE_MOUNTINFO = (
    "24 1 259:2 / / rw,relatime shared:1 - ext4 /dev/nvme0n1p1 rw\n"
    "25 24 0:5 / /dev rw,nosuid - devtmpfs udev rw\n"
    "26 24 0:23 / /proc rw,nosuid,nodev,noexec,relatime - proc proc rw\n"
    "27 24 0:24 / /sys rw,nosuid,nodev,noexec,relatime - sysfs sysfs rw\n"
    "28 24 0:25 / /run rw,nosuid,nodev - tmpfs tmpfs rw,size=1024k\n"
    "29 24 259:4 / /mnt/local-nvme rw,noatime - xfs /dev/nvme1n1 rw\n"
)
BASE_DISKSTATS = (
    " 259       0 nvme0n1 1000 0 8000 500 400 0 3200 800 0 900 1300 0 0 0 0 100 300\n"
    " 259       2 nvme0n1p1 900 0 7000 450 350 0 3000 700 0 850 1200 0 0 0 0 0 0\n"
    " 259       4 nvme1n1 1000 0 8000 500 400 0 3200 800 0 900 1300 0 0 0 0 100 300\n"
)
NFS_OPS = ("GETATTR", "LOOKUP", "ACCESS", "READ", "WRITE", "COMMIT", "OPEN", "CLOSE", "CREATE", "RENAME", "READDIR")


def pod_uid(i: int) -> str:
    return f"{i:08x}-0000-4000-8000-{i:012x}"


class Volume:
    """One cycle: a pod volume of one of three kinds."""

    def __init__(self, i: int, born: int) -> None:
        self.i, self.born = i, born
        self.kind = ("nfs", "loop", "tmpfs")[i % 3]
        uid = pod_uid(i)
        plugin, name = {
            "nfs": ("kubernetes.io~csi", f"pvc-{uid}/mount"),
            "loop": ("kubernetes.io~local-volume", f"pvc-{uid}"),
            "tmpfs": ("kubernetes.io~empty-dir", "scratch"),
        }[self.kind]
        self.pod_dir = f"/var/lib/kubelet/pods/{uid}"
        self.mountpoint = f"{self.pod_dir}/volumes/{plugin}/{name}"
        self.loop = f"loop{i}"

    def mountinfo_line(self) -> str:
        mount_id = 1000 + self.i
        if self.kind == "nfs":
            return (
                f"{mount_id} 24 0:{100 + self.i % 900} / {self.mountpoint} rw,relatime - nfs4 "
                f"10.0.0.5:/exports/vol{self.i} rw,vers=4.1,addr=10.0.0.5\n"
            )
        if self.kind == "loop":
            return f"{mount_id} 24 {LOOP_MAJOR}:{self.i} / {self.mountpoint} rw,relatime - ext4 /dev/{self.loop} rw\n"
        return f"{mount_id} 24 0:{100 + self.i % 900} / {self.mountpoint} rw,relatime - tmpfs tmpfs rw,size=65536k\n"

    def mountstats_block(self, tick: int) -> str:
        n = 10 * (tick - self.born + 1)  # counters move on every tick the volume is mounted
        lines = [
            f"device 10.0.0.5:/exports/vol{self.i} mounted on {self.mountpoint} with fstype nfs4 statvers=1.1",
            "\topts:\trw,vers=4.1,rsize=1048576,wsize=1048576,hard,proto=tcp,timeo=600,retrans=2,sec=sys",
            "\tage:\t100",
            "\tevents:\t" + " ".join(["1"] * 27) + " ",
            f"\tbytes:\t{n * 4096} {n * 4096} 0 0 {n * 4096} {n * 4096} {n} {n} ",
            "\tRPC iostats version: 1.1  p/v: 100003/4 (nfs)",
            f"\txprt:\ttcp 785 1 2 0 8 {n} {n} 0 {n} 0 128 {n} {n}",
            "\tper-op statistics",
        ]
        for op in NFS_OPS:
            lines.append(f"\t{op:>12}: {n} {n} 0 {n * 128} {n * 4096} {n} {n * 2} {n * 3}")
        return "\n".join(lines) + "\n\n"

    def diskstats_line(self, tick: int) -> str:
        n = 10 * (tick - self.born + 1)
        fields = (n, 0, n * 8, n, n, 0, n * 8, n * 2, 0, n, n * 3, 0, 0, 0, 0, n, n)
        return f"   {LOOP_MAJOR} {self.i:7d} {self.loop} " + " ".join(map(str, fields)) + "\n"


class Host:
    """The fixture host's files, rewritten each tick."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.proc, self.sys, self.rootfs = root / "proc", root / "sys", root / "rootfs"
        for d in (self.proc / "1", self.sys / "dev" / "block", self.sys / "class" / "block", self.rootfs):
            d.mkdir(parents=True, exist_ok=True)
        for d in ("mnt/local-nvme", "run", "var/lib/kubelet/pods"):
            (self.rootfs / d).mkdir(parents=True, exist_ok=True)
        self.rootfs_s, self.sys_s = str(self.rootfs), str(self.sys)

    def _write(self, path: Path, text: str) -> None:
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(text)
        os.replace(tmp, path)

    # Per-volume paths are plain strings: pathlib interns every path part, and the interpreter's table of interned
    # strings grows with 10,000 pod UIDs and never shrinks, which would be the driver's growth, not the agent's.

    def appear(self, v: Volume, event_log: bool) -> None:
        mp = os.path.join(self.rootfs_s, v.mountpoint.lstrip("/"))
        os.makedirs(os.path.join(mp, "run"))
        write_checkpoint(os.path.join(mp, "run", "step-1.safetensors"))
        if event_log:
            with open(os.path.join(mp, "run", ".storwatch-events.jsonl"), "w", encoding="utf-8") as f:
                f.write(json.dumps({"path": "step-1.safetensors", "start": 1.0, "end": 2.0, "bytes": 4}) + "\n")
        if v.kind == "loop":
            dev = os.path.join(self.sys_s, "devices", "virtual", "block", v.loop)
            os.makedirs(os.path.join(dev, "loop"))
            with open(os.path.join(dev, "dev"), "w", encoding="ascii") as f:
                f.write(f"{LOOP_MAJOR}:{v.i}\n")
            with open(os.path.join(dev, "loop", "backing_file"), "w", encoding="ascii") as f:
                f.write(f"/var/lib/images/vol{v.i}.img\n")
            target = f"../../devices/virtual/block/{v.loop}"
            os.symlink(target, os.path.join(self.sys_s, "dev", "block", f"{LOOP_MAJOR}:{v.i}"))
            os.symlink(target, os.path.join(self.sys_s, "class", "block", v.loop))

    def disappear(self, v: Volume) -> None:
        shutil.rmtree(os.path.join(self.rootfs_s, v.pod_dir.lstrip("/")))
        if v.kind == "loop":
            os.unlink(os.path.join(self.sys_s, "dev", "block", f"{LOOP_MAJOR}:{v.i}"))
            os.unlink(os.path.join(self.sys_s, "class", "block", v.loop))
            shutil.rmtree(os.path.join(self.sys_s, "devices", "virtual", "block", v.loop))

    def write_tables(self, live: list[Volume], tick: int) -> None:
        self._write(self.proc / "1" / "mountinfo", BASE_MOUNTINFO + "".join(v.mountinfo_line() for v in live))
        self._write(
            self.proc / "1" / "mountstats",
            "device /dev/nvme0n1p1 mounted on / with fstype ext4\n"
            + "".join(v.mountstats_block(tick) for v in live if v.kind == "nfs"),
        )
        self._write(
            self.proc / "diskstats", BASE_DISKSTATS + "".join(v.diskstats_line(tick) for v in live if v.kind == "loop")
        )


def write_checkpoint(path: str) -> None:
    """A complete single-tensor safetensors file: 8-byte header length, JSON header, 4 bytes of data."""
    header = json.dumps({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(header)) + header + b"\0\0\0\0")


def rss_bytes() -> int:
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def make_agent(host: Host, clock: list[float]) -> Agent:
    config = parse_config(
        f"""
platform: together-k8s
history_size: 10
paths: {{procfs: {host.proc}, sysfs: {host.sys}, rootfs: {host.rootfs}}}
mounts: {{statvfs_timeout_seconds: 2.0}}
probes: {{mountpoints: ["/var/lib/kubelet/pods/*"], timeout_seconds: 2.0}}
checkpoints: {{settle_seconds: 0, deep_per_scan: 0}}
gpu: {{enabled: false}}
kube: {{enabled: false}}
""",
        "mount_churn",
    )
    return Agent(config, clock=lambda: clock[0])


def collect_all(agent: Agent, now: float) -> None:
    """Every source once, recorded as the agent's workers record it."""
    agent.collect_now()
    failed = [c for c in agent.collector_statuses() if c.enabled and not c.success]
    if failed:
        raise RuntimeError(f"source {failed[0].name} failed: {failed[0].error}")


def run(root: Path, cycles: int, per_tick: int, at: list[int], event_logs: bool = False) -> dict[str, Any]:
    host = Host(root)
    clock = [1_800_000_000.0]
    agent = make_agent(host, clock)
    live: list[Volume] = []
    born = 0
    rss: dict[str, int] = {}
    max_live_windows = 0
    seen = dict.fromkeys(("latency", "probed", "runs", "devices", "usage_errors"), 0)
    tick = 0
    started = time.monotonic()
    try:
        while born < cycles or live:
            for v in [v for v in live if tick - v.born >= LIFETIME_TICKS]:
                live.remove(v)
                host.disappear(v)
            for _ in range(min(per_tick, cycles - born)):
                v = Volume(born, tick)
                host.appear(v, event_logs)
                live.append(v)
                born += 1
            host.write_tables(live, tick)
            collect_all(agent, clock[0])
            agent.advance()
            view = agent.current_view()
            assert view is not None
            agent.metrics()
            data = view_to_dict(view)
            json.dumps(data)
            render_status_page(data)
            max_live_windows = max(max_live_windows, len(agent.windows))
            seen["latency"] = max(seen["latency"], sum(1 for m in data["mounts"] if m["io"]["latency"]))
            seen["probed"] = max(seen["probed"], sum(1 for m in data["mounts"] if m["io"]["probe"] is not None))
            seen["runs"] = max(seen["runs"], len(data["checkpoints"]))
            seen["devices"] = max(seen["devices"], len(view.disks.counters) if view.disks is not None else 0)
            seen["usage_errors"] += sum(1 for m in data["mounts"] if m["usage_error"])
            done = born - len(live)  # cycles whose volume has been mounted and unmounted
            for n in at:
                if str(n) not in rss and done >= n:
                    rss[str(n)] = rss_bytes()
            clock[0] += 1.0
            tick += 1
        return {
            "cycles": cycles,
            "ticks": tick,
            "seconds": round(time.monotonic() - started, 1),
            "rss_bytes": rss,
            "windows_at_end": len(agent.windows),
            "max_windows": max_live_windows,
            "history": len(agent.history),
            "most_seen_at_once": seen,
        }
    finally:
        agent.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", required=True, type=Path, help="an empty directory for the fixture host")
    parser.add_argument("--cycles", type=int, default=10_000)
    parser.add_argument("--per-tick", type=int, default=10)
    parser.add_argument("--at", type=int, action="append", help="report the RSS after this many cycles")
    parser.add_argument(
        "--event-logs", action="store_true", help="give every run a .storwatch-events.jsonl (atomic_save's write log)"
    )
    args = parser.parse_args()
    result = run(args.root, args.cycles, args.per_tick, args.at or [100, args.cycles], args.event_logs)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
