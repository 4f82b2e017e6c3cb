"""The benchmarks' checks of the machine they run on read what other people's tests leave there, and their
measures of the agent (bench/_common.py)."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

from bench._common import fuse_mounts, thread_cpu_seconds
from storwatch.threadname import name_this_thread


def test_a_fuse_mount_point_that_is_not_utf8_is_named_and_the_bench_goes_on(tmp_path: Path) -> None:
    # mountinfo as the kernel writes it: a mount point's bytes as they are (a space would be \040), here a Latin-1
    # "é" a test left behind, which is not UTF-8.
    mountinfo = tmp_path / "mountinfo"
    mountinfo.write_bytes(
        b"22 1 253:0 / / rw,relatime shared:1 - ext4 /dev/vda rw\n"
        b"41 22 0:40 / /tmp/caf\xe9/slow rw,nosuid,nodev,relatime shared:20 - fuse.slowfs slowfs rw,user_id=0\n"
        b"42 22 0:41 / /sys/fs/fuse/connections rw,relatime shared:21 - fusectl fusectl rw\n"
    )
    assert fuse_mounts(str(mountinfo)) == ["/tmp/caf\ufffd/slow"]


def test_no_mount_table_means_no_fuse_mounts(tmp_path: Path) -> None:
    assert fuse_mounts(str(tmp_path / "absent")) == []


def test_a_threads_cpu_is_counted_under_the_name_it_gave_the_os() -> None:
    """The benches report the agent's CPU by thread: a thread that names itself and spends 0.2 s of CPU (by its own
    clock, so a busy machine only makes it take longer) is found under its name with that CPU, and the caller's
    threads are not."""
    spent, read = threading.Event(), threading.Event()

    def burn() -> None:
        name_this_thread()
        while time.thread_time() < 0.2:
            pass
        spent.set()
        read.wait(60.0)  # alive while it is read: an ended thread's task is gone from /proc

    t = threading.Thread(target=burn, name="bench-burner", daemon=True)
    t.start()
    try:
        assert spent.wait(60.0)
        by_name = thread_cpu_seconds(os.getpid())
    finally:
        read.set()
        t.join(10.0)
    assert 0.15 <= by_name["bench-burner"] <= 0.5, by_name
    assert thread_cpu_seconds(2**22 + 1) == {}  # no such process: nothing, not an error
