"""Verified sync copies (storwatch/sync/) on real files: what is copied, where it may go, what aborts it, what is
left behind, and the helper processes that run copies with a deadline.

Every copy here is a real one (files on disk, real directories and links, real child processes); tests that need a
mount (a full filesystem, a hung one, SIGKILLs on tmpfs) are in test_sync_mounts.py and test_sync_kill.py.
"""

from __future__ import annotations

import ctypes
import errno
import itertools
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from storwatch import sync
from storwatch.config import ConfigError, parse_config
from storwatch.sync import (
    MANIFEST_SUFFIX,
    Destinations,
    SyncRefused,
    SyncResult,
    SyncWorker,
    copy_verified,
    safe_field,
)
from tests.builders import SYNC_LEFTOVER as LEFTOVER
from tests.builders import sync_checkpoint as make_checkpoint
from tests.builders import sync_tree as tree

REPO_ROOT = Path(__file__).resolve().parents[1]
WAIT = 60.0
"""How long a test waits for a helper's copy at most: a bound against hanging, generous for a loaded machine."""


def leftovers(directory: Path) -> list[str]:
    return sorted(n for n in os.listdir(directory) if LEFTOVER.fullmatch(n))


# --------------------------------------------------------------------------------------------------------------------
# Destinations: paths from template fields, never out of the root


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        pytest.param({"pod": "../../etc"}, "field 'pod' holds '/'", id="dotdot-slash"),
        pytest.param({"pod": ".."}, "field 'pod' is '..'", id="dotdot"),
        pytest.param({"pod": "."}, "field 'pod' is '.'", id="dot"),
        pytest.param({"run": "a/b"}, "field 'run' holds '/'", id="slash"),
        pytest.param({"checkpoint": "ck\0x"}, "field 'checkpoint' holds the control character", id="nul"),
        pytest.param({"checkpoint": "ck\nx"}, "field 'checkpoint' holds the control character", id="newline"),
        pytest.param({"checkpoint": "ck\x1b[2J"}, "field 'checkpoint' holds the control character", id="escape"),
        pytest.param({"checkpoint": "ck\u2028"}, "field 'checkpoint' holds the control character", id="line-sep"),
        pytest.param({"namespace": ""}, "field 'namespace' is empty", id="empty"),
        pytest.param({"namespace": None}, "field 'namespace' has no value", id="missing"),
        pytest.param({"pod": "x" * 256}, "field 'pod' is longer than 255 bytes", id="too-long"),
        pytest.param(
            {"checkpoint": ".ck.storwatch-sync-0123456789abcdef.tmp"}, "storwatch's own temporaries", id="our-temp"
        ),
    ],
)
def test_a_field_that_could_leave_its_place_is_refused_by_name(
    fields: dict[str, str | None], message: str, tmp_path: Path
) -> None:
    root = tmp_path / "durable"
    root.mkdir()
    good = {"namespace": "team-a", "pod": "trainer-0", "run": "run1", "checkpoint": "step-100"}
    merged = {k: v for k, v in {**good, **fields}.items() if v is not None}
    with pytest.raises(SyncRefused, match=re.escape(message)):
        Destinations([str(root)]).resolve("{namespace}/{pod}/{run}/{checkpoint}", merged)
    assert os.listdir(root) == []


def test_a_path_is_built_below_the_chosen_root() -> None:
    d = Destinations(["/durable/a/", "/durable/b"])
    fields = {"namespace": "ns", "pod": "p-0", "run": safe_field("user/job 1/ckpts"), "node": "n1", "checkpoint": "c"}
    assert d.resolve("{namespace}/{pod}/{run}/{checkpoint}", fields) == "/durable/a/ns/p-0/user%2Fjob 1%2Fckpts/c"
    assert d.resolve("{node}/{checkpoint}", fields, root="/durable/b") == "/durable/b/n1/c"
    with pytest.raises(SyncRefused, match="not an allowlisted sync destination"):
        d.resolve("{checkpoint}", fields, root="/elsewhere")
    with pytest.raises(SyncRefused, match="no sync destination is configured"):
        Destinations([]).resolve("{checkpoint}", fields)


@pytest.mark.parametrize(
    ("template", "problem"),
    [
        pytest.param("../{pod}", "non-empty components, none '.' or '..'", id="dotdot"),
        pytest.param("/{pod}", "non-empty components", id="absolute"),
        pytest.param("{pod}//{run}", "non-empty components", id="empty-component"),
        pytest.param("{pod!r}", "takes no format spec", id="conversion"),
        pytest.param("{pod.__class__}", "is not one of", id="attribute"),
        pytest.param("{user}", "is not one of", id="unknown-field"),
        pytest.param("fixed", "names no field", id="no-field"),
        pytest.param("{pod", "is not a template", id="unclosed"),
    ],
)
def test_a_bad_template_is_refused_and_names_the_config_line(template: str, problem: str) -> None:
    with pytest.raises(SyncRefused, match=re.escape(problem)):
        Destinations(["/durable"]).resolve(template, {"pod": "p", "run": "r"})
    with pytest.raises(ConfigError, match=r"sync\.yaml:3: sync\.template: .*" + re.escape(problem)):
        parse_config(f"sync:\n  destinations: [/durable]\n  template: {json.dumps(template)}\n", "sync.yaml")


@pytest.mark.parametrize(
    ("roots", "problem"),
    [
        pytest.param("[durable]", "must be an absolute path", id="relative"),
        pytest.param("['/']", "'/' allows every path", id="slash"),
        pytest.param("['//']", "'/' allows every path", id="double-slash"),
        pytest.param("[/a, /a/]", "is given twice", id="twice"),
    ],
)
def test_a_bad_destination_root_is_refused(roots: str, problem: str) -> None:
    with pytest.raises(ConfigError, match=r"sync\.yaml:2: sync\.destinations: .*" + re.escape(problem)):
        parse_config(f"sync:\n  destinations: {roots}\n", "sync.yaml")


@pytest.mark.parametrize(
    "value",
    [
        "",
        ".",
        "..",
        "a/b",
        "%2F",
        ".hidden",
        "x\0y",
        "\x1b[31m",
        "é/ü",
        "x" * 300,
        ".a.storwatch-sync-0.tmp",
        "a.storwatch-sync.json",
    ],
)
def test_safe_field_makes_any_text_one_valid_component(value: str) -> None:
    text = safe_field(value)
    assert sync.destinations.field_problem("f", text) is None
    assert safe_field(value + "!") != text


@pytest.mark.parametrize(
    "dest",
    [
        pytest.param("{tmp}/other/x", id="outside"),
        pytest.param("{tmp}/durable/../other/x", id="dotdot"),
        pytest.param("{tmp}/durable", id="the-root-itself"),
        pytest.param("{tmp}/durablex/y", id="a-sibling-with-the-root-as-prefix"),
        pytest.param("durable/x", id="relative"),
    ],
)
def test_the_worker_refuses_a_destination_outside_the_allowlist_and_writes_nothing(dest: str, tmp_path: Path) -> None:
    src = make_checkpoint(tmp_path / "src", shards=1, shard_bytes=1000)
    for name in ("durable", "other", "durablex"):
        (tmp_path / name).mkdir()
    worker = SyncWorker(Destinations([str(tmp_path / "durable")]))
    try:
        job_id = worker.submit(str(src), dest.format(tmp=tmp_path))
        job = worker.wait(job_id, WAIT)
    finally:
        worker.close()
    assert job is not None and job.state == "failed" and job.result is not None
    assert job.result.outcome == "refused" and "not below an allowlisted sync destination" in (job.result.error or "")
    for name in ("durable", "other", "durablex"):
        assert os.listdir(tmp_path / name) == []


# --------------------------------------------------------------------------------------------------------------------
# The copy


def test_a_directory_is_copied_whole_byte_identical_with_a_manifest(tmp_path: Path) -> None:
    src = make_checkpoint(tmp_path / "src")
    (tmp_path / "dst").mkdir()
    dest = tmp_path / "dst" / "step-100"
    before = tree(src)
    seen: list[tuple[int, int]] = []
    result = copy_verified(str(src), str(dest), progress=lambda d, t: seen.append((d, t)))
    assert result.ok and result.outcome == "verified", result.error
    assert tree(dest) == before == tree(src)  # the copy is the source; the source is untouched
    assert (
        os.readlink(dest / "model.link") == "model.bin" and os.readlink(dest / "shards" / "up.link") == "../model.bin"
    )
    assert stat.S_IMODE(os.stat(dest / "model.bin").st_mode) == 0o640
    assert os.stat(dest / "model.bin").st_mtime_ns == os.stat(src / "model.bin").st_mtime_ns
    total = sum(len(v[2]) for v in before.values() if v[0] == "file")
    assert (result.bytes, result.written_bytes, result.files) == (total, total, 10)
    assert seen and seen[-1] == (total, total) and all(a[0] <= b[0] for a, b in itertools.pairwise(seen))
    assert sorted(os.listdir(tmp_path / "dst")) == ["step-100", "step-100" + MANIFEST_SUFFIX]
    manifest = json.loads((tmp_path / "dst" / ("step-100" + MANIFEST_SUFFIX)).read_text())
    assert result.manifest == str(dest) + MANIFEST_SUFFIX
    assert manifest["source"] == str(src) and manifest["hash"] == "xxh3_128" and manifest["bytes"] == total
    assert manifest["finished"] >= manifest["started"] > 0
    files = {e["path"]: e for e in manifest["entries"]}
    import xxhash

    assert files["model.bin"]["xxh3_128"] == xxhash.xxh3_128_hexdigest((src / "model.bin").read_bytes())
    assert files["model.bin"]["size"] == (src / "model.bin").stat().st_size and files["model.bin"]["mode"] == 0o640
    assert files["shards/up.link"] == {**files["shards/up.link"], "type": "link", "target": "../model.bin"}


def test_a_single_file_is_copied_and_a_second_run_leaves_it_unchanged(tmp_path: Path) -> None:
    src = tmp_path / "model.pt"
    src.write_bytes(os.urandom(3 << 20))
    (tmp_path / "dst").mkdir()
    dest = tmp_path / "dst" / "model.pt"
    first = copy_verified(str(src), str(dest))
    assert first.outcome == "verified" and dest.read_bytes() == src.read_bytes()
    inode = dest.stat().st_ino
    again = copy_verified(str(src), str(dest))
    assert again.ok and again.outcome == "unchanged" and again.written_bytes == 0 and again.bytes == 3 << 20
    assert dest.stat().st_ino == inode


def test_a_changed_source_replaces_the_earlier_copy_atomically(tmp_path: Path) -> None:
    src = make_checkpoint(tmp_path / "src", shards=2)
    (tmp_path / "dst").mkdir()
    dest = tmp_path / "dst" / "last"
    assert copy_verified(str(src), str(dest)).outcome == "verified"
    (src / "shards" / "__0_0.distcp").write_bytes(b"new weights")
    (src / "added.bin").write_bytes(b"x" * 10)
    result = copy_verified(str(src), str(dest))
    assert result.outcome == "verified", result.error
    assert tree(dest) == tree(src)
    assert leftovers(tmp_path / "dst") == []
    manifest = json.loads((tmp_path / "dst" / ("last" + MANIFEST_SUFFIX)).read_text())
    assert "added.bin" in {e["path"] for e in manifest["entries"]}


def test_something_at_dest_that_we_did_not_make_is_refused_and_left_alone(tmp_path: Path) -> None:
    src = make_checkpoint(tmp_path / "src", shards=1)
    (tmp_path / "dst" / "step-1").mkdir(parents=True)
    (tmp_path / "dst" / "step-1" / "precious").write_text("keep me")
    (tmp_path / "dst" / "file").write_text("keep me too")
    for name in ("step-1", "file"):
        result = copy_verified(str(src), str(tmp_path / "dst" / name))
        assert result.outcome == "refused" and "is not a copy storwatch made" in (result.error or "")
    # A forged manifest beside it (not describing that inode) does not make it ours.
    (tmp_path / "dst" / ("step-1" + MANIFEST_SUFFIX)).write_text(
        json.dumps({"storwatch_sync": 1, "inode": 1, "entries": [{"type": "dir", "mtime_ns": 0}]})
    )
    assert copy_verified(str(src), str(tmp_path / "dst" / "step-1")).outcome == "refused"
    assert (tmp_path / "dst" / "step-1" / "precious").read_text() == "keep me"
    assert (tmp_path / "dst" / "file").read_text() == "keep me too"
    assert leftovers(tmp_path / "dst") == []


@pytest.mark.parametrize(
    ("make", "message"),
    [
        pytest.param(
            lambda s: os.symlink("/etc/passwd", s / "abs"), "symbolic link to the absolute path", id="absolute"
        ),
        pytest.param(lambda s: os.symlink("../outside", s / "up"), "leads out of the checkpoint", id="dotdot"),
        pytest.param(
            lambda s: (os.symlink("shards/hop", s / "first"), os.symlink("../../x", s / "shards" / "hop")),
            "leads out of the checkpoint",
            id="through-another-link",
        ),
        pytest.param(
            lambda s: (
                os.symlink("dir/..", s / "a"),
                os.symlink("../..", s / "shards" / "dir"),
                os.symlink("a/../..", s / "b"),
            ),
            "leads out of the checkpoint",
            id="dotdot-after-a-link",
        ),
        pytest.param(lambda s: os.symlink("loop", s / "loop"), "symbolic links in a row", id="loop"),
        pytest.param(lambda s: os.mkfifo(s / "fifo"), "is a FIFO", id="fifo"),
    ],
)
def test_a_source_holding_a_way_out_or_a_special_file_is_refused(
    make: Callable[[Path], Any], message: str, tmp_path: Path
) -> None:
    src = make_checkpoint(tmp_path / "src", shards=1, shard_bytes=100)
    make(src)
    (tmp_path / "dst").mkdir()
    result = copy_verified(str(src), str(tmp_path / "dst" / "ck"))
    assert result.outcome == "refused" and message in (result.error or ""), result.error
    assert os.listdir(tmp_path / "dst") == []


def test_a_source_that_is_itself_a_symlink_is_refused(tmp_path: Path) -> None:
    real = make_checkpoint(tmp_path / "real", shards=1, shard_bytes=100)
    os.symlink(real, tmp_path / "link")
    (tmp_path / "dst").mkdir()
    result = copy_verified(str(tmp_path / "link"), str(tmp_path / "dst" / "ck"))
    assert result.outcome == "refused" and "is a symbolic link" in (result.error or "")
    assert os.listdir(tmp_path / "dst") == []


def test_links_inside_are_copied_as_links_never_followed(tmp_path: Path) -> None:
    src = make_checkpoint(tmp_path / "src", shards=1, shard_bytes=100)
    os.symlink("shards", src / "dirlink")
    os.symlink("missing-inside", src / "dangling")
    (tmp_path / "dst").mkdir()
    result = copy_verified(str(src), str(tmp_path / "dst" / "ck"))
    assert result.outcome == "verified", result.error
    assert os.readlink(tmp_path / "dst" / "ck" / "dirlink") == "shards"
    assert os.readlink(tmp_path / "dst" / "ck" / "dangling") == "missing-inside"
    assert result.files == 5  # the files through dirlink are not copied twice


def _change(kind: str, src: Path) -> Callable[[int, int], None]:
    """A progress callback that changes the source once, mid-copy (it runs on the copying thread)."""
    done = [False]

    def progress(read: int, total: int) -> None:
        if done[0] or read < sync.CHUNK:
            return
        done[0] = True
        if kind == "append":  # model.bin is being read (its first chunk of three)
            with open(src / "model.bin", "ab") as f:
                f.write(b"more")
        elif kind == "rewrite-same-size":
            with open(src / "model.bin", "r+b") as f:
                f.write(b"X")
        elif kind == "earlier-file":  # "empty" is copied before model.bin: only the listing at the end sees this
            (src / "empty").write_bytes(b"Y")
        elif kind == "added":
            (src / "shards" / "late.distcp").write_bytes(b"late")
        elif kind == "removed":
            os.unlink(src / "latest")
        elif kind == "replaced-dir":
            os.rename(src / "shards", src / "shards.old")
            (src / "shards").mkdir()

    return progress


@pytest.mark.parametrize("kind", ["append", "rewrite-same-size", "earlier-file", "added", "removed", "replaced-dir"])
def test_a_source_changed_during_the_copy_aborts_and_nothing_is_put_in_place(kind: str, tmp_path: Path) -> None:
    src = make_checkpoint(tmp_path / "src", shards=2, shard_bytes=1 << 20)
    (tmp_path / "dst").mkdir()
    dest = tmp_path / "dst" / "ck"
    result = copy_verified(str(src), str(dest), progress=_change(kind, src))
    assert not result.ok and result.outcome == "source_changed", (result.outcome, result.error)
    assert os.listdir(tmp_path / "dst") == []  # no copy, no manifest, no temporary


def test_the_changed_source_of_an_earlier_copy_leaves_that_copy_in_place(tmp_path: Path) -> None:
    src = make_checkpoint(tmp_path / "src", shards=1)
    (tmp_path / "dst").mkdir()
    dest = tmp_path / "dst" / "ck"
    assert copy_verified(str(src), str(dest)).ok
    before = tree(dest)
    (src / "latest").write_text("global_step20\n")
    result = copy_verified(str(src), str(dest), progress=_change("append", src))
    assert result.outcome == "source_changed"
    assert tree(dest) == before and leftovers(tmp_path / "dst") == []


def test_leftovers_of_earlier_copies_are_removed_and_nothing_else(tmp_path: Path) -> None:
    src = make_checkpoint(tmp_path / "src", shards=1)
    dst = tmp_path / "dst"
    dst.mkdir()
    (dst / ".ck.storwatch-sync-0123456789abcdef.tmp" / "sub").mkdir(parents=True)
    (dst / ".ck.storwatch-sync-0123456789abcdef.tmp" / "sub" / "f").write_bytes(b"half")
    (dst / ".other.storwatch-sync-fedcba9876543210.old").write_bytes(b"moved aside")
    (dst / ".x.storwatch-sync-00000000000000aa.manifest").write_text("{}")
    (dst / ("gone" + MANIFEST_SUFFIX)).write_text(json.dumps({"storwatch_sync": 1, "inode": 5, "entries": []}))
    # Not ours: the names do not match, or the manifest is not one of ours.
    (dst / ".ck.storwatch-sync-XYZ.tmp").write_bytes(b"a tenant's")
    (dst / ("notes" + MANIFEST_SUFFIX)).write_text("a tenant's")
    (dst / "keep.txt").write_text("a tenant's")
    os.symlink("/etc", dst / ".l.storwatch-sync-00000000000000bb.tmp")  # ours by name: removed, never followed
    result = copy_verified(str(src), str(dst / "ck"))
    assert result.outcome == "verified", result.error
    assert sorted(os.listdir(dst)) == sorted(
        [".ck.storwatch-sync-XYZ.tmp", "notes" + MANIFEST_SUFFIX, "keep.txt", "ck", "ck" + MANIFEST_SUFFIX]
    )
    assert os.path.isdir("/etc/ssl") or os.listdir("/etc")  # /etc untouched


def test_keep_n_removes_only_the_oldest_of_our_own_copies(tmp_path: Path) -> None:
    src = make_checkpoint(tmp_path / "src", shards=1, shard_bytes=1000)
    dst = tmp_path / "dst"
    dst.mkdir()
    (dst / "someone-elses").mkdir()
    (dst / "someone-elses" / "data").write_text("x")
    made = []
    for step in range(1, 5):
        (src / "latest").write_text(f"global_step{step}\n")
        result = copy_verified(str(src), str(dst / f"step-{step}"), keep=2)
        assert result.outcome == "verified", result.error
        made.append(result)
    assert made[2].removed == (str(dst / "step-1"),) and made[3].removed == (str(dst / "step-2"),)
    names = sorted(os.listdir(dst))
    assert names == sorted(
        ["someone-elses", "step-3", "step-4", "step-3" + MANIFEST_SUFFIX, "step-4" + MANIFEST_SUFFIX]
    )
    assert (dst / "someone-elses" / "data").read_text() == "x"
    assert tree(src)  # the source is never pruned
    assert (src / "latest").read_text() == "global_step4\n"


def test_the_destination_directories_below_a_root_are_made_and_never_followed(tmp_path: Path) -> None:
    src = make_checkpoint(tmp_path / "src", shards=1, shard_bytes=1000)
    root = tmp_path / "durable"
    root.mkdir()
    result = copy_verified(str(src), str(root / "ns" / "pod" / "run" / "ck"), root=str(root))
    assert result.outcome == "verified", result.error
    assert tree(root / "ns" / "pod" / "run" / "ck") == tree(src)
    # A symlink planted on the way (a tenant who can write a directory of the path) is refused, never followed.
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    os.symlink(elsewhere, root / "evil")
    result = copy_verified(str(src), str(root / "evil" / "x" / "ck"), root=str(root))
    assert result.outcome == "refused" and "is a symbolic link: never followed" in (result.error or "")
    (root / "ns" / "file").write_text("not a directory")
    result = copy_verified(str(src), str(root / "ns" / "file" / "ck"), root=str(root))
    assert result.outcome == "refused" and "is a regular file, not a directory" in (result.error or "")
    assert os.listdir(elsewhere) == []


def test_the_source_below_a_source_root_is_reached_without_following_links(tmp_path: Path) -> None:
    real = make_checkpoint(tmp_path / "real" / "ck", shards=1, shard_bytes=1000)
    scan = tmp_path / "scan"
    scan.mkdir()
    os.symlink(real.parent, scan / "run")  # a tenant swapped the run directory for a link to someone else's
    (tmp_path / "dst").mkdir()
    result = copy_verified(str(scan / "run" / "ck"), str(tmp_path / "dst" / "ck"), source_root=str(scan))
    assert result.outcome == "refused" and "is a symbolic link: never followed" in (result.error or "")
    assert os.listdir(tmp_path / "dst") == []


def test_a_bandwidth_limit_paces_the_reads(tmp_path: Path) -> None:
    src = make_checkpoint(tmp_path / "src", shards=2, shard_bytes=1 << 20)
    (tmp_path / "dst").mkdir()
    total = sum(f.stat().st_size for f in src.rglob("*") if f.is_file() and not f.is_symlink())
    now = [0.0]
    slept: list[float] = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        now[0] += seconds

    result = copy_verified(str(src), str(tmp_path / "dst" / "ck"), bandwidth=4 << 20, clock=lambda: now[0], sleep=sleep)
    assert result.outcome == "verified", result.error
    # The clock moves only when the copy sleeps: its time is what the limit asks for, no more.
    assert result.seconds == pytest.approx(total / (4 << 20), rel=1e-6)
    assert max(slept) <= 0.1


def test_stop_aborts_and_removes_the_temporaries(tmp_path: Path) -> None:
    src = make_checkpoint(tmp_path / "src", shards=3, shard_bytes=2 << 20)
    (tmp_path / "dst").mkdir()
    calls = [0]

    def stop() -> bool:
        calls[0] += 1
        return calls[0] > 3

    result = copy_verified(str(src), str(tmp_path / "dst" / "ck"), stop=stop)
    assert result.outcome == "stopped" and not result.ok
    assert os.listdir(tmp_path / "dst") == []


@pytest.mark.parametrize("how", ["missing", "refused"])
def test_without_sync_file_range_each_read_back_waits_with_fdatasync(
    how: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A C library without sync_file_range, or a filesystem that refuses it (EINVAL, ENOSYS, EOPNOTSUPP): the copy
    still completes, verified, each read-back waiting for the file's data with fdatasync instead."""
    calls: list[int] = []

    def refused(fd: int, offset: int, n: int, flags: int) -> int:
        calls.append(flags)
        ctypes.set_errno(errno.EOPNOTSUPP)
        return -1

    monkeypatch.setattr(sync.pipeline, "_sync_file_range", None if how == "missing" else refused)
    real_fdatasync = os.fdatasync
    synced: list[int] = []

    def fdatasync(fd: int) -> None:
        synced.append(fd)
        real_fdatasync(fd)

    monkeypatch.setattr(sync.pipeline.os, "fdatasync", fdatasync)
    src = make_checkpoint(tmp_path / "src", shards=1, shard_bytes=1000)
    (tmp_path / "dst").mkdir()
    result = copy_verified(str(src), str(tmp_path / "dst" / "ck"))
    assert result.outcome == "verified", result.error
    ranges = 3 + 1 + 1 + 1  # model.bin's three chunks, the shard, .metadata and latest (empty has none)
    assert len(synced) == ranges
    assert len(calls) == (0 if how == "missing" else 2 * ranges)  # each range: a start, then a wait
    assert (tmp_path / "dst" / "ck" / "model.bin").read_bytes() == (src / "model.bin").read_bytes()


def test_a_verification_mismatch_fails_the_copy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The read-back is what decides: a copy whose bytes read back differ from what was read fails, and is removed.
    The difference is made where a device would make it: in what a read of the copy returns."""
    src = make_checkpoint(tmp_path / "src", shards=1, shard_bytes=1000)
    (tmp_path / "dst").mkdir()
    real_preadv = os.preadv

    def preadv_then_flip(fd: int, buffers: list[memoryview], offset: int) -> int:
        got = real_preadv(fd, buffers, offset)
        if offset == sync.CHUNK and os.readlink(f"/proc/self/fd/{fd}").endswith("/model.bin"):
            buffers[0][100] ^= 0xFF
        return got

    monkeypatch.setattr(sync.pipeline.os, "preadv", preadv_then_flip)
    result = copy_verified(str(src), str(tmp_path / "dst" / "ck"))
    assert result.outcome == "failed" and "model.bin: read back past the page cache" in (result.error or "")
    assert os.listdir(tmp_path / "dst") == []


def test_modes_and_owners_are_kept_as_root_without_setuid(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("keeping owners needs root (CAP_CHOWN)")
    src = make_checkpoint(tmp_path / "src", shards=1, shard_bytes=1000)
    os.chown(src / "model.bin", 1000, 1001)
    os.chown(src / "shards", 1002, 1003)
    os.lchown(src / "model.link", 1004, 1005)
    os.chmod(src / "latest", 0o4755)
    (tmp_path / "dst").mkdir()
    result = copy_verified(str(src), str(tmp_path / "dst" / "ck"))
    assert result.outcome == "verified" and result.notes == (), (result.error, result.notes)
    dest = tmp_path / "dst" / "ck"
    assert (os.stat(dest / "model.bin").st_uid, os.stat(dest / "model.bin").st_gid) == (1000, 1001)
    assert (os.stat(dest / "shards").st_uid, os.stat(dest / "shards").st_gid) == (1002, 1003)
    assert (os.lstat(dest / "model.link").st_uid, os.lstat(dest / "model.link").st_gid) == (1004, 1005)
    assert stat.S_IMODE(os.stat(dest / "shards").st_mode) == 0o750
    assert stat.S_IMODE(os.stat(dest / "latest").st_mode) == 0o755  # set-user-ID dropped


def test_not_root_the_mode_is_kept_and_the_owner_skipped() -> None:
    """A copy run as uid 1000 keeps each file's mode and skips its owner, and says why.

    The checkout may lie in a directory uid 1000 cannot enter (a clone under /root, any 0700 directory), with the
    interpreter a venv inside it: the copy then could not import storwatch, nor xxhash from the venv. So it runs with
    one capability, CAP_DAC_READ_SEARCH, in its ambient set (it reads the checkout, the venv and the interpreter's
    own library, wherever they are): still uid 1000, and without CAP_CHOWN, which is what keeping an owner takes."""
    setpriv = shutil.which("setpriv")
    if os.geteuid() != 0 or setpriv is None:
        pytest.skip("needs root and setpriv to run the copy as another user")
    base = Path(tempfile.mkdtemp(prefix="storwatch-sync-user-"))
    try:
        os.chmod(base, 0o755)
        src = make_checkpoint(base / "src", shards=1, shard_bytes=1000)
        for path in [src, *src.rglob("*")]:
            os.lchown(path, 1000, 1000)
        (base / "dst").mkdir()
        os.chown(base / "dst", 1000, 1000)
        code = (
            "import json, os, sys; sys.path.insert(0, sys.argv[1]); from storwatch import sync; "
            "caps = [line.split()[1] for line in open('/proc/self/status') if line.startswith('CapEff:')][0]; "
            "result = sync.copy_verified(sys.argv[2], sys.argv[3]).to_dict(); "
            "print(json.dumps({'uid': os.geteuid(), 'caps': caps, 'module': sync.__file__, 'result': result}))"
        )
        done = subprocess.run(
            [
                setpriv,
                "--reuid=1000",
                "--regid=1000",
                "--clear-groups",
                "--inh-caps=+dac_read_search",
                "--ambient-caps=+dac_read_search",
                sys.executable,
                "-c",
                code,
                str(REPO_ROOT),
                str(src),
                str(base / "dst" / "ck"),
            ],
            capture_output=True,
            text=True,
            timeout=WAIT,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        out = json.loads(done.stdout)
        assert out["uid"] == 1000
        assert int(out["caps"], 16) == 1 << 2  # CAP_DAC_READ_SEARCH alone
        # This checkout's code, not another one's.
        assert out["module"] == str(REPO_ROOT / "storwatch" / "sync" / "__init__.py")
        result = SyncResult.from_dict(out["result"])
        assert result.outcome == "verified", result.error
        assert any("not running as root" in n for n in result.notes)
        assert tree(base / "dst" / "ck") == tree(src)
        assert json.loads((base / "dst" / ("ck" + MANIFEST_SUFFIX)).read_text())["owner_kept"] is False
    finally:
        shutil.rmtree(base)


# --------------------------------------------------------------------------------------------------------------------
# SyncWorker: helper processes, deadlines, cancel, close


@pytest.fixture
def worker() -> Iterator[Callable[..., SyncWorker]]:
    made: list[SyncWorker] = []

    def make(*args: Any, **kwargs: Any) -> SyncWorker:
        made.append(SyncWorker(*args, **kwargs))
        return made[-1]

    yield make
    for w in made:
        w.close()


def test_the_worker_runs_jobs_in_order_and_reports_each_once(tmp_path: Path, worker: Callable[..., SyncWorker]) -> None:
    src = make_checkpoint(tmp_path / "src", shards=2)
    root = tmp_path / "durable"
    root.mkdir()
    w = worker(Destinations([str(root)]), keep=0)
    first = w.submit(str(src), str(root / "ns" / "a"))
    second = w.submit(str(src), str(root / "ns" / "b"))
    assert [j.job_id for j in w.status()] == [first, second]
    done = w.wait(second, WAIT)
    assert done is not None and done.state == "done", done
    a = w.job(first)
    assert a is not None and a.state == "done" and a.result is not None and a.result.job_id == first
    assert a.bytes_total == a.result.bytes and a.finished >= a.started >= a.submitted > 0
    results = w.poll()
    assert [r.job_id for r in results] == [first, second] and all(r.outcome == "verified" for r in results)
    assert w.poll() == []
    assert tree(root / "ns" / "a") == tree(root / "ns" / "b") == tree(src)


def test_a_job_past_its_deadline_is_abandoned_and_its_helper_killed(
    tmp_path: Path, worker: Callable[..., SyncWorker]
) -> None:
    src = make_checkpoint(tmp_path / "src", shards=1)
    (tmp_path / "dst").mkdir()
    w = worker(None, bandwidth=1 << 20)  # about 20 s at 1 MiB/s: far past the deadline
    job_id = w.submit(str(src), str(tmp_path / "dst" / "ck"), deadline_seconds=1.0)
    pid = _helper_pid(w, job_id)
    job = w.wait(job_id, WAIT)
    assert job is not None and job.state == "abandoned" and job.result is not None
    assert job.result.outcome == "abandoned" and "past its deadline of 1 s" in (job.result.error or "")
    _wait_gone(pid)
    # What the killed helper left is removed by the next copy into that directory, which completes.
    fast = w.submit(str(src), str(tmp_path / "dst" / "ck"), bandwidth=0)
    job = w.wait(fast, WAIT)
    assert job is not None and job.state == "done", job
    assert leftovers(tmp_path / "dst") == [] and tree(tmp_path / "dst" / "ck") == tree(src)


def test_cancel_stops_the_copy_which_removes_its_temporaries(tmp_path: Path, worker: Callable[..., SyncWorker]) -> None:
    src = make_checkpoint(tmp_path / "src", shards=1)
    (tmp_path / "dst").mkdir()
    w = worker(None, bandwidth=1 << 20)
    job_id = w.submit(str(src), str(tmp_path / "dst" / "ck"))
    queued = w.submit(str(src), str(tmp_path / "dst" / "ck2"))
    _wait_for(lambda: (w.job(job_id) or _never()).bytes_done > 0, "the copy to start reading")
    w.cancel(queued)
    w.cancel(job_id)
    job = w.wait(job_id, WAIT)
    assert job is not None and job.result is not None and job.result.outcome == "stopped", job
    assert job.state == "failed"
    gone = w.job(queued)
    assert gone is not None and gone.state == "abandoned" and gone.result is not None
    assert os.listdir(tmp_path / "dst") == []


def test_close_returns_at_once_and_kills_what_runs(tmp_path: Path, worker: Callable[..., SyncWorker]) -> None:
    src = make_checkpoint(tmp_path / "src", shards=1)
    (tmp_path / "dst").mkdir()
    w = worker(None, bandwidth=1 << 20)
    job_id = w.submit(str(src), str(tmp_path / "dst" / "ck"))
    pid = _helper_pid(w, job_id)
    closer = threading.Thread(target=w.close)
    closer.start()
    closer.join(5.0)
    assert not closer.is_alive()
    job = w.job(job_id)
    assert job is not None and job.state == "abandoned"
    _wait_gone(pid)
    late = w.job(w.submit(str(src), str(tmp_path / "dst" / "x")))
    assert late is not None and late.state == "abandoned"


def test_a_helper_that_dies_without_a_result_fails_its_job(tmp_path: Path, worker: Callable[..., SyncWorker]) -> None:
    w = worker(None, command=[sys.executable, "-c", "import sys; sys.stdin.readline(); print('not json'); sys.exit(3)"])
    job = w.wait(w.submit(str(tmp_path), str(tmp_path / "x")), WAIT)
    assert job is not None and job.state == "failed" and job.result is not None
    assert "unreadable" in (job.result.error or "")


def _never() -> Any:
    raise AssertionError("the job is gone")


def _wait_for(predicate: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def _helper_pid(w: SyncWorker, job_id: int) -> int:
    _wait_for(lambda: w._jobs[job_id].proc is not None, "the helper to start")
    proc = w._jobs[job_id].proc
    assert proc is not None
    return proc.pid


def _wait_gone(pid: int) -> None:
    """The helper was killed: its process is gone, or a zombie waiting for the reaper."""

    def gone() -> bool:
        try:
            with open(f"/proc/{pid}/stat") as f:
                return f.read().rsplit(")", 1)[1].split()[0] == "Z"
        except (FileNotFoundError, ProcessLookupError):  # gone before the open, or between the open and the read
            return True

    _wait_for(gone, f"helper {pid} to end")
