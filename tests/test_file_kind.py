"""What kind of file a mode says (storwatch/nofollow.py ``file_kind``).

Every kind is a real file made in the test's directory (a FIFO, a unix socket, a symbolic link, a directory, a
character and a block device node), looked at with ``lstat`` as the package does.
"""

from __future__ import annotations

import contextlib
import glob
import os
import socket
import stat
from collections.abc import Callable
from pathlib import Path

import pytest

from storwatch.nofollow import file_kind


def _free_block_major() -> int:
    """A block major no driver holds here (240-254 are for local use): a node of it opens nothing. A node of a
    registered major can make a device when opened (the loop driver makes ``loopN`` for any minor asked for)."""
    with open("/proc/devices") as f:
        text = f.read()
    taken = {int(line.split()[0]) for line in text.split("Block devices:")[1].splitlines() if line.strip()}
    return next(m for m in range(240, 255) if m not in taken)


def _fifo(p: Path) -> None:
    os.mkfifo(p, 0o600)


def _socket(p: Path) -> None:
    # Bound by its name from its own directory: a socket's path is limited to 108 bytes, a test's directory is not.
    with contextlib.chdir(p.parent), socket.socket(socket.AF_UNIX) as sock:
        sock.bind(p.name)


def _char_device(p: Path) -> None:
    os.mknod(p, 0o600 | stat.S_IFCHR, os.makedev(1, 3))  # what /dev/null is


def _block_device(p: Path) -> None:
    try:
        os.mknod(p, 0o600 | stat.S_IFBLK, os.makedev(_free_block_major(), 0))
    except PermissionError:
        pytest.skip("making a block device node needs CAP_MKNOD")


def _symlink(p: Path) -> None:
    os.symlink("elsewhere", p)


def _directory(p: Path) -> None:
    p.mkdir(mode=0o700)


def _regular(p: Path) -> None:
    p.write_bytes(b"x")


PLANT: dict[str, Callable[[Path], None]] = {
    "fifo": _fifo,
    "socket": _socket,
    "char": _char_device,
    "block": _block_device,
    "symlink": _symlink,
    "dir": _directory,
    "regular": _regular,
}
WORDS = {
    "fifo": "a FIFO",
    "socket": "a socket",
    "char": "a character device",
    "block": "a block device",
    "symlink": "a symbolic link",
    "dir": "a directory",
    "regular": "a regular file",
}


# --------------------------------------------------------------------------------------------------------------------
# The one function, on real files


@pytest.mark.parametrize("kind", ["fifo", "socket", "block", "symlink", "dir", "regular"])
def test_each_kind_made_here_is_named(kind: str, tmp_path: Path) -> None:
    path = tmp_path / kind
    PLANT[kind](path)
    assert file_kind(os.lstat(path).st_mode) == WORDS[kind]


def test_dev_null_is_a_character_device() -> None:
    assert file_kind(os.lstat("/dev/null").st_mode) == "a character device"


def test_a_loop_device_node_is_a_block_device() -> None:
    # The node the kernel made, beside the ones the test makes with mknod.
    loops = sorted(glob.glob("/dev/loop[0-9]*"))
    if not loops:
        pytest.skip("no loop device node under /dev")
    assert file_kind(os.lstat(loops[0]).st_mode) == "a block device"


@pytest.mark.parametrize(("mode", "words"), [(0o160000 | 0o644, "a file of type 160000"), (0, "a file of type 0")])
def test_a_type_linux_does_not_have_is_named_by_its_bits(mode: int, words: str) -> None:
    # No file of such a type can be made on Linux (0o160000 is BSD's whiteout), so the mode is written by hand: a
    # filesystem that reports one is named by its type bits, never taken for another kind.
    assert file_kind(mode) == words
