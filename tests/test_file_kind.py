"""What kind of file a mode says (storwatch/nofollow.py ``file_kind``), and that every message naming one says it in
those words: the walker below a root, the request file, a secret file, a sync copy's source and the entries under it,
the probe's file in the blocking helper, and a checkpoint check (its top and a file it opens).

Every kind is a real file made in the test's directory (a FIFO, a unix socket, a symbolic link, a directory, a
character and a block device node), looked at with ``lstat`` as the package does.
"""

from __future__ import annotations

import contextlib
import glob
import os
import socket
import stat
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from storwatch.actions.request_file import Refused, place_request
from storwatch.actions.secret_file import SecretFileError, read_secret_file
from storwatch.calls._blocking_worker import probe_file_name
from storwatch.calls.blocking import BlockingCalls
from storwatch.checkpoints.formats import check
from storwatch.config import ProbesConfig
from storwatch.nofollow import NotFollowed, file_kind, open_below
from storwatch.paths import HostPaths
from storwatch.sources.probe import ProbeSource, ProbeTarget
from storwatch.sync import copy_verified
from storwatch.training import REQUEST_NAME
from storwatch.vocabulary import Durability
from tests.builders import sync_checkpoint
from tests.realmounts import tmpfs_mount


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


# --------------------------------------------------------------------------------------------------------------------
# Every message that names a kind of file says it in those words


def _open_below(tmp_path: Path, kind: str) -> str:
    PLANT[kind](tmp_path / "x")
    with pytest.raises(NotFollowed) as err:
        open_below(str(tmp_path), ["x", "ck"])
    return str(err.value)


def _request_file(tmp_path: Path, kind: str) -> str:
    PLANT[kind](tmp_path / REQUEST_NAME)
    with pytest.raises(Refused) as err:
        place_request(str(tmp_path), None, "save now")
    return str(err.value)


def _secret_file(tmp_path: Path, kind: str) -> str:
    PLANT[kind](tmp_path / "token")
    with pytest.raises(SecretFileError) as err:
        read_secret_file(str(tmp_path / "token"), "token_file")
    return str(err.value)


def _sync_source(tmp_path: Path, kind: str) -> str:
    PLANT[kind](tmp_path / "src")
    (tmp_path / "dst").mkdir()
    result = copy_verified(str(tmp_path / "src"), str(tmp_path / "dst" / "ck"))
    assert result.outcome == "refused", result
    return result.error or ""


def _sync_entry(tmp_path: Path, kind: str) -> str:
    src = sync_checkpoint(tmp_path / "src", shards=1, shard_bytes=100)
    PLANT[kind](src / "shards" / "x")
    (tmp_path / "dst").mkdir()
    result = copy_verified(str(src), str(tmp_path / "dst" / "ck"))
    assert result.outcome == "refused", result
    return result.error or ""


def _checkpoint_top(tmp_path: Path, kind: str) -> str:
    PLANT[kind](tmp_path / "model.pt")
    result = check(str(tmp_path / "model.pt"))
    assert result.verdict == "unknown", result
    return result.reason


def _checkpoint_file(tmp_path: Path, kind: str) -> str:
    dcp = tmp_path / "step-1"
    dcp.mkdir()
    (dcp / "__0_0.distcp").write_bytes(b"x")
    PLANT[kind](dcp / ".metadata")
    result = check(str(dcp))
    assert result.format == "torch-dcp" and result.verdict == "unknown", result
    return result.reason


CALLERS: list[tuple[Callable[[Path, str], str], str, str]] = [
    *[(_open_below, k, "/x is {}, not a directory: never followed") for k in ("fifo", "socket", "char", "block")],
    (_open_below, "regular", "/x is {}, not a directory: never followed"),
    (_open_below, "symlink", "/x is {}: never followed"),
    *[
        (_request_file, k, "{} is at ")
        for k in ("fifo", "socket", "char", "block", "symlink", "dir")  # never opened: a device is safe here
    ],
    # Only what opens nothing when opened: the secret is opened before it is looked at.
    *[(_secret_file, k, "/token is {}, not a regular file: not read") for k in ("fifo", "socket", "char", "dir")],
    *[
        (_sync_source, k, "/src' is {}: name a checkpoint file or directory itself")
        for k in ("fifo", "socket", "char", "block", "symlink")
    ],
    *[
        (_sync_entry, k, "/shards/x is {}: a checkpoint holds files, directories and symbolic links only")
        for k in ("fifo", "socket", "char", "block")
    ],
    *[(_checkpoint_top, k, "/model.pt is {}, not a checkpoint") for k in ("fifo", "socket", "char", "block")],
    *[
        (_checkpoint_file, k, "/.metadata is not a regular file ({}); it was not read")
        for k in ("fifo", "socket", "char")  # a socket's open fails (ENXIO): it is named, not taken for bad storage
    ],
]


@pytest.mark.parametrize(
    ("caller", "kind", "message"), CALLERS, ids=[f"{c.__name__.lstrip('_')}-{k}" for c, k, _ in CALLERS]
)
def test_each_message_names_the_kind_in_the_one_vocabulary(
    caller: Callable[[Path, str], str], kind: str, message: str, tmp_path: Path
) -> None:
    got = caller(tmp_path, kind)
    assert message.format(WORDS[kind]) in got, got


@pytest.mark.realpart
@pytest.mark.parametrize("kind", ["fifo", "socket", "char", "block", "symlink", "dir"])
def test_the_probe_helper_names_a_planted_file_in_the_one_vocabulary(
    kind: str, tmp_path: Path, real_mounts: Callable[..., object]
) -> None:
    mount = real_mounts(tmpfs_mount(tmp_path / "m")).mountpoint  # type: ignore[attr-defined]
    scratch = mount / ".storwatch-probe"
    scratch.mkdir(mode=0o700)
    name = probe_file_name(os.fsencode(str(mount)))
    PLANT[kind](scratch / name)
    source = ProbeSource(
        HostPaths(),
        ProbesConfig(mountpoints=(str(mount),), timeout_seconds=60.0),
        lambda: [ProbeTarget(str(mount), Durability.VOLATILE, False)],
        time.time,
        calls=BlockingCalls(max_inflight=2),
    )
    try:
        (result,) = source.collect()
    finally:
        source.close()
    assert result.error is not None, result
    assert f"probe file {name} is {WORDS[kind]}, not one the probe made: refused" in result.error, result.error


def _dcp_with_a_link_out(tmp_path: Path) -> Path:
    """A DCP checkpoint whose ``.metadata`` is a link to a file outside it."""
    outside = tmp_path / "outside"
    outside.write_bytes(b"someone else's")
    dcp = tmp_path / "step-1"
    dcp.mkdir()
    (dcp / "__0_0.distcp").write_bytes(b"x")
    (dcp / ".metadata").symlink_to(outside)
    return dcp


def test_a_link_out_of_a_checkpoint_is_named_a_symbolic_link(tmp_path: Path) -> None:
    dcp = _dcp_with_a_link_out(tmp_path)
    result = check(str(dcp))
    assert f"/.metadata is a symbolic link leading out of {dcp}; it was not followed" in result.reason, result


def test_a_link_swapped_in_after_the_check_is_not_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A tenant swaps a link in between the check of the path and its open: what the kernel opened is checked too."""
    import storwatch.checkpoints.formats.common as common

    dcp = _dcp_with_a_link_out(tmp_path)
    monkeypatch.setattr(common, "_inside", lambda path, root: True)  # the link came after the check
    result = check(str(dcp))
    assert f"/.metadata is a symbolic link leading out of {dcp}; it was not followed" in result.reason, result


def test_a_file_named_like_the_kernels_deleted_mark_is_read(tmp_path: Path) -> None:
    """What /proc/self/fd names for a removed file ends in " (deleted)"; a file so named that is there is read."""
    from storwatch.checkpoints.formats.common import _open_regular

    named = tmp_path / "step-1.pt (deleted)"
    named.write_bytes(b"x" * 10)
    f, size = _open_regular(str(named), str(tmp_path))
    with f:
        assert size == 10 and f.read() == b"x" * 10
