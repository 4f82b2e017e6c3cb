"""Cost of the I/O sources: parse and delta per tick for 64 block devices and 64 NFS mounts, and the agent's CPU.

1. In-process: DiskIOSource.collect() and NFSSource.collect() on a synthetic procfs tree whose counters move every
   tick; CPU time per tick (p50/p99), next to node_exporter's CPU per scrape of the same files (its diskstats and
   mountstats collectors, --path.procfs pointed at the tree) measured in the same run.
2. The whole agent at a 1 s cadence (diskstats 1 s, NFS 1 s, mounts 10 s, tick 1 s) on that tree for --seconds,
   scraped every --scrape-interval seconds (15, as Prometheus is commonly set; 0: never) the way Prometheus does,
   after one warm-up scrape: its CPU and its helper process's (statvfs and probes run there) as a share of one
   core, and its RSS at the end. Target: <= 1 %.

Usage: .venv/bin/python bench/io_sources.py [--devices 64] [--nfs 64] [--busy-nfs 64] [--seconds 60]
       [--scrape-interval 15] [--nfs-operations '*'] [--json FILE]
BENCH_EXTRA_CONFIG (YAML text) is appended to the agent's config, e.g. to switch sources off while investigating;
it must not repeat a section written above (tick_seconds, paths, diskio, nfs, mounts): the agent refuses a field
given twice.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import (
    ROOT,
    VENV_BIN,
    HarnessError,
    cpu_seconds,
    free_port,
    measure_agent,
    reference_cpu_ms,
    summary,
    terminate,
    verdict,
    write_json,
)

GPU_NODE_MOUNTINFO = ROOT / "tests" / "fixtures" / "gpu-node" / "proc" / "1" / "mountinfo"

NFS_OPS_V4 = [
    "NULL", "READ", "WRITE", "COMMIT", "OPEN", "OPEN_CONFIRM", "OPEN_NOATTR", "OPEN_DOWNGRADE", "CLOSE", "SETATTR",
    "FSINFO", "RENEW", "SETCLIENTID", "SETCLIENTID_CONFIRM", "LOCK", "LOCKT", "LOCKU", "ACCESS", "GETATTR", "LOOKUP",
    "LOOKUP_ROOT", "REMOVE", "RENAME", "LINK", "SYMLINK", "CREATE", "PATHCONF", "STATFS", "READLINK", "READDIR",
    "SERVER_CAPS", "DELEGRETURN", "GETACL", "SETACL", "FS_LOCATIONS", "RELEASE_LOCKOWNER", "SECINFO",
    "FSID_PRESENT", "EXCHANGE_ID", "CREATE_SESSION", "DESTROY_SESSION", "SEQUENCE", "GET_LEASE_TIME",
    "RECLAIM_COMPLETE", "LAYOUTGET", "GETDEVICEINFO", "LAYOUTCOMMIT", "LAYOUTRETURN", "SECINFO_NO_NAME",
    "TEST_STATEID", "FREE_STATEID", "GETDEVICELIST", "BIND_CONN_TO_SESSION", "DESTROY_CLIENTID", "SEEK",
    "ALLOCATE", "DEALLOCATE", "LAYOUTSTATS", "CLONE", "COPY", "OFFLOAD_CANCEL", "LOOKUPP", "LAYOUTERROR",
]  # fmt: skip


def diskstats_text(devices: int, tick: int) -> str:
    lines = []
    for i in range(devices):
        base = 1000 * (i + 1) + 37 * tick
        stats = [base, 3, base * 8, base // 2, base, 5, base * 16, base, 0, base // 3, base, 0, 0, 0, 0, 7, 3]
        lines.append(f" 259 {i} nvme{i}n1 " + " ".join(str(v) for v in stats))
    return "\n".join(lines) + "\n"


BUSY = [64]  # how many NFS mounts do I/O every tick (set from --busy-nfs)


def nfs_mountpoints(mounts: int) -> list[str]:
    """Where the NFS mounts are mounted unless a bench says otherwise (at_scale.py: on pods' volume directories)."""
    return [f"/mnt/nfs{m}" for m in range(mounts)]


def mountstats_text(mounts: int, tick: int, mountpoints: Sequence[str] | None = None) -> str:
    where = mountpoints or nfs_mountpoints(mounts)
    out = ["device proc mounted on /proc with fstype proc", "device /dev/nvme0n1p1 mounted on / with fstype ext4"]
    for m in range(mounts):
        mtick = tick if m < BUSY[0] else 0  # an idle mount's counters stand still
        out.append(f"device 10.0.0.{m % 250 + 1}:/export/vol{m} mounted on {where[m]} with fstype nfs4 statvers=1.1")
        out.append("\topts:\trw,vers=4.2,rsize=1048576,wsize=1048576,namlen=255,acregmin=3,acregmax=60,hard,proto=tcp")
        out.append("\tage:\t86400")
        out.append("\tcaps:\tcaps=0x3ffbffff,wtmult=512,dtsize=1048576,bsize=0,namlen=255")
        out.append("\tsec:\tflavor=1,pseudoflavor=1")
        out.append("\tevents:\t" + " ".join(str(1000 + mtick + k) for k in range(27)))
        out.append("\tbytes:\t" + " ".join(str(10**9 + mtick * 4096 * (k + 1)) for k in range(8)))
        out.append("\tRPC iostats version: 1.1  p/v: 100003/4 (nfs)")
        out.append(f"\txprt:\ttcp 7{m:03d} 1 2 0 0 {10**6 + mtick} {10**6 + mtick} 0 {10**7} 0 64 {10**5} {10**5}")
        out.append("\tper-op statistics")
        for k, op in enumerate(NFS_OPS_V4):
            n = 0 if k > 30 else 1000 * (k + 1) + mtick * (k % 5)
            out.append(f"\t{op:>12s}: {n} {n} 0 {n * 200} {n * 150} {n // 10} {n} {n + n // 10} 0")
        out.append("")
    return "\n".join(out) + "\n"


def make_tree(devices: int, mounts: int, mountpoints: Sequence[str] | None = None, parent: str | None = None) -> Path:
    """The synthetic tree (``proc``, ``sys``, and ``root``: the host's /) in a new temporary directory (in
    ``parent`` when given); ``mountpoints``: one per NFS mount (default :func:`nfs_mountpoints`)."""
    where = mountpoints or nfs_mountpoints(mounts)
    root = Path(tempfile.mkdtemp(prefix="storwatch-bench-io-", dir=parent))
    proc = root / "proc"
    (proc / "1").mkdir(parents=True)
    os.symlink("1", proc / "self")  # node_exporter's procfs reads /proc/self as a link to a PID directory
    # The GPU node's mounts, and the NFS mounts of mountstats, so that the View joins each one's I/O as on a real node.
    nfs_lines = "".join(
        f"{2000 + m} 1 0:{500 + m} / {where[m]} rw,relatime shared:{900 + m} - nfs4 "
        f"10.0.0.{m % 250 + 1}:/export/vol{m} rw,vers=4.2,rsize=1048576,wsize=1048576,hard,proto=tcp\n"
        for m in range(mounts)
    )
    (proc / "1" / "mountinfo").write_bytes(GPU_NODE_MOUNTINFO.read_bytes() + nfs_lines.encode())
    write_tick(proc, devices, mounts, 0, where)
    (root / "sys").mkdir()
    for m in range(mounts):
        (root / "root" / where[m].lstrip("/")).mkdir(parents=True)  # statvfs answers for them
    (root / "root").mkdir(exist_ok=True)
    return root


def write_tick(proc: Path, devices: int, mounts: int, tick: int, mountpoints: Sequence[str] | None = None) -> None:
    for path, text in (
        (proc / "diskstats", diskstats_text(devices, tick)),
        (proc / "1" / "mountstats", mountstats_text(mounts, tick, mountpoints)),
    ):
        tmp = path.with_suffix(".tmp")
        tmp.write_text(text)
        os.replace(tmp, path)


def in_process(root: Path, devices: int, mounts: int, ticks: int) -> dict[str, Any]:
    from storwatch.config import DiskIOConfig, NFSConfig
    from storwatch.paths import HostPaths
    from storwatch.sources.diskio import DiskIOSource
    from storwatch.sources.nfs import NFSSource

    paths = HostPaths(procfs=str(root / "proc"), sysfs=str(root / "sys"), rootfs=str(root / "root"))
    disk, nfs = DiskIOSource(paths, DiskIOConfig()), NFSSource(paths, NFSConfig())
    disk.collect()
    nfs.collect()
    disk_cpu, nfs_cpu = [], []
    for tick in range(1, ticks + 1):
        write_tick(root / "proc", devices, mounts, tick)
        t0 = time.process_time()
        facts = disk.collect()
        t1 = time.process_time()
        nstats = nfs.collect()
        t2 = time.process_time()
        assert len(facts.deltas) == devices and len(nstats.deltas) == min(BUSY[0], mounts), "deltas missing"
        disk_cpu.append(t1 - t0)
        nfs_cpu.append(t2 - t1)
    return {"diskstats_cpu_s": summary(disk_cpu), "mountstats_cpu_s": summary(nfs_cpu)}


def node_exporter_cost(root: Path, scrapes: int) -> dict[str, Any] | None:
    binary = shutil.which("prometheus-node-exporter")
    if binary is None:
        return None
    port = free_port()
    proc = subprocess.Popen(
        [
            binary,
            f"--web.listen-address=127.0.0.1:{port}",
            f"--path.procfs={root / 'proc'}",
            "--collector.disable-defaults",
            "--collector.diskstats",
            "--collector.diskstats.device-exclude=^$",
            "--collector.mountstats",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}/metrics"
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                body = urllib.request.urlopen(url, timeout=5).read()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise HarnessError("node_exporter did not answer") from None
                time.sleep(0.1)
        if b"node_mountstats_nfs_operations_requests_total" not in body:
            raise HarnessError("node_exporter's mountstats collector reported nothing from the synthetic tree")
        for _ in range(5):
            urllib.request.urlopen(url, timeout=5).read()
        before = cpu_seconds(proc.pid) or 0.0
        for _ in range(scrapes):
            urllib.request.urlopen(url, timeout=5).read()
        after = cpu_seconds(proc.pid) or 0.0
        return {"cpu_per_scrape_s": (after - before) / scrapes, "scrapes": scrapes}
    finally:
        terminate(proc)


def agent_cpu(
    root: Path, devices: int, mounts: int, seconds: float, scrape_interval: float, nfs_operations: str = ""
) -> dict[str, Any]:
    cfg = root / "storwatch.yaml"
    operations = f", operations: [{', '.join(repr(o) for o in nfs_operations.split(','))}]" if nfs_operations else ""
    cfg.write_text(
        "tick_seconds: 1.0\n"
        f"paths: {{procfs: {root / 'proc'}, sysfs: {root / 'sys'}, rootfs: {root / 'root'}}}\n"
        f"diskio: {{interval_seconds: 1.0}}\nnfs: {{interval_seconds: 1.0{operations}}}\n"
        "mounts: {interval_seconds: 10}\n" + os.environ.get("BENCH_EXTRA_CONFIG", "")
    )
    port = free_port()
    proc = subprocess.Popen(
        [str(VENV_BIN / "storwatch"), "agent", "--config", str(cfg), "--listen", f"127.0.0.1:{port}"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        # 3 s of warm-up: past start-up imports and the first rounds.
        figures, _ = measure_agent(
            proc,
            port,
            seconds=seconds,
            warmup=3.0,
            scrape_interval=scrape_interval,
            tick=lambda n: write_tick(root / "proc", devices, mounts, n),
        )
        return figures
    finally:
        terminate(proc)


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:.2f}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--devices", type=int, default=64)
    ap.add_argument("--nfs", type=int, default=64)
    ap.add_argument("--ticks", type=int, default=60)
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--busy-nfs", type=int, default=64, help="NFS mounts whose counters move every tick (default all)")
    ap.add_argument("--scrape-interval", type=float, default=15.0, help="seconds between scrapes (default 15; 0: none)")
    ap.add_argument(
        "--nfs-operations", default="", help="nfs.operations, comma-separated ('*': all; default: the agent's own)"
    )
    ap.add_argument("--json", metavar="FILE")
    args = ap.parse_args()
    BUSY[0] = args.busy_nfs
    root = make_tree(args.devices, args.nfs)
    try:
        result: dict[str, Any] = {"devices": args.devices, "nfs_mounts": args.nfs}
        result["storwatch"] = ip = in_process(root, args.devices, args.nfs, args.ticks)
        per_tick = ip["diskstats_cpu_s"]["p50"] + ip["mountstats_cpu_s"]["p50"]
        print(f"storwatch parse+delta per tick ({args.devices} devices, {args.nfs} NFS mounts, {args.busy_nfs} busy):")
        print(f"  diskstats  p50 {ms(ip['diskstats_cpu_s']['p50'])} ms  p99 {ms(ip['diskstats_cpu_s']['p99'])} ms")
        print(f"  mountstats p50 {ms(ip['mountstats_cpu_s']['p50'])} ms  p99 {ms(ip['mountstats_cpu_s']['p99'])} ms")
        ne = node_exporter_cost(root, 50)
        result["node_exporter"] = ne
        if ne is not None:
            ratio = per_tick / ne["cpu_per_scrape_s"]
            result["ratio_storwatch_tick_to_node_exporter_scrape"] = ratio
            print(
                "node_exporter (diskstats + mountstats), CPU per scrape of the same files: "
                f"{ms(ne['cpu_per_scrape_s'])} ms"
            )
            print(f"  ratio storwatch parse+delta / node_exporter scrape: {ratio:.2f}")
        agent = agent_cpu(root, args.devices, args.nfs, args.seconds, args.scrape_interval, args.nfs_operations)
        result["agent"] = agent
        share = agent["cpu_share_of_one_core"]
        scraped = (
            f"{agent['scrapes']} scrapes (p50 {ms(agent['scrape_seconds']['p50'])} ms)"
            if agent["scrape_seconds"]
            else "no scrapes"
        )
        rss = agent["rss_bytes"]
        print(
            f"agent at 1 s cadence for {agent['seconds']:.0f} s, {agent['series']} series, {scraped}: "
            f"{share * 100:.2f}% of one core (agent {agent['agent_cpu_share'] * 100:.2f}% + helper "
            f"{agent['helper_cpu_share'] * 100:.2f}%)  [{verdict(share <= 0.01)} target <= 1%], "
            f"RSS {rss / 2**20 if rss else float('nan'):.1f} MiB"
        )
        result["reference_cpu_ms"] = ref = reference_cpu_ms()
        steal = agent["steal_share"]
        print(
            f"machine: a reference loop took {ref:.1f} ms of CPU; "
            f"steal {'unknown' if steal is None else f'{steal * 100:.1f}%'} of the CPUs during the run "
            "(compare the agent's share between runs only where these are alike)"
        )
        write_json(args.json, result)
        return 0
    except HarnessError as err:
        print(f"harness error: {err}", file=sys.stderr)
        return 2
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
