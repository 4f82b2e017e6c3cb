"""Parser tables for /proc/diskstats (raw line -> DiskStats or error), each kernel layout's capture parsed whole, and
the per-interval delta of two samples."""

from __future__ import annotations

from pathlib import Path

import pytest

from storwatch.procfs.diskstats import (
    DiskStats,
    DiskStatsError,
    diskstats_delta,
    diskstats_lines,
    parse_diskstats,
    parse_line,
)

FIXTURES = Path(__file__).parent / "fixtures" / "diskstats"


def ds(major: int, minor: int, name: str, *stats: int) -> DiskStats:
    """A DiskStats from the numbers in the order the kernel prints them (11, 15 or 17 of them)."""
    assert len(stats) in (11, 15, 17)
    discards = stats[11:15] if len(stats) >= 15 else (None,) * 4
    flushes = stats[15:17] if len(stats) == 17 else (None,) * 2
    return DiskStats(major, minor, name, *stats[:11], *discards, *flushes)


GOOD_LINES = [
    pytest.param(
        "   8       0 sda 2843391 184227 175120694 1837204 9124871 6023554 463290768 14829620 0 6112344 16680376",
        ds(8, 0, "sda", 2843391, 184227, 175120694, 1837204, 9124871, 6023554, 463290768, 14829620, 0, 6112344,
           16680376),
        id="14-fields-disk-4.14",
    ),
    pytest.param(
        "   8       1 sda1 1024 0 12842 311 2 0 2 0 0 240 311",
        ds(8, 1, "sda1", 1024, 0, 12842, 311, 2, 0, 2, 0, 0, 240, 311),
        id="14-fields-partition",
    ),
    pytest.param(
        "   9       0 md0 1206304 0 97343184 0 2201833 0 180200944 0 0 0 0",
        ds(9, 0, "md0", 1206304, 0, 97343184, 0, 2201833, 0, 180200944, 0, 0, 0, 0),
        id="14-fields-md-without-times",
    ),
    pytest.param(
        " 259       3 nvme1n1 183920311 12 94161999872 50193021 43192011 0 34553608800 42819120 12 31280221 85109321 "
        "1201 0 7501922304 341",
        ds(259, 3, "nvme1n1", 183920311, 12, 94161999872, 50193021, 43192011, 0, 34553608800, 42819120, 12, 31280221,
           85109321, 1201, 0, 7501922304, 341),
        id="18-fields-discards-5.4",
    ),
    pytest.param(
        " 259       0 nvme0n1 2210933 401227 183301442 641080 11839204 9024413 1119283702 19302877 0 7129310 "
        "20845991 112944 0 3844210816 48816 812933 853218",
        ds(259, 0, "nvme0n1", 2210933, 401227, 183301442, 641080, 11839204, 9024413, 1119283702, 19302877, 0,
           7129310, 20845991, 112944, 0, 3844210816, 48816, 812933, 853218),
        id="20-fields-flushes-6.8",
    ),
    pytest.param(
        " 259       1 nvme0n1p1 611 1802 28690 207 2 0 2 1 0 188 208 0 0 0 0 0 0",
        ds(259, 1, "nvme0n1p1", 611, 1802, 28690, 207, 2, 0, 2, 1, 0, 188, 208, 0, 0, 0, 0, 0, 0),
        id="20-fields-partition-flushes-untracked",
    ),
    pytest.param(
        " 252       0 rbd0 28811023 0 7375621888 90114882 4410227 103201 1129018112 61002177 4 30120338 151117059 "
        "0 0 0 0 88120 402218",
        ds(252, 0, "rbd0", 28811023, 0, 7375621888, 90114882, 4410227, 103201, 1129018112, 61002177, 4, 30120338,
           151117059, 0, 0, 0, 0, 88120, 402218),
        id="20-fields-in-flight",
    ),
    pytest.param(
        " 253       0 dm-0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17",
        ds(253, 0, "dm-0", 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17),
        id="every-field-in-its-place",
    ),
    pytest.param(
        " 259 1048575 nvme9n1p9 18446744073709551615 0 0 0 0 0 0 0 0 0 0",
        ds(259, 1048575, "nvme9n1p9", 18446744073709551615, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0),
        id="20-bit-minor-and-64-bit-counter",
    ),
    pytest.param(
        "   7       0 loop0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0",
        ds(7, 0, "loop0", *[0] * 17),
        id="unused-loop-all-zero",
    ),
    pytest.param(
        "8\t16  sdb 1 0 8 1 1 0 8 1 0 1 2   \r",
        ds(8, 16, "sdb", 1, 0, 8, 1, 1, 0, 8, 1, 0, 1, 2),
        id="any-whitespace-between-fields",
    ),
    pytest.param(
        b"   8       0 sda 1 0 8 1 1 0 8 1 0 1 2",
        ds(8, 0, "sda", 1, 0, 8, 1, 1, 0, 8, 1, 0, 1, 2),
        id="bytes-input",
    ),
]  # fmt: skip


@pytest.mark.parametrize(("line", "expected"), GOOD_LINES)
def test_parse_line(line: str | bytes, expected: DiskStats) -> None:
    assert parse_line(line) == expected


BAD_LINES = [
    pytest.param("   8       0 sda 1 0 8 1 1 0 8 1 0 1", "expected 14, 18 or 20 fields, got 13", id="13-fields"),
    pytest.param("   8       0 sda 1 0 8 1 1 0 8 1 0 1 2 3", "expected 14, 18 or 20 fields, got 15", id="15-fields"),
    pytest.param("   8       0 sda 1 0 8 1 1 0 8 1 0 1 2 3 4 5", "expected 14, 18 or 20 fields, got 17",
                 id="17-fields"),
    pytest.param("   8       0 sda 1 0 8 1 1 0 8 1 0 1 2 3 4 5 6 7", "expected 14, 18 or 20 fields, got 19",
                 id="19-fields-truncated-20"),
    pytest.param("   8       0 sda 1 0 8 1 1 0 8 1 0 1 2 3 4 5 6 7 8 9", "expected 14, 18 or 20 fields, got 21",
                 id="21-fields-future-layout"),
    pytest.param("   8       1 sda1 1204 9640 3012 24096", "expected 14, 18 or 20 fields, got 7",
                 id="pre-2.6.25-partition-line"),
    pytest.param(" 259       0 nvme0n1 2210933 401227", "expected 14, 18 or 20 fields, got 5", id="truncated-early"),
    pytest.param("   8       0 sda 1 0 8 1 x 0 8 1 0 1 2", "not a non-negative decimal integer",
                 id="non-numeric-counter"),
    pytest.param("   8       0 sda 1 0 8 1 -1 0 8 1 0 1 2", "not a non-negative decimal integer",
                 id="negative-counter"),
    pytest.param("   8       0 sda 1 0 8 1 +1 0 8 1 0 1 2", "not a non-negative decimal integer", id="plus-sign"),
    pytest.param("   8       0 sda 1 0 8 1 1_0 0 8 1 0 1 2", "not a non-negative decimal integer",
                 id="underscore-digits"),
    pytest.param("   8       0 sda 1 0 8 1 \u0661 0 8 1 0 1 2", "not a non-negative decimal integer",
                 id="non-ascii-digit"),
    pytest.param("   8       0 sda 1 0 8 1 1.5 0 8 1 0 1 2", "not a non-negative decimal integer", id="float"),
    pytest.param("   x       0 sda 1 0 8 1 1 0 8 1 0 1 2", "not a non-negative decimal integer",
                 id="non-numeric-major"),
    pytest.param("   8     0x0 sda 1 0 8 1 1 0 8 1 0 1 2", "not a non-negative decimal integer",
                 id="hex-minor"),
    pytest.param("\x00\x00\xde\xad garbage", "expected 14, 18 or 20 fields, got 2", id="garbage"),
    pytest.param("   8       0 sd\x00a 1 0 8 1 1 0 8 1 0 1 2", "device name holds a NUL byte", id="nul-in-name"),
    pytest.param("", "expected 14, 18 or 20 fields, got 0", id="empty"),
]  # fmt: skip


@pytest.mark.parametrize(("line", "message"), BAD_LINES)
def test_parse_line_errors(line: str, message: str) -> None:
    with pytest.raises(DiskStatsError) as excinfo:
        parse_line(line, lineno=9)
    err = excinfo.value
    assert message in str(err)
    assert err.lineno == 9
    assert str(err).startswith("line 9: ")
    assert err.line == line
    assert isinstance(err, ValueError)


def test_bytes_properties_use_512_byte_sectors() -> None:
    # A 4Kn NVMe namespace still counts in 512-byte units in /proc/diskstats.
    disk = parse_line(" 259 0 nvme1n1 10 0 80 1 20 0 160 2 0 3 3 5 0 4096 1 0 0")
    assert (disk.read_bytes, disk.written_bytes, disk.discarded_bytes) == (40960, 81920, 2097152)
    assert disk.device_number == "259:0"
    old = parse_line("8 0 sda 10 0 80 1 20 0 160 2 0 3 3")
    assert old.discarded_bytes is None


# ---------------------------------------------------------------------------------------------- whole captures


def parse_fixture(name: str) -> dict[str, DiskStats]:
    disks, errors = parse_diskstats((FIXTURES / name).read_bytes())
    assert errors == []
    by_name = {d.name: d for d in disks}
    assert len(by_name) == len(disks), "device names are unique in one capture"
    return by_name


def test_linux_4_14_fourteen_fields() -> None:
    disks = parse_fixture("linux-4.14")
    assert list(disks) == [
        *(f"loop{i}" for i in range(8)),
        "sda", "sda1", "sda2", "sdb", "sdb1", "sdc", "sdc1", "nvme0n1", "nvme0n1p1", "md0", "dm-0", "dm-1", "sr0",
    ]  # fmt: skip
    sda = disks["sda"]
    assert (sda.major, sda.minor) == (8, 0)
    assert sda.reads_completed == 2843391
    assert sda.sectors_written == 463290768
    assert sda.written_bytes == 463290768 * 512
    assert sda.weighted_io_time_ms == 16680376
    nvme = disks["nvme0n1"]
    assert nvme.in_flight == 3
    assert nvme.read_bytes == 12343259340 * 512
    assert all(
        d.discards_completed is None and d.sectors_discarded is None and d.flushes_completed is None
        for d in disks.values()
    )
    assert disks["md0"].read_time_ms == 0 and disks["md0"].reads_completed == 1206304
    assert disks["dm-0"].major == 253


def test_linux_5_4_eighteen_fields() -> None:
    disks = parse_fixture("linux-5.4")
    assert len(disks) == 13
    assert sorted(n for n in disks if n.startswith("nvme")) == [
        "nvme0n1", "nvme0n1p1", "nvme0n1p2", "nvme1n1", "nvme2n1"
    ]  # fmt: skip
    nvme1 = disks["nvme1n1"]
    assert nvme1.discards_completed == 1201
    assert nvme1.sectors_discarded == 7501922304
    assert nvme1.discarded_bytes == 7501922304 * 512
    assert nvme1.discard_time_ms == 341
    assert nvme1.in_flight == 12
    assert all(d.discards_completed is not None and d.flushes_completed is None for d in disks.values())
    md = disks["md127"]
    assert (md.major, md.minor, md.sectors_read, md.write_time_ms) == (9, 127, 188302021888, 0)


def test_linux_6_8_twenty_fields() -> None:
    disks = parse_fixture("linux-6.8")
    assert list(disks) == [
        *(f"loop{i}" for i in range(8)),
        "nvme0n1", "nvme0n1p1", "nvme0n1p2", "nvme1n1", "dm-0", "md127", "sr0", "rbd0",
    ]  # fmt: skip
    nvme0 = disks["nvme0n1"]
    assert (nvme0.flushes_completed, nvme0.flush_time_ms) == (812933, 853218)
    # The block layer does not track flushes for partitions.
    assert disks["nvme0n1p2"].flushes_completed == 0
    assert disks["nvme1n1"].in_flight == 17
    assert disks["nvme1n1"].read_bytes == 466210344010 * 512
    rbd = disks["rbd0"]
    assert (rbd.major, rbd.minor, rbd.in_flight, rbd.flushes_completed) == (252, 0, 4, 88120)
    assert disks["sr0"] == ds(11, 0, "sr0", *[0] * 17)
    assert all(d.flushes_completed is not None for d in disks.values())


def test_linux_6_18_capture_of_a_real_machine() -> None:
    disks = parse_fixture("linux-6.18")
    assert len(disks) == 10
    vda = disks["vda"]
    assert (vda.major, vda.minor) == (254, 0)
    assert vda.reads_completed == 164081
    assert (vda.flushes_completed, vda.flush_time_ms) == (7080, 1702)
    assert "zram0" in disks


def test_bad_lines_are_numbered_and_good_lines_kept() -> None:
    good = (FIXTURES / "linux-6.8").read_text().splitlines()
    lines = [*good[:3], " 259       0 nvme0n1 2210933 401227", *good[3:9], "garbage", "", *good[9:]]
    disks, errors = parse_diskstats("\n".join(lines) + "\n")
    assert [d.name for d in disks] == [d.name for d in parse_diskstats("\n".join(good))[0]]
    assert [e.lineno for e in errors] == [4, 11]
    assert errors[0].line == " 259       0 nvme0n1 2210933 401227"
    assert "got 5" in str(errors[0])


def test_str_and_bytes_give_the_same_result() -> None:
    raw = (FIXTURES / "linux-5.4").read_bytes()
    assert parse_diskstats(raw) == parse_diskstats(raw.decode())


# ---------------------------------------------------------------------------------------------- deltas

PREV = ds(259, 0, "nvme0n1", 1000, 10, 80000, 500, 2000, 20, 160000, 3000, 1, 4000, 9000, 50, 0, 40960, 100, 300,
          60)  # fmt: skip


def test_delta_over_an_interval() -> None:
    cur = ds(259, 0, "nvme0n1", 1400, 14, 80000 + 8192, 700, 2600, 26, 160000 + 16384, 3900, 5, 4500, 10800, 60, 1,
             40960 + 2048, 150, 310, 80)  # fmt: skip
    d = diskstats_delta(PREV, cur, 2.0)
    assert d.name == "nvme0n1" and d.seconds == 2.0
    assert (d.reads, d.writes, d.discards, d.flushes) == (400, 600, 10, 10)
    assert (d.reads_merged, d.writes_merged) == (4, 6)
    assert (d.read_bytes, d.written_bytes, d.discarded_bytes) == (8192 * 512, 16384 * 512, 2048 * 512)
    assert d.read_time_seconds == pytest.approx(0.2)
    assert d.write_time_seconds == pytest.approx(0.9)
    assert d.discard_time_seconds == pytest.approx(0.05)
    assert d.flush_time_seconds == pytest.approx(0.02)
    assert d.io_time_seconds == pytest.approx(0.5)
    assert d.weighted_io_time_seconds == pytest.approx(1.8)
    assert d.in_flight == 5
    assert d.utilisation == pytest.approx(0.25)
    assert d.average_queue_depth == pytest.approx(0.9)
    assert d.read_latency_seconds == pytest.approx(0.2 / 400)
    assert d.write_latency_seconds == pytest.approx(0.9 / 600)
    assert d.discard_latency_seconds == pytest.approx(0.05 / 10)
    assert d.flush_latency_seconds == pytest.approx(0.002)
    assert d.reset_counters == ()


def test_delta_counter_reset_takes_the_current_value() -> None:
    # The device was removed and re-created (or a 32-bit time field wrapped): its counters restarted from zero.
    cur = ds(259, 0, "nvme0n1", 30, 0, 2400, 12, 2100, 21, 160800, 3100, 0, 20, 9100, 0, 0, 0, 0, 301, 61)
    d = diskstats_delta(PREV, cur, 10.0)
    assert (d.reads, d.reads_merged, d.read_bytes) == (30, 0, 2400 * 512)
    assert d.read_time_seconds == pytest.approx(0.012)
    assert d.io_time_seconds == pytest.approx(0.02)
    # Counters that did not go backwards keep their ordinary delta.
    assert (d.writes, d.writes_merged, d.written_bytes) == (100, 1, 800 * 512)
    assert d.weighted_io_time_seconds == pytest.approx(0.1)
    assert d.reset_counters == (
        "reads_completed", "reads_merged", "sectors_read", "read_time_ms", "io_time_ms", "discards_completed",
        "sectors_discarded", "discard_time_ms",
    )  # fmt: skip
    assert d.read_latency_seconds == pytest.approx(0.012 / 30)
    # A reset discard counter that is back at 0 has 0 ops: no latency, not a division by zero.
    assert d.discards == 0 and d.discard_latency_seconds is None


def test_delta_with_no_ops_has_no_latency() -> None:
    d = diskstats_delta(PREV, PREV, 5.0)
    assert (d.reads, d.writes, d.discards, d.flushes) == (0, 0, 0, 0)
    assert d.read_latency_seconds is None
    assert d.write_latency_seconds is None
    assert d.discard_latency_seconds is None
    assert d.flush_latency_seconds is None
    assert d.utilisation == 0.0
    assert d.in_flight == 1


@pytest.mark.parametrize(
    ("io_time_delta_ms", "seconds", "expected"),
    [(1000, 1.0, 1.0), (1040, 1.0, 1.0), (5000, 2.0, 1.0), (500, 1.0, 0.5), (0, 1.0, 0.0)],
    ids=["exactly-busy", "jiffy-overshoot", "far-over", "half", "idle"],
)
def test_delta_utilisation_is_clamped(io_time_delta_ms: int, seconds: float, expected: float) -> None:
    cur = PREV._replace(io_time_ms=PREV.io_time_ms + io_time_delta_ms)
    assert diskstats_delta(PREV, cur, seconds).utilisation == pytest.approx(expected)


def test_delta_of_the_14_field_layout_has_no_discards_or_flushes() -> None:
    prev = ds(8, 0, "sda", 10, 0, 80, 5, 20, 0, 160, 9, 0, 12, 14)
    cur = ds(8, 0, "sda", 20, 1, 160, 9, 22, 0, 176, 11, 2, 20, 30)
    d = diskstats_delta(prev, cur, 1.0)
    assert (d.reads, d.writes, d.read_bytes) == (10, 2, 80 * 512)
    assert (d.discards, d.flushes, d.discarded_bytes) == (None, None, None)
    assert (d.discard_time_seconds, d.flush_time_seconds) == (None, None)
    assert (d.discard_latency_seconds, d.flush_latency_seconds) == (None, None)
    assert d.read_latency_seconds == pytest.approx(0.0004)


def test_delta_between_layouts_drops_what_one_sample_lacks() -> None:
    prev = ds(259, 0, "nvme0n1", *range(1, 16))
    cur = ds(259, 0, "nvme0n1", *range(2, 19))
    d = diskstats_delta(prev, cur, 1.0)
    assert d.discards == 1 and d.flushes is None and d.flush_latency_seconds is None


@pytest.mark.parametrize("seconds", [0.0, -1.0, float("nan")], ids=["zero", "negative", "nan"])
def test_delta_rejects_a_non_positive_interval(seconds: float) -> None:
    with pytest.raises(ValueError, match="interval must be positive"):
        diskstats_delta(PREV, PREV, seconds)


def test_delta_rejects_two_different_devices() -> None:
    with pytest.raises(ValueError, match="different devices"):
        diskstats_delta(PREV, PREV._replace(name="nvme1n1"), 1.0)


def test_delta_from_two_captures_of_the_same_machine() -> None:
    before = parse_fixture("linux-6.8")["nvme1n1"]
    after = before._replace(
        reads_completed=before.reads_completed + 120000,
        sectors_read=before.sectors_read + 120000 * 256,
        read_time_ms=before.read_time_ms + 36000,
        io_time_ms=before.io_time_ms + 9800,
    )
    d = diskstats_delta(before, after, 10.0)
    assert d.read_bytes == 120000 * 128 * 1024
    assert d.read_latency_seconds == pytest.approx(0.0003)
    assert d.utilisation == pytest.approx(0.98)


# -- the whole file checked at once, each line parsed when asked for (the diskstats source every second)

CAPTURES = sorted(FIXTURES.iterdir())


def _as_parsed(lines: dict[str, str]) -> dict[str, DiskStats]:
    return {name: parse_line(line) for name, line in lines.items()}


@pytest.mark.parametrize("path", CAPTURES, ids=[p.name for p in CAPTURES])
def test_diskstats_lines_of_a_capture_parse_as_the_whole_file_does(path: Path) -> None:
    data = path.read_bytes()
    lines = diskstats_lines(data)
    assert lines is not None
    disks, errors = parse_diskstats(data)
    assert errors == [] and _as_parsed(lines) == {d.name: d for d in disks}
    assert list(lines) == [d.name for d in disks]


@pytest.mark.parametrize(("line", "message"), BAD_LINES)
def test_diskstats_lines_leave_a_file_with_a_bad_line_to_the_whole_parse(line: str, message: str) -> None:
    good = CAPTURES[0].read_bytes()
    assert diskstats_lines(good + line.encode("utf-8", "surrogateescape") + b"\n") is None


@pytest.mark.parametrize(
    "data",
    [
        pytest.param(b"", id="empty"),
        pytest.param(b"   8       0 sda 1 0 8 1 1 0 8 1 0 1 2", id="no-newline-at-the-end"),
        pytest.param(b"   8       0 sda 1 0 8 1 1 0 8 1 0 1 2\n\n", id="an-empty-line"),
        pytest.param(b"   8       0 sda 1 0 8 1 1 0 8 1 0 1  2\n", id="two-spaces-between-counters"),
        pytest.param(b"   8\t0 sda 1 0 8 1 1 0 8 1 0 1 2\n", id="a-tab"),
        pytest.param("   8       0 sd\u00e9 1 0 8 1 1 0 8 1 0 1 2\n".encode(), id="a-name-not-in-ascii"),
    ],
)  # fmt: skip
def test_diskstats_lines_take_only_the_kernels_own_layout(data: bytes) -> None:
    """Anything else takes the long way, parse_diskstats, which reads what it can and says what it cannot."""
    assert diskstats_lines(data) is None


def test_diskstats_lines_of_a_name_given_twice_are_the_later_line() -> None:
    data = b"   8       0 sda 1 0 8 1 1 0 8 1 0 1 2\n   8      16 sda 5 0 8 1 1 0 8 1 0 1 2\n"
    lines = diskstats_lines(data)
    assert lines is not None and _as_parsed(lines) == {d.name: d for d in parse_diskstats(data)[0]}
    assert lines["sda"].split()[1] == "16"
