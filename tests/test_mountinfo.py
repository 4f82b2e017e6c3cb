"""Parser tables for /proc/<pid>/mountinfo: raw line -> MountInfo or error, and the fixture trees parsed whole."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from storwatch.procfs.mountinfo import MountInfo, MountInfoError, parse_line, parse_mountinfo, unescape

FIXTURES = Path(__file__).parent / "fixtures"
GPU_NODE_MOUNTINFO = FIXTURES / "gpu-node" / "proc" / "1" / "mountinfo"
MALFORMED_MOUNTINFO = FIXTURES / "malformed" / "proc" / "1" / "mountinfo"

NFS_OPTS = (
    "rw",
    "vers=4.1",
    "rsize=1048576",
    "wsize=1048576",
    "namlen=255",
    "hard",
    "proto=tcp",
    "timeo=600",
    "retrans=2",
    "sec=sys",
    "clientaddr=10.0.1.23",
    "local_lock=none",
    "addr=10.0.0.5",
)


def mi(
    mount_id: int,
    parent_id: int,
    major: int,
    minor: int,
    root: str,
    mountpoint: str,
    mount_options: tuple[str, ...],
    optional_fields: tuple[str, ...],
    fstype: str,
    source: str,
    super_options: tuple[str, ...],
) -> MountInfo:
    return MountInfo(
        mount_id=mount_id,
        parent_id=parent_id,
        major=major,
        minor=minor,
        root=root,
        mountpoint=mountpoint,
        mount_options=mount_options,
        optional_fields=optional_fields,
        fstype=fstype,
        source=source,
        super_options=super_options,
    )


GOOD_LINES = [
    pytest.param(
        b"24 1 259:2 / / rw,relatime shared:1 - ext4 /dev/nvme0n1p1 rw,discard,errors=remount-ro",
        mi(24, 1, 259, 2, "/", "/", ("rw", "relatime"), ("shared:1",), "ext4", "/dev/nvme0n1p1",
           ("rw", "discard", "errors=remount-ro")),
        id="plain-ext4-root",
    ),
    pytest.param(
        b"412 29 0:53 / /run/user/0 rw,nosuid,nodev,relatime - tmpfs tmpfs rw,size=211300480k,mode=700,inode64",
        mi(412, 29, 0, 53, "/", "/run/user/0", ("rw", "nosuid", "nodev", "relatime"), (), "tmpfs", "tmpfs",
           ("rw", "size=211300480k", "mode=700", "inode64")),
        id="no-optional-fields",
    ),
    pytest.param(
        b"601 97 259:4 /exp /mnt/local-nvme/exp rw,noatime master:48 propagate_from:1 - xfs /dev/nvme1n1 rw,noquota",
        mi(601, 97, 259, 4, "/exp", "/mnt/local-nvme/exp", ("rw", "noatime"), ("master:48", "propagate_from:1"),
           "xfs", "/dev/nvme1n1", ("rw", "noquota")),
        id="two-optional-fields",
    ),
    pytest.param(
        b"700 24 0:90 / /mnt/peer rw shared:301 master:48 propagate_from:2 - tmpfs tmpfs rw",
        mi(700, 24, 0, 90, "/", "/mnt/peer", ("rw",), ("shared:301", "master:48", "propagate_from:2"), "tmpfs",
           "tmpfs", ("rw",)),
        id="three-optional-fields",
    ),
    pytest.param(
        b"602 97 259:4 /users/alice /mnt/local-nvme/users/alice rw,noatime unbindable - xfs /dev/nvme1n1 rw",
        mi(602, 97, 259, 4, "/users/alice", "/mnt/local-nvme/users/alice", ("rw", "noatime"), ("unbindable",),
           "xfs", "/dev/nvme1n1", ("rw",)),
        id="unbindable-only",
    ),
    pytest.param(
        b"514 24 259:4 /kubelet-ephemeral/81742e8f/cache /var/lib/kubelet/pods/81742e8f/volumes/kubernetes.io~empty-dir"
        b"/cache rw,noatime shared:48 - xfs /dev/nvme1n1 rw,attr2,inode64",
        mi(514, 24, 259, 4, "/kubelet-ephemeral/81742e8f/cache",
           "/var/lib/kubelet/pods/81742e8f/volumes/kubernetes.io~empty-dir/cache", ("rw", "noatime"), ("shared:48",),
           "xfs", "/dev/nvme1n1", ("rw", "attr2", "inode64")),
        id="bind-mount-root-not-slash",
    ),
    pytest.param(
        b"505 29 0:4 net:[4026533012] /run/netns/cni-2f1c rw shared:252 - nsfs nsfs rw",
        mi(505, 29, 0, 4, "net:[4026533012]", "/run/netns/cni-2f1c", ("rw",), ("shared:252",), "nsfs", "nsfs",
           ("rw",)),
        id="nsfs-root-is-not-a-path",
    ),
    pytest.param(
        b"600 97 259:4 /datasets/imagenet\\040val /mnt/local-nvme/shared\\040data rw - xfs /dev/nvme1n1 rw",
        mi(600, 97, 259, 4, "/datasets/imagenet val", "/mnt/local-nvme/shared data", ("rw",), (), "xfs",
           "/dev/nvme1n1", ("rw",)),
        id="escaped-space-in-root-and-mountpoint",
    ),
    pytest.param(
        b"601 97 259:4 / /mnt/exp\\011tabbed rw - xfs /dev/nvme1n1 rw",
        mi(601, 97, 259, 4, "/", "/mnt/exp\ttabbed", ("rw",), (), "xfs", "/dev/nvme1n1", ("rw",)),
        id="escaped-tab-in-mountpoint",
    ),
    pytest.param(
        b"602 97 259:4 / /mnt/CORP\\134alice rw - xfs /dev/nvme1n1 rw",
        mi(602, 97, 259, 4, "/", "/mnt/CORP\\alice", ("rw",), (), "xfs", "/dev/nvme1n1", ("rw",)),
        id="escaped-backslash-in-mountpoint",
    ),
    pytest.param(
        b"603 97 259:4 / /mnt/two\\012lines rw - xfs /dev/nvme1n1 rw",
        mi(603, 97, 259, 4, "/", "/mnt/two\nlines", ("rw",), (), "xfs", "/dev/nvme1n1", ("rw",)),
        id="escaped-newline-in-mountpoint",
    ),
    pytest.param(
        b"604 97 259:4 / /mnt/C:\\134\\134share\\040x rw - xfs /dev/nvme1n1 rw",
        mi(604, 97, 259, 4, "/", "/mnt/C:\\\\share x", ("rw",), (), "xfs", "/dev/nvme1n1", ("rw",)),
        id="adjacent-escapes",
    ),
    pytest.param(
        b"520 24 0:74 / /mnt/team\\040a rw,relatime shared:258 - nfs4 10.0.0.5:/exports/team\\040a "
        b"rw,vers=4.1,rsize=1048576,wsize=1048576,namlen=255,hard,proto=tcp,timeo=600,retrans=2,sec=sys,"
        b"clientaddr=10.0.1.23,local_lock=none,addr=10.0.0.5",
        mi(520, 24, 0, 74, "/", "/mnt/team a", ("rw", "relatime"), ("shared:258",), "nfs4",
           "10.0.0.5:/exports/team a", NFS_OPTS),
        id="escaped-space-in-nfs-source",
    ),
    pytest.param(
        b"540 24 252:0 / /mnt/rbd rw,relatime - ext4 /dev/rbd0 rw,stripe=16",
        mi(540, 24, 252, 0, "/", "/mnt/rbd", ("rw", "relatime"), (), "ext4", "/dev/rbd0", ("rw", "stripe=16")),
        id="major-minor-rbd",
    ),
    pytest.param(
        b"880 24 259:1048575 / /mnt/big rw - ext4 /dev/nvme9n1p9 rw",
        mi(880, 24, 259, 1048575, "/", "/mnt/big", ("rw",), (), "ext4", "/dev/nvme9n1p9", ("rw",)),
        id="major-minor-20-bit-minor",
    ),
    pytest.param(
        b"60 24 7:0 / /snap/core20/2318 ro,nodev,relatime shared:30 - squashfs /dev/loop0 ro,errors=continue",
        mi(60, 24, 7, 0, "/", "/snap/core20/2318", ("ro", "nodev", "relatime"), ("shared:30",), "squashfs",
           "/dev/loop0", ("ro", "errors=continue")),
        id="read-only-squashfs-on-loop",
    ),
    pytest.param(
        b"418 24 0:55 / /mnt/s3-datasets rw,nosuid,nodev,relatime shared:224 - fuse mountpoint-s3 "
        b"rw,user_id=0,group_id=0,default_permissions,allow_other",
        mi(418, 24, 0, 55, "/", "/mnt/s3-datasets", ("rw", "nosuid", "nodev", "relatime"), ("shared:224",), "fuse",
           "mountpoint-s3", ("rw", "user_id=0", "group_id=0", "default_permissions", "allow_other")),
        id="fuse-without-subtype",
    ),
    pytest.param(
        b"419 24 0:56 / /mnt/s3fs rw,nosuid - fuse.s3fs s3fs rw,user_id=0,group_id=0,allow_other",
        mi(419, 24, 0, 56, "/", "/mnt/s3fs", ("rw", "nosuid"), (), "fuse.s3fs", "s3fs",
           ("rw", "user_id=0", "group_id=0", "allow_other")),
        id="fuse-with-subtype",
    ),
    pytest.param(
        b"33 25 0:28 / /sys/fs/cgroup rw,nosuid shared:9 - cgroup2 cgroup2",
        mi(33, 25, 0, 28, "/", "/sys/fs/cgroup", ("rw", "nosuid"), ("shared:9",), "cgroup2", "cgroup2", ()),
        id="missing-super-options",
    ),
    pytest.param(
        # mount(2) with an empty source string: the kernel prints an empty field, i.e. two spaces in a row.
        b"44 27 0:41 / /mnt/empty-source rw,relatime - tmpfs  rw,size=4k",
        mi(44, 27, 0, 41, "/", "/mnt/empty-source", ("rw", "relatime"), (), "tmpfs", "", ("rw", "size=4k")),
        id="empty-source",
    ),
    pytest.param(
        # Only space, tab, newline and backslash are escaped: a carriage return is printed raw.
        b"45 27 0:42 / /mnt/b\rc rw,relatime - tmpfs swcr rw",
        mi(45, 27, 0, 42, "/", "/mnt/b\rc", ("rw", "relatime"), (), "tmpfs", "swcr", ("rw",)),
        id="raw-carriage-return-in-mountpoint",
    ),
    pytest.param(
        b"46 27 0:43 / /mnt/v\x0bf\x0c rw - tmpfs tmpfs rw",
        mi(46, 27, 0, 43, "/", "/mnt/v\x0bf\x0c", ("rw",), (), "tmpfs", "tmpfs", ("rw",)),
        id="raw-vertical-tab-and-form-feed-in-mountpoint",
    ),
    pytest.param(
        b"47 27 0:44 / /mnt/- rw - tmpfs - rw",
        mi(47, 27, 0, 44, "/", "/mnt/-", ("rw",), (), "tmpfs", "-", ("rw",)),
        id="source-that-is-a-dash",
    ),
    pytest.param(
        # An escaped backslash followed by the digits 000 is a backslash and three zeros, not a NUL.
        b"48 27 0:45 / /mnt/a\\134000 rw - tmpfs tmpfs rw",
        mi(48, 27, 0, 45, "/", "/mnt/a\\000", ("rw",), (), "tmpfs", "tmpfs", ("rw",)),
        id="escaped-backslash-then-zeros",
    ),
]  # fmt: skip


@pytest.mark.parametrize(("line", "expected"), GOOD_LINES)
def test_parse_line(line: bytes, expected: MountInfo) -> None:
    assert parse_line(line) == expected


NON_UTF8 = [
    pytest.param(b"603 97 259:4 /users/jos\xe9 /mnt/users/jos\xe9 ro - xfs /dev/nvme1n1 rw", id="raw-latin1-byte"),
    pytest.param(b"603 97 259:4 /users/jos\\351 /mnt/users/jos\\351 ro - xfs /dev/nvme1n1 rw", id="octal-escaped-byte"),
    pytest.param(b"603 97 259:4 /users/jos\xe9 /mnt/users/jos\\351 ro - xfs /dev/nvme1n1 rw", id="mixed"),
]


@pytest.mark.parametrize("line", NON_UTF8)
def test_non_utf8_paths_round_trip_to_the_raw_bytes(line: bytes) -> None:
    info = parse_line(line)
    assert os.fsencode(info.mountpoint) == b"/mnt/users/jos\xe9"
    assert os.fsencode(info.root) == b"/users/jos\xe9"
    # Not a lossy decode: the byte survives as a lone surrogate, not as U+FFFD or a Latin-1 "é".
    assert "\ufffd" not in info.mountpoint
    assert "é" not in info.mountpoint
    assert info.mount_options == ("ro",)
    assert info.readonly is True


def test_raw_ff_byte_round_trips() -> None:
    info = parse_line(b"1 2 0:1 / /x\xff\xfey rw - tmpfs src\xff rw")
    assert os.fsencode(info.mountpoint) == b"/x\xff\xfey"
    assert os.fsencode(info.source) == b"src\xff"


BAD_LINES = [
    pytest.param(b"24 1 259:2 / / rw,relatime shared:1 ext4 /dev/nvme0n1p1 rw", "no ' - ' separator",
                 id="no-separator"),
    pytest.param(b"24 1 259:2 / - ext4 /dev/nvme0n1p1 rw", "no ' - ' separator", id="separator-too-early"),
    pytest.param(b"24 1 259:2 /", "no ' - ' separator", id="too-few-fields-truncated-early"),
    pytest.param(b"24 1 259:2 / / rw,relatime shared:1 - ext4", "expected at least 10 fields, got 9",
                 id="too-few-fields-no-source"),
    pytest.param(b"24 1 259:2 / / rw -", "expected at least 10 fields, got 7", id="too-few-fields-ends-at-separator"),
    pytest.param(b"x24 1 259:2 / / rw - ext4 /dev/sda1 rw", "mount ID, parent ID or MAJOR:MINOR is not numeric",
                 id="non-numeric-mount-id"),
    pytest.param(b"24 one 259:2 / / rw - ext4 /dev/sda1 rw", "mount ID, parent ID or MAJOR:MINOR is not numeric",
                 id="non-numeric-parent-id"),
    pytest.param(b"24 1 259-2 / / rw - ext4 /dev/sda1 rw", "mount ID, parent ID or MAJOR:MINOR is not numeric",
                 id="major-minor-without-colon"),
    pytest.param(b"24 1 nvme:2 / / rw - ext4 /dev/sda1 rw", "mount ID, parent ID or MAJOR:MINOR is not numeric",
                 id="non-numeric-major"),
    pytest.param(b"\x00\x00\xde\xad garbage", "no ' - ' separator", id="garbage"),
    pytest.param(b"", "no ' - ' separator", id="empty"),
    # The kernel prints C strings: \000 (or a raw NUL) in a path is a torn or forged line, and no system call could
    # take that path.
    pytest.param(b"99 24 0:80 / /mnt/bad\\000name rw - tmpfs tmpfs rw", "mount point holds a NUL byte",
                 id="escaped-nul-in-mountpoint"),
    pytest.param(b"99 24 0:80 /x\\0001 /mnt/a rw - ext4 /dev/sda1 rw", "root holds a NUL byte",
                 id="escaped-nul-in-root"),
    pytest.param(b"99 24 0:80 / /mnt/a rw - tmpfs tmp\x00fs rw", "source holds a NUL byte", id="raw-nul-in-source"),
    pytest.param(b"99 24 0:80 / /mnt/a\\134\\000 rw - tmpfs tmpfs rw", "mount point holds a NUL byte",
                 id="escaped-backslash-then-escaped-nul"),
]  # fmt: skip


@pytest.mark.parametrize(("line", "message"), BAD_LINES)
def test_parse_line_errors(line: bytes, message: str) -> None:
    with pytest.raises(MountInfoError) as excinfo:
        parse_line(line, lineno=17)
    err = excinfo.value
    assert message in str(err)
    assert err.lineno == 17
    assert str(err).startswith("line 17: ")
    # The offending line is kept (as text) so a log says what was skipped.
    assert err.line == line.decode("utf-8", "backslashreplace")
    assert isinstance(err, ValueError)


@pytest.mark.parametrize(
    ("escaped", "expected"),
    [
        (b"/a\\040b", "/a b"),
        (b"/a\\011b", "/a\tb"),
        (b"/a\\012b", "/a\nb"),
        (b"/a\\134b", "/a\\b"),
        (b"/a\\134040b", "/a\\040b"),  # an escaped backslash followed by digits is not a second escape
        (b"/a\\08b", "/a\\08b"),  # not three octal digits: left alone
        (b"/plain", "/plain"),
    ],
    ids=["space", "tab", "newline", "backslash", "backslash-then-digits", "not-octal", "nothing-to-undo"],
)
def test_unescape(escaped: bytes, expected: str) -> None:
    assert unescape(escaped) == expected


def test_readonly_and_device_number() -> None:
    rw = parse_line(b"97 24 259:4 / /mnt/local-nvme rw,noatime shared:48 - xfs /dev/nvme1n1 rw,attr2")
    assert rw.readonly is False
    assert rw.device_number == "259:4"
    # Read-only at the superblock only (e.g. ext4 remounted ro after errors): still read-only.
    sb_ro = parse_line(b"24 1 259:2 / / rw,relatime - ext4 /dev/nvme0n1p1 ro,errors=remount-ro")
    assert sb_ro.readonly is True


def test_gpu_node_fixture_parses_whole() -> None:
    mounts, errors = parse_mountinfo(GPU_NODE_MOUNTINFO.read_bytes())
    assert errors == []
    assert len(mounts) == 47
    by_id = {m.mount_id: m for m in mounts}
    assert len(by_id) == 47, "mount IDs are unique in one namespace"
    assert by_id[24].mountpoint == "/" and by_id[24].parent_id == 1 and by_id[24].source == "/dev/nvme0n1p1"
    # The stacked /home: a local ext4 partition, hidden by NFS mounted on top of it (its parent is the ext4 mount).
    homes = [m for m in mounts if m.mountpoint == "/home"]
    assert [(m.mount_id, m.fstype, m.source) for m in homes] == [
        (95, "ext4", "/dev/nvme0n1p2"),
        (410, "nfs4", "10.0.0.5:/home"),
    ]
    assert homes[1].parent_id == homes[0].mount_id
    assert by_id[600].mountpoint == "/mnt/local-nvme/shared data"
    assert by_id[600].root == "/datasets/imagenet val"
    assert by_id[600].optional_fields == ("shared:301", "master:48")
    assert by_id[601].mountpoint == "/mnt/local-nvme/exp\ttabbed"
    assert by_id[601].optional_fields == ("master:48", "propagate_from:1")
    assert by_id[602].mountpoint == "/mnt/local-nvme/users/CORP\\alice"
    assert by_id[602].optional_fields == ("unbindable",)
    assert os.fsencode(by_id[603].mountpoint) == b"/mnt/local-nvme/users/jos\xe9"
    assert by_id[603].readonly is True
    assert by_id[418].fstype == "fuse" and by_id[418].source == "mountpoint-s3"
    assert by_id[505].root == "net:[4026533012]"
    assert by_id[540].device_number == "252:0"


def test_gpu_node_fixture_bytes_are_as_the_kernel_prints_them() -> None:
    data = GPU_NODE_MOUNTINFO.read_bytes()
    assert data.endswith(b"\n")
    # Octal escapes are literal backslash-digit text; a non-UTF-8 byte is printed raw, never escaped.
    assert b"\\040" in data and b"\\011" in data and b"\\134" in data
    assert b"jos\xe9 " in data
    assert b"\\351" not in data
    assert b"\t" not in data
    with pytest.raises(UnicodeDecodeError):
        data.decode("utf-8")


def test_malformed_fixture_keeps_good_lines_and_numbers_bad_ones() -> None:
    mounts, errors = parse_mountinfo(MALFORMED_MOUNTINFO.read_bytes())
    assert [m.mountpoint for m in mounts] == ["/", "/sys", "/run", "/mnt/local-nvme", "/home", "/lustre"]
    assert [e.lineno for e in errors] == [5, 7, 9]
    truncated, garbage, nul = errors
    assert "mount point holds a NUL byte" in str(nul) and "/mnt/torn\\000read" in nul.line
    assert "expected at least 10 fields" in str(truncated)
    assert truncated.line.startswith("516 24 0:74 / /var/lib/kubelet/pods/")
    assert truncated.line.endswith("- nfs4")
    assert "no ' - ' separator" in str(garbage)
    assert "garbage" in garbage.line


def test_blank_lines_are_skipped_but_counted() -> None:
    data = b"\n24 1 259:2 / / rw - ext4 /dev/sda1 rw\n\nbroken\n"
    mounts, errors = parse_mountinfo(data)
    assert [m.mountpoint for m in mounts] == ["/"]
    assert [e.lineno for e in errors] == [4]
