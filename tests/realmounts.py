"""Real mounts for tests: tmpfs, ext4 on a loop device, overlayfs, and a FUSE passthrough that can be slow or hang.

Everything here needs root (CAP_SYS_ADMIN). When a part cannot be had, the helpers raise
:class:`RealPartUnavailable` with the reason; the tests turn that into ``pytest.skip`` (or a failure in CI).

Every context manager tears down in a ``finally``: it runs when the test failed, too, and leaves no mount here and
nothing of the test's own holding a loop device. It waits only for what the test holds: another process's mount
namespace, made while a mount existed, keeps a copy of it for as long as it lives, so a loop device is set to
autoclear once mounted and the kernel detaches it when the last copy goes. Teardown never calls ``stat``/``statvfs``
on a mount that may hang: mounts are looked up in ``/proc/self/mountinfo`` only, and a FUSE mount is released by
aborting its connection through fusectl before it is lazily unmounted.

All external commands are run with argument lists (no shell) and a timeout.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
import importlib.util
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

__all__ = [
    "FUSECTL_DIR",
    "FUSEFS_SCRIPT",
    "DiskStats",
    "FuseMount",
    "Holder",
    "LoopMount",
    "MountError",
    "MountInfo",
    "OverlayMount",
    "RealPartUnavailable",
    "TmpfsMount",
    "average_write_latency_ms",
    "ensure_fusectl",
    "find_mount",
    "fuse_connection_id",
    "fuse_mount",
    "is_mounted",
    "is_root",
    "loop_devices_for",
    "loop_devices_left_behind",
    "loop_ext4_mount",
    "overlay_mount",
    "read_diskstats",
    "read_mountinfo",
    "require_fuse",
    "require_loop",
    "require_mkfs_ext4",
    "require_root",
    "require_tool",
    "tmpfs_mount",
    "unmount",
]

FUSEFS_SCRIPT = Path(__file__).resolve().with_name("fusefs.py")
FUSECTL_DIR = "/sys/fs/fuse/connections"
MOUNTINFO = "/proc/self/mountinfo"

# Sources shown in the mount table, so that a leftover mount can be told apart from the machine's own.
TMPFS_SOURCE = "storwatch-tmpfs"
OVERLAY_SOURCE = "storwatch-overlay"
FUSE_FSNAME = "storwatch-fusefs"
IMAGE_PREFIX = "storwatch-test-"

_CMD_TIMEOUT = 30.0
_MNT_DETACH = 2

# Mountpoints of live fuse_mount(..., block_statfs=True) mounts (see loop_ext4_mount).
_STATFS_BLOCKING: set[str] = set()
_STATFS_BLOCKING_LOCK = threading.Lock()


class RealPartUnavailable(Exception):
    """A real part of the machine (root, /dev/fuse, loop devices, mkfs.ext4, libfuse3 ...) cannot be had."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class MountError(RuntimeError):
    """Setting up or tearing down a real mount failed although the parts are there."""


# ---------------------------------------------------------------------------------------------------------
# prerequisites


def is_root() -> bool:
    return os.geteuid() == 0


def require_root() -> None:
    if not is_root():
        raise RealPartUnavailable(f"needs root (CAP_SYS_ADMIN) for mounts; running as uid {os.geteuid()}")


def require_tool(name: str) -> str:
    """Return the path of command ``name`` (also looked up in the sbin directories) or raise."""
    path = shutil.which(name) or shutil.which(name, path="/usr/local/sbin:/usr/sbin:/sbin")
    if path is None:
        raise RealPartUnavailable(f"command {name!r} not found")
    return path


def require_mkfs_ext4() -> str:
    return require_tool("mkfs.ext4")


def require_loop() -> None:
    require_root()
    if not os.path.exists("/dev/loop-control") and not os.path.exists("/dev/loop0"):
        raise RealPartUnavailable("no loop devices (/dev/loop-control missing)")
    require_tool("losetup")
    require_tool("mount")
    require_tool("umount")


def require_fuse() -> None:
    require_root()
    if not os.path.exists("/dev/fuse"):
        raise RealPartUnavailable("/dev/fuse does not exist")
    if ctypes.util.find_library("fuse3") is None:
        raise RealPartUnavailable("libfuse3 not found (install Debian libfuse3-3)")
    if importlib.util.find_spec("mfusepy") is None:
        raise RealPartUnavailable("Python package mfusepy is not installed")
    if not FUSEFS_SCRIPT.is_file():
        raise RealPartUnavailable(f"{FUSEFS_SCRIPT} is missing")
    require_tool("umount")


# ---------------------------------------------------------------------------------------------------------
# commands


def _run(args: Sequence[str], timeout: float = _CMD_TIMEOUT, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run a command (argument list, no shell) with a timeout that holds even for a child stuck in the kernel.

    ``subprocess.run`` waits without limit for a timed-out child after killing it; a child blocked on a hung
    FUSE request (state D once signalled) never dies, so here the wait after the kill is bounded too.
    """
    argv = [os.fspath(a) for a in args]
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        try:
            proc.wait(5.0)
            state = "killed"
        except subprocess.TimeoutExpired:
            state = f"pid {proc.pid} stuck in the kernel, left behind"
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()
        raise MountError(f"{' '.join(argv)}: timed out after {timeout:.0f} s ({state})") from None
    result = subprocess.CompletedProcess(argv, proc.returncode, stdout, stderr)
    if check and result.returncode != 0:
        raise MountError(f"{' '.join(argv)}: exit {result.returncode}: {(stderr or stdout).strip()}")
    return result


# ---------------------------------------------------------------------------------------------------------
# the mount table (read from /proc only: never stat a mount that may hang)


@dataclass(frozen=True)
class MountInfo:
    mount_id: int
    parent_id: int
    major: int
    minor: int
    root: str
    mountpoint: str
    options: str
    fstype: str
    source: str
    super_options: str

    @property
    def dev(self) -> int:
        """The kernel's internal dev_t (what fusectl names connections by): major << 20 | minor."""
        return (self.major << 20) | self.minor


def _unescape(text: str) -> str:
    # mountinfo escapes space, tab, newline and backslash as \ooo
    if "\\" not in text:
        return text
    out: list[str] = []
    i = 0
    while i < len(text):
        code = text[i + 1 : i + 4]
        if text[i] == "\\" and len(code) == 3 and all(c in "01234567" for c in code):
            out.append(chr(int(code, 8)))
            i += 4
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def read_mountinfo(path: str = MOUNTINFO) -> list[MountInfo]:
    entries: list[MountInfo] = []
    with open(path, encoding="utf-8", errors="surrogateescape") as fh:
        for line in fh:
            fields = line.split()
            try:
                sep = fields.index("-", 6)
            except ValueError:
                continue
            major, minor = fields[2].split(":")
            entries.append(
                MountInfo(
                    mount_id=int(fields[0]),
                    parent_id=int(fields[1]),
                    major=int(major),
                    minor=int(minor),
                    root=_unescape(fields[3]),
                    mountpoint=_unescape(fields[4]),
                    options=fields[5],
                    fstype=fields[sep + 1],
                    source=_unescape(fields[sep + 2]) if len(fields) > sep + 2 else "",
                    super_options=fields[sep + 3] if len(fields) > sep + 3 else "",
                )
            )
    return entries


def find_mount(mountpoint: str | os.PathLike[str]) -> MountInfo | None:
    """The topmost mount at exactly ``mountpoint`` (an absolute, already resolved path), or None."""
    target = os.fspath(mountpoint)
    found = None
    for entry in read_mountinfo():
        if entry.mountpoint == target:
            found = entry  # later lines are mounted on top
    return found


def is_mounted(mountpoint: str | os.PathLike[str]) -> bool:
    return find_mount(mountpoint) is not None


@functools.cache
def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def _umount2_detach(mountpoint: str) -> None:
    libc = _libc()
    if libc.umount2(os.fsencode(mountpoint), _MNT_DETACH) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), mountpoint)


def unmount(mountpoint: str | os.PathLike[str], lazy: bool = False, timeout: float = _CMD_TIMEOUT) -> None:
    """Unmount everything stacked at ``mountpoint``; falls back to a lazy unmount when busy.

    ``umount -c`` (no canonicalisation) is used so that the command does not look up the mounted path.
    """
    target = os.fspath(mountpoint)
    for _ in range(8):
        if not is_mounted(target):
            return
        if not lazy:
            proc = _run(["umount", "-c", target], timeout=timeout, check=False)
            if proc.returncode == 0 or not is_mounted(target):
                continue
        proc = _run(["umount", "-l", "-c", target], timeout=timeout, check=False)
        if proc.returncode != 0 and is_mounted(target):
            try:
                _umount2_detach(target)
            except OSError as exc:
                if is_mounted(target):
                    raise MountError(f"cannot unmount {target}: {proc.stderr.strip()}; umount2: {exc}") from exc
    if is_mounted(target):
        raise MountError(f"{target} is still mounted")


def _prepare_mountpoint(path: str | os.PathLike[str]) -> str:
    """Create the directory and return its resolved path (done before anything is mounted there)."""
    os.makedirs(path, exist_ok=True)
    resolved = os.path.realpath(path)
    if is_mounted(resolved):
        raise MountError(f"{resolved} is already a mount point")
    return resolved


# ---------------------------------------------------------------------------------------------------------
# tmpfs


@dataclass
class TmpfsMount:
    mountpoint: Path
    size: str


@contextlib.contextmanager
def tmpfs_mount(dir: str | os.PathLike[str], size: str = "16m") -> Iterator[TmpfsMount]:
    """Mount a tmpfs of ``size`` at ``dir`` (created if missing)."""
    require_root()
    require_tool("mount")
    target = _prepare_mountpoint(dir)
    with contextlib.ExitStack() as stack:
        _run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", TMPFS_SOURCE, target])
        stack.callback(unmount, target)
        yield TmpfsMount(mountpoint=Path(target), size=size)


# ---------------------------------------------------------------------------------------------------------
# ext4 on a loop device


@dataclass
class LoopMount:
    mountpoint: Path
    loop_device: str  # e.g. /dev/loop3
    image: Path

    @property
    def loop_name(self) -> str:
        """The name in /proc/diskstats and /sys/block, e.g. ``loop3``."""
        return os.path.basename(self.loop_device)


def _backed_by(name: str, image: str) -> bool | None:
    """Whether loop device ``name`` (e.g. ``loop3``) is attached to ``image``; None when it is attached to nothing.
    Read from /sys, never from the image's filesystem."""
    try:
        with open(f"/sys/block/{name}/loop/backing_file", encoding="utf-8") as fh:
            backing = fh.read().strip()
    except OSError:
        return None
    backing = backing.removesuffix(" (deleted)")
    # Once the image's filesystem is lazily unmounted, the kernel shows the path from that filesystem's root only:
    # match our uniquely named images by name then.
    unique = os.path.basename(image).startswith(IMAGE_PREFIX)
    return backing == image or (unique and os.path.basename(backing) == os.path.basename(image))


def loop_devices_for(image: str | os.PathLike[str]) -> list[str]:
    """Loop devices whose backing file is ``image``."""
    target = os.fspath(image)
    found = []
    with contextlib.suppress(FileNotFoundError):
        for name in sorted(os.listdir("/sys/block")):
            if name.startswith("loop") and _backed_by(name, target):
                found.append(f"/dev/{name}")
    return found


def _autoclear(name: str) -> bool:
    """Whether loop device ``name`` is set to detach itself when its last holder goes (LO_FLAGS_AUTOCLEAR)."""
    try:
        with open(f"/sys/block/{name}/loop/autoclear", encoding="ascii") as fh:
            return fh.read().strip() == "1"
    except OSError:
        return False


_AT_FDCWD = -100
_AT_STATX_DONT_SYNC = 0x4000
_STATX_SIZE = 256
_STATX_DEV_OFFSET = 136  # stx_dev_major and stx_dev_minor, two __u32, in struct statx


def _device_of(path: str) -> tuple[int, int] | None:
    """The (major, minor) of the filesystem holding ``path`` (e.g. ``/proc/PID/fd/3``, followed), or None.

    Asked with statx(AT_STATX_DONT_SYNC): the filesystem answers from its cache, so a file on a FUSE mount whose
    daemon never answers does not hang the call, as a plain stat of it would."""
    libc = _libc()
    if not hasattr(libc, "statx"):  # glibc < 2.28
        try:
            st_dev = os.stat(path).st_dev
        except OSError:
            return None
        return os.major(st_dev), os.minor(st_dev)
    buf = ctypes.create_string_buffer(_STATX_SIZE)
    if libc.statx(_AT_FDCWD, os.fsencode(path), _AT_STATX_DONT_SYNC, 0, buf) != 0:
        return None
    major, minor = struct.unpack_from("=II", buf, _STATX_DEV_OFFSET)
    return major, minor


def _this_tests_processes() -> set[int]:
    """This process and every process it started (its descendants by parent PID): what a test holds itself."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as fh:
                stat = fh.read()
        except OSError:
            continue
        ppid = int(stat[stat.rindex(b")") + 2 :].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    tree: set[int] = set()
    todo = [os.getpid()]
    while todo:
        pid = todo.pop()
        if pid not in tree:
            tree.add(pid)
            todo.extend(children.get(pid, ()))
    return tree


@dataclass(frozen=True)
class Holder:
    """Something that keeps a (lazily unmounted) filesystem, and with it its loop device, alive."""

    what: str  # "PID (NAME, state S, in WCHAN): fd 3 /x, cwd" or "the mount namespace mnt:[N] of PIDS: mounted at P"
    ours: bool  # a process of this test (itself or one it started): what its teardown waits for


def _holders(device: str, only_this_test: bool = False) -> list[Holder]:
    """What holds the filesystem on block device ``device``: processes with a file open or mapped there, or their
    working or root directory on it, and other mount namespaces that still have it mounted (a namespace holds a
    copy of each mount there was when it was made). Found by device number, as the paths of a lazily unmounted
    filesystem no longer say where it was. ``only_this_test``: look at this test's processes only (and at no
    namespace)."""
    try:
        rdev = os.stat(device).st_rdev
    except OSError:
        return []
    major, minor = os.major(rdev), os.minor(rdev)
    mapped = f" {major:02x}:{minor:02x} "
    ours = _this_tests_processes()
    pids = sorted(ours) if only_this_test else [int(p) for p in os.listdir("/proc") if p.isdigit()]
    found = []
    namespaces: dict[str, list[int]] = {}
    for pid in pids:
        base = f"/proc/{pid}"
        what: list[str] = []
        with contextlib.suppress(OSError):
            if not only_this_test:
                namespaces.setdefault(os.readlink(f"{base}/ns/mnt"), []).append(pid)
            for link in ("cwd", "root"):
                if _device_of(f"{base}/{link}") == (major, minor):
                    what.append(link)
            for fd in os.listdir(f"{base}/fd"):
                if _device_of(f"{base}/fd/{fd}") == (major, minor):
                    with contextlib.suppress(OSError):
                        what.append(f"fd {fd} {os.readlink(f'{base}/fd/{fd}')}")
            with open(f"{base}/maps", encoding="utf-8", errors="replace") as fh:
                what += [f"maps {line.split()[-1]}" for line in fh if mapped in line][:3]
        if what:
            state = wchan = comm = "?"
            with contextlib.suppress(OSError):
                comm = Path(f"{base}/comm").read_text().strip()
                state = Path(f"{base}/stat").read_text().rsplit(")", 1)[1].split()[0]
                wchan = Path(f"{base}/wchan").read_text().strip() or "-"
            found.append(Holder(f"{pid} ({comm}, state {state}, in {wchan}): {', '.join(what[:6])}", pid in ours))
    own = os.readlink("/proc/self/ns/mnt")
    for ns, members in namespaces.items():
        if ns == own:
            continue
        with contextlib.suppress(OSError):
            points = [
                e.mountpoint
                for e in read_mountinfo(f"/proc/{members[0]}/mountinfo")
                if (e.major, e.minor) == (major, minor)
            ]
            if points:
                shown = ", ".join(map(str, members[:5])) + (f" and {len(members) - 5} more" if len(members) > 5 else "")
                found.append(Holder(f"the mount namespace {ns} of {shown}: mounted at {points[0]}", False))
    return found


def _wait_until_this_test_lets_go(device: str, image: str | os.PathLike[str], timeout: float = 10.0) -> None:
    """Wait until no process of this test (this one and those it started) holds the filesystem on ``device`` (while
    it still serves ``image``): a file open or mapped there, a working or root directory. Nothing else is waited
    for: another process's mount namespace made while the mount existed holds a copy of it for as long as it lives,
    and the device, set to autoclear, is then freed by the kernel when that copy goes."""
    name = os.path.basename(device)
    target = os.fspath(image)
    deadline = time.monotonic() + timeout
    while _backed_by(name, target):
        ours = _holders(device, only_this_test=True)
        if not ours:
            return
        if time.monotonic() > deadline:
            others = [h.what for h in _holders(device) if not h.ours]
            raise MountError(
                f"the filesystem on {device} (lazily unmounted) is still held by this test after {timeout:.0f} s:"
                f" {'; '.join(h.what for h in ours)}"
                + (f"; also held, not waited for: {'; '.join(others)}" if others else "")
            )
        time.sleep(0.1)


def _release_loop(device: str, image: str | os.PathLike[str]) -> None:
    """Hand ``device`` to the kernel while it serves ``image``: ``losetup -d`` detaches it at once when nothing holds
    it, else sets autoclear, so that the kernel detaches it when its last holder goes (the mounted filesystem, or a
    copy of the mount in another mount namespace). Never waits for that. A device that serves another image (its
    number was free, and someone took it) is left alone."""
    name = os.path.basename(device)
    target = os.fspath(image)
    if not _backed_by(name, target) or _autoclear(name):
        return
    proc = _run(["losetup", "-d", device], check=False)
    if _backed_by(name, target) and not _autoclear(name):
        said = (proc.stderr or proc.stdout).strip() or f"exit {proc.returncode}"
        raise MountError(f"losetup -d {device}: {said}; it is still attached to {target}, without autoclear")


def loop_devices_left_behind(image: str | os.PathLike[str]) -> list[str]:
    """What of ``image``'s loop devices a test still keeps after its teardown: a device attached without autoclear
    (nothing would ever detach it), or one a process of this test holds. Empty when a device is left to the kernel
    only, held by others (a copy of the mount in another process's mount namespace) until they go."""
    left = []
    for device in loop_devices_for(image):
        name = os.path.basename(device)
        if not _autoclear(name):
            left.append(f"{device}: attached to {os.fspath(image)} without autoclear")
        left += [f"{device}: held by {h.what}" for h in _holders(device, only_this_test=True)]
    return left


@contextlib.contextmanager
def loop_ext4_mount(
    dir: str | os.PathLike[str],
    size_mb: int = 64,
    image_dir: str | os.PathLike[str] | None = None,
    mkfs_args: Sequence[str] = (),
    mount_options: str | None = None,
    mkfs_timeout: float = 300.0,
    losetup_args: Sequence[str] = (),
    preallocate: bool = False,
    mkfs_via: str | os.PathLike[str] | None = None,
) -> Iterator[LoopMount]:
    """An ext4 image of ``size_mb`` MiB (sparse, or written through with zeros with ``preallocate``) on its own loop
    device, mounted at ``dir``.

    The image goes into ``image_dir`` (e.g. a FUSE mount, to give the loop device latency) or a fresh
    temporary directory. ``losetup_args`` such as ``--direct-io=on`` (the loop device then bypasses the page cache of
    its image, so its writes cost what the disk under it costs). ``preallocate`` gives every block of the image a
    place on the disk under it before mkfs, as a real disk has: a write into a sparse image's hole costs an
    allocation in the filesystem under it that a write into a written block does not, so timings on a sparse image
    depend on which blocks were written before. ``mkfs_via``: a directory that holds the same files as
    ``image_dir`` another way (the backing directory of a FUSE passthrough mounted at ``image_dir``): the image is
    made and formatted there, so a FUSE filesystem that delays writes slows the loop device's I/O and not mkfs's
    hundreds of small writes (seconds each image).

    Once mounted, the device is set to autoclear (``losetup -d`` of a device in use). Teardown: unmount (lazily if
    busy); wait until no process of this test (this one and those it started) holds the filesystem, up to 10 s, then
    fail naming them; remove the image (unlink works while the device still holds it). Other processes and mount
    namespaces (a copy of the mount, made while it existed) are not waited for: the kernel detaches the device when
    they go, so its number may stay taken for a while after the test.
    """
    require_loop()
    mkfs = require_mkfs_ext4()
    if image_dir is not None:
        _refuse_statfs_blocking(image_dir)
    target = _prepare_mountpoint(dir)
    with contextlib.ExitStack() as stack:
        if image_dir is None:
            image_dir = tempfile.mkdtemp(prefix="storwatch-img-")
            stack.callback(shutil.rmtree, image_dir, True)
        image = Path(image_dir, f"{IMAGE_PREFIX}{uuid.uuid4().hex[:12]}.img")
        made = image if mkfs_via is None else Path(mkfs_via, image.name)
        stack.callback(_remove_image, image)
        with open(made, "wb") as fh:
            if preallocate:
                zeros = bytes(1 << 20)
                for _ in range(size_mb):
                    fh.write(zeros)
                fh.flush()
                os.fsync(fh.fileno())
            else:
                fh.truncate(size_mb * 1024 * 1024)
        _run([mkfs, "-q", "-F", *mkfs_args, os.fspath(made)], timeout=mkfs_timeout)
        try:
            loop_device = _run(["losetup", "-f", "--show", *losetup_args, os.fspath(image)]).stdout.strip()
        except MountError:
            # losetup may be stuck in the kernel (LOOP_CONFIGURE statfs's the backing file) and attach the
            # device later, when whatever blocks it is released: detach it then.
            _start_loop_reaper(image)
            raise
        if not loop_device.startswith("/dev/loop"):
            # be safe: detach whatever got attached to this image
            for dev in loop_devices_for(image):
                stack.callback(_release_loop, dev, image)
            raise MountError(f"losetup -f --show printed {loop_device!r}")
        stack.callback(_release_loop, loop_device, image)
        cmd = ["mount", "-t", "ext4"]
        if mount_options:
            cmd += ["-o", mount_options]
        _run([*cmd, loop_device, target])
        stack.callback(_wait_until_this_test_lets_go, loop_device, image)
        stack.callback(unmount, target)
        # The mount holds the device now: autoclear leaves it to the kernel, which detaches it when the filesystem's
        # last holder goes, be it the mount here or a copy in another process's mount namespace.
        _release_loop(loop_device, image)
        yield LoopMount(mountpoint=Path(target), loop_device=loop_device, image=image)


def _refuse_statfs_blocking(image_dir: str | os.PathLike[str]) -> None:
    resolved = os.path.realpath(image_dir)
    with _STATFS_BLOCKING_LOCK:
        blocking = sorted(_STATFS_BLOCKING)
    for mountpoint in blocking:
        if resolved == mountpoint or resolved.startswith(mountpoint + os.sep):
            raise MountError(
                f"image_dir {resolved} is on a FUSE mount whose statfs blocks: the kernel's LOOP_CONFIGURE"
                " calls statfs on the backing file, so losetup would hang"
            )


def _start_loop_reaper(image: Path, timeout: float = 120.0) -> None:
    """Detach any loop device that gets attached to ``image`` within ``timeout`` (in a daemon thread)."""

    def reap() -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            devices = loop_devices_for(image)
            for device in devices:
                with contextlib.suppress(MountError):
                    _release_loop(device, image)
            if devices:
                return
            time.sleep(0.2)

    threading.Thread(target=reap, name=f"loop-reaper-{image.name}", daemon=True).start()


def _remove_image(path: Path, timeout: float = 10.0) -> None:
    """Remove ``path``, giving up after ``timeout``: on a stuck FUSE mount even unlink can block.

    (libfuse's high-level API holds a lock on a path while a request on it, such as a blocked statfs, runs.)
    A given-up unlink runs on in a daemon thread and ends when the FUSE connection is aborted.
    """
    error: list[BaseException] = []

    def remove() -> None:
        try:
            path.unlink()
        except FileNotFoundError:
            pass
        except BaseException as exc:
            error.append(exc)

    thread = threading.Thread(target=remove, name=f"remove-{path.name}", daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        raise MountError(f"removing {path} did not finish within {timeout:.0f} s (its filesystem hangs?)")
    if error:
        raise MountError(f"removing {path}: {error[0]}")


# ---------------------------------------------------------------------------------------------------------
# overlayfs


@dataclass
class OverlayMount:
    mountpoint: Path  # dir/merged
    lower: Path
    upper: Path
    work: Path


@contextlib.contextmanager
def overlay_mount(dir: str | os.PathLike[str]) -> Iterator[OverlayMount]:
    """An overlayfs at ``dir/merged`` over ``dir/lower``, with ``dir/upper`` and ``dir/work``.

    Put files into ``.lower`` before entering if the lower layer should have content.
    """
    require_root()
    require_tool("mount")
    base = Path(os.path.realpath(dir))
    lower, upper, work, merged = (base / name for name in ("lower", "upper", "work", "merged"))
    for path in (lower, upper, work):
        path.mkdir(parents=True, exist_ok=True)
    for path in (lower, upper, work):
        if any(ch in os.fspath(path) for ch in ",:\\ "):
            raise MountError(f"overlay paths must not contain , : \\ or spaces: {path}")
    target = _prepare_mountpoint(merged)
    with contextlib.ExitStack() as stack:
        proc = _run(
            [
                "mount",
                "-t",
                "overlay",
                "-o",
                f"lowerdir={lower},upperdir={upper},workdir={work}",
                OVERLAY_SOURCE,
                target,
            ],
            check=False,
        )
        if proc.returncode != 0:
            message = (proc.stderr or proc.stdout).strip()
            if "unknown filesystem type" in message:
                raise RealPartUnavailable(f"overlayfs is not available: {message}")
            raise MountError(f"mount -t overlay at {target}: {message}")
        stack.callback(unmount, target)
        yield OverlayMount(mountpoint=Path(target), lower=lower, upper=upper, work=work)


# ---------------------------------------------------------------------------------------------------------
# FUSE


def ensure_fusectl() -> None:
    """Mount fusectl at /sys/fs/fuse/connections unless it is mounted already."""
    if any(entry.fstype == "fusectl" for entry in read_mountinfo()):
        return
    if not os.path.isdir(FUSECTL_DIR):
        raise RealPartUnavailable(f"{FUSECTL_DIR} does not exist (fuse module not loaded?)")
    proc = _run(["mount", "-t", "fusectl", "none", FUSECTL_DIR], check=False)
    if proc.returncode != 0 and not any(entry.fstype == "fusectl" for entry in read_mountinfo()):
        raise MountError(f"cannot mount fusectl: {(proc.stderr or proc.stdout).strip()}")


def fuse_connection_id(entry: MountInfo) -> int:
    """The fusectl connection number of a FUSE mount: its st_dev, taken from mountinfo's major:minor."""
    return entry.dev


@dataclass
class FuseMount:
    mountpoint: Path
    backing: Path
    proc: subprocess.Popen[bytes]
    connection: int  # directory name under /sys/fs/fuse/connections
    log_path: Path
    write_delay_ms: float = 0.0
    block_statfs: bool = False
    block_readdir: bool = False
    block_getattr: bool = False
    _aborted: bool = field(default=False, repr=False)

    def abort(self) -> bool:
        """Abort the FUSE connection (like a server that died): pending and later requests fail ENOTCONN.

        Releases callers stuck in the kernel (e.g. a blocked ``statvfs``). Returns whether a connection was
        aborted (False if it was gone already).
        """
        ensure_fusectl()
        path = f"{FUSECTL_DIR}/{self.connection}/abort"
        try:
            with open(path, "w", encoding="ascii") as fh:
                fh.write("1")
        except FileNotFoundError:
            return False
        self._aborted = True
        return True

    def is_mounted(self) -> bool:
        entry = find_mount(self.mountpoint)
        return entry is not None and entry.fstype.startswith("fuse") and entry.dev == self.connection

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""


def _stop_process(proc: subprocess.Popen[bytes], timeout: float = 5.0) -> None:
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        proc.terminate()
    try:
        proc.wait(timeout)
        return
    except subprocess.TimeoutExpired:
        pass
    with contextlib.suppress(ProcessLookupError):
        proc.kill()
    proc.wait(timeout)


def _fuse_teardown(mount: FuseMount) -> None:
    """Release the FUSE mount, hung or not: abort the connection, unmount lazily, stop the daemon."""
    errors: list[str] = []
    target = os.fspath(mount.mountpoint)
    try:
        if mount.is_mounted():
            mount.abort()
    except Exception as exc:
        errors.append(f"abort: {exc}")
    try:
        unmount(target, lazy=True)
    except Exception as exc:
        errors.append(f"unmount: {exc}")
    try:
        _stop_process(mount.proc)
    except Exception as exc:
        errors.append(f"stopping fusefs (pid {mount.proc.pid}): {exc}")
    if errors:
        raise MountError(f"FUSE teardown at {target}: " + "; ".join(errors))


@contextlib.contextmanager
def fuse_mount(
    dir: str | os.PathLike[str],
    backing: str | os.PathLike[str] | None = None,
    write_delay_ms: float = 0,
    block_statfs: bool = False,
    ready_timeout: float = 10.0,
    debug: bool = False,
    block_readdir: bool = False,
    block_getattr: bool = False,
    rename_flags: bool = True,
) -> Iterator[FuseMount]:
    """Mount ``tests/fusefs.py`` (a passthrough over ``backing``, or over a fresh temporary dir) at ``dir``.

    ``write_delay_ms`` sleeps in every write; ``block_statfs`` makes ``statvfs(dir)`` hang in the kernel;
    ``block_readdir`` / ``block_getattr`` make listing / stat'ing anything on it hang while statvfs answers (fill
    ``backing`` before mounting: nothing on such a mount can be read or written through it); ``rename_flags``
    False makes ``renameat2`` with a flag fail with EINVAL, as on NFS.
    Waits (up to ``ready_timeout``) until the mount is in /proc/self/mountinfo and the daemon has answered
    FUSE_INIT. Teardown aborts the connection through fusectl, unmounts lazily and stops the daemon, so it
    works for a hung mount too.
    """
    require_fuse()
    target = _prepare_mountpoint(dir)
    with contextlib.ExitStack() as stack:
        state_dir = Path(tempfile.mkdtemp(prefix="storwatch-fuse-"))
        stack.callback(shutil.rmtree, state_dir, True)
        if backing is None:
            backing_dir = Path(tempfile.mkdtemp(prefix="storwatch-fuse-backing-"))
            stack.callback(shutil.rmtree, backing_dir, True)
        else:
            backing_dir = Path(os.path.realpath(backing))
            backing_dir.mkdir(parents=True, exist_ok=True)
        ensure_fusectl()
        ready_file = state_dir / "ready"
        log_path = state_dir / "fusefs.log"
        cmd = [
            sys.executable,
            os.fspath(FUSEFS_SCRIPT),
            "--backing",
            os.fspath(backing_dir),
            "--mountpoint",
            target,
            "--ready-file",
            os.fspath(ready_file),
            "--fsname",
            FUSE_FSNAME,
        ]
        if write_delay_ms:
            cmd += ["--write-delay-ms", str(write_delay_ms)]
        if block_statfs:
            cmd.append("--block-statfs")
        if block_readdir:
            cmd.append("--block-readdir")
        if block_getattr:
            cmd.append("--block-getattr")
        if not rename_flags:
            cmd.append("--no-rename-flags")
        if debug:
            cmd.append("--debug")
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(
                cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        # Until the mount shows up, stopping the process (and unmounting whatever came up) is the cleanup.
        stack.callback(_stop_process, proc)
        stack.callback(_unmount_if_fuse, target)

        deadline = time.monotonic() + ready_timeout
        entry = None
        while True:
            entry = find_mount(target)
            if entry is not None and entry.fstype.startswith("fuse") and ready_file.exists():
                break
            if proc.poll() is not None:
                raise MountError(
                    f"fusefs exited with {proc.returncode} before mounting {target}:\n"
                    + log_path.read_text(encoding="utf-8", errors="replace")[-4000:]
                )
            if time.monotonic() > deadline:
                raise MountError(
                    f"fusefs did not mount {target} within {ready_timeout:.0f} s:\n"
                    + log_path.read_text(encoding="utf-8", errors="replace")[-4000:]
                )
            time.sleep(0.02)

        mount = FuseMount(
            mountpoint=Path(target),
            backing=backing_dir,
            proc=proc,
            connection=fuse_connection_id(entry),
            log_path=log_path,
            write_delay_ms=float(write_delay_ms),
            block_statfs=block_statfs,
            block_readdir=block_readdir,
            block_getattr=block_getattr,
        )
        stack.callback(_fuse_teardown, mount)
        if block_statfs:
            with _STATFS_BLOCKING_LOCK:
                _STATFS_BLOCKING.add(target)
            stack.callback(_forget_statfs_blocking, target)
        yield mount


def _forget_statfs_blocking(target: str) -> None:
    with _STATFS_BLOCKING_LOCK:
        _STATFS_BLOCKING.discard(target)


def _unmount_if_fuse(target: str) -> None:
    """Setup-failure cleanup: release a FUSE mount at ``target`` that came up without being handed out."""
    entry = find_mount(target)
    if entry is None or not entry.fstype.startswith("fuse"):
        return
    with contextlib.suppress(OSError):
        ensure_fusectl()
        with open(f"{FUSECTL_DIR}/{entry.dev}/abort", "w", encoding="ascii") as fh:
            fh.write("1")
    unmount(target, lazy=True)


# ---------------------------------------------------------------------------------------------------------
# /proc/diskstats


@dataclass(frozen=True)
class DiskStats:
    name: str
    reads_completed: int
    reads_merged: int
    sectors_read: int
    read_ticks_ms: int
    writes_completed: int
    writes_merged: int
    sectors_written: int
    write_ticks_ms: int
    in_flight: int
    io_ticks_ms: int
    time_in_queue_ms: int


def read_diskstats(name: str) -> DiskStats:
    """Counters of block device ``name`` (``loop3`` or ``/dev/loop3``) from /proc/diskstats."""
    name = os.path.basename(name)
    with open("/proc/diskstats", encoding="ascii") as fh:
        for line in fh:
            fields = line.split()
            if len(fields) >= 14 and fields[2] == name:
                values = [int(v) for v in fields[3:14]]
                return DiskStats(name, *values)
    raise MountError(f"{name} is not in /proc/diskstats")


def average_write_latency_ms(before: DiskStats, after: DiskStats) -> float:
    """Average write latency between two samples: write_ticks delta / writes_completed delta."""
    writes = after.writes_completed - before.writes_completed
    if writes <= 0:
        raise ValueError(f"no writes completed on {after.name} between the samples")
    return (after.write_ticks_ms - before.write_ticks_ms) / writes
