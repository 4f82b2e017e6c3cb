"""Tests of the real-mount harness itself (tests/realmounts.py and tests/fusefs.py).

They need root, loop devices, mkfs.ext4, /dev/fuse and libfuse3; without them they skip with the reason.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
import signal
import subprocess
import threading
import time
from contextlib import AbstractContextManager, ExitStack
from pathlib import Path
from typing import TypeVar

import pytest

from tests.realmounts import (
    IMAGE_PREFIX,
    MountError,
    RealPartUnavailable,
    _holders,
    _release_loop,
    _this_tests_processes,
    _wait_until_this_test_lets_go,
    average_write_latency_ms,
    find_mount,
    fuse_mount,
    is_mounted,
    loop_devices_for,
    loop_devices_left_behind,
    loop_ext4_mount,
    overlay_mount,
    read_diskstats,
    read_mountinfo,
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


def _autoclear(device: str) -> str:
    return Path(f"/sys/block/{os.path.basename(device)}/loop/autoclear").read_text().strip()


def test_loop_ext4_mount(tmp_path: Path) -> None:
    with ExitStack() as inner:
        lm = enter_or_skip(inner, loop_ext4_mount(tmp_path / "ext4", size_mb=32))
        assert re.fullmatch(r"/dev/loop\d+", lm.loop_device), lm.loop_device
        entry = find_mount(lm.mountpoint)
        assert entry is not None
        assert entry.fstype == "ext4"
        assert entry.source == lm.loop_device
        assert loop_devices_for(lm.image) == [lm.loop_device]
        assert _autoclear(lm.loop_device) == "1"  # the kernel detaches it when the filesystem's last holder goes
        (lm.mountpoint / "data").write_bytes(b"x" * 4096)
        read_diskstats(lm.loop_name)  # the loop device has counters
    assert not is_mounted(lm.mountpoint)
    assert not lm.image.exists()
    # Gone, or (where another process's mount namespace holds a copy of the mount) left to the kernel alone.
    assert loop_devices_left_behind(lm.image) == []


def test_a_loop_device_number_taken_by_another_image_is_left_alone(tmp_path: Path) -> None:
    """Once a test's image is detached, its device number is free, and a test running beside it may attach its own
    image to that number at once: the first test's teardown must never detach the other's image (held open here, as
    a mounted one is, so a detach would set it to autoclear)."""
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
            _release_loop(device, ours)  # our image is not on it (any more): nothing to do
            assert loop_devices_for(theirs) == [device]
            assert _autoclear(name) == "0"  # never asked to go
        finally:
            os.close(holder)
    finally:
        _release_loop(device, theirs)
    assert loop_devices_left_behind(theirs) == []


def _wait_for_exec(proc: subprocess.Popen[bytes], name: str, timeout: float = 10.0) -> None:
    """Wait until ``proc`` runs the program ``name`` (what started it execs it)."""
    for _ in range(int(timeout / 0.05)):
        if Path(f"/proc/{proc.pid}/comm").read_text().strip() == name:
            return
        threading.Event().wait(0.05)
    raise AssertionError(f"pid {proc.pid} did not exec {name} within {timeout:.0f} s")


def test_a_filesystem_the_test_itself_still_holds_is_waited_for_and_its_holders_named(tmp_path: Path) -> None:
    """A filesystem lazily unmounted while the test's own processes hold it (a file open here, a child's working
    directory) stays, and its loop device with it: the teardown waits for them, and its error names them, found by
    the device number, as the paths no longer say where the filesystem was. A mount namespace made while it was
    mounted is named too, as not waited for: the kernel frees the device when it goes."""
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
                _wait_until_this_test_lets_go(lm.loop_device, lm.image, timeout=0.5)
            message = str(err.value)
            held, _, others = message.partition("also held, not waited for:")
            assert re.search(rf"\b{os.getpid()} \([^)]*, state \S+, in [^)]+\): fd {fd} /open.bin", held), message
            assert re.search(rf"\b{child.pid} \(sleep, state S, in [^)]+\): cwd", held), message
            assert re.search(rf"the mount namespace mnt:\[\d+\] of {spaced.pid}: mounted at {lm.mountpoint}", others), (
                message
            )
        finally:
            for proc in (child, spaced):
                proc.kill()
                proc.wait()
            os.close(fd)
    assert not lm.image.exists()
    assert loop_devices_left_behind(lm.image) == []


def _start_outsider(pidfile: Path) -> int:
    """Start, as another user's process would be, one that makes a private mount namespace (a copy of every mount
    there is now) and stays in it: not a child of this test (``setsid --fork`` leaves it to init). Its PID."""
    subprocess.run(
        ["setsid", "--fork", "unshare", "--mount", "--propagation", "private",
         "sh", "-c", 'echo $$ > "$0.new" && mv "$0.new" "$0" && exec sleep 300', os.fspath(pidfile)],
        stdin=subprocess.DEVNULL, timeout=30, check=True,
    )  # fmt: skip
    for _ in range(200):
        if pidfile.exists():
            pid = int(pidfile.read_text())
            for _ in range(200):
                if Path(f"/proc/{pid}/comm").read_text().strip() == "sleep":
                    return pid
                time.sleep(0.05)
            raise AssertionError(f"pid {pid} did not exec sleep within 10 s")
        time.sleep(0.05)
    raise AssertionError(f"the outsider did not write {pidfile} within 10 s")


def _stop_outsider(pid: int) -> None:
    with contextlib.suppress(OSError):
        if Path(f"/proc/{pid}/comm").read_text().strip() == "sleep":  # still the one started (not a reused PID)
            os.kill(pid, signal.SIGKILL)


def test_another_processs_mount_namespace_holding_the_mount_does_not_hold_up_the_teardown(tmp_path: Path) -> None:
    """Another process that makes a mount namespace while a test's loop mount exists has a copy of the mount, and
    with it the filesystem and the loop device, for as long as it lives. The teardown unmounts the test's own mount
    and waits only for what the test holds: it ends while the copy is still there, the image is removed, and the
    device, set to autoclear, is left to the kernel, which detaches it once that namespace goes."""
    if shutil.which("setsid") is None or shutil.which("unshare") is None:
        pytest.skip("real part unavailable: setsid and unshare (util-linux) are needed")
    outsider, outsider_ns = None, ""
    try:
        with ExitStack() as stack:
            lm = enter_or_skip(stack, loop_ext4_mount(tmp_path / "ours", size_mb=16))
            (lm.mountpoint / "data").write_bytes(b"x" * 4096)
            outsider = _start_outsider(tmp_path / "outsider.pid")
            assert outsider not in _this_tests_processes()
            outsider_ns = os.readlink(f"/proc/{outsider}/ns/mnt")
            assert any(e.mountpoint == str(lm.mountpoint) for e in read_mountinfo(f"/proc/{outsider}/mountinfo"))
        # The teardown went through, with the copy still mounted in the other namespace, holding the device.
        assert not is_mounted(lm.mountpoint)
        assert not lm.image.exists()
        assert any(e.mountpoint == str(lm.mountpoint) for e in read_mountinfo(f"/proc/{outsider}/mountinfo"))
        assert loop_devices_for(lm.image) == [lm.loop_device]
        assert _autoclear(lm.loop_device) == "1"
        assert loop_devices_left_behind(lm.image) == []
    finally:
        if outsider is not None:
            _stop_outsider(outsider)
    # When the copy goes, the kernel detaches the device (unless yet another namespace has a copy too: then it waits
    # for that one as well).
    deadline = time.monotonic() + 30.0
    while True:
        holders = _holders(lm.loop_device) if loop_devices_for(lm.image) else []
        if not loop_devices_for(lm.image) or (holders and not any(outsider_ns in h.what for h in holders)):
            break
        assert time.monotonic() < deadline, f"{lm.loop_device} still serves {lm.image}, held by {holders or 'nothing'}"
        time.sleep(0.2)
    assert loop_devices_left_behind(lm.image) == []


def test_an_agents_own_mount_table_holds_no_other_tests_mount(tmp_path: Path) -> None:
    """The private mount namespace the e2e tests run their agent in (tests/builders.py ``own_mount_table``) would
    hold a copy of every mount there is, another test's loop device's filesystem among them, and keep it alive until
    the agent exited. The namespace detaches what is not its own below the temporary directory, so the other's
    filesystem and loop device go when its teardown unmounts it, while the agent still runs."""
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
            table = Path(f"/proc/{agent.pid}/mountinfo").read_text(errors="surrogateescape")  # odd names of others
            assert f" {ours.mountpoint} " in table
            assert f" {theirs.mountpoint} " not in table
            assert Path(f"/proc/{agent.pid}/root/proc/1/mountinfo").read_bytes().count(b"\n") == 2  # "/" and ours
        # the other test's filesystem is not kept alive by the agent's namespace (its loop device is gone, or held by
        # others only), while the agent still runs
        agent_ns = os.readlink(f"/proc/{agent.pid}/ns/mnt")
        if loop_devices_for(theirs.image):
            assert not any(agent_ns in h.what for h in _holders(theirs.loop_device))
        assert loop_devices_left_behind(theirs.image) == []
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
    assert loop_devices_left_behind(lm.image) == []


def test_loop_image_on_statfs_blocking_fuse_is_refused(tmp_path: Path) -> None:
    # The kernel's LOOP_CONFIGURE calls statfs on the backing file: losetup would hang there.
    with ExitStack() as inner:
        fm = enter_or_skip(inner, fuse_mount(tmp_path / "hung", block_statfs=True))
        with pytest.raises(MountError, match="statfs"):
            inner.enter_context(loop_ext4_mount(tmp_path / "ext4", image_dir=fm.mountpoint))
        assert os.listdir(fm.mountpoint) == []
    assert not is_mounted(fm.mountpoint)
    assert not is_mounted(tmp_path / "ext4")
