"""Tests of the real-mount harness itself (tests/realmounts.py and tests/fusefs.py).

They need root, loop devices, mkfs.ext4, /dev/fuse and libfuse3; without them they skip with the reason.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import subprocess
import threading
from contextlib import AbstractContextManager, ExitStack
from pathlib import Path
from typing import TypeVar

import pytest

from tests.realmounts import (
    IMAGE_PREFIX,
    MountError,
    RealPartUnavailable,
    _detach_loop,
    average_write_latency_ms,
    find_mount,
    fuse_mount,
    is_mounted,
    loop_devices_for,
    loop_ext4_mount,
    overlay_mount,
    read_diskstats,
    tmpfs_mount,
    unmount,
)

pytestmark = pytest.mark.realpart

T = TypeVar("T")


def enter_or_skip(stack: ExitStack, cm: AbstractContextManager[T]) -> T:
    """Enter a harness context manager; a missing real part becomes a skip with the reason."""
    try:
        return stack.enter_context(cm)
    except RealPartUnavailable as exc:
        pytest.skip(f"real part unavailable: {exc.reason}")


def _thread_state(native_id: int) -> str:
    """The scheduler state letter (R, S, D ...) of one of this process's threads."""
    try:
        with open(f"/proc/self/task/{native_id}/stat", encoding="ascii") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "?"


def test_tmpfs_mount_is_in_mountinfo(tmp_path: Path) -> None:
    with ExitStack() as inner:
        mnt = enter_or_skip(inner, tmpfs_mount(tmp_path / "tmpfs", size="8m"))
        entry = find_mount(mnt.mountpoint)
        assert entry is not None
        assert entry.fstype == "tmpfs"
        (mnt.mountpoint / "hello").write_text("hi")
        assert (mnt.mountpoint / "hello").read_text() == "hi"
        sv = os.statvfs(mnt.mountpoint)
        assert sv.f_blocks * sv.f_frsize == 8 * 1024 * 1024
    assert not is_mounted(mnt.mountpoint)
    assert not (mnt.mountpoint / "hello").exists()


def test_loop_ext4_mount(tmp_path: Path) -> None:
    with ExitStack() as inner:
        lm = enter_or_skip(inner, loop_ext4_mount(tmp_path / "ext4", size_mb=32))
        assert re.fullmatch(r"/dev/loop\d+", lm.loop_device), lm.loop_device
        entry = find_mount(lm.mountpoint)
        assert entry is not None
        assert entry.fstype == "ext4"
        assert entry.source == lm.loop_device
        assert loop_devices_for(lm.image) == [lm.loop_device]
        (lm.mountpoint / "data").write_bytes(b"x" * 4096)
        read_diskstats(lm.loop_name)  # the loop device has counters
    assert not is_mounted(lm.mountpoint)
    assert loop_devices_for(lm.image) == []
    assert not lm.image.exists()
    losetup = subprocess.run(["losetup", "-a"], capture_output=True, text=True, timeout=10, check=True)
    assert os.fspath(lm.image) not in losetup.stdout


def test_a_loop_device_number_taken_by_another_image_is_left_alone(tmp_path: Path) -> None:
    """Once a test's image is detached, its device number is free, and a test running beside it may attach its own
    image to that number at once: the first test's teardown must then end, and never detach the other's image (held
    open here, as a mounted one is, so a detach would leave it waiting with autoclear set)."""
    if os.geteuid() != 0 or not os.path.exists("/dev/loop-control"):
        pytest.skip("real part unavailable: loop devices need root and /dev/loop-control")
    ours = tmp_path / f"{IMAGE_PREFIX}ours.img"
    theirs = tmp_path / f"{IMAGE_PREFIX}theirs.img"
    for image in (ours, theirs):
        image.write_bytes(bytes(1 << 20))
    device = subprocess.run(
        ["losetup", "-f", "--show", os.fspath(theirs)], capture_output=True, text=True, timeout=30, check=True
    ).stdout.strip()
    name = os.path.basename(device)
    try:
        holder = os.open(device, os.O_RDONLY)
        try:
            _detach_loop(device, ours, timeout=2.0)  # our image is not on it (any more): nothing to wait for
            assert loop_devices_for(theirs) == [device]
            with open(f"/sys/block/{name}/loop/autoclear", encoding="ascii") as fh:
                assert fh.read().strip() == "0"  # never asked to go
        finally:
            os.close(holder)
    finally:
        _detach_loop(device, theirs)
    assert loop_devices_for(theirs) == []


def _wait_for_exec(proc: subprocess.Popen[bytes], name: str, timeout: float = 10.0) -> None:
    """Wait until ``proc`` runs the program ``name`` (what started it execs it)."""
    for _ in range(int(timeout / 0.05)):
        if Path(f"/proc/{proc.pid}/comm").read_text().strip() == name:
            return
        threading.Event().wait(0.05)
    raise AssertionError(f"pid {proc.pid} did not exec {name} within {timeout:.0f} s")


def test_a_loop_device_held_past_the_wait_names_its_holders(tmp_path: Path) -> None:
    """A filesystem lazily unmounted while files on it are open stays, and its loop device with it: the teardown's
    error names the processes that hold it (a file open here, a child's working directory), found by the device
    number, as the paths no longer say where the filesystem was, and a mount namespace made while it was mounted."""
    with ExitStack() as stack:
        lm = enter_or_skip(stack, loop_ext4_mount(tmp_path / "held", size_mb=16))
        (lm.mountpoint / "open.bin").write_bytes(b"x")
        fd = os.open(lm.mountpoint / "open.bin", os.O_RDONLY)
        child = subprocess.Popen(["sleep", "60"], cwd=lm.mountpoint)
        spaced = subprocess.Popen(["unshare", "--mount", "--propagation", "private", "sleep", "60"])
        try:
            _wait_for_exec(spaced, "sleep")  # it runs in its own namespace
            unmount(lm.mountpoint, lazy=True)
            with pytest.raises(MountError) as err:
                _detach_loop(lm.loop_device, lm.image, timeout=0.5)
            message = str(err.value)
            assert re.search(rf"\b{os.getpid()} \([^)]*, state \S+, in [^)]+\): fd {fd} /open.bin", message), message
            assert re.search(rf"\b{child.pid} \(sleep, state S, in [^)]+\): cwd", message), message
            assert re.search(
                rf"the mount namespace mnt:\[\d+\] of {spaced.pid}: mounted at {lm.mountpoint}", message
            ), message
        finally:
            for proc in (child, spaced):
                proc.kill()
                proc.wait()
            os.close(fd)
    assert loop_devices_for(lm.image) == []  # both gone: the kernel detached it (autoclear)


def test_an_agents_own_mount_table_holds_no_other_tests_mount(tmp_path: Path) -> None:
    """The private mount namespace the e2e tests run their agent in (tests/builders.py ``own_mount_table``) would
    hold a copy of every mount there is, another test's loop device's filesystem among them, and keep it alive until
    the agent exited: that test's teardown then waited in vain for its loop device. The namespace detaches what is
    not its own below the temporary directory, so the other's teardown goes through while the agent still runs."""
    from tests.builders import own_mount_table

    with ExitStack() as stack:
        ours = enter_or_skip(stack, tmpfs_mount(tmp_path / "ours"))
        with ExitStack() as others:
            theirs = enter_or_skip(others, loop_ext4_mount(tmp_path / "theirs", size_mb=16))
            prefix = own_mount_table(tmp_path / "table", [ours.mountpoint])
            agent = subprocess.Popen([*prefix, "sleep", "60"])
            stack.callback(agent.wait)
            stack.callback(agent.kill)
            _wait_for_exec(agent, "sleep")  # the namespace is set up and the command runs
            table = Path(f"/proc/{agent.pid}/mountinfo").read_text()
            assert f" {ours.mountpoint} " in table
            assert f" {theirs.mountpoint} " not in table
            assert Path(f"/proc/{agent.pid}/root/proc/1/mountinfo").read_text().count("\n") == 2  # "/" and ours
        # the other test's teardown (unmount, losetup -d, waiting until the kernel detached it) went through
        assert loop_devices_for(theirs.image) == []
        assert agent.poll() is None


def test_overlay_mount(tmp_path: Path) -> None:
    with ExitStack() as inner:
        ov = enter_or_skip(inner, overlay_mount(tmp_path / "ov"))
        entry = find_mount(ov.mountpoint)
        assert entry is not None
        assert entry.fstype == "overlay"
        (ov.mountpoint / "new").write_text("upper")
        assert (ov.upper / "new").read_text() == "upper"
    assert not is_mounted(ov.mountpoint)


def test_overlay_lower_content_is_visible(tmp_path: Path) -> None:
    (tmp_path / "ov" / "lower").mkdir(parents=True)
    (tmp_path / "ov" / "lower" / "base").write_text("lower")
    with ExitStack() as inner:
        ov = enter_or_skip(inner, overlay_mount(tmp_path / "ov"))
        assert (ov.mountpoint / "base").read_text() == "lower"


def test_fuse_passthrough_write_read(tmp_path: Path) -> None:
    backing = tmp_path / "backing"
    with ExitStack() as inner:
        fm = enter_or_skip(inner, fuse_mount(tmp_path / "fuse", backing=backing))
        entry = find_mount(fm.mountpoint)
        assert entry is not None
        assert entry.fstype.startswith("fuse")
        assert fm.is_mounted()
        mnt = fm.mountpoint
        payload = os.urandom(300_000)
        with open(mnt / "f.bin", "wb") as fh:
            fh.write(payload)
            fh.flush()
            os.fsync(fh.fileno())
        assert (mnt / "f.bin").read_bytes() == payload
        assert (backing / "f.bin").read_bytes() == payload
        (mnt / "d").mkdir()
        os.rename(mnt / "f.bin", mnt / "d" / "g.bin")
        assert sorted(os.listdir(mnt / "d")) == ["g.bin"]
        os.truncate(mnt / "d" / "g.bin", 10)
        assert (mnt / "d" / "g.bin").stat().st_size == 10
        os.utime(mnt / "d" / "g.bin", ns=(1_600_000_000_000_000_000, 1_600_000_000_123_456_789))
        assert (backing / "d" / "g.bin").stat().st_mtime_ns == 1_600_000_000_123_456_789
        os.chmod(mnt / "d" / "g.bin", 0o600)
        assert (backing / "d" / "g.bin").stat().st_mode & 0o777 == 0o600
        os.unlink(mnt / "d" / "g.bin")
        os.rmdir(mnt / "d")
        assert os.listdir(mnt) == []
        assert os.statvfs(mnt).f_blocks > 0
    assert not is_mounted(fm.mountpoint)
    assert fm.proc.poll() is not None


def test_fuse_block_statfs_hangs_and_teardown_releases(tmp_path: Path) -> None:
    result: dict[str, object] = {}

    def call_statvfs(path: Path) -> None:
        result["tid"] = threading.get_native_id()
        try:
            result["value"] = os.statvfs(path)
        except OSError as exc:
            result["error"] = exc

    with ExitStack() as inner:
        fm = enter_or_skip(inner, fuse_mount(tmp_path / "hung", block_statfs=True))
        (fm.mountpoint / "still-works").write_text("ok")  # only statfs hangs
        thread = threading.Thread(target=call_statvfs, args=(fm.mountpoint,), daemon=True)
        thread.start()
        thread.join(1.0)
        assert thread.is_alive(), f"statvfs returned on a hung mount: {result}"
        state = _thread_state(int(result["tid"]))  # type: ignore[call-overload]
        print(f"blocked statvfs thread state: {state}")
        assert state in {"D", "S"}, state
    # teardown aborted the connection: the blocked statvfs fails now
    thread.join(5.0)
    assert not thread.is_alive(), "statvfs still blocked after teardown"
    error = result.get("error")
    assert isinstance(error, OSError), result
    assert error.errno == errno.ECONNABORTED, error  # the request in flight when the connection was aborted
    assert not is_mounted(fm.mountpoint)
    assert fm.proc.poll() is not None


def test_fuse_abort_makes_mount_fail_like_a_dead_server(tmp_path: Path) -> None:
    with ExitStack() as inner:
        fm = enter_or_skip(inner, fuse_mount(tmp_path / "dead"))
        assert fm.abort()
        with pytest.raises(OSError) as info:
            os.listdir(fm.mountpoint)
        assert info.value.errno == errno.ENOTCONN  # a new request on an aborted connection
    assert not is_mounted(fm.mountpoint)


def test_loop_on_slow_fuse_has_write_latency(tmp_path: Path, record_property: pytest.RecordProperty) -> None:
    with ExitStack() as inner:
        fm = enter_or_skip(inner, fuse_mount(tmp_path / "slow", write_delay_ms=20))
        lm = enter_or_skip(inner, loop_ext4_mount(tmp_path / "ext4", size_mb=64, image_dir=fm.mountpoint))
        assert Path(lm.image).parent == fm.mountpoint
        with contextlib.suppress(OSError):
            os.sync()
        before = read_diskstats(lm.loop_name)
        subprocess.run(
            [
                "dd",
                "if=/dev/zero",
                f"of={lm.mountpoint / 'f'}",
                "bs=64k",
                "count=4",
                "conv=fsync",
                "oflag=direct",
                "status=none",
            ],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=120,
            check=True,
        )
        after = read_diskstats(lm.loop_name)
        latency = average_write_latency_ms(before, after)
        writes = after.writes_completed - before.writes_completed
        record_property("loop_write_latency_ms", latency)
        record_property("loop_writes", writes)
        print(f"{lm.loop_name}: {writes} writes, average write latency {latency:.1f} ms")
        assert writes >= 4
        assert latency > 15.0, f"{writes} writes, {latency:.1f} ms average"
    assert not is_mounted(lm.mountpoint)
    assert not is_mounted(fm.mountpoint)
    assert loop_devices_for(lm.image) == []


def test_loop_image_on_statfs_blocking_fuse_is_refused(tmp_path: Path) -> None:
    # The kernel's LOOP_CONFIGURE calls statfs on the backing file: losetup would hang there.
    with ExitStack() as inner:
        fm = enter_or_skip(inner, fuse_mount(tmp_path / "hung", block_statfs=True))
        with pytest.raises(MountError, match="statfs"):
            inner.enter_context(loop_ext4_mount(tmp_path / "ext4", image_dir=fm.mountpoint))
        assert os.listdir(fm.mountpoint) == []
    assert not is_mounted(fm.mountpoint)
    assert not is_mounted(tmp_path / "ext4")
