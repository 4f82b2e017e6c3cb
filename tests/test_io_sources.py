"""The diskstats and NFS sources on fixture trees: deltas between reads, and bad lines skipped with one log line."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pytest

from storwatch.config import DiskIOConfig, NFSConfig
from storwatch.paths import HostPaths
from storwatch.procfs.diskstats import parse_diskstats
from storwatch.sources import UnusableInput
from storwatch.sources.diskio import DiskIOSource
from storwatch.sources.nfs import NO_NFS_INTERVAL_SECONDS, NFSSource, NFSStats, OpDelta, latency_samples

FIXTURES = Path(__file__).parent / "fixtures"


def _proc(tmp_path: Path) -> Path:
    proc = tmp_path / "proc"
    (proc / "1").mkdir(parents=True)
    return proc


def _bump_diskstats(text: str, name: str, writes: int, write_ms: int) -> str:
    out = []
    for line in text.splitlines():
        f = line.split()
        if len(f) >= 14 and f[2] == name:
            f[7] = str(int(f[7]) + writes)
            f[10] = str(int(f[10]) + write_ms)
            line = " ".join(f)
        out.append(line)
    return "\n".join(out) + "\n"


def test_diskstats_source_reports_deltas_and_skips_garbled_lines(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    proc = _proc(tmp_path)
    good = (FIXTURES / "diskstats" / "linux-6.8").read_text()
    garbled = good + " 259 9 nvme9n1 12 oops\n 259 10 nvme9n2 1 2 3\n"
    (proc / "diskstats").write_text(garbled)
    source = DiskIOSource(HostPaths(procfs=str(proc)), DiskIOConfig(), clock=lambda: 1000.0)
    with caplog.at_level(logging.WARNING, logger="storwatch.sources.diskio"):
        first = source.collect()
        (proc / "diskstats").write_text(_bump_diskstats(garbled, "nvme0n1", 10, 250))
        second = source.collect()
    names = [line.split()[2] for line in good.splitlines() if line.strip()]
    assert sorted(first.counters) == sorted(names)  # every good device reports
    assert first.deltas == {}
    delta = second.deltas["nvme0n1"]
    assert delta.writes == 10
    assert delta.write_time_seconds == pytest.approx(0.25)
    assert delta.write_latency_seconds == pytest.approx(0.025)
    warnings = [r for r in caplog.records if "diskstats" in r.getMessage()]
    assert len(warnings) == 2, [r.getMessage() for r in warnings]  # one per bad line, not one per read
    assert ["nvme9n1" in warnings[0].getMessage(), "nvme9n2" in warnings[1].getMessage()] == [True, True]


def test_nfs_source_reports_op_deltas_and_skips_garbled_lines(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    proc = _proc(tmp_path)
    text = (FIXTURES / "mountstats" / "nfsv3").read_bytes()
    (proc / "1" / "mountstats").write_bytes(text)
    source = NFSSource(HostPaths(procfs=str(proc)), NFSConfig(), clock=lambda: 1000.0)
    first = source.collect()
    assert first.mounts and first.deltas == {}
    mountpoint, mount = next(iter(first.mounts.items()))
    write = mount.operation("WRITE")
    assert write is not None
    old = f"WRITE: {write.requests} {write.transmissions} ".encode()
    new = f"WRITE: {write.requests + 4} {write.transmissions + 4} ".encode()
    assert old in text
    bumped = text.replace(old, new, 1)
    # the execute time is the line's 8th number: add 400 ms for the 4 new WRITEs
    lines = bumped.split(b"\n")
    for i, line in enumerate(lines):
        if line.strip().startswith(b"WRITE:"):
            nums = line.split()
            nums[8] = str(int(nums[8]) + 400).encode()
            lines[i] = b"\t" + b" ".join(nums)
    nfs_line = next(i for i, line in enumerate(lines) if b"with fstype nfs" in line)
    lines.insert(nfs_line + 1, b"\tevents:\tgarbage here")
    (proc / "1" / "mountstats").write_bytes(b"\n".join(lines))
    with caplog.at_level(logging.WARNING, logger="storwatch.sources.nfs"):
        second = source.collect()
        third = source.collect()
        # The bad line is in a table parsed when first used (a scrape, the status page): logged then, once.
        assert second.mounts[mountpoint].events == mount.events  # the block's own events line comes later
        assert third.mounts[mountpoint].events == mount.events
        assert second.mounts[mountpoint].bytes == mount.bytes  # the rest of the mount still reports
    delta = second.deltas[mountpoint]["WRITE"]
    assert delta.requests == 4
    assert delta.execute_seconds == pytest.approx(0.4)
    assert third.deltas == {}  # the same bytes again: nothing happened
    logged = [r.getMessage() for r in caplog.records if "mountstats" in r.getMessage()]
    assert len(logged) == 1 and f"line {nfs_line + 2}: events" in logged[0], logged


def test_sources_fall_back_and_fail_clearly(tmp_path: Path) -> None:
    proc = _proc(tmp_path)
    shutil.copy(FIXTURES / "mountstats" / "nfsv3", proc / "1" / "mountstats")
    assert NFSSource(HostPaths(procfs=str(proc)), NFSConfig()).collect().mounts
    with pytest.raises(OSError, match="cannot read diskstats"):
        DiskIOSource(HostPaths(procfs=str(proc)), DiskIOConfig()).collect()


def test_nfs_source_logs_a_garbled_read_line_at_once_and_the_other_mounts_report(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    proc = _proc(tmp_path)
    v3, v42 = (
        (FIXTURES / "mountstats" / "nfsv3").read_bytes(),
        (FIXTURES / "mountstats" / "nfsv4.2-nconnect").read_bytes(),
    )
    stats = proc / "1" / "mountstats"
    stats.write_bytes(v3 + v42)
    source = NFSSource(HostPaths(procfs=str(proc)), NFSConfig(), clock=lambda: 1000.0)
    source.collect()
    old_v3_read = next(line for line in v3.split(b"\n") if line.strip().startswith(b"READ:"))
    v42_write = next(line for line in v42.split(b"\n") if line.strip().startswith(b"WRITE:"))
    fields = v42_write.split()
    more = b"\t       WRITE: " + b" ".join([str(int(fields[1]) + 2).encode(), *fields[2:]])
    damaged = (v3 + v42).replace(old_v3_read, old_v3_read + b" x").replace(v42_write, more)
    stats.write_bytes(damaged)
    with caplog.at_level(logging.WARNING, logger="storwatch.sources.nfs"):
        second = source.collect()  # no consumer reads the tables: the READ line is parsed for the windows
    lineno = damaged.split(b"\n").index(old_v3_read + b" x") + 1
    logged = [r.getMessage() for r in caplog.records]
    assert len(logged) == 1 and f"line {lineno}: per-op line" in logged[0], logged
    assert second.deltas == {"/mnt/checkpoints": {"WRITE": second.deltas["/mnt/checkpoints"]["WRITE"]}}
    assert second.deltas["/mnt/checkpoints"]["WRITE"].requests == 2


def test_diskstats_deltas_are_worked_out_when_asked_for(monkeypatch: pytest.MonkeyPatch) -> None:
    import storwatch.sources.diskio as diskio
    from storwatch.procfs.diskstats import diskstats_delta, parse_diskstats

    before = {d.name: d for d in parse_diskstats((FIXTURES / "diskstats" / "linux-6.8").read_bytes())[0]}
    after = {name: d._replace(writes_completed=d.writes_completed + 5) for name, d in before.items()}
    after["nvme9n9"] = next(iter(before.values()))._replace(name="nvme9n9")  # new since the last read: no delta
    worked: list[str] = []
    monkeypatch.setattr(diskio, "diskstats_delta", lambda b, a, s: worked.append(a.name) or diskstats_delta(b, a, s))
    deltas = diskio.Deltas(before, after, 2.0)
    assert len(deltas) == len(before) and "nvme9n9" not in deltas and "nvme9n9" not in list(deltas)
    assert worked == []  # nothing asked yet
    name = next(iter(before))
    assert deltas[name] == diskstats_delta(before[name], after[name], 2.0) and deltas[name].writes == 5
    assert deltas.get(name) is deltas[name] and worked == [name]  # once, then kept
    assert deltas.get("nvme9n9") is None
    assert dict(deltas) == {n: diskstats_delta(before[n], after[n], 2.0) for n in before}


# -- input that gives nothing to report: the collector fails, naming the file; bad lines are counted


@pytest.mark.parametrize(
    ("data", "message", "bad_lines"),
    [
        pytest.param(b"", "diskstats: empty: no device in it", 0, id="empty"),
        pytest.param(b"\x00\xde\xad torn\n 8 0 sda 1 2\n", "no device could be parsed, 2 malformed; the first: line 1",
                     2, id="garbage"),
    ],
)  # fmt: skip
def test_diskstats_with_no_good_line_fails_and_the_last_good_read_stays_the_base(
    tmp_path: Path, data: bytes, message: str, bad_lines: int
) -> None:
    proc = _proc(tmp_path)
    good = (FIXTURES / "diskstats" / "linux-6.8").read_text()
    (proc / "diskstats").write_text(good)
    source = DiskIOSource(HostPaths(procfs=str(proc)), DiskIOConfig(), clock=lambda: 1000.0)
    source.collect()
    (proc / "diskstats").write_bytes(data)
    with pytest.raises(UnusableInput, match=message) as excinfo:
        source.collect()
    assert str(proc / "diskstats") in str(excinfo.value)
    assert source.parse_errors == bad_lines
    (proc / "diskstats").write_text(_bump_diskstats(good, "nvme0n1", 10, 250))
    after = source.collect()
    assert after.deltas["nvme0n1"].writes == 10  # against the read before the bad one


def test_diskstats_parse_errors_count_each_bad_line_of_each_read(tmp_path: Path) -> None:
    proc = _proc(tmp_path)
    good = (FIXTURES / "diskstats" / "linux-6.8").read_text()
    (proc / "diskstats").write_text(good + " 259 9 nvme9n1 12 oops\n 259 10 nvme\x009n2 " + "1 " * 17 + "\n")
    source = DiskIOSource(HostPaths(procfs=str(proc)), DiskIOConfig(), clock=lambda: 1000.0)
    source.collect()
    assert source.parse_errors == 2
    source.collect()
    assert source.parse_errors == 4


def _mountstats_of(tmp_path: Path, data: bytes) -> tuple[Path, NFSSource]:
    proc = _proc(tmp_path)
    (proc / "1" / "mountstats").write_bytes(data)
    return proc / "1" / "mountstats", NFSSource(HostPaths(procfs=str(proc)), NFSConfig(), clock=lambda: 1000.0)


@pytest.mark.parametrize(
    ("data", "message", "bad_lines"),
    [
        pytest.param(b"", "mountstats: empty", 0, id="empty"),
        pytest.param(b"\x00\xde\xad torn read\n\tage:\t12\n", "no 'device ... mounted on ... with fstype ...' line "
                     "could be parsed, 2 malformed; the first: line 1: expected a 'device ...' line", 2, id="garbage"),
        pytest.param(b"device sda1 mounted on /\n\tage:\t1\ndevice srv:/x mounted at /x with fstype nfs\n",
                     "could be parsed, 2 malformed", 2, id="every-device-line-bad"),
        pytest.param(b"device rootfs mounted on / with fstype rootfs", "could be parsed, 1 malformed; the first: "
                     "line 1: truncated", 1, id="torn-before-the-first-newline"),
    ],
)  # fmt: skip
def test_mountstats_with_no_good_device_line_fails_naming_the_file(
    tmp_path: Path, data: bytes, message: str, bad_lines: int
) -> None:
    path, source = _mountstats_of(tmp_path, data)
    with pytest.raises(UnusableInput, match=message) as excinfo:
        source.collect()
    assert str(path) in str(excinfo.value)
    assert source.parse_errors == bad_lines


def test_mountstats_without_nfs_mounts_is_a_success_with_nothing_to_report(tmp_path: Path) -> None:
    _, source = _mountstats_of(
        tmp_path, b"device rootfs mounted on / with fstype rootfs\ndevice proc mounted on /proc with fstype proc\n"
    )
    assert source.interval_seconds == 1.0  # before the first read: the configured pace
    stats = source.collect()
    assert dict(stats.mounts) == {} and stats.deltas == {}
    assert source.parse_errors == 0
    assert source.interval_seconds == NO_NFS_INTERVAL_SECONDS  # no NFS mount to time: read less often


def test_nfs_source_reads_at_its_interval_while_an_nfs_mount_is_there(tmp_path: Path) -> None:
    path, source = _mountstats_of(tmp_path, b"device rootfs mounted on / with fstype rootfs\n")
    source.collect()
    assert source.interval_seconds == NO_NFS_INTERVAL_SECONDS
    path.write_bytes((FIXTURES / "mountstats" / "nfsv3").read_bytes())  # a mount came
    assert source.collect().mounts
    assert source.interval_seconds == 1.0


def test_mountstats_parse_errors_count_bad_lines_of_reads_and_of_tables(tmp_path: Path) -> None:
    text = (FIXTURES / "mountstats" / "nfsv3").read_bytes()
    read_line = next(line for line in text.split(b"\n") if line.strip().startswith(b"READ:"))
    damaged = text.replace(read_line, read_line + b" x")
    nfs_line = next(i for i, line in enumerate(damaged.split(b"\n")) if b"with fstype nfs" in line)
    lines = damaged.split(b"\n")
    lines.insert(nfs_line + 1, b"\tevents:\tgarbage here")
    _, source = _mountstats_of(tmp_path, b"\n".join(lines))
    stats = source.collect()
    assert source.parse_errors == 1  # the READ line, read every second for the latency windows
    [mount] = stats.mounts.values()  # a consumer has the tables parsed: the events line is bad too
    assert mount.operation("READ") is None and mount.events
    assert source.parse_errors == 3


# -- every second at scale: each diskstats line parsed when asked for, NFS deltas worked out over columns


def test_diskstats_lines_are_parsed_when_asked_for(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A GPU node lists dozens of devices (NVMe namespaces, partitions, loop and dm devices); every second the latency
    windows need those under mounts, a scrape every fifteen all of them."""
    import storwatch.sources.diskio as diskio

    parsed: list[str] = []
    real = diskio.parse_line
    monkeypatch.setattr(diskio, "parse_line", lambda line, lineno=1: parsed.append(line.split()[2]) or real(line))
    proc = _proc(tmp_path)
    good = (FIXTURES / "diskstats" / "linux-6.8").read_text()
    (proc / "diskstats").write_text(good)
    source = DiskIOSource(HostPaths(procfs=str(proc)), DiskIOConfig(), clock=lambda: 1000.0)
    source.collect()
    (proc / "diskstats").write_text(_bump_diskstats(good, "nvme0n1", 10, 250))
    second = source.collect()
    assert parsed == []
    assert second.deltas["nvme0n1"].writes == 10 and sorted(parsed) == ["nvme0n1", "nvme0n1"]  # before and after
    expected = {d.name: d for d in parse_diskstats(_bump_diskstats(good, "nvme0n1", 10, 250).encode())[0]}
    assert dict(second.counters) == expected and len(second.counters) == len(expected)


def _nfs_block(mountpoint: str, read: int, write: int, commit: int, rtt: int = 0) -> str:
    lines = [
        f"device filer:/vol{len(mountpoint)} mounted on {mountpoint} with fstype nfs4 statvers=1.1",
        "\tage:\t100",
        "\tper-op statistics",
        "\t        NULL: 0 0 0 0 0 0 0 0 0",
        *(
            f"\t{name:>12}: {n} {n} {n // 100} {n * 200} {n * 100} {n // 10} {n * 2 + rtt} {n * 3} 0"
            for name, n in (("READ", read), ("WRITE", write), ("COMMIT", commit))
        ),
        "\t     GETATTR: 5 5 0 5 5 0 5 5 0",
        "",
    ]
    return "\n".join(lines) + "\n"


ROOT_LINE = "device /dev/sda1 mounted on / with fstype ext4\n"


def _nfs_reads(tmp_path: Path, *files: str) -> list[NFSStats]:
    path, source = _mountstats_of(tmp_path, b"")
    out = []
    for text in files:
        path.write_text(text)
        out.append(source.collect())
    return out


def test_nfs_deltas_of_mounts_that_come_and_go_and_of_one_mounted_again(tmp_path: Path) -> None:
    first, second, third = _nfs_reads(
        tmp_path,
        ROOT_LINE + _nfs_block("/a", 100, 200, 10) + _nfs_block("/b", 100, 200, 10),
        ROOT_LINE
        + _nfs_block("/new", 500, 500, 500)
        + _nfs_block("/a", 110, 200, 12, rtt=40)
        + _nfs_block("/b", 5, 1, 0),
        ROOT_LINE + _nfs_block("/new", 501, 500, 500) + _nfs_block("/a", 110, 200, 12),
    )
    assert first.deltas == {}
    # /new is new: no delta; /a moved; /b went back (mounted again: its counters started again): no delta.
    assert second.deltas == {"/a": {"READ": OpDelta(10, 0.03, 0.06, 0), "COMMIT": OpDelta(2, 0.006, 0.044, 0)}}
    assert list(latency_samples(second.deltas)) == [("/a", "READ", 10, 0.03), ("/a", "COMMIT", 2, 0.006)]
    assert third.deltas == {"/new": {"READ": OpDelta(1, 0.003, 0.002, 0)}}


def test_nfs_deltas_of_two_mounts_on_one_mountpoint_are_the_later_ones(tmp_path: Path) -> None:
    """A mount over another on the same mountpoint: the one a path there reaches, as the tables have it."""
    _, second = _nfs_reads(
        tmp_path,
        ROOT_LINE + _nfs_block("/a", 100, 100, 100) + _nfs_block("/a", 1000, 1000, 1000),
        ROOT_LINE + _nfs_block("/a", 150, 100, 100) + _nfs_block("/a", 1001, 1000, 1000),
    )
    assert second.deltas == {"/a": {"READ": OpDelta(1, 0.003, 0.002, 0)}}
    assert list(latency_samples(second.deltas)) == [("/a", "READ", 1, 0.003)]
    assert second.mounts["/a"].operation("READ").requests == 1001  # type: ignore[union-attr]


def test_nfs_delta_after_a_line_that_did_not_parse(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    good = ROOT_LINE + _nfs_block("/a", 100, 100, 100)
    bad = good.replace("READ: 100 100 1", "READ: 120 120 x")
    with caplog.at_level(logging.WARNING, logger="storwatch.sources.nfs"):
        _, second, third = _nfs_reads(
            tmp_path, good, bad.replace("WRITE: 100", "WRITE: 101"), good.replace("WRITE: 100", "WRITE: 103")
        )
    assert [r.getMessage() for r in caplog.records if "per-op line" in r.getMessage()] != []
    assert set(second.deltas["/a"]) == {"WRITE"}  # the bad READ line costs only itself
    assert set(third.deltas["/a"]) == {"WRITE"}  # READ has nothing to be measured against: no delta this read
    assert third.deltas["/a"]["WRITE"].requests == 2
