"""Sync copies onto real mounts: a destination without the space, and one that hangs in the kernel (a FUSE daemon that
never answers, as a dead NFS server or object-store mount does).

A hung destination must never block the caller of SyncWorker: submit, status, poll and close all return while the
helper is stuck in the kernel, and close() within 5 s. The helper itself may outlive close() in the kernel (SIGKILL
does not end a task waiting for a FUSE answer the daemon already took: state D) until the mount is released.
"""

from __future__ import annotations

import fcntl
import os
import struct
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from storwatch import sync
from storwatch.sync import Destinations, SyncWorker, copy_verified
from tests.builders import sync_checkpoint as make_checkpoint
from tests.realmounts import fuse_mount, loop_ext4_mount, tmpfs_mount

pytestmark = pytest.mark.realpart

WAIT = 60.0
"""A bound against hanging with a hung mount, generous for a loaded machine."""


def test_a_destination_without_the_space_is_refused_before_anything_is_written(tmp_path: Path, real_mounts) -> None:  # type: ignore[no-untyped-def]
    small = real_mounts(tmpfs_mount(tmp_path / "small", size="16m"))
    src = make_checkpoint(tmp_path / "src", shards=2, shard_bytes=1 << 20)  # about 19 MiB
    root = str(small.mountpoint)
    result = copy_verified(str(src), f"{root}/ns/ck", root=root)
    assert result.outcome == "no_space" and not result.ok, result.error
    assert "bytes free" in (result.error or "") and "nothing was written" in (result.error or "")
    assert os.listdir(f"{root}/ns") == []  # the directories below the root are made; no byte of the copy


def _helper_waits_in_fuse(pid: int) -> bool:
    """Whether a thread of ``pid`` waits in the kernel on a FUSE request (its wchan names the wait)."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except FileNotFoundError:
        return False
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/wchan") as f:
                wchan = f.read()
        except OSError:
            continue
        if "fuse" in wchan or "request_wait_answer" in wchan:
            return True
    return False


def _returns(call: Callable[[], Any], bound: float = 5.0) -> Any:
    """``call()`` on a thread of its own, which must return within ``bound`` seconds; what it returned."""
    out: list[Any] = []
    t = threading.Thread(target=lambda: out.append(call()), daemon=True)
    t.start()
    t.join(bound)
    assert not t.is_alive(), f"{call} did not return within {bound} s: the caller was blocked"
    return out[0]


@pytest.mark.parametrize("hang", ["statfs", "getattr"])
def test_a_hung_destination_never_blocks_the_caller_and_close_returns(hang: str, tmp_path: Path, real_mounts) -> None:  # type: ignore[no-untyped-def]
    src = make_checkpoint(tmp_path / "src", shards=1, shard_bytes=1 << 20)
    backing = tmp_path / "backing"
    backing.mkdir()
    hung = real_mounts(
        fuse_mount(tmp_path / "hung", backing=backing, block_statfs=hang == "statfs", block_getattr=hang == "getattr")
    )
    root = str(hung.mountpoint)
    worker = SyncWorker(Destinations([root]), deadline_seconds=3600.0)
    closed = False
    try:
        job_id = _returns(lambda: worker.submit(str(src), f"{root}/ns/ck"))
        deadline = time.monotonic() + WAIT
        pid = None
        while pid is None or not _helper_waits_in_fuse(pid):
            assert time.monotonic() < deadline, "the helper never reached the hung mount"
            job = worker._jobs[job_id]
            pid = job.proc.pid if job.proc is not None else None
            time.sleep(0.05)
        # The helper is stuck in the kernel on the mount; everything a caller does still returns.
        second = _returns(lambda: worker.submit(str(src), f"{root}/ns/other"))
        snapshot = _returns(worker.status)
        assert [(j.job_id, j.state) for j in snapshot] == [(job_id, "running"), (second, "queued")]
        assert _returns(worker.poll) == []
        assert _returns(lambda: worker.wait(job_id, 0.2)).state == "running"
        _returns(worker.close, 5.0)
        closed = True
        states = {j.job_id: j.state for j in worker.status()}
        assert states == {job_id: "abandoned", second: "abandoned"}
        result = worker.job(job_id).result  # type: ignore[union-attr]
        assert result is not None and result.outcome == "abandoned"
        # The killed helper may stay in the kernel (a request the daemon already took is waited for uninterruptibly,
        # state D) as long as the mount hangs: nothing waited for it. Once the connection is aborted, it goes.
        hung.abort()
        end = time.monotonic() + WAIT
        while _state(pid) not in ("gone", "Z"):
            assert time.monotonic() < end, f"helper {pid} did not end once the mount was aborted ({_state(pid)})"
            time.sleep(0.05)
    finally:
        if not closed:
            worker.close()


def _state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):  # gone before the open, or between the open and the read
        return "gone"


_FS_IOC_FIEMAP = 0xC020660B
_FIEMAP_FLAG_SYNC = 1


def _physical_offset(fd: int, offset: int) -> int:
    """Where byte ``offset`` of the file behind ``fd`` lies on its filesystem's device (FIEMAP, one extent asked)."""
    answer = bytearray(struct.pack("=QQIIII", offset, 1, _FIEMAP_FLAG_SYNC, 0, 1, 0) + bytes(56))
    fcntl.ioctl(fd, _FS_IOC_FIEMAP, answer)  # the answer is written into the buffer
    mapped = struct.unpack_from("=I", answer, 20)[0]
    assert mapped == 1, f"FIEMAP found {mapped} extents at {offset}"
    logical, physical = struct.unpack_from("=QQ", answer, 32)
    return physical + offset - logical


def test_each_range_is_read_back_from_the_device_not_the_page_cache(
    tmp_path: Path, real_mounts, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    """The read-back sees what the device holds. Just before model.bin's second chunk is read back, a byte of it is
    changed on the device itself (the loop device's image, where FIEMAP places it): a read-back served from the page
    cache would still find the bytes written and pass; the copy must fail, and leave nothing."""
    disk = real_mounts(loop_ext4_mount(tmp_path / "ext4", size_mb=160))
    src = make_checkpoint(tmp_path / "src", shards=1, shard_bytes=1000)
    real_preadv = os.preadv
    changed: list[int] = []

    def preadv_after_the_device_changed(fd: int, buffers: list[memoryview], offset: int) -> int:
        if not changed and offset == sync.CHUNK and os.readlink(f"/proc/self/fd/{fd}").endswith("/model.bin"):
            where = _physical_offset(fd, offset + 100)
            with open(disk.image, "r+b") as image:
                image.seek(where)
                byte = image.read(1)
                image.seek(where)
                image.write(bytes([byte[0] ^ 0xFF]))
            changed.append(where)
        return real_preadv(fd, buffers, offset)

    monkeypatch.setattr(sync.pipeline.os, "preadv", preadv_after_the_device_changed)
    root = str(disk.mountpoint)
    result = copy_verified(str(src), f"{root}/ck")
    assert changed, "model.bin's second chunk was never read back"
    assert result.outcome == "failed", (result.outcome, result.error)
    assert "model.bin: read back past the page cache" in (result.error or "")
    assert sorted(os.listdir(root)) == ["lost+found"]
