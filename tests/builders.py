"""Builders that several test modules share: mount records, checkpoint runs and their states, GPU facts, files in
the layouts the checkpoint formats recognise, and a stall feed that saw a GPU wait on its own save.

Test modules import these from here and never from one another (tests/test_layout.py holds the suite to it).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import stat
import struct
import sys
import tempfile
import threading
import zipfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from storwatch.actions.base import ActionRequest, ActionResult
from storwatch.analysis.findings import find
from storwatch.analysis.stall_feed import StallFeed
from storwatch.analysis.stalls import StallParams
from storwatch.analysis.view import MountView, RunView, View
from storwatch.procfs.mountinfo import parse_mountinfo
from storwatch.report import view_to_dict
from storwatch.snapshot import Snapshot
from storwatch.sources.checkpoints import Checkpoint, RunState
from storwatch.sources.gpu.facts import GPUFacts, GPUProcess, GPUState
from storwatch.sources.mounts import mount_of
from storwatch.vocabulary import Durability, Mount, Platform, Verdict
from storwatch.web.page import render_status_page

FIXTURES = Path(__file__).parent / "fixtures"
K8S_NODE_MOUNTINFO = FIXTURES / "k8s-node" / "proc" / "1" / "mountinfo"

NOW = 1_800_000_000.0
"""The wall-clock time ``ckpt`` measures checkpoint ages from."""


# -- mounts


def mount(mountpoint: str, fstype: str, device: str, root: str = "/") -> Mount:
    """A mount table entry with nothing unusual about it."""
    return Mount(
        mount_id=100,
        mountpoint=mountpoint,
        device=device,
        fstype=fstype,
        root=root,
        major=0,
        minor=0,
        readonly=False,
        options=("rw",),
        super_options=("rw",),
        usage=None,
        stuck=False,
        stuck_seconds=0.0,
    )


def fixture_mounts() -> dict[str, Mount]:
    """The k8s-node fixture's mount table, by mountpoint."""
    infos, errors = parse_mountinfo(K8S_NODE_MOUNTINFO.read_bytes())
    assert not errors
    return {i.mountpoint: mount_of(i) for i in infos}


class FixedMounts:
    """A mounts source that reports one local disk until a test changes ``mounts``."""

    name = "mounts"
    interval_seconds = 3600.0

    def __init__(self) -> None:
        self.mounts: tuple[Mount, ...] = (mount("/data", "ext4", "/dev/nvme0n1"),)

    def collect(self) -> tuple[Mount, ...]:
        return self.mounts

    def close(self) -> None:
        pass


def on(durability: Durability, mountpoint: str = "/data") -> MountView:
    """A mount of the given durability, as the View holds it."""
    m = Mount(1, mountpoint, "dev", "ext4", "/", 8, 1, False, (), (), None, False, 0.0)
    return MountView(m, Verdict(durability, "test", ()))


# -- checkpoint runs


def ckpt(age: float, verdict: str = "complete", write_seconds: float | None = None) -> Checkpoint:
    """A 1 GiB checkpoint last written ``age`` seconds before NOW."""
    return Checkpoint(
        path=f"/ckpt/run/step-{age:g}",
        format="torch-zip",
        verdict=verdict,
        reason=verdict,
        size_bytes=1 << 30,
        allocated_bytes=1 << 30,
        mtime=NOW - age,
        deep_checked=False,
        first_seen=NOW - age,
        write_seconds=write_seconds,
        write_bytes_per_second=None if write_seconds is None else (1 << 30) / write_seconds,
    )


def run(label: str, where: MountView | None, *checkpoints: Checkpoint) -> RunView:
    """A checkpoint run under /ckpt on the given mount."""
    return RunView(RunState(f"/ckpt/{label}", "/ckpt", checkpoints), label, where)


# -- files in the checkpoint formats' layouts


def torch_like_zip(path: Path, payload: bytes = b"x" * 4096) -> None:
    """A file with the layout torch.save writes (a stored ZIP with archive/data.pkl), built without torch."""
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED) as z:
        z.writestr("archive/data.pkl", b"\x80\x02}q\x00.")
        z.writestr("archive/data/0", payload)
        z.writestr("archive/version", b"3\n")


def gguf_string(text: str | bytes) -> bytes:
    """A GGUF string: its length as a little-endian u64, then its bytes."""
    b = text.encode() if isinstance(text, str) else text
    return struct.pack("<Q", len(b)) + b


def gguf_bytes(alignment: int | None = None, vocab: int = 1000) -> bytes:
    """A small GGUF v3 file: a few metadata entries (a string array as tokenizers have), an F32 and a Q8_0 tensor."""
    _s = gguf_string
    kv = [
        _s("general.architecture") + struct.pack("<I", 8) + _s("llama"),
        _s("llama.context_length") + struct.pack("<I", 4) + struct.pack("<I", 4096),
        _s("tokenizer.ggml.tokens")
        + struct.pack("<I", 9)
        + struct.pack("<IQ", 8, vocab)
        + b"".join(_s(f"tok{i}") for i in range(vocab)),
        _s("tokenizer.ggml.scores") + struct.pack("<I", 9) + struct.pack("<IQ", 6, vocab) + b"\0" * (4 * vocab),
    ]
    if alignment is not None:
        kv.append(_s("general.alignment") + struct.pack("<I", 4) + struct.pack("<I", alignment))
    align = alignment or 32
    # tensor a: F32 [64, 3] = 768 bytes; tensor b: Q8_0 [256] = 8 blocks of 34 = 272 bytes
    a_len, b_len = 64 * 3 * 4, 8 * 34
    b_off = -(-a_len // align) * align
    infos = (
        _s("a")
        + struct.pack("<I", 2)
        + struct.pack("<QQ", 64, 3)
        + struct.pack("<IQ", 0, 0)
        + _s("b")
        + struct.pack("<I", 1)
        + struct.pack("<Q", 256)
        + struct.pack("<IQ", 8, b_off)
    )
    head = b"GGUF" + struct.pack("<IQQ", 3, 2, len(kv)) + b"".join(kv) + infos
    pad = -len(head) % align
    return head + b"\0" * pad + b"\1" * a_len + b"\0" * (b_off - a_len) + b"\2" * b_len


# -- GPUs and stalls


def stall_gpus(t: float, util: float) -> GPUFacts:
    """Two GPUs read at ``t``: GPU 0 (its process PID 4242) at ``util``, GPU 1 (PID 7) idle, both holding memory."""
    states = (
        GPUState(
            0, "GPU-a", "H100", True, utilization_samples=((t, util),), processes=(GPUProcess(4242, 1 << 30, None),)
        ),
        GPUState(1, "GPU-b", "H100", True, utilization_samples=((t, 0.0),), processes=(GPUProcess(7, 1 << 30, None),)),
    )
    return GPUFacts(t, True, "550", None, states)


def stalled_feed(t0: float, seconds: int, stalled: tuple[int, int], label: str = "r") -> tuple[StallFeed, RunView]:
    """A feed that saw ``seconds`` of two GPUs: GPU 0's process (PID 4242) waits on its own checkpoint write (run
    ``label`` on node storage /scratch) from ``stalled[0]`` to ``stalled[1]`` seconds in, GPU 1 idles throughout."""
    feed = StallFeed(StallParams(settle_seconds=5.0))
    lo, hi = stalled
    c = dataclasses.replace(
        ckpt(0.0), mtime=t0 + hi - 1, write_start=t0 + lo - 1.0, write_seconds=float(hi - lo), writer_pid=4242
    )
    rv = run(label, on(Durability.NODE, "/scratch"), c)
    assert rv.mount is not None
    feed.update(t0, [rv], [rv.mount], stall_gpus(t0, 0.95), {})  # a View: the run's mount is watched from now on
    for i in range(seconds):
        t = t0 + i
        feed.observe(stall_gpus(t, 0.02 if lo <= i < hi else 0.95), [("/scratch", "write", t - 1, t, 3.0, 0.012)])
    return feed, rv


def page_with_a_stalled_gpu() -> tuple[str, View]:
    """The /status page, and its View, of a node whose GPU 0 waited 30 s on its run's checkpoint write."""
    t0 = 1_000_000.0
    feed, rv = stalled_feed(t0, 120, (40, 70), "llama")
    assert rv.mount is not None
    now = t0 + 130
    state, picture = feed.update(now, [rv], [rv.mount], stall_gpus(t0 + 119, 0.95), {})
    findings = find([rv], [rv.mount], now)
    view = View(
        Snapshot(now, gpus=stall_gpus(t0 + 119, 0.95)),
        Platform("generic", "test"),
        mounts=(rv.mount,),
        checkpoints=(rv,),
        findings=findings,
        stalls=state,
        timeline=picture,
    )
    return render_status_page(view_to_dict(view)), view


def own_mount_table(dest: Path, mountpoints: Iterable[str | os.PathLike[str]]) -> list[str]:
    """A command prefix (``start_agent``'s ``prefix``) that runs the agent in a private mount namespace where
    /proc/1/mountinfo and /proc/1/mountstats hold only "/" and ``mountpoints``: what other users mounted on this
    machine (a name with a newline, a hung FUSE mount) never reaches the test, and every other file of /proc stays the
    live one (processes started later included).

    The tables are the real ones' lines for those mount points as they are now (make the mounts first), written under
    ``dest``; the namespace is the agent's alone (private propagation), so the host's /proc is left as it is. Root.

    A new mount namespace holds a copy of every mount there is, and a copy keeps its filesystem alive until the
    namespace goes: the filesystem and loop device of a test beside this one (another xdist worker) would then stay
    until this agent had exited (that test's teardown does not wait for them: tests/realmounts.py). So the namespace
    first detaches every mount below the temporary directory (where tests make theirs) other than ``mountpoints`` and
    the directories above them.
    """
    import shutil

    from storwatch.procfs.mountinfo import parse_line

    wanted = {"/"} | {os.fspath(m) for m in mountpoints}
    kept: list[bytes] = []
    for line in Path("/proc/1/mountinfo").read_bytes().splitlines():
        if parse_line(line).mountpoint in wanted:
            kept.append(line)
    missing = wanted - {parse_line(line).mountpoint for line in kept}
    assert not missing, f"not mounted (yet): {sorted(missing)}"
    escaped = {line.split(b" ")[4] for line in kept}  # mountstats escapes a path as mountinfo does
    # mountstats: a block per mount, from its "device SOURCE mounted on MOUNTPOINT with fstype ..." line to the next.
    blocks: list[bytes] = []
    keep = False
    for line in Path("/proc/1/mountstats").read_bytes().splitlines(keepends=True):
        if line.startswith(b"device "):
            words = line.split(b" ")
            keep = len(words) > 4 and words[2:4] == [b"mounted", b"on"] and words[4] in escaped
        if keep:
            blocks.append(line)
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "mountinfo").write_bytes(b"".join(line + b"\n" for line in kept))
    (dest / "mountstats").write_bytes(b"".join(blocks))
    unshare = shutil.which("unshare") or "unshare"
    # unshare and python both exec: the agent keeps the PID the test started, and its process group.
    return [unshare, "--mount", "--propagation", "private", sys.executable, "-I", "-c", _IN_OWN_NAMESPACE,
            str(Path(__file__).resolve().parents[1]), str(dest / "mountinfo"), str(dest / "mountstats"),
            tempfile.gettempdir(), json.dumps(sorted(wanted - {"/"}))]  # fmt: skip


_IN_OWN_NAMESPACE = """
import errno, json, os, subprocess, sys
sys.path.insert(0, sys.argv[1])
from tests.realmounts import _umount2_detach, read_mountinfo
mountinfo, mountstats, top, wanted = sys.argv[2], sys.argv[3], sys.argv[4], json.loads(sys.argv[5])
def under(path, above):
    return path.startswith(above.rstrip("/") + "/")
points = {e.mountpoint for e in read_mountinfo()}
foreign = [p for p in points if under(p, top) and p not in wanted
           and not any(under(w, p) or under(p, w) for w in wanted)]
for point in sorted(foreign, key=len, reverse=True):  # the deepest first
    try:
        _umount2_detach(point)
    except OSError as err:
        if err.errno not in (errno.ENOENT, errno.EINVAL):  # gone already
            sys.exit(f"own mount table: cannot detach {point!r}: {err.strerror}")
for table, over in ((mountinfo, "/proc/1/mountinfo"), (mountstats, "/proc/1/mountstats")):
    subprocess.run(["mount", "--bind", table, over], check=True)
os.execvp(sys.argv[6], sys.argv[6:])
"""


def host_mounts() -> tuple[Mount, ...]:
    """This process's mount table as the mount source reads it."""
    from storwatch.procfs.mountinfo import parse_mountinfo
    from storwatch.sources.mounts import mount_of

    entries, _ = parse_mountinfo(Path("/proc/self/mountinfo").read_bytes())
    return tuple(mount_of(e) for e in entries)


def release_cgroup(group: Path, parent: Path) -> None:
    """Move what is left in a test's cgroup back to ``parent`` and remove it (the kernel refuses while a process is
    in it, so it is tried for up to 10 s)."""
    import contextlib
    import time

    with contextlib.suppress(OSError):
        for pid in (group / "cgroup.procs").read_text().split():
            with contextlib.suppress(OSError):
                (parent / "cgroup.procs").write_text(pid)
    deadline = time.monotonic() + 10
    while True:
        try:
            group.rmdir()
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


SYNC_LEFTOVER = re.compile(r"\..+\.storwatch-sync-[0-9a-f]{16}\.(tmp|old|manifest|gone)")
"""The names storwatch sync gives what it writes before the rename (a temporary, the copy it replaces, its manifest's
temporary): what a killed copy may leave, and the next run removes."""


def sync_checkpoint(top: Path, shards: int = 6, shard_bytes: int = 3 << 20, seed: int = 1) -> Path:
    """A DCP-like directory: shards in a subdirectory, a big file over several chunks, a marker, a tracker, links
    that stay inside."""
    top.mkdir(parents=True)
    (top / "shards").mkdir()
    import random

    from storwatch import sync

    rng = random.Random(seed)
    for i in range(shards):
        (top / "shards" / f"__{i}_0.distcp").write_bytes(rng.randbytes(shard_bytes + i * 4097))
    (top / "model.bin").write_bytes(rng.randbytes(sync.CHUNK * 2 + 12345))  # three chunks, the last partial
    (top / ".metadata").write_bytes(rng.randbytes(5000))
    (top / "latest").write_text("global_step10\n")
    (top / "empty").write_bytes(b"")
    os.symlink("model.bin", top / "model.link")
    os.symlink("../model.bin", top / "shards" / "up.link")
    os.chmod(top / "shards", 0o750)
    os.chmod(top / "model.bin", 0o640)
    return top


def sync_tree(top: Path) -> dict[str, tuple[Any, ...]]:
    """Every entry below ``top`` (never following a link): its kind, mode, and content or target."""
    out: dict[str, tuple[Any, ...]] = {}
    st = os.lstat(top)
    if stat.S_ISREG(st.st_mode):
        return {".": ("file", stat.S_IMODE(st.st_mode), top.read_bytes())}
    for dirpath, dirnames, filenames in os.walk(top):
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            rel = str(path.relative_to(top))
            st = os.lstat(path)
            if stat.S_ISLNK(st.st_mode):
                out[rel] = ("link", os.readlink(path))
            elif stat.S_ISDIR(st.st_mode):
                out[rel] = ("dir", stat.S_IMODE(st.st_mode))
            else:
                out[rel] = ("file", stat.S_IMODE(st.st_mode), path.read_bytes())
    return out


class Recorder:
    """An action that records what it was asked, and blocks while ``gate`` is closed."""

    def __init__(self, name: str = "record") -> None:
        self.name = name
        self.runs: list[ActionRequest] = []
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()
        self.answer = ActionResult("ok", "done")

    def check(self, params: Mapping[str, object]) -> list[str]:
        return []

    def run(self, request: ActionRequest, timeout: float) -> ActionResult:
        self.runs.append(request)
        self.entered.set()
        self.gate.wait(30)
        return self.answer


def node_mounts(node: str) -> list[Mount]:
    """The fixture node's mount table as the mount source keeps it (the top mount of each point)."""
    infos, errors = parse_mountinfo((FIXTURES / node / "proc" / "1" / "mountinfo").read_bytes())
    assert not errors
    by_point = {}
    for info in infos:
        by_point.pop(info.mountpoint, None)
        by_point[info.mountpoint] = info
    return [mount_of(info) for info in by_point.values()]


def node_tree(tmp_path: Path, node: str) -> tuple[Path, Path]:
    """procfs with the fixture's mount table, and a root with a directory at each of its mountpoints, /home and
    /tmp."""
    proc = tmp_path / "proc"
    (proc / "1").mkdir(parents=True)
    shutil.copy(FIXTURES / node / "proc" / "1" / "mountinfo", proc / "1" / "mountinfo")
    root = tmp_path / "root"
    for mount in node_mounts(node):
        (root / mount.mountpoint.lstrip("/")).mkdir(parents=True, exist_ok=True)
    (root / "tmp").mkdir(exist_ok=True)
    (root / "home").mkdir(exist_ok=True)
    if node == "k8s-node":
        (root / "var/lib/kubelet/pods").mkdir(parents=True, exist_ok=True)
    if node == "gradient-node":
        (root / "home/paperspace").mkdir(parents=True)
    return proc, root
