"""The diskstats and NFS sources on fixture trees: deltas between reads, and bad lines skipped with one log line."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pytest

from storwatch.config import DiskIOConfig, NFSConfig
from storwatch.paths import HostPaths
from storwatch.sources.diskio import DiskIOSource
from storwatch.sources.nfs import NFSSource

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
