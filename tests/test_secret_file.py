"""Reading a secret file (storwatch/actions/secret_file.py): a table of real files of every type, each read or
refused with the reason, none waited on."""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from pathlib import Path

import pytest

from storwatch.actions.secret_file import SecretFileError, read_secret_file


def regular(p: Path) -> str:
    p.write_bytes(b"s3cret\n")
    return str(p)


def fifo(p: Path) -> str:
    os.mkfifo(p)
    return str(p)


def unix_socket(p: Path) -> str:
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(p))
    sock.close()
    return str(p)


def link(p: Path) -> str:
    target = p.with_name("target")
    target.write_bytes(b"s3cret")
    p.symlink_to(target)
    return str(p)


def in_linked_directory(p: Path) -> str:
    """A link above the file is followed: only the last component is held (as a Secret's DIR/..data/KEY needs)."""
    real = p.with_name("..2026_11_22")
    real.mkdir()
    (real / "key").write_bytes(b"s3cret")
    p.symlink_to(real.name)
    return str(p / "key")


def secret_volume(p: Path, mode: int = 0o755, target: str = "..data/key") -> str:
    """A Secret volume as the kubelet writes it: DIR/KEY -> ..data/KEY, ..data -> ..TIMESTAMP, root's."""
    p.mkdir()
    (p / "..2026_11_22").mkdir()
    (p / "..2026_11_22" / "key").write_bytes(b"s3cret")
    (p / "..data").symlink_to("..2026_11_22")
    (p / "key").symlink_to(target)
    os.chmod(p, mode)
    return str(p / "key")


def grown(p: Path) -> str:
    p.write_bytes(b"x" * 17)
    return str(p)


@pytest.mark.parametrize(
    ("make", "outcome"),
    [
        (regular, b"s3cret\n"),
        (in_linked_directory, b"s3cret"),
        (lambda p: str(p), "cannot read {path}: No such file or directory"),
        (fifo, "{path} is a FIFO, not a regular file: not read"),
        (unix_socket, "{path} is a socket, not a regular file: not read"),
        (lambda p: "/dev/null", "/dev/null is a character device, not a regular file: not read"),
        (lambda p: (p.mkdir(), str(p))[1], "{path} is a directory, not a regular file: not read"),
        (link, "{path} is a symbolic link, not followed: name the file itself"),
        (grown, "{path} is 17 bytes, over the 16 a secret may hold"),
        (secret_volume, b"s3cret"),
        (lambda p: secret_volume(p, 0o777), "{path} is a symbolic link, not followed"),
        (lambda p: secret_volume(p, target="..data/../../target"), "{path} is a symbolic link, not followed"),
    ],
    ids=[
        "regular",
        "linked-directory",
        "missing",
        "fifo",
        "socket",
        "device",
        "directory",
        "symlink",
        "too-big",
        "secret-volume",
        "secret-volume-others-may-write",
        "secret-volume-link-elsewhere",
    ],
)
def test_a_secret_file_is_read_or_refused_with_the_reason(
    tmp_path: Path, make: Callable[[Path], str], outcome: bytes | str
) -> None:
    path = make(tmp_path / "secret")
    if isinstance(outcome, bytes):
        assert read_secret_file(path, "hmac_key_file", 16) == outcome
        return
    with pytest.raises(SecretFileError) as caught:
        read_secret_file(path, "hmac_key_file", 16)
    assert str(caught.value).startswith("hmac_key_file: " + outcome.format(path=path)), str(caught.value)
