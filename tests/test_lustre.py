"""The Lustre client source: llite stats parsed, joined to their mounts, bad input isolated."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from storwatch.analysis.view import View
from storwatch.exporter import ExportState, render_text
from storwatch.exporter import lustre as lustre_area
from storwatch.paths import HostPaths
from storwatch.procfs.lustre import fsname_of_instance, fsname_of_source, parse_llite_stats
from storwatch.procfs.mountinfo import parse_mountinfo
from storwatch.snapshot import Snapshot
from storwatch.sources.lustre import LUSTRE, LustreConfig, LustreSource, join_mounts
from storwatch.sources.mounts import mount_of
from storwatch.vocabulary import Mount, Platform

FIXTURES = Path(__file__).parent / "fixtures" / "lustre"
SCRATCH_STATS = FIXTURES / "v2.15/sys/kernel/debug/lustre/llite/scratch-ffff9bc043537800/stats"


def mounts_of(tree: Path) -> list[Mount]:
    infos, errors = parse_mountinfo((tree / "proc/1/mountinfo").read_bytes())
    assert not errors
    return [mount_of(i) for i in infos]


def source_for(tree: Path, mounts: list[Mount] | None = None) -> LustreSource:
    paths = HostPaths(procfs=str(tree / "proc"), sysfs=str(tree / "sys"))
    table = mounts_of(tree) if mounts is None else mounts
    return LustreSource(paths, LustreConfig(), lambda: table, clock=lambda: 1000.0)


# -- the parser


def test_a_2_15_client_file_parses_every_counter_with_its_unit_and_sums() -> None:
    stats, errors = parse_llite_stats(SCRATCH_STATS.read_bytes())
    assert errors == []
    assert stats.snapshot_time == pytest.approx(1732374512.481290531)
    assert stats.elapsed_seconds == pytest.approx(86400.477177274)
    assert len(stats.counters) == 23
    read = stats.counters["read_bytes"]
    assert (read.samples, read.unit, read.minimum, read.maximum, read.total) == (
        182934,
        "bytes",
        4096,
        4194304,
        392473214976,
    )
    assert stats.counters["open"].unit == "usecs"
    assert stats.total("fsync") == 48123412
    ioctl = stats.counters["ioctl"]  # a counter that keeps no min, max or sum
    assert (ioctl.samples, ioctl.total) == (41, None)
    assert stats.total("ioctl") == 0
    assert stats.samples("unlink") == 2290
    assert stats.samples("link") == 0  # an idle counter is omitted by the client


def test_a_2_10_client_file_without_start_time_and_with_three_figures() -> None:
    data = (FIXTURES / "v2.10/proc/fs/lustre/llite/x7ab2bmv-ffff88103a5e9000/stats").read_bytes()
    stats, errors = parse_llite_stats(data)
    assert errors == []
    assert stats.elapsed_seconds is None
    assert stats.total("write_bytes") == 851443712
    assert stats.counters["open"].unit == "regs"


@pytest.mark.parametrize(
    ("line", "why"),
    [
        ("read_bytes 12 samples", "expected 'NAME N samples"),
        ("read_bytes 12 sample [bytes] 1 2 3", "expected 'NAME N samples"),
        ("read_bytes twelve samples [bytes] 1 2 3", "not a number: 'twelve'"),
        ("read_bytes 12 samples bytes 1 2 3", "unit not in brackets"),
        ("read_bytes 12 samples [bytes] 1 2", "2 figures after the unit"),
        ("read_bytes -3 samples [bytes]", "negative sample count"),
        ("snapshot_time 17x.5 secs.nsecs", "not secs.nsecs"),
        ("open 3 samples [usecs] 1 2 3 4 5", "5 figures after the unit"),
        ("open 1 samples [usecs] 1 1 1 1", "open given twice"),
    ],
)
def test_a_bad_line_fails_alone_with_its_number_and_reason(line: str, why: str) -> None:
    good = "snapshot_time 1732374512.5 secs.nsecs\nopen 4 samples [usecs] 9 412 612 182741\n"
    stats, errors = parse_llite_stats((good + line + "\nclose 4 samples [usecs] 5 98 141 11092\n").encode())
    assert [e.lineno for e in errors] == [3]
    assert why in str(errors[0])
    assert stats.samples("close") == 4
    assert stats.samples("open") == 4


def test_names_of_clients_and_mount_sources() -> None:
    assert fsname_of_instance("scratch-ffff9bc043537800") == "scratch"
    assert fsname_of_instance("my-fs-ffff9bc043537800") == "my-fs"
    assert fsname_of_instance("scratch") is None
    assert fsname_of_instance("scratch-nothex") is None
    assert fsname_of_source("10.42.0.11@o2ib:10.42.0.12@o2ib:/scratch") == "scratch"
    assert fsname_of_source("fs-0a1b.fsx.us-east-1.amazonaws.com@tcp:/x7ab2bmv/sub/dir") == "x7ab2bmv"
    assert fsname_of_source("/dev/sda1") is None


# -- the join


def test_bind_mounts_share_one_client_given_to_the_filesystem_top() -> None:
    mounts = mounts_of(FIXTURES / "v2.15")
    joined = join_mounts(["scratch", "home", "absent"], mounts)
    # /lustre/scratch and a pod's view of a subdirectory share one superblock: the top gets the counters
    assert joined == {"scratch": "/lustre/scratch", "home": "/home", "absent": None}


def test_two_client_mounts_of_one_filesystem_are_not_guessed() -> None:
    mounts = mounts_of(FIXTURES / "v2.15")
    second = next(m for m in mounts if m.mountpoint == "/home")
    other = Mount(**{**second.__dict__, "mount_id": 99, "mountpoint": "/home2", "minor": 99})
    assert join_mounts(["home"], [*mounts, other]) == {"home": None}


# -- the source


def test_the_source_reads_every_client_from_debugfs_joined_to_its_mount() -> None:
    facts = source_for(FIXTURES / "v2.15").collect()
    assert facts.timestamp == 1000.0
    assert facts.errors == ()
    by_fs = {c.fsname: c for c in facts.clients}
    assert set(by_fs) == {"scratch", "home"}
    assert by_fs["scratch"].mountpoint == "/lustre/scratch"
    assert by_fs["scratch"].instance == "scratch-ffff9bc043537800"
    assert by_fs["scratch"].stats.total("write_bytes") == 96451702784
    assert by_fs["home"].mountpoint == "/home"


def test_an_older_client_in_procfs_is_read_the_same_way() -> None:
    facts = source_for(FIXTURES / "v2.10").collect()
    (client,) = facts.clients
    assert (client.fsname, client.mountpoint) == ("x7ab2bmv", "/fsx")
    assert client.stats.total("read_bytes") == 4718123520


def test_no_lustre_anywhere_turns_the_collector_off_until_a_client_mounts(tmp_path: Path) -> None:
    source = source_for(tmp_path, mounts=[])
    assert source.collect().clients == ()
    assert source.off_reason == "no Lustre client mount on this node"
    shutil.copytree(FIXTURES / "v2.15/sys", tmp_path / "sys")
    assert len(source.collect().clients) == 2
    assert source.off_reason is None


def test_lustre_mounts_without_client_statistics_fail_the_collector(tmp_path: Path) -> None:
    mounts = mounts_of(FIXTURES / "v2.15")
    with pytest.raises(OSError, match=r"3 Lustre mount\(s\) \(/lustre/scratch, /home, .*is debugfs mounted"):
        source_for(tmp_path, mounts=mounts).collect()


def test_one_unreadable_client_fails_alone(tmp_path: Path) -> None:
    tree = tmp_path / "node"
    shutil.copytree(FIXTURES / "v2.15", tree)
    home = tree / "sys/kernel/debug/lustre/llite/home-ffff9bc04a1c2000/stats"
    home.unlink()
    os.symlink("/etc/shadow", home)  # never followed
    garbled = tree / "sys/kernel/debug/lustre/llite/bad-ffff0000/stats"
    garbled.parent.mkdir()
    garbled.write_bytes(b"\x00\xff garbage\n" * 20)
    source = source_for(tree)
    facts = source.collect()
    assert [c.fsname for c in facts.clients] == ["scratch"]
    assert len(facts.errors) == 2
    assert any("home-ffff9bc04a1c2000/stats" in e for e in facts.errors)
    assert any("bad-ffff0000/stats: no counter could be parsed" in e for e in facts.errors)
    assert source.parse_errors == 20


def test_every_client_unreadable_fails_the_collector_naming_the_first(tmp_path: Path) -> None:
    tree = tmp_path / "node"
    stats = tree / "sys/kernel/debug/lustre/llite/scratch-ffff9bc043537800/stats"
    stats.parent.mkdir(parents=True)
    stats.mkdir()  # not a file
    with pytest.raises(OSError, match=r"no Lustre client statistics could be read: .*scratch-ffff9bc043537800/stats"):
        source_for(tree, mounts=[]).collect()


def test_a_huge_stats_file_is_read_only_to_its_bound(tmp_path: Path) -> None:
    tree = tmp_path / "node"
    stats = tree / "sys/kernel/debug/lustre/llite/scratch-ffff9bc043537800/stats"
    stats.parent.mkdir(parents=True)
    with open(stats, "wb") as f:
        f.write(SCRATCH_STATS.read_bytes())
        f.write(b"x 1 samples [reqs]\n" * 500_000)  # 9.5 MB
    facts = source_for(tree, mounts=[]).collect()
    (client,) = facts.clients
    assert client.stats.samples("read_bytes") == 182934


# -- the metrics


def test_the_metrics_of_each_client_are_labelled_with_its_mount() -> None:
    facts = source_for(FIXTURES / "v2.15").collect()
    view = View(Snapshot(1000.0, facts={LUSTRE.name: facts}), Platform("generic", "test"))
    text = render_text(lustre_area.families(view, ExportState())).decode()
    scratch = 'fsname="scratch",mountpoint="/lustre/scratch"'
    lines = set(text.splitlines())
    instance = 'instance="scratch-ffff9bc043537800"'
    info = f'storwatch_lustre_client_info{{fsname="scratch",{instance},mountpoint="/lustre/scratch"}}'
    assert f"{info} 1.0" in lines
    assert f"storwatch_lustre_read_bytes_total{{{scratch}}} 3.92473214976e+11" in lines
    assert f"storwatch_lustre_written_bytes_total{{{scratch}}} 9.6451702784e+10" in lines
    assert f'storwatch_lustre_operations_total{{{scratch},operation="read"}} 182934.0' in lines
    assert f'storwatch_lustre_operations_total{{{scratch},operation="unlink"}} 2290.0' in lines
    assert f'storwatch_lustre_operation_seconds_total{{{scratch},operation="fsync"}} 48.123412' in lines
    assert f'storwatch_lustre_operations_total{{{scratch},operation="ioctl"}} 41.0' in lines
    assert f'storwatch_lustre_operation_seconds_total{{{scratch},operation="ioctl"}}' not in text  # counted, untimed
    home = 'fsname="home",mountpoint="/home"'
    assert f'storwatch_lustre_operations_total{{{home},operation="write"}}' not in text  # never written: omitted
    assert f"storwatch_lustre_written_bytes_total{{{home}}} 0.0" in lines


def test_an_older_client_counts_reads_and_writes_by_its_byte_counters() -> None:
    facts = source_for(FIXTURES / "v2.10").collect()
    view = View(Snapshot(1000.0, facts={LUSTRE.name: facts}), Platform("generic", "test"))
    text = render_text(lustre_area.families(view, ExportState())).decode()
    fsx = 'fsname="x7ab2bmv",mountpoint="/fsx"'
    assert f'storwatch_lustre_operations_total{{{fsx},operation="write"}} 812.0' in text.splitlines()
    assert "storwatch_lustre_operation_seconds_total{" not in text  # [regs]: nothing timed
