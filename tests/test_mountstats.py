"""Parser tables for /proc/<pid>/mountstats (per-op, xprt and device lines -> values or errors), each capture parsed
whole, and garbled or truncated lines that cost only themselves."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from storwatch.procfs.mountstats import (
    EVENT_NAMES,
    RDMA_COUNTER_NAMES,
    MountStatsError,
    NFSBytes,
    NFSMount,
    NFSOperation,
    NFSTransport,
    later_blocks,
    next_block,
    parse_mountstats,
    parse_operation_line,
    parse_operation_times,
    parse_operation_times_all,
    parse_transport_line,
)
from storwatch.sources.mountstats_reader import MountStatsReader, OperationLines

FIXTURES = Path(__file__).parent / "fixtures" / "mountstats"
NFSV3 = FIXTURES / "nfsv3"
NFSV42_NCONNECT = FIXTURES / "nfsv4.2-nconnect"
RDMA_UDP = FIXTURES / "nfsv3-rdma-udp"

V3_OPS = [
    "NULL", "GETATTR", "SETATTR", "LOOKUP", "ACCESS", "READLINK", "READ", "WRITE", "CREATE", "MKDIR", "SYMLINK",
    "MKNOD", "REMOVE", "RMDIR", "RENAME", "LINK", "READDIR", "READDIRPLUS", "FSSTAT", "FSINFO", "PATHCONF", "COMMIT",
]  # fmt: skip


def op(name: str, *values: int) -> NFSOperation:
    assert len(values) in (8, 9)
    v = values
    return NFSOperation(name, v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7], v[8] if len(v) == 9 else None)


def tcp(*v: int) -> NFSTransport:
    return NFSTransport("tcp", v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7], v[8], v[9],
                        *(v[10:13] if len(v) == 13 else (None, None, None)))  # fmt: skip


def parse_clean(path: Path) -> list[NFSMount]:
    mounts, errors = parse_mountstats(path.read_bytes())
    assert errors == []
    return mounts


# ---------------------------------------------------------------------------------------------- per-op lines

OPERATION_LINES = [
    pytest.param(b"\t        READ: 4882202 4882213 0 703037088 5121022001152 41209 30122010 30190551",
                 op("READ", 4882202, 4882213, 0, 703037088, 5121022001152, 41209, 30122010, 30190551),
                 id="8-numbers-before-errors-column"),
    pytest.param(b"\t        OPEN: 201332 201332 0 60399600 72479520 310 80221 81022 1203",
                 op("OPEN", 201332, 201332, 0, 60399600, 72479520, 310, 80221, 81022, 1203),
                 id="9-numbers-with-errors"),
    pytest.param(b"\t        NULL: 1 1 0 44 24 0 0 0 0", op("NULL", 1, 1, 0, 44, 24, 0, 0, 0, 0), id="null"),
    pytest.param(b"\tBIND_CONN_TO_SESSION: 4 4 0 496 264 0 0 0 0",
                 op("BIND_CONN_TO_SESSION", 4, 4, 0, 496, 264, 0, 0, 0, 0),
                 id="name-longer-than-the-12-column-pad"),
    pytest.param(b"\t          42: 0 0 0 0 0 0 0 0 0", op("42", 0, 0, 0, 0, 0, 0, 0, 0, 0),
                 id="procedure-without-a-name-prints-its-number"),
    pytest.param(b"\t       WRITE: 8820112 8820114 3 18446744073709551615 1587620160 1201233 40220119 41833021 0",
                 op("WRITE", 8820112, 8820114, 3, 18446744073709551615, 1587620160, 1201233, 40220119, 41833021, 0),
                 id="retransmits-timeouts-and-64-bit-bytes"),
    pytest.param(b"READ_PLUS: 1 1 0 216 96 0 0 0 1", op("READ_PLUS", 1, 1, 0, 216, 96, 0, 0, 0, 1),
                 id="no-indent"),
]  # fmt: skip


@pytest.mark.parametrize(("line", "expected"), OPERATION_LINES)
def test_parse_operation_line(line: bytes, expected: NFSOperation) -> None:
    assert parse_operation_line(line) == expected


BAD_OPERATION_LINES = [
    pytest.param(b"\t        READ: 4882202 4882213 0 703037088 5121022001152 41209 30122010",
                 "expected 'NAME:' and 8 or 9 numbers, got 7", id="7-numbers-truncated"),
    pytest.param(b"\t        READ: 1 2 3 4 5 6 7 8 9 10", "got 10", id="10-numbers"),
    pytest.param(b"\t        READ:", "got 0", id="name-only"),
    pytest.param(b"\t        READ 1 1 0 44 24 0 0 0 0", "expected 'NAME:'", id="no-colon"),
    pytest.param(b"\t: 1 1 0 44 24 0 0 0 0", "expected 'NAME:'", id="empty-name"),
    pytest.param(b"\tREAD PLUS: 1 1 0 44 24 0 0 0 0", "expected 'NAME:'", id="name-with-a-space"),
    pytest.param(b"\t        READ: 1 1 0 44 24 0 x 0 0", "not a decimal integer", id="non-numeric"),
    pytest.param(b"\t        READ: 1 1 0 44 -24 0 0 0 0", "not a decimal integer", id="negative"),
    pytest.param(b"\t        READ: 1 1 0 44 2.4 0 0 0 0", "not a decimal integer", id="float"),
    pytest.param(b"\x00\xde\xad", "expected 'NAME:'", id="garbage"),
]  # fmt: skip


@pytest.mark.parametrize(("line", "message"), BAD_OPERATION_LINES)
def test_parse_operation_line_errors(line: bytes, message: str) -> None:
    with pytest.raises(MountStatsError) as excinfo:
        parse_operation_line(line, lineno=31)
    err = excinfo.value
    assert message in str(err)
    assert err.lineno == 31
    assert str(err).startswith("line 31: ")
    assert err.line == line.decode("utf-8", "backslashreplace")
    assert isinstance(err, ValueError)


# ---------------------------------------------------------------------------------------------- xprt lines

RDMA_27 = (11020, 2203311, 1021, 9241022102016, 2310332113920, 0, 0, 0, 0, 0, 0, 12, 0, 2048, 4403, 0, 17)

TRANSPORT_LINES = [
    pytest.param(b"\txprt:\ttcp 785 1 2 0 8 11951195 11951195 0 1502371442 0 128 90210993 1121990321",
                 tcp(785, 1, 2, 0, 8, 11951195, 11951195, 0, 1502371442, 0, 128, 90210993, 1121990321),
                 id="tcp-statvers-1.1"),
    pytest.param(b"\txprt:\ttcp 1002 0 2 0 2 3730020 3730018 0 41030222 0",
                 tcp(1002, 0, 2, 0, 2, 3730020, 3730018, 0, 41030222, 0),
                 id="tcp-statvers-1.0"),
    pytest.param(b"\txprt:\ttcp 0 0 3 12 -1 10 10 0 10 0 2 10 10",
                 tcp(0, 0, 3, 12, -1, 10, 10, 0, 10, 0, 2, 10, 10),
                 id="tcp-negative-idle-time"),
    pytest.param(b"\txprt:\tudp 858 1 402446 402427 14 402485 0 16 402449 804903",
                 NFSTransport("udp", 858, 1, None, None, None, 402446, 402427, 14, 402485, 0, 16, 402449, 804903),
                 id="udp-statvers-1.1"),
    pytest.param(b"\txprt:\tudp 740 1 881477 875055 5946 2888414103 286261",
                 NFSTransport("udp", 740, 1, None, None, None, 881477, 875055, 5946, 2888414103, 286261, None, None,
                              None),
                 id="udp-statvers-1.0"),
    pytest.param(b"\txprt:\trdma 0 0 1 0 3 11293251 11293249 0 237158271 0 " + " ".join(map(str, RDMA_27)).encode(),
                 NFSTransport("rdma", 0, 0, 1, 0, 3, 11293251, 11293249, 0, 237158271, 0, None, None, None,
                              rdma=dict(zip(RDMA_COUNTER_NAMES, RDMA_27, strict=True))),
                 id="rdma-27-numbers"),
    pytest.param(b"\txprt:\trdma 0 0 1 0 3 5 5 0 9 0 " + " ".join(map(str, RDMA_27[:15])).encode(),
                 NFSTransport("rdma", 0, 0, 1, 0, 3, 5, 5, 0, 9, 0, None, None, None,
                              rdma=dict(zip(RDMA_COUNTER_NAMES[:15], RDMA_27[:15], strict=True))),
                 id="rdma-25-numbers-4.9"),
    pytest.param(b"\txprt:\trdma 0 0 1 0 3 5 5 0 9 0 1 2 3 4 5 6 7 8 9 10",
                 NFSTransport("rdma", 0, 0, 1, 0, 3, 5, 5, 0, 9, 0, None, None, None,
                              rdma=dict(zip(RDMA_COUNTER_NAMES[:10], range(1, 11), strict=True))),
                 id="rdma-20-numbers-before-4.3"),
    pytest.param(b"\txprt:\tlocal 1 1 0 0 40 40 0 40 0 1 40 40",
                 NFSTransport("local", None, 1, 1, 0, 0, 40, 40, 0, 40, 0, 1, 40, 40),
                 id="local-has-no-port"),
    pytest.param(b"xprt: tcp 785 1 2 0 8 1 1 0 1 0 1 1 1",
                 tcp(785, 1, 2, 0, 8, 1, 1, 0, 1, 0, 1, 1, 1),
                 id="spaces-instead-of-tabs"),
]  # fmt: skip


@pytest.mark.parametrize(("line", "expected"), TRANSPORT_LINES)
def test_parse_transport_line(line: bytes, expected: NFSTransport) -> None:
    assert parse_transport_line(line) == expected


BAD_TRANSPORT_LINES = [
    pytest.param(b"\txprt:\ttcp 785 1 2 0 8 11951195 11951195 0 1502371442 0 128 90210993",
                 "xprt tcp: expected 10 or 13 numbers, got 12", id="tcp-truncated"),
    pytest.param(b"\txprt:\ttcp 785 1 2 0 8 1 1 0 1 0 1 1 1 1", "got 14", id="tcp-too-long"),
    pytest.param(b"\txprt:\tudp 785 1 2 0 8 1 1 0 1 0 1 1 1", "xprt udp: expected 7 or 10 numbers, got 13",
                 id="udp-with-the-tcp-layout"),
    pytest.param(b"\txprt:\trdma 0 0 1 0 3 5 5 0 9 0 1 2 3 4 5 6 7 8 9", "xprt rdma: expected 20 to 27 numbers, got 19",
                 id="rdma-too-short"),
    pytest.param(b"\txprt:\trdma 0 0 1 0 3 5 5 0 9 0 " + b"1 " * 18, "got 28", id="rdma-too-long"),
    pytest.param(b"\txprt:\tsctp 1 2 3", "unknown transport protocol 'sctp'", id="unknown-protocol"),
    pytest.param(b"\txprt:\ttcp 785 1 2 0 8 1 1 0 x 0 1 1 1", "not a decimal integer", id="non-numeric"),
    pytest.param(b"\txprt:\ttcp 785 1 -2 0 8 1 1 0 1 0 1 1 1", "not a decimal integer",
                 id="negative-outside-idle-time"),
    pytest.param(b"\txprt:\tudp 785 1 -2 0 8 1 1", "not a decimal integer", id="udp-has-no-signed-field"),
    pytest.param(b"\txprt:", "not an 'xprt: PROTOCOL ...' line", id="no-protocol"),
    pytest.param(b"\tbytes:\t1 2 3", "not an 'xprt: PROTOCOL ...' line", id="not-xprt"),
]  # fmt: skip


@pytest.mark.parametrize(("line", "message"), BAD_TRANSPORT_LINES)
def test_parse_transport_line_errors(line: bytes, message: str) -> None:
    with pytest.raises(MountStatsError) as excinfo:
        parse_transport_line(line, lineno=12)
    assert message in str(excinfo.value)
    assert excinfo.value.lineno == 12


# ---------------------------------------------------------------------------------------------- device lines


def nfs_block(head: bytes) -> bytes:
    return head + b"\n\tage:\t7\n\tper-op statistics\n\t        NULL: 0 0 0 0 0 0 0 0 0\n\n"


DEVICE_LINES = [
    pytest.param(b"device 10.0.0.5:/export mounted on /mnt/x with fstype nfs statvers=1.1",
                 ("10.0.0.5:/export", "/mnt/x", "nfs", "1.1"), id="nfs"),
    pytest.param(b"device srv:/home mounted on /home with fstype nfs4 statvers=1.1",
                 ("srv:/home", "/home", "nfs4", "1.1"), id="nfs4"),
    pytest.param(b"device srv:/old mounted on /old with fstype nfs statvers=1.0",
                 ("srv:/old", "/old", "nfs", "1.0"), id="statvers-1.0"),
    pytest.param(b"device srv:/x mounted on /x with fstype nfs", ("srv:/x", "/x", "nfs", None), id="no-statvers"),
    pytest.param(b"device 10.0.0.5:/exports/team\\040a mounted on /mnt/team\\040a\\011b\\134c with fstype nfs4 "
                 b"statvers=1.1",
                 ("10.0.0.5:/exports/team a", "/mnt/team a\tb\\c", "nfs4", "1.1"), id="octal-escapes"),
    pytest.param(b"device [fd00::5]:/export mounted on /mnt/v6 with fstype nfs4 statvers=1.1",
                 ("[fd00::5]:/export", "/mnt/v6", "nfs4", "1.1"), id="ipv6-server"),
    pytest.param(b"no device mounted on /mnt/anon with fstype nfs statvers=1.1", ("", "/mnt/anon", "nfs", "1.1"),
                 id="no-device"),
]  # fmt: skip


@pytest.mark.parametrize(("line", "expected"), DEVICE_LINES)
def test_device_lines(line: bytes, expected: tuple[str, str, str, str | None]) -> None:
    mounts, errors = parse_mountstats(nfs_block(line))
    assert errors == []
    [mount] = mounts
    assert (mount.device, mount.mountpoint, mount.fstype, mount.statvers) == expected
    assert mount.age_seconds == 7
    assert [o.name for o in mount.operations] == ["NULL"]


def test_non_utf8_mountpoint_round_trips_to_the_raw_bytes() -> None:
    [mount], errors = parse_mountstats(nfs_block(b"device srv:/x mounted on /mnt/jos\xe9\\351 with fstype nfs"))
    assert errors == []
    assert os.fsencode(mount.mountpoint) == b"/mnt/jos\xe9\xe9"


BAD_DEVICE_LINES = [
    pytest.param(b"device srv:/x mounted on /x with fstype", "expected 'device SOURCE mounted on", id="no-fstype"),
    pytest.param(b"device srv:/x mounted on", "expected 'device SOURCE mounted on", id="truncated"),
    pytest.param(b"device srv:/x mounted at /x with fstype nfs statvers=1.1", "expected 'device SOURCE mounted on",
                 id="wrong-words"),
    pytest.param(b"device srv:/a b mounted on /x with fstype nfs statvers=1.1", "expected 'device SOURCE mounted on",
                 id="unescaped-space"),
    pytest.param(b"device srv:/x mounted on /x with fstype nfs statver=1.1", "expected 'statvers=VERSION'",
                 id="misspelt-statvers"),
    pytest.param(b"device srv:/x mounted on /x with fstype nfs statvers=", "expected 'statvers=VERSION'",
                 id="empty-statvers"),
    pytest.param(b"device srv:/x mounted on /x\\000y with fstype nfs statvers=1.1", "holds a NUL byte",
                 id="escaped-nul-in-mountpoint"),
    pytest.param(b"device srv:/x\x00 mounted on /x with fstype nfs statvers=1.1", "holds a NUL byte",
                 id="raw-nul-in-source"),
]  # fmt: skip


@pytest.mark.parametrize(("line", "message"), BAD_DEVICE_LINES)
def test_bad_device_line_skips_its_block_and_nothing_else(line: bytes, message: str) -> None:
    good = nfs_block(b"device srv:/good mounted on /good with fstype nfs statvers=1.1")
    mounts, errors = parse_mountstats(good + nfs_block(line) + good)
    assert [m.mountpoint for m in mounts] == ["/good", "/good"]
    assert all(m.age_seconds == 7 and len(m.operations) == 1 for m in mounts)
    # One error for the device line; the lines of its block are skipped, not each reported.
    [err] = errors
    assert err.lineno == 6
    assert message in str(err)
    assert err.line == line.decode("utf-8", "backslashreplace")


# ---------------------------------------------------------------------------------------------- whole captures


def test_nfsv3_over_tcp() -> None:
    [mount] = parse_clean(NFSV3)
    assert mount.device == "10.0.0.5:/export/datasets"
    assert mount.mountpoint == "/mnt/datasets"
    assert (mount.fstype, mount.statvers) == ("nfs", "1.1")
    assert mount.age_seconds == 1209614
    assert "vers=3" in mount.options and "proto=tcp" in mount.options and mount.options[0] == "rw"
    assert list(mount.events) == list(EVENT_NAMES)
    assert mount.events["inoderevalidate"] == 4821093
    assert mount.events["vfsreadpages"] == 2402211
    assert mount.events["extendwrite"] == 61
    assert mount.bytes == NFSBytes(5120398331904, 1048576, 0, 0, 5120511229952, 1048576, 1250121614, 256)
    assert mount.transports == (tcp(785, 1, 2, 0, 8, 11951195, 11951195, 0, 1502371442, 0, 128, 90210993, 1121990321),)
    assert [o.name for o in mount.operations] == V3_OPS
    # A 4.18 kernel: per-op lines without the errors column.
    assert all(o.errors is None for o in mount.operations)
    assert mount.operation("READ") == op(
        "READ", 4882202, 4882213, 0, 703037088, 5121022001152, 41209, 30122010, 30190551
    )
    assert mount.operation("GETATTR") == op("GETATTR", 4821093, 4821093, 0, 578531160, 539962416, 6102, 1302221,
                                            1341993)  # fmt: skip
    assert mount.operation("LAYOUTGET") is None
    # Every transmission went out on the one transport.
    assert sum(o.transmissions for o in mount.operations) == mount.transports[0].sends


def test_nfsv3_fixture_has_other_mounts_around_the_nfs_one() -> None:
    data = NFSV3.read_bytes()
    heads = [line for line in data.split(b"\n") if line.startswith(b"device ")]
    assert len(heads) == 11
    assert heads.index(b"device 10.0.0.5:/export/datasets mounted on /mnt/datasets with fstype nfs statvers=1.1") == 8
    assert heads[-1] == b"device /dev/nvme0n1p1 mounted on /mnt/scratch\\040space with fstype ext4"


def test_nfsv4_2_with_nconnect() -> None:
    [mount] = parse_clean(NFSV42_NCONNECT)
    assert mount.device == "filer01.example.internal:/vol/checkpoints"
    assert mount.mountpoint == "/mnt/checkpoints"
    assert (mount.fstype, mount.statvers, mount.age_seconds) == ("nfs4", "1.1", 604822)
    assert "vers=4.2" in mount.options and "nconnect=4" in mount.options
    assert len(mount.events) == 27 and mount.events["vfswritepages"] == 2205028
    assert mount.bytes is not None and mount.bytes.server_write == 9248113541120

    # nconnect=4: one xprt line per TCP connection, each with its own source port and counters.
    assert [(t.protocol, t.port) for t in mount.transports] == [("tcp", 919), ("tcp", 877), ("tcp", 1002), ("tcp", 693)]
    assert [t.connect_count for t in mount.transports] == [1, 1, 2, 1]
    assert [t.idle_time for t in mount.transports] == [0, 1, 2, 3]
    assert all(t.max_slots == 64 and t.rdma == {} for t in mount.transports)
    assert mount.transports[0].backlog_u == 402
    third = mount.transports[2]
    assert (third.sends, third.recvs, third.bad_xids) == (3730020, 3730018, 0)
    assert sum(t.sends for t in mount.transports) == sum(o.transmissions for o in mount.operations) == 14920077

    names = [o.name for o in mount.operations]
    assert len(names) == 69
    assert names[:5] == ["NULL", "READ", "WRITE", "COMMIT", "OPEN"]
    for name in ("CLOSE", "GETATTR", "LOOKUP", "ACCESS", "SEQUENCE", "LAYOUTGET", "GETDEVICEINFO", "LAYOUTRETURN",
                 "BIND_CONN_TO_SESSION", "COPY", "READ_PLUS"):  # fmt: skip
        assert name in names
    # A 6.8 kernel: every per-op line carries the errors column.
    assert all(o.errors is not None for o in mount.operations)
    assert mount.operation("WRITE") == op(
        "WRITE", 8820112, 8820114, 0, 9248270426112, 1587620160, 1201233, 40220119, 41833021, 0
    )
    assert mount.operation("COMMIT") == op("COMMIT", 1021, 1021, 0, 220536, 134772, 12, 80221, 80301, 0)
    assert mount.operation("SEQUENCE") == op("SEQUENCE", 20160, 20160, 0, 2983680, 2177280, 9, 4021, 4102, 0)
    lookup, open_ = mount.operation("LOOKUP"), mount.operation("OPEN")
    assert lookup is not None and (lookup.requests, lookup.errors) == (120331, 20311)
    assert open_ is not None and open_.errors == 1203
    assert mount.operation("LAYOUTGET") == op("LAYOUTGET", *[0] * 9)
    read_plus = mount.operation("READ_PLUS")
    assert read_plus is not None and (read_plus.requests, read_plus.errors) == (1, 1)


def test_rdma_and_udp_mounts() -> None:
    rdma_mount, udp_mount = parse_clean(RDMA_UDP)

    assert rdma_mount.device == "192.168.100.10:/scratch"
    assert rdma_mount.mountpoint == "/mnt/team a"
    assert "proto=rdma" in rdma_mount.options
    [rdma] = rdma_mount.transports
    assert rdma.protocol == "rdma"
    # xprtrdma has no source port to show and prints 0; it has no slot or queue gauges either.
    assert (rdma.port, rdma.bind_count, rdma.connect_count, rdma.connect_idle_time, rdma.idle_time) == (0, 0, 1, 0, 3)
    assert (rdma.sends, rdma.recvs, rdma.bad_xids, rdma.backlog_u) == (11293251, 11293249, 0, 0)
    assert (rdma.max_slots, rdma.sending_u, rdma.pending_u) == (None, None, None)
    assert list(rdma.rdma) == list(RDMA_COUNTER_NAMES)
    assert rdma.rdma["write_chunk_count"] == 2203311
    assert rdma.rdma["total_rdma_request"] == 9241022102016
    assert rdma.rdma["mrs_allocated"] == 2048
    assert rdma.rdma["reply_waits_for_send"] == 17
    assert len(rdma_mount.operations) == 22
    assert rdma_mount.operation("WRITE") == op(
        "WRITE", 8812088, 8812090, 0, 9241022102016, 1233692320, 402211, 5203318, 5702113, 0
    )

    assert (udp_mount.device, udp_mount.mountpoint) == ("10.0.0.7:/export/tools", "/opt/tools")
    assert "proto=udp" in udp_mount.options and udp_mount.options[0] == "ro"
    assert udp_mount.transports == (
        NFSTransport("udp", 858, 1, None, None, None, 402446, 402427, 14, 402485, 0, 16, 402449, 804903),
    )
    read = udp_mount.operation("READ")
    assert read is not None
    assert (read.requests, read.transmissions, read.major_timeouts, read.errors) == (6732, 6751, 2, 2)
    assert sum(o.transmissions for o in udp_mount.operations) == udp_mount.transports[0].sends


def test_only_nfs_mounts_are_reported() -> None:
    for path in (NFSV3, NFSV42_NCONNECT, RDMA_UDP):
        mounts, _ = parse_mountstats(path.read_bytes())
        assert {m.fstype for m in mounts} <= {"nfs", "nfs4"}
    data = b"device proc mounted on /proc with fstype proc\ndevice tmpfs mounted on /tmp with fstype tmpfs\n"
    assert parse_mountstats(data) == ([], [])
    assert parse_mountstats(b"") == ([], [])


def test_mounts_are_hashable_despite_their_counter_maps() -> None:
    mounts = parse_clean(RDMA_UDP)
    assert len(set(mounts)) == 2


# ---------------------------------------------------------------------------------------------- garbled captures


def all_captures() -> list[bytes]:
    """The three captures, one after another, as one file's lines (no trailing empty element)."""
    return (NFSV3.read_bytes() + NFSV42_NCONNECT.read_bytes() + RDMA_UDP.read_bytes()).split(b"\n")[:-1]


def inserted(lines: list[bytes], before: bytes, new: bytes) -> bytes:
    """The file with ``new`` inserted before the one line that starts with ``before``."""
    [index] = [i for i, line in enumerate(lines) if line.startswith(before)]
    return b"\n".join([*lines[:index], new, *lines[index:]]) + b"\n"


def replaced(lines: list[bytes], old: bytes, new: bytes) -> tuple[bytes, int]:
    """The file with the one line that starts with ``old`` replaced by ``new``, and that line's 1-based number."""
    [index] = [i for i, line in enumerate(lines) if line.startswith(old)]
    return b"\n".join([*lines[:index], new, *lines[index + 1 :]]) + b"\n", index + 1


CLEAN = [m for p in (NFSV3, NFSV42_NCONNECT, RDMA_UDP) for m in parse_mountstats(p.read_bytes())[0]]


def test_clean_captures_concatenated() -> None:
    mounts, errors = parse_mountstats(b"\n".join(all_captures()) + b"\n")
    assert errors == []
    assert mounts == CLEAN
    assert [m.mountpoint for m in mounts] == ["/mnt/datasets", "/mnt/checkpoints", "/mnt/team a", "/opt/tools"]


def test_truncated_per_op_line_costs_only_that_operation() -> None:
    data, lineno = replaced(all_captures(), b"\t     GETATTR: 4821093", b"\t     GETATTR: 4821093 4821093 0 5785")
    mounts, errors = parse_mountstats(data)
    [err] = errors
    assert err.lineno == lineno == 20
    assert "line 20: per-op line: expected 'NAME:' and 8 or 9 numbers, got 4" in str(err)
    assert err.line == "\t     GETATTR: 4821093 4821093 0 5785"
    v3 = mounts[0]
    assert [o.name for o in v3.operations] == [n for n in V3_OPS if n != "GETATTR"]
    assert v3.transports == CLEAN[0].transports and v3.events == CLEAN[0].events and v3.bytes == CLEAN[0].bytes
    assert mounts[1:] == CLEAN[1:]


def test_garbled_device_line_skips_that_mount_only() -> None:
    data, lineno = replaced(all_captures(), b"device filer01", b"device filer01.example.internal:/vol/check")
    mounts, errors = parse_mountstats(data)
    [err] = errors
    assert err.lineno == lineno
    assert "expected 'device SOURCE mounted on MOUNTPOINT" in str(err)
    assert mounts == [CLEAN[0], *CLEAN[2:]]


def test_garbled_xprt_line_costs_only_that_transport() -> None:
    lines = all_captures()
    data, lineno = replaced(lines, b"\txprt:\ttcp 1002", b"\txprt:\ttcp 1002 0 2 0 2 3730020 37300")
    mounts, errors = parse_mountstats(data)
    [err] = errors
    assert err.lineno == lineno
    assert "xprt tcp: expected 10 or 13 numbers, got 7" in str(err)
    v4 = mounts[1]
    assert [t.port for t in v4.transports] == [919, 877, 693]
    assert v4.operations == CLEAN[1].operations
    assert [mounts[0], *mounts[2:]] == [CLEAN[0], *CLEAN[2:]]


def test_garbled_events_and_bytes_lines() -> None:
    lines = all_captures()
    data, events_lineno = replaced(lines, b"\tevents:\t220331", b"\tevents:\t220331 2402211 4 10")
    data, bytes_lineno = replaced(data.split(b"\n")[:-1], b"\tbytes:\t220333056", b"\tbytes:\t220333056 0 0 zero")
    mounts, errors = parse_mountstats(data)
    assert [e.lineno for e in errors] == [events_lineno, bytes_lineno]
    assert "events: expected at least 25 counters, got 4" in str(errors[0])
    assert "bytes holds a value that is not a decimal integer" in str(errors[1])
    rdma_mount, udp_mount = mounts[2:]
    assert rdma_mount.events == {} and rdma_mount.bytes == CLEAN[2].bytes
    assert rdma_mount.operations == CLEAN[2].operations and rdma_mount.transports == CLEAN[2].transports
    assert udp_mount.bytes is None and udp_mount.events == CLEAN[3].events
    assert mounts[:2] == CLEAN[:2]


def test_stray_unindented_line_inside_a_block_does_not_end_the_mount() -> None:
    lines = all_captures()
    data, lineno = replaced(lines, b"\t        READ: 2210331", b"\x00\x00\x00\x00 READ: 2210331 2210331 0 47743149")
    mounts, errors = parse_mountstats(data)
    [err] = errors
    assert err.lineno == lineno
    assert "expected a 'device ...' line or an indented statistics line" in str(err)
    v4 = mounts[1]
    assert len(v4.operations) == 68 and v4.operation("READ") is None and v4.operation("WRITE") is not None
    assert [mounts[0], *mounts[2:]] == [CLEAN[0], *CLEAN[2:]]


def test_garbled_per_op_header_keeps_the_operations() -> None:
    lines = all_captures()
    index = lines.index(b"\tper-op statistics")
    lines[index] = b"\tper-op statis"
    mounts, errors = parse_mountstats(b"\n".join(lines) + b"\n")
    assert [e.lineno for e in errors] == [index + 1]
    assert mounts == CLEAN


def test_unknown_key_lines_from_newer_kernels_are_ignored() -> None:
    # The captures themselves carry caps:, nfsv4:, impl_id: and sec: lines, passed over the same way.
    head = b"device srv:/x mounted on /x with fstype nfs4 statvers=1.1\n"
    block = head + b"\tage:\t5\n\tfsc:\t1 2 3 4 5\n\tnewthing:\tkey=value\n"
    block += b"\tper-op statistics\n\t        NULL: 0 0 0 0 0 0 0 0 0\n"
    [mount], errors = parse_mountstats(block)
    assert errors == []
    assert mount.age_seconds == 5 and [o.name for o in mount.operations] == ["NULL"]


def test_truncated_last_line_is_not_trusted() -> None:
    # A read cut short mid-number leaves a line that still parses: "READ: ... 30190551" cut to "... 3019".
    data = NFSV3.read_bytes()
    cut = data[: data.index(b" 30190551\n") + 5]
    mounts, errors = parse_mountstats(cut)
    [err] = errors
    assert err.lineno == len(cut.split(b"\n"))
    assert "truncated: the last line has no newline" in str(err)
    assert err.line.endswith("30122010 3019")
    [mount] = mounts
    assert [o.name for o in mount.operations] == V3_OPS[:6]


def test_statistics_before_any_device_line() -> None:
    data = b"\tage:\t5\n" + NFSV3.read_bytes()
    mounts, errors = parse_mountstats(data)
    assert [e.lineno for e in errors] == [1]
    assert "statistics line before any 'device ...' line" in str(errors[0])
    assert mounts == parse_clean(NFSV3)


@pytest.mark.parametrize(
    ("line", "message"),
    [
        (b"\tage:\t", "age: expected 1 number, got 0"),
        (b"\tage:\t12 13", "age: expected 1 number, got 2"),
        (b"\tage:\t-12", "age holds a value that is not a decimal integer"),
        (b"\tage 12", "per-op line: expected 'NAME:' and 8 or 9 numbers, got 0"),
    ],
    ids=["empty", "two-numbers", "negative", "colon-lost"],
)
def test_bad_age_line(line: bytes, message: str) -> None:
    data, lineno = replaced(NFSV3.read_bytes().split(b"\n")[:-1], b"\tage:", line)
    [mount], errors = parse_mountstats(data)
    [err] = errors
    assert err.lineno == lineno == 11
    assert message in str(err)
    assert mount.age_seconds is None
    assert mount.operations == parse_clean(NFSV3)[0].operations


# ------------------------------------------------------------------------------------- the reader the agent uses


def variants() -> dict[str, bytes]:
    """Clean and damaged files: each must read the same through MountStatsReader as through parse_mountstats."""
    lines = all_captures()
    whole = b"\n".join(lines) + b"\n"
    header = lines.index(b"\tper-op statistics")
    return {
        "clean": whole,
        "truncated-op": replaced(lines, b"\t     GETATTR: 4821093", b"\t     GETATTR: 4821093 4821093 0 5785")[0],
        "device": replaced(lines, b"device filer01", b"device filer01.example.internal:/vol/check")[0],
        "xprt": replaced(lines, b"\txprt:\ttcp 1002", b"\txprt:\ttcp 1002 0 2 0 2 3730020 37300")[0],
        "events": replaced(lines, b"\tevents:\t220331", b"\tevents:\t220331 2402211 4 10")[0],
        "stray": replaced(lines, b"\t        READ: 2210331", b"\x00\x00 READ: 2210331 2210331 0 47743149")[0],
        "bad-read": replaced(lines, b"\t        READ: 2210331", b"\t        READ: 2210331 x")[0],
        "header": b"\n".join([*lines[:header], b"\tper-op statis", *lines[header + 1 :]]) + b"\n",
        "cut": whole[: whole.index(b" 30190551\n") + 5],
        "cut-after-newline": whole[: whole.index(b"device filer01") + 3],
        "before-device": b"\tage:\t5\n" + whole,
        "others": b"device proc mounted on /proc with fstype proc\nno device mounted on /x with fstype tmpfs\n",
        "other-with-lines": b"device tmpfs mounted on /tmp with fstype tmpfs\n\tjunk: 1\nstray\n" + whole,
        "empty": b"",
        # Where the per-second reader looks for the next mount (OperationLines): the first lowercase "d" after a
        # per-op header, which a procedure's name may hold; a mount with no device name between two NFS mounts;
        # an NFS mount whose source is the word "device".
        "lowercase-procedure": inserted(lines, b"\t     GETATTR: 4821093", b"\t   dcompound: 1 1 0 10 10 0 0 0 0"),
        "no-device-between": inserted(
            lines, b"device tmpfs mounted on /run/user/1000", b"no device mounted on /x with fstype tmpfs"
        ),
        "source-named-device": replaced(
            lines,
            b"device 10.0.0.5:/export/datasets",
            b"device device mounted on /mnt/datasets with fstype nfs statvers=1.1",
        )[0],
    }


@pytest.mark.parametrize("name", list(variants()))
def test_reader_gives_what_a_parse_gives(name: str) -> None:
    data = variants()[name]
    expected_mounts, expected_errors = parse_mountstats(data)
    reported: list[MountStatsError] = []
    reader = MountStatsReader(reported.extend)
    mounts, errors = reader.read(data)
    for m in mounts:
        m.operations  # noqa: B018 (use the tables, as a scrape does)
    assert mounts == expected_mounts
    found = sorted([*errors, *reported], key=lambda e: e.lineno)
    assert [str(e) for e in found] == [str(e) for e in expected_errors]
    # The same bytes again: the same objects, their tables already parsed (and their bad lines already reported).
    reported.clear()
    again, errors_again = reader.read(data)
    assert len(again) == len(mounts) and all(a is b for a, b in zip(again, mounts, strict=True))
    assert [str(e) for e in errors_again] == [str(e) for e in errors] and reported == []


def test_reader_reuses_unchanged_mounts_and_parses_tables_only_when_used() -> None:
    reported: list[MountStatsError] = []
    reader = MountStatsReader(reported.extend)
    clean = b"\n".join(all_captures()) + b"\n"
    first, _ = reader.read(clean)
    # One GETATTR line garbled in the NFSv4.2 mount; the other mounts' blocks are the same bytes.
    damaged = replaced(all_captures(), b"\t     GETATTR: 3302191", b"\t     GETATTR: 3302191 x")[0]
    second, errors = reader.read(damaged)
    assert errors == []
    assert [a is b for a, b in zip(first, second, strict=True)] == [True, False, True, True]
    v4 = second[1]
    read = v4.operation("READ")  # one line found and parsed; the table (and its bad line) not yet
    assert read == CLEAN[1].operation("READ") and reported == []
    assert [o.name for o in v4.operations if o.name == "GETATTR"] == []
    [err] = reported
    assert "GETATTR: 3302191 x" in err.line and err.lineno == damaged.split(b"\n").index(err.line.encode()) + 1
    assert v4.operation("READ") == read and v4.transports == CLEAN[1].transports


def test_a_bad_line_asked_for_by_name_is_reported_with_its_line_number() -> None:
    # operation(name) finds one line without numbering the lines before it; a bad one is numbered when reported.
    reported: list[MountStatsError] = []
    damaged, lineno = replaced(all_captures(), b"\t     GETATTR: 3302191", b"\t     GETATTR: 3302191 x")
    mounts, _ = MountStatsReader(reported.extend).read(damaged)
    assert mounts[1].operation("GETATTR") is None
    [err] = reported
    assert err.lineno == lineno and err.line.endswith("GETATTR: 3302191 x")
    assert str(err).startswith(f"line {lineno}: per-op line: expected")


def test_reader_parses_only_the_per_op_lines_that_changed_since_the_mount_was_last_parsed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import storwatch.procfs.mountstats as mountstats

    parsed: list[bytes] = []
    real = mountstats.parse_operation_line

    def counting(line: bytes, lineno: int = 1) -> NFSOperation:
        parsed.append(line.split()[0])
        return real(line, lineno)

    monkeypatch.setattr(mountstats, "parse_operation_line", counting)
    reader = MountStatsReader(lambda errors: None)
    clean = NFSV42_NCONNECT.read_bytes()
    [first], _ = reader.read(clean)
    assert len(first.operations) > 50 and len(parsed) == len(first.operations)  # every line, the first time
    parsed.clear()
    busier = clean.replace(b"\t        READ: 2210331 2210331", b"\t        READ: 2210400 2210400")
    assert busier != clean
    [second], _ = reader.read(busier)
    before = first.operation("READ")
    assert before is not None and second.operation("READ") == before._replace(requests=2210400, transmissions=2210400)
    assert parsed == [b"READ:"]  # found and parsed alone
    fresh, _ = parse_mountstats(busier)
    parsed.clear()
    assert second.operations == fresh[0].operations
    assert parsed == []  # the table: READ as parsed alone just now, every other line as the first mount parsed it


# ---------------------------------------------------------------------------------------------- per-tick lines

TICK_OPS = ("READ", "WRITE", "COMMIT")


@pytest.mark.parametrize("name", list(variants()))
def test_operation_lines_are_the_lines_a_whole_parse_reads(name: str) -> None:
    """Every clean or damaged file: the READ, WRITE and COMMIT lines found are those of the mounts a whole parse
    keeps, at their offsets, and they parse to that parse's operations."""
    data = variants()[name]
    found = OperationLines(TICK_OPS).find(data)
    mounts, _ = parse_mountstats(data)
    expected = [(m.mountpoint, op.name) for m in mounts for op in m.operations if op.name in TICK_OPS]
    good = []
    for mountpoint, op, line, offset in found:
        assert data[offset : offset + len(line)] == line and data[offset + len(line) : offset + len(line) + 1] == b"\n"
        try:
            parse_operation_line(line)
        except MountStatsError:
            continue  # the caller parses the line and reports it, as the whole parse does
        good.append((mountpoint, op, line))
    # A bad device line drops its mount from both; a cut-short last line is in neither.
    assert [(mp, op) for mp, op, _ in good] == expected
    by_mount = {m.mountpoint: m for m in mounts}
    assert all(parse_operation_line(line) == by_mount[mp].operation(op) for mp, op, line in good)
    assert len(good) >= len(found) - 1


def test_operation_lines_pass_over_other_filesystems_and_look_alike_names() -> None:
    nfs = NFSV42_NCONNECT.read_bytes()
    fuse = b"device s3fs mounted on /mnt/bucket with fstype fuse.s3fs\n\t        READ: 1 1 0 1 1 0 0 0 0\n"
    found = OperationLines(("COMMIT",)).find(fuse + nfs)
    [(mountpoint, op, line, _)] = found  # not the FUSE mount's line, not the v4.2 LAYOUTCOMMIT line
    assert (mountpoint, op) == ("/mnt/checkpoints", "COMMIT") and line.split()[0] == b"COMMIT:"
    assert b"LAYOUTCOMMIT: " in nfs
    cut = nfs[: nfs.index(b"COMMIT: ") + 20]  # the file ends in the middle of the COMMIT line
    assert OperationLines(("READ", "COMMIT")).find(cut)[-1][1] == "READ"


@pytest.mark.parametrize(("line", "expected"), OPERATION_LINES)
def test_parse_operation_times_reads_what_the_whole_line_parse_reads(line: bytes, expected: NFSOperation) -> None:
    times = parse_operation_times(line)
    assert times == (expected.requests, expected.major_timeouts, expected.rtt_ms, expected.execute_time_ms)


@pytest.mark.parametrize(("line", "message"), BAD_OPERATION_LINES)
def test_parse_operation_times_refuses_what_the_whole_line_parse_refuses(line: bytes, message: str) -> None:
    with pytest.raises(MountStatsError, match=r"^line 31: ") as excinfo:
        parse_operation_times(line, lineno=31)
    assert message in str(excinfo.value)


# ---------------------------------------------------------------------------------------------- many lines at once


def _same_width(width: int) -> list[bytes]:
    return [p.values[0] for p in OPERATION_LINES if len(p.values[0].split()) == width]


@pytest.mark.parametrize("width", [9, 10], ids=["8-numbers", "9-numbers"])
def test_operation_times_all_reads_what_each_line_reads(width: int) -> None:
    lines = _same_width(width) * 3
    columns = parse_operation_times_all(lines)
    assert columns is not None
    assert list(zip(*columns, strict=True)) == [tuple(parse_operation_times(line)) for line in lines]


@pytest.mark.parametrize(("line", "message"), BAD_OPERATION_LINES)
def test_operation_times_all_leaves_a_bad_line_to_the_line_by_line_parse(line: bytes, message: str) -> None:
    good = _same_width(10)
    assert parse_operation_times_all([*good, line, *good]) is None
    assert parse_operation_times_all([line]) is None


@pytest.mark.parametrize(
    "lines",
    [
        # Each would read as good lines were the fields of all of them counted together, not line by line.
        pytest.param([b"READ: 1 2 3 4 5 6 7 8", b"1 WRITE: 1 2 3 4 5 6 7 8 9"], id="a-number-moved-to-the-line-before"),
        pytest.param([b"READ: 1 2 3 4 5 6 7 8 9 X: 1 2 3 4 5 6 7 8 9", b"", b"WRITE: 1 2 3 4 5 6 7 8 9"],
                     id="two-lines-in-one-and-an-empty-one"),
        pytest.param([b"READ: 1 2 3 4 5 6 7 8 | 9", b"WRITE: 1 2 3 4 5 6 7 8 9"], id="the-separator-in-a-line"),
    ],
)  # fmt: skip
def test_operation_times_all_takes_no_line_that_is_not_good_on_its_own(lines: list[bytes]) -> None:
    assert parse_operation_times_all(lines) is None
    assert any(_refused(line) for line in lines)


def _refused(line: bytes) -> bool:
    try:
        parse_operation_times(line)
    except MountStatsError:
        return True
    return False


def test_operation_times_all_leaves_lines_of_two_kernels_to_the_line_by_line_parse() -> None:
    lines = [b"READ: 1 2 3 4 5 6 7 8", b"WRITE: 1 2 3 4 5 6 7 8 9"]  # 8 numbers, then 9: each good on its own
    assert parse_operation_times_all(lines) is None
    assert not any(_refused(line) for line in lines)


def test_operation_times_all_of_no_lines() -> None:
    assert parse_operation_times_all([]) == ([], [], [], [])


def _blocks_by_markers(data: bytes) -> list[int]:
    """What later_blocks gives, the plain way: each line after the first that starts with either marker."""
    return [i + 1 for i in range(len(data)) if data.startswith((b"\ndevice ", b"\nno device "), i)]


@pytest.mark.parametrize(
    "data",
    [
        pytest.param(b"no device mounted on /a with fstype tmpfs\ndevice device mounted on /b with fstype nfs\n"
                     b"\topts:\tdevice \nno device mounted on /c with fstype tmpfs\nxno device \n device x\n",
                     id="markers-inside-lines"),
        pytest.param(b"\ndevice a mounted on /a with fstype nfs\n", id="an-empty-first-line"),
        pytest.param(b"device a\nno devic\nno device", id="cut-short"),
        *(pytest.param(v, id=name) for name, v in variants().items()),
    ],
)  # fmt: skip
def test_later_blocks_are_the_lines_that_start_with_a_marker(data: bytes) -> None:
    assert later_blocks(data) == _blocks_by_markers(data)
    starts = _blocks_by_markers(data)
    for lo in range(0, len(data), max(1, len(data) // 97)):
        after = [s for s in starts if s >= lo]
        assert next_block(data, lo) == (after[0] if after else -1)
        assert next_block(data, lo, lo + 40) == (after[0] if after and after[0] < lo + 40 else -1)


@pytest.mark.parametrize("name", list(variants()))
def test_operation_lines_as_columns_are_the_lines_found(name: str) -> None:
    data = variants()[name]
    finder = OperationLines(TICK_OPS)
    columns = finder.columns(data)
    assert list(zip(*columns, strict=True)) == OperationLines(TICK_OPS).find(data)
    device_lines = len(_blocks_by_markers(data)) + data.startswith((b"device ", b"no device "))
    assert finder.device_lines == device_lines
