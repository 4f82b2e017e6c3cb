"""The benchmarks' checks of the machine they run on read what other people's tests leave there (bench/_common.py)."""

from __future__ import annotations

from pathlib import Path

from bench._common import fuse_mounts


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
