"""The mount source on fixture trees (with a stand-in for statvfs), and the real blocking-call helper here."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import pytest

from storwatch.calls.blocking import BlockingCalls, CallOutcome
from storwatch.config import MountsConfig
from storwatch.paths import HostPaths
from storwatch.sources import UnusableInput
from storwatch.sources.mounts import MountSource
from storwatch.vocabulary import FsUsage

FIXTURES = Path(__file__).parent / "fixtures"
MALFORMED_PROC = FIXTURES / "malformed" / "proc"
GPU_NODE_PROC = FIXTURES / "gpu-node" / "proc"
MOUNTS_LOGGER = "storwatch.sources.mounts"

# statvfs answers in the helper's order: f_frsize, f_blocks, f_bfree, f_bavail, f_files, f_ffree, f_flag.
DEFAULT_STATVFS = (4096, 1000, 600, 500, 2000, 1500, 0)


class FakeStatvfs:
    """A stand-in for ``BlockingCalls`` doing statvfs: the fixture's mountpoints are not mounts on this machine.

    It answers ``call_many`` from a table (``values`` per mountpoint, or a whole ``CallOutcome``), records every
    request so tests can check what the source asked for, and has the ``close()`` the source calls on shutdown.
    """

    def __init__(
        self,
        values: Mapping[str, tuple[int, ...]] | None = None,
        outcomes: Mapping[str, CallOutcome] | None = None,
    ) -> None:
        self.values = dict(values or {})
        self.outcomes = dict(outcomes or {})
        self.max_inflight = 16
        self.calls: list[tuple[str, dict[str, tuple[bytes | str, ...]], float]] = []
        self.closed = False

    def call_many(
        self, op: str, requests: Mapping[str, Sequence[bytes | str]], timeout: float
    ) -> dict[str, CallOutcome]:
        self.calls.append((op, {k: tuple(v) for k, v in requests.items()}, timeout))
        result = {}
        for key in requests:
            if key in self.outcomes:
                result[key] = self.outcomes[key]
            else:
                result[key] = CallOutcome(values=tuple(str(v) for v in self.values.get(key, DEFAULT_STATVFS)))
        return result

    def close(self) -> None:
        self.closed = True


def source_on(proc: Path, calls: FakeStatvfs, config: MountsConfig | None = None, rootfs: str = "/") -> MountSource:
    return MountSource(HostPaths(procfs=str(proc), rootfs=rootfs), config or MountsConfig(), calls=calls)  # type: ignore[arg-type]


def mount_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == MOUNTS_LOGGER and r.levelno == logging.WARNING]


def test_malformed_lines_are_logged_once_and_good_mounts_reported(caplog: pytest.LogCaptureFixture) -> None:
    calls = FakeStatvfs()
    source = source_on(MALFORMED_PROC, calls)
    with caplog.at_level(logging.WARNING, logger=MOUNTS_LOGGER):
        mounts = source.collect()
    # /sys is sysfs, a pseudo filesystem: parsed, then skipped.
    assert [m.mountpoint for m in mounts] == ["/", "/run", "/mnt/local-nvme", "/home", "/lustre"]
    assert [m.fstype for m in mounts] == ["ext4", "tmpfs", "xfs", "nfs4", "lustre"]
    warnings = mount_warnings(caplog)
    assert len(warnings) == 3
    assert warnings[0].startswith("mountinfo: skipping malformed line 5: expected at least 10 fields")
    assert "/var/lib/kubelet/pods/81742e8f" in warnings[0]
    assert warnings[1].startswith("mountinfo: skipping malformed line 7: no ' - ' separator")
    # A mount point with an escaped NUL (\000) fails its own line only.
    assert warnings[2].startswith("mountinfo: skipping malformed line 9: mount point holds a NUL byte")
    assert source.parse_errors == 3

    caplog.clear()
    with caplog.at_level(logging.WARNING, logger=MOUNTS_LOGGER):
        again = source.collect()
    assert mount_warnings(caplog) == []
    assert [m.mountpoint for m in again] == [m.mountpoint for m in mounts]
    assert len(calls.calls) == 2


def test_a_new_malformed_line_is_logged_when_it_first_appears(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    proc = tmp_path / "proc"
    (proc / "1").mkdir(parents=True)
    good = (MALFORMED_PROC / "1" / "mountinfo").read_bytes()
    (proc / "1" / "mountinfo").write_bytes(good)
    source = source_on(proc, FakeStatvfs())
    with caplog.at_level(logging.WARNING, logger=MOUNTS_LOGGER):
        source.collect()
        assert len(mount_warnings(caplog)) == 3
        (proc / "1" / "mountinfo").write_bytes(good + b"999 24 0:99 /\n")
        source.collect()
        source.collect()
    warnings = mount_warnings(caplog)
    assert len(warnings) == 4
    assert "line 10" in warnings[3] and "999 24 0:99 /" in warnings[3]


def test_usage_comes_from_statvfs_in_bytes() -> None:
    calls = FakeStatvfs(
        values={
            "/": (4096, 250_000_000, 100_000_000, 90_000_000, 60_000_000, 55_000_000, 0),
            "/mnt/local-nvme": (4096, 1_875_000_000, 1_000_000_000, 1_000_000_000, 750_000_000, 749_000_000, 0),
            # ST_RDONLY set by the filesystem though the mount line says rw.
            "/lustre": (1_048_576, 3_000_000, 1_000_000, 1_000_000, 900_000_000, 800_000_000, 1),
        }
    )
    mounts = {m.mountpoint: m for m in source_on(MALFORMED_PROC, calls).collect()}
    assert mounts["/"].usage == FsUsage(
        size_bytes=4096 * 250_000_000,
        free_bytes=4096 * 100_000_000,
        avail_bytes=4096 * 90_000_000,
        files=60_000_000,
        files_free=55_000_000,
    )
    assert mounts["/"].usage_error is None
    assert mounts["/"].readonly is False
    assert mounts["/mnt/local-nvme"].usage is not None
    assert mounts["/mnt/local-nvme"].usage.size_bytes == 7_680_000_000_000
    assert mounts["/lustre"].readonly is True
    assert mounts["/lustre"].usage is not None
    assert mounts["/lustre"].usage.avail_bytes == 1_048_576 * 1_000_000
    m = mounts["/mnt/local-nvme"]
    assert (m.mount_id, m.device, m.root, m.major, m.minor) == (97, "/dev/nvme1n1", "/", 259, 4)
    assert m.options == ("rw", "noatime")
    assert m.super_options[:2] == ("rw", "attr2")


def test_statvfs_requests_go_to_host_paths_with_the_configured_timeout() -> None:
    calls = FakeStatvfs()
    config = MountsConfig(statvfs_timeout_seconds=2.5)
    source_on(MALFORMED_PROC, calls, config, rootfs="/host").collect()
    assert len(calls.calls) == 1
    op, requests, timeout = calls.calls[0]
    assert op == "statvfs"
    assert timeout == 2.5
    assert requests == {
        "/": ("/host/",),
        "/run": ("/host/run",),
        "/mnt/local-nvme": ("/host/mnt/local-nvme",),
        "/home": ("/host/home",),
        "/lustre": ("/host/lustre",),
    }


def test_stuck_failed_and_unanswered_mounts() -> None:
    calls = FakeStatvfs(
        outcomes={
            "/home": CallOutcome(stuck=True, in_flight_seconds=12.5),
            "/lustre": CallOutcome(error="Transport endpoint is not connected"),
        }
    )
    mounts = {m.mountpoint: m for m in source_on(MALFORMED_PROC, calls).collect()}
    home = mounts["/home"]
    assert (home.stuck, home.stuck_seconds, home.usage, home.usage_error) == (
        True,
        12.5,
        None,
        "statvfs has not returned",
    )
    lustre = mounts["/lustre"]
    assert (lustre.stuck, lustre.usage, lustre.usage_error) == (False, None, "Transport endpoint is not connected")
    assert mounts["/"].stuck is False and mounts["/"].usage is not None

    class Silent(FakeStatvfs):
        def call_many(
            self, op: str, requests: Mapping[str, Sequence[bytes | str]], timeout: float
        ) -> dict[str, CallOutcome]:
            return {}

    unanswered = source_on(MALFORMED_PROC, Silent()).collect()
    assert {m.usage_error for m in unanswered} == {"no answer"}
    assert all(m.usage is None and not m.stuck for m in unanswered)


def test_a_call_still_within_its_deadline_keeps_the_last_usage() -> None:
    calls = FakeStatvfs(values={"/home": (4096, 10, 5, 5, 100, 50, 0)})
    source = source_on(MALFORMED_PROC, calls)
    first = {m.mountpoint: m for m in source.collect()}
    assert first["/home"].usage == FsUsage(40960, 20480, 20480, 100, 50)
    # The call started in this round's predecessor is still running, but not yet past its deadline.
    calls.outcomes["/home"] = CallOutcome(stuck=False, in_flight_seconds=0.4)
    second = {m.mountpoint: m for m in source.collect()}
    assert second["/home"].usage == FsUsage(40960, 20480, 20480, 100, 50)
    assert second["/home"].stuck is False
    assert second["/home"].usage_error == "statvfs in flight"
    # Past its deadline: the old answer is dropped, the mount is stuck.
    calls.outcomes["/home"] = CallOutcome(stuck=True, in_flight_seconds=3.0)
    third = {m.mountpoint: m for m in source.collect()}
    assert third["/home"].usage is None
    assert third["/home"].stuck is True
    # And once stuck, a later in-flight answer has no stale usage to fall back on.
    calls.outcomes["/home"] = CallOutcome(stuck=False, in_flight_seconds=0.1)
    assert {m.mountpoint: m for m in source.collect()}["/home"].usage is None


def test_exclude_fstypes_and_close() -> None:
    calls = FakeStatvfs()
    source = source_on(MALFORMED_PROC, calls, MountsConfig(exclude_fstypes=("lustre", "tmpfs")))
    assert [m.mountpoint for m in source.collect()] == ["/", "/mnt/local-nvme", "/home"]
    source.configure(MountsConfig(max_inflight=3))
    assert calls.max_inflight == 3
    assert [m.mountpoint for m in source.collect()] == ["/", "/run", "/mnt/local-nvme", "/home", "/lustre"]
    source.close()
    assert calls.closed is True


def test_gpu_node_fixture_non_utf8_mountpoint_is_requested_as_its_raw_bytes() -> None:
    calls = FakeStatvfs()
    mounts = source_on(GPU_NODE_PROC, calls).collect()
    assert len(mounts) == 28
    (_, requests, _) = calls.calls[0]
    jose = os.fsdecode(b"/mnt/local-nvme/users/jos\xe9")
    assert os.fsencode(requests[jose][0]) == b"/mnt/local-nvme/users/jos\xe9"


def test_unreadable_mount_table_raises_naming_each_candidate(tmp_path: Path) -> None:
    source = source_on(tmp_path / "proc", FakeStatvfs())
    with pytest.raises(OSError, match="cannot read the mount table") as excinfo:
        source.collect()
    assert str(tmp_path / "proc" / "1" / "mountinfo") in str(excinfo.value)
    assert str(tmp_path / "proc" / "self" / "mountinfo") in str(excinfo.value)


GARBAGE = b"\x00\xde\xad\xbe\xef torn read\nnot a mount table either\n\n"


@pytest.mark.parametrize(
    ("data", "message", "bad_lines"),
    [
        pytest.param(b"", r"mountinfo: empty: no mount in it", 0, id="empty"),
        pytest.param(b"\n\n", r"mountinfo: empty: no mount in it", 0, id="blank-lines"),
        pytest.param(GARBAGE, r"mountinfo: no mount could be parsed, 2 malformed; the first: line 1: no ' - '", 2,
                     id="garbage"),
    ],
)  # fmt: skip
def test_a_mount_table_with_no_good_line_fails_naming_the_file(
    tmp_path: Path, data: bytes, message: str, bad_lines: int
) -> None:
    proc = tmp_path / "proc"
    (proc / "1").mkdir(parents=True)
    (proc / "1" / "mountinfo").write_bytes(data)
    calls = FakeStatvfs()
    source = source_on(proc, calls)
    for read in (1, 2):  # the same bad table read again fails again, and its lines count again
        with pytest.raises(UnusableInput, match=message) as excinfo:
            source.collect()
        assert str(proc / "1" / "mountinfo") in str(excinfo.value)
        assert source.parse_errors == read * bad_lines
    assert calls.calls == []  # nothing to statvfs
    (proc / "1" / "mountinfo").write_bytes((MALFORMED_PROC / "1" / "mountinfo").read_bytes())
    assert [m.mountpoint for m in source.collect()][:1] == ["/"]  # and it recovers with the file


def test_parse_errors_count_every_read_of_a_bad_line(tmp_path: Path) -> None:
    source = source_on(MALFORMED_PROC, FakeStatvfs())
    source.collect()
    assert source.parse_errors == 3
    source.collect()  # the same table, not parsed again, but its three bad lines were read again
    assert source.parse_errors == 6


# -- the real helper process, against real paths on this machine


@pytest.fixture
def blocking_calls() -> Iterator[BlockingCalls]:
    calls = BlockingCalls(max_inflight=4)
    yield calls
    calls.close()


def test_real_statvfs_of_root_matches_os_statvfs(blocking_calls: BlockingCalls) -> None:
    outcomes = blocking_calls.call_many("statvfs", {"/": ("/",)}, timeout=10.0)
    outcome = outcomes["/"]
    assert outcome.error is None and outcome.stuck is False
    assert outcome.values is not None and len(outcome.values) == 7
    frsize, blocks, _bfree, _bavail, files, _ffree, flag = (int(v) for v in outcome.values)
    st = os.statvfs("/")
    assert blocks * frsize == st.f_blocks * st.f_frsize
    assert frsize == st.f_frsize
    assert files == st.f_files
    assert flag == st.f_flag
    assert blocking_calls.in_flight() == 0


def test_real_statvfs_of_a_missing_path_is_an_error_outcome(tmp_path: Path, blocking_calls: BlockingCalls) -> None:
    missing = str(tmp_path / "not-there")
    outcomes = blocking_calls.call_many("statvfs", {"gone": (missing,), "/": ("/",)}, timeout=10.0)
    assert outcomes["gone"].values is None
    assert outcomes["gone"].stuck is False
    assert outcomes["gone"].error == os.strerror(2)  # ENOENT: "No such file or directory"
    assert outcomes["/"].values is not None


def test_real_statvfs_of_a_non_utf8_path(tmp_path: Path, blocking_calls: BlockingCalls) -> None:
    raw = os.path.join(os.fsencode(tmp_path), b"jos\xe9")
    os.mkdir(raw)
    outcomes = blocking_calls.call_many("statvfs", {"jose": (os.fsdecode(raw),), "bytes": (raw,)}, timeout=10.0)
    st = os.statvfs(raw)
    for key in ("jose", "bytes"):
        values = outcomes[key].values
        assert values is not None, outcomes[key]
        assert int(values[1]) * int(values[0]) == st.f_blocks * st.f_frsize


def test_the_helper_keeps_its_threads_for_later_calls(blocking_calls: BlockingCalls, tmp_path: Path) -> None:
    dirs = {str(tmp_path / f"d{i}"): (str(tmp_path / f"d{i}"),) for i in range(40)}
    for path in dirs:
        os.mkdir(path)
    for _ in range(5):
        outcomes = blocking_calls.call_many("statvfs", dirs, timeout=10.0)
        assert all(o.values is not None for o in outcomes.values())
    helper = blocking_calls.helper_pid
    assert helper is not None
    threads = len(os.listdir(f"/proc/{helper}/task"))
    # 200 calls, at most 4 in flight at a time: a few threads in all (main + those kept), not one per call.
    assert 2 <= threads <= 1 + blocking_calls.max_inflight
