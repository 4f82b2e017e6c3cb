"""A mount whose statfs hangs in the kernel (a FUSE daemon that never answers, like a dead NFS server).

The agent must mark it stuck, keep every scrape fast, keep its threads bounded, and still stop on SIGTERM in 5 s.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import threading
import time
from pathlib import Path

import pytest

from storwatch.calls.blocking import BlockingCalls, CallOutcome
from tests.agentproc import running_agent
from tests.builders import own_mount_table
from tests.realmounts import fuse_mount, tmpfs_mount

pytestmark = pytest.mark.realpart


def _threads(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return int(re.search(r"^Threads:\s+(\d+)", f.read(), re.M).group(1))  # type: ignore[union-attr]


def _children(pid: int) -> list[int]:
    kids: list[int] = []
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/children") as f:
                kids += [int(x) for x in f.read().split()]
        except (FileNotFoundError, ProcessLookupError):
            continue  # a thread that ended between the listing and the read (its children are its process's)
    return kids


def _own_table(tmp_path: Path, *mounts: Path) -> list[str]:
    """Run the agent seeing "/" and ``mounts`` only (tests/builders.own_mount_table): another hung mount on the
    machine would change what is stuck and how many of the helper's threads wait."""
    return own_mount_table(tmp_path / "table", mounts)


EXIT_WAIT_SECONDS = 60.0
"""How long a test waits for a process to finish while a mount is hung: a bound against hanging with it, generous for
a loaded machine; what is asserted is that it finishes at all, since the hung calls never return."""


def _get(port: int, path: str) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=EXIT_WAIT_SECONDS)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        body = resp.read()
    finally:
        conn.close()
    return resp.status, body


def _wait_for(predicate, timeout: float, what: str):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def test_blocking_calls_mark_a_hung_statvfs_stuck_and_never_call_twice(tmp_path: Path, real_mounts) -> None:  # type: ignore[no-untyped-def]
    hung = real_mounts(fuse_mount(tmp_path / "hung", block_statfs=True))
    calls = BlockingCalls(max_inflight=4)
    try:
        key = str(hung.mountpoint)
        # The helper process started first (its start-up is not what the deadline below is about).
        assert calls.call_many("statvfs", {"/": ["/"]}, timeout=10.0)["/"].values is not None
        # The hung statfs never returns until the connection is aborted: the round returning is its deadline at work.
        first = calls.call_many("statvfs", {key: [key], "/": ["/"]}, timeout=0.3)
        assert first[key].stuck and first[key].values is None
        assert first["/"].values is not None  # the healthy mount is not held up by the hung one
        for _ in range(5):
            again = calls.call_many("statvfs", {key: [key]}, timeout=0.1)
            assert again[key].stuck
        assert calls.in_flight() == 1  # one call per key, however often it is asked
        assert again[key].in_flight_seconds >= first[key].in_flight_seconds
        hung.abort()  # the daemon "dies": the stuck call fails and the key is free again
        # A call past its deadline is not waited for: each round says at once that it is still stuck.

        def unstuck() -> CallOutcome | None:
            outcome = calls.call_many("statvfs", {key: [key]}, 0.1)[key]
            return None if outcome.stuck else outcome

        released = _wait_for(unstuck, 5, "the aborted call to come back")
        assert not released.stuck
        # The stuck call itself comes back, failed (ECONNABORTED); a new one would fail with ENOTCONN.
        assert released.error in ("Software caused connection abort", "Transport endpoint is not connected")
        assert calls.in_flight() == 0
    finally:
        calls.close()


def test_agent_with_a_hung_mount(tmp_path: Path, real_mounts) -> None:  # type: ignore[no-untyped-def]
    hung = real_mounts(fuse_mount(tmp_path / "hung", block_statfs=True))
    mp = str(hung.mountpoint)
    config = tmp_path / "storwatch.yaml"
    # No checkpoint search (this machine's /home would be a default place): the statvfs helper is the only one.
    config.write_text(
        "tick_seconds: 0.2\nmounts:\n  interval_seconds: 0.5\n  statvfs_timeout_seconds: 0.3\n  max_inflight: 8\n"
        "checkpoints:\n  default_roots: false\n"
    )
    prefix = _own_table(tmp_path, hung.mountpoint)
    with running_agent("--config", str(config), "--listen", "127.0.0.1:0", prefix=prefix) as agent:
        port = agent.port
        stuck_line = f'storwatch_mount_stuck{{mountpoint="{mp}"}} 1.0'
        _wait_for(lambda: stuck_line in _get(port, "/metrics")[1].decode(), 10, "the hung mount to show stuck")

        threads_before = _threads(agent.proc.pid)
        # Every scrape is answered while the mount stays hung (its statfs never returns): none waits on it.
        for _ in range(100):
            status, body = _get(port, "/metrics")
            assert status == 200
        text = body.decode()
        assert stuck_line in text
        assert 'storwatch_mount_size_bytes{mountpoint="/"}' in text  # the healthy mounts keep reporting
        assert 'storwatch_collector_success{collector="mounts"} 1.0' in text

        # Many more rounds of the mount source pass; no thread piles up, here or in the helper.
        time.sleep(3)
        threads_after = _threads(agent.proc.pid)
        assert threads_after <= threads_before + 2, (threads_before, threads_after)
        # Its fixed set: a worker per known source (running or off), and the main thread, the ticker, the HTTP
        # server and its four body workers, the policy worker, the helper's reply reader, and at most two that
        # start on first use (the NVML deadline worker, an action lane).
        sources = sum(1 for line in text.splitlines() if line.startswith("storwatch_collector_enabled{"))
        assert threads_after <= sources + 11, (threads_after, sources)
        helpers = _children(agent.proc.pid)
        assert len(helpers) == 1
        # One call per mount at most (the hung one's never returns, and it gets no second), so one thread per mount
        # of the table ("/" and the hung one), plus the helper's main thread.
        assert _threads(helpers[0]) <= 2 + 1

        status, body = _get(port, "/api/status")
        entry = next(m for m in json.loads(body)["mounts"] if m["mountpoint"] == mp)
        assert entry["stuck"] is True and entry["size_bytes"] is None and entry["stuck_seconds"] > 0.3

        # SIGTERM ends the agent although one of its statvfs calls is stuck in the kernel (it never returns).
        agent.proc.send_signal(signal.SIGTERM)
        assert agent.proc.wait(timeout=EXIT_WAIT_SECONDS) == 0


def test_scan_with_a_hung_mount_finishes_and_reports_it_stuck(tmp_path: Path, real_mounts) -> None:  # type: ignore[no-untyped-def]
    import subprocess
    import sys

    hung = real_mounts(fuse_mount(tmp_path / "hung", block_statfs=True))
    # Its own mount table ("/" and the hung one): the host's other mounts, hung ones among them on a busy machine,
    # would take the scan's working slots first, leaving the hung one unmeasured rather than stuck.
    prefix = _own_table(tmp_path, hung.mountpoint)
    command = [*prefix, sys.executable, "-m", "storwatch", "scan", "--json", "--timeout", "0.3"]
    # The hung statfs never returns while the mount lives: a scan that waited on it would never finish (the run's
    # timeout only keeps the test from hanging with it).
    out = subprocess.run(command, capture_output=True, timeout=EXIT_WAIT_SECONDS, check=True)
    mounts = {m["mountpoint"]: m for m in json.loads(out.stdout)["mounts"]}
    assert mounts[str(hung.mountpoint)]["stuck"] is True
    assert mounts["/"]["size_bytes"] > 0


def _stuck_lines(text: str) -> int:
    return sum(1 for line in text.splitlines() if line.startswith("storwatch_mount_stuck{") and line.endswith(" 1.0"))


def test_scrapes_continue_while_statvfs_threads_are_stuck(tmp_path: Path, real_mounts) -> None:  # type: ignore[no-untyped-def]
    """More hung mounts than the stuck set holds: threads stay bounded, healthy mounts are measured, scrapes answer,
    and the mount left unmeasured by the limit makes the collector fail."""
    hung = [real_mounts(fuse_mount(tmp_path / f"hung{i}", block_statfs=True)) for i in range(3)]
    config = tmp_path / "storwatch.yaml"
    # One working slot: a hung mount holds it until its deadline moves it to the stuck set, so the calls go out one
    # after another in table order ("/" first once it answered in time) and the third hung mount can only come up
    # once the stuck set is full. With more slots, whether it is called before the set fills is a race with the
    # round's end, which a busy machine decides either way.
    config.write_text(
        "tick_seconds: 0.2\nmounts:\n  interval_seconds: 0.3\n  statvfs_timeout_seconds: 0.5\n  max_inflight: 1\n"
        "  max_stuck: 2\n"
    )
    prefix = _own_table(tmp_path, *(h.mountpoint for h in hung))
    with running_agent("--config", str(config), "--listen", "127.0.0.1:0", prefix=prefix) as agent:
        # The stuck set fills with the first two; the third is then never called: nothing is known of it, so it is
        # not called stuck, and the collector says a mount went unmeasured.
        _wait_for(lambda: _stuck_lines(_get(agent.port, "/metrics")[1].decode()) >= 2, 10, "two stuck mounts")
        time.sleep(1.5)
        helper = _children(agent.proc.pid)[0]
        assert _threads(helper) <= 1 + 2 + 1  # max_inflight + max_stuck calls, plus the helper's main thread
        text = _get(agent.port, "/metrics")[1].decode()
        assert _stuck_lines(text) == 2
        for h in hung[:2]:
            assert f'storwatch_mount_stuck{{mountpoint="{h.mountpoint}"}} 1.0' in text
        assert (
            sum(
                'storwatch_mount_info{device="storwatch-fusefs"' in line and str(h.mountpoint) in line
                for h in hung
                for line in text.splitlines()
            )
            == 3
        )  # all three are listed, stuck or not
        assert 'storwatch_mount_size_bytes{mountpoint="/"}' in text
        assert 'storwatch_collector_success{collector="mounts"} 0.0' in text
        mounts = {m["mountpoint"]: m for m in json.loads(_get(agent.port, "/api/status")[1])["mounts"]}
        left_out = [m for m in mounts.values() if (m["usage_error"] or "").startswith("not called")]
        assert [m["mountpoint"] for m in left_out] == [str(hung[2].mountpoint)]
        assert all(not m["stuck"] and m["size_bytes"] is None for m in left_out)
        errors: list[str] = []

        def scrape() -> None:
            for _ in range(20):
                status, _ = _get(agent.port, "/metrics")
                if status != 200:
                    errors.append(str(status))

        # Scrapes from four clients at once, all answered while three mounts stay hung.
        workers = [threading.Thread(target=scrape, daemon=True) for _ in range(4)]
        for w in workers:
            w.start()
        for w in workers:
            w.join(EXIT_WAIT_SECONDS)
        assert not any(w.is_alive() for w in workers) and errors == []


def test_twenty_hung_mounts_leave_every_healthy_mount_fresh(tmp_path: Path, real_mounts) -> None:  # type: ignore[no-untyped-def]
    """Issue 13: 16 hung FUSE mounts used to take every statvfs slot, and every mount's usage went blank while the
    collector said success. With 20 (more than max_inflight's 16), every healthy mount keeps fresh usage."""
    hung = [real_mounts(fuse_mount(tmp_path / f"hung{i:02}", block_statfs=True)) for i in range(20)]
    healthy = real_mounts(tmpfs_mount(tmp_path / "healthy"))
    config = tmp_path / "storwatch.yaml"
    config.write_text("tick_seconds: 0.2\nmounts:\n  interval_seconds: 0.3\n  statvfs_timeout_seconds: 0.3\n")
    prefix = _own_table(tmp_path, *(h.mountpoint for h in hung), healthy.mountpoint)
    with running_agent("--config", str(config), "--listen", "127.0.0.1:0", prefix=prefix) as agent:

        def all_ours_stuck() -> bool:
            text = _get(agent.port, "/metrics")[1].decode()
            return all(f'storwatch_mount_stuck{{mountpoint="{h.mountpoint}"}} 1.0' in text for h in hung)

        _wait_for(all_ours_stuck, 20, "all 20 hung mounts to show stuck")

        def avail() -> int:
            mounts = {m["mountpoint"]: m for m in json.loads(_get(agent.port, "/api/status")[1])["mounts"]}
            return int(mounts[str(healthy.mountpoint)]["avail_bytes"])

        before = avail()
        (healthy.mountpoint / "blob").write_bytes(os.urandom(4 << 20))
        _wait_for(lambda: avail() <= before - (4 << 20), 5, "the healthy mount's usage to follow a 4 MiB write")
        status = json.loads(_get(agent.port, "/api/status")[1])
        for m in status["mounts"]:
            # Every mount either answered this round or is stuck itself; none is left blank by the hung ones.
            assert m["stuck"] or m["size_bytes"] is not None, m
        collectors = {c["name"]: c for c in status["collectors"]}
        assert collectors["mounts"]["success"] is True, collectors["mounts"]
        helper = _children(agent.proc.pid)[0]
        assert _threads(helper) <= 22 + 1  # one call per mount at most ("/", 20 hung, the healthy one), and main

        # SIGTERM ends the agent although calls of its helper stay stuck in the kernel (they never return).
        agent.proc.send_signal(signal.SIGTERM)
        assert agent.proc.wait(timeout=EXIT_WAIT_SECONDS) == 0


def test_checkpoint_scan_skips_a_hung_mount_under_its_root(tmp_path: Path, real_mounts) -> None:  # type: ignore[no-untyped-def]
    """A hung mount inside a checkpoint root: once statvfs marks it stuck the walk leaves it alone, the checkpoints
    beside it are still found, and SIGTERM still ends the agent in 5 s."""
    from tests.builders import torch_like_zip

    root = tmp_path / "ckpt-root"
    run = root / "run"
    run.mkdir(parents=True)
    torch_like_zip(run / "step-1.pt")
    hung = real_mounts(fuse_mount(root / "zz-hung", block_statfs=True))
    config = tmp_path / "storwatch.yaml"
    config.write_text(
        "tick_seconds: 0.2\nmounts:\n  interval_seconds: 0.3\n  statvfs_timeout_seconds: 0.2\n"
        f"checkpoints:\n  roots: ['{root}']\n  kubelet: false\n  interval_seconds: 0.5\n  timeout_seconds: 1.0\n"
        # Scans every 0.5 s whatever they cost: on a busy machine a rescan's CPU time over the default share would
        # stretch the interval past the waits below (what is tested is the hung mount, not the pace).
        "  scan_cpu_share: 0\n"
    )
    prefix = _own_table(tmp_path, hung.mountpoint)
    with running_agent("--config", str(config), "--listen", "127.0.0.1:0", prefix=prefix) as agent:
        _wait_for(
            lambda: (
                f'storwatch_mount_stuck{{mountpoint="{hung.mountpoint}"}} 1.0'
                in _get(agent.port, "/metrics")[1].decode()
            ),
            10,
            "the hung mount to show stuck",
        )
        _wait_for(
            lambda: 'storwatch_checkpoint_kept{run="run"} 1.0' in _get(agent.port, "/metrics")[1].decode(),
            15,
            "the run to be found",
        )
        status = json.loads(_get(agent.port, "/api/status")[1])
        assert [r["run"] for r in status["checkpoints"]] == ["run"]
        # Now the daemon stops answering anything (as a dead server): entering the mount would hang the walk.
        os.kill(hung.proc.pid, signal.SIGSTOP)
        try:
            torch_like_zip(run / "step-2.pt")
            _wait_for(
                lambda: 'storwatch_checkpoint_kept{run="run"} 2.0' in _get(agent.port, "/metrics")[1].decode(),
                15,
                "later scans to go on beside the hung mount",
            )
        finally:
            os.kill(hung.proc.pid, signal.SIGCONT)
        # SIGTERM ends the agent although calls of its helper stay stuck in the kernel (they never return).
        agent.proc.send_signal(signal.SIGTERM)
        assert agent.proc.wait(timeout=EXIT_WAIT_SECONDS) == 0


def _kernel_stacks(pid: int) -> dict[int, str]:
    """Each thread's kernel stack (/proc/PID/task/TID/stack, root only): where a thread blocked in a syscall waits."""
    stacks = {}
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/stack") as f:
                stacks[int(task)] = f.read()
        except OSError:
            continue  # the thread ended meanwhile
    return stacks


def test_checkpoint_roots_whose_readdir_or_getattr_hangs_are_stuck_and_hold_no_agent_thread(  # type: ignore[no-untyped-def]
    tmp_path: Path, real_mounts
) -> None:
    """Issue 12: a checkpoint root on a FUSE mount whose readdir or getattr hangs while statfs answers (as s3fs can)
    pinned an agent thread in the kernel, the collector said success, and the agent could not finish exiting."""
    from tests.builders import torch_like_zip

    healthy = tmp_path / "healthy"
    run = healthy / "run"
    run.mkdir(parents=True)
    torch_like_zip(run / "step-1.pt")
    # A root of its own whose listing hangs, and a mount below the healthy root whose every stat hangs.
    readdir_backing = tmp_path / "readdir-backing"
    (readdir_backing / "job").mkdir(parents=True)
    torch_like_zip(readdir_backing / "job" / "step-1.pt")
    hung_readdir = real_mounts(fuse_mount(tmp_path / "hung-readdir", backing=readdir_backing, block_readdir=True))
    hung_getattr = real_mounts(fuse_mount(healthy / "zz-getattr", block_getattr=True))
    config = tmp_path / "storwatch.yaml"
    config.write_text(
        "tick_seconds: 0.2\nmounts:\n  interval_seconds: 0.5\n  statvfs_timeout_seconds: 0.5\n"
        f"checkpoints:\n  roots: ['{healthy}', '{hung_readdir.mountpoint}']\n  kubelet: false\n"
        "  interval_seconds: 0.5\n  timeout_seconds: 1.0\n  scan_cpu_share: 0\n"  # the pace is not what is tested
    )
    prefix = _own_table(tmp_path, hung_readdir.mountpoint, hung_getattr.mountpoint)
    with running_agent("--config", str(config), "--listen", "127.0.0.1:0", prefix=prefix) as agent:

        def stuck_roots() -> str | None:
            text = _get(agent.port, "/metrics")[1].decode()
            lines = [
                f'storwatch_checkpoint_root_stuck{{root="{m.mountpoint}"}} 1.0' for m in (hung_readdir, hung_getattr)
            ]
            return text if all(line in text for line in lines) else None

        text = _wait_for(stuck_roots, 60, "both hung roots to show stuck")
        assert f'storwatch_checkpoint_root_stuck{{root="{healthy}"}} 0.0' in text
        # statfs answers on both: the mount source sees nothing wrong, the checkpoint source does.
        for m in (hung_readdir, hung_getattr):
            assert f'storwatch_mount_stuck{{mountpoint="{m.mountpoint}"}} 0.0' in text
        assert 'storwatch_collector_success{collector="checkpoints"} 0.0' in text
        collectors = {c["name"]: c for c in json.loads(_get(agent.port, "/api/status")[1])["collectors"]}
        error = collectors["checkpoints"]["error"] or ""
        assert str(hung_readdir.mountpoint) in error and "stuck" in error, error
        # The healthy root keeps being scanned: a new checkpoint beside the hung mount is found.
        assert 'storwatch_checkpoint_kept{run="run"} 1.0' in text
        torch_like_zip(run / "step-2.pt")
        _wait_for(
            lambda: 'storwatch_checkpoint_kept{run="run"} 2.0' in _get(agent.port, "/metrics")[1].decode(),
            10,
            "the healthy root's new checkpoint",
        )

        # The hung calls wait in the kernel in the helper, never in the agent.
        agent_stacks = _kernel_stacks(agent.proc.pid)
        assert agent_stacks, "no kernel stacks readable (needs root)"
        in_fuse = {tid: s for tid, s in agent_stacks.items() if "fuse" in s}
        assert not in_fuse, in_fuse
        helper_stacks = [s for child in _children(agent.proc.pid) for s in _kernel_stacks(child).values()]
        assert sum("fuse" in s for s in helper_stacks) >= 2  # the detection above can see such a thread

        # SIGTERM ends the agent although calls of its helper stay stuck in the kernel (they never return).
        agent.proc.send_signal(signal.SIGTERM)
        assert agent.proc.wait(timeout=EXIT_WAIT_SECONDS) == 0


def test_a_walk_still_out_is_waited_for_only_as_long_as_walks_bound_themselves(  # type: ignore[no-untyped-def]
    tmp_path: Path, real_mounts
) -> None:
    """A collection waits max_seconds plus a margin for the walks, not the whole deadline: a hung unit is not a
    failure while within its deadline, and is stuck once past it."""
    from storwatch.config import CheckpointsConfig
    from storwatch.sources.checkpoints import CheckpointSource
    from tests.builders import torch_like_zip

    healthy = tmp_path / "healthy"
    healthy.mkdir()
    torch_like_zip(healthy / "step-1.pt")
    hung = real_mounts(fuse_mount(tmp_path / "hung", block_readdir=True))
    roots = [str(healthy), str(hung.mountpoint)]
    # An hour's deadline: a collection that waited for it, or for the hung walk, would not answer.
    within = CheckpointSource(roots, CheckpointsConfig(deep_per_scan=0, max_seconds=0.5, timeout_seconds=3600.0))
    try:
        first = within.collect()
        assert [r.path for r in first.runs] == [str(healthy)]
        assert first.stuck_roots == () and first.failure is None  # still within its deadline
    finally:
        within.close()
    past = CheckpointSource(roots, CheckpointsConfig(deep_per_scan=0, max_seconds=0.5, timeout_seconds=1.0))
    try:
        later = _wait_for(lambda: (c := past.collect()).stuck_roots and c, 60, "the hung unit to be stuck")
        (stuck,) = later.stuck_roots
        assert stuck.path == str(hung.mountpoint)
        assert stuck.seconds >= 1.0  # stuck once its walk has been out past the deadline, not before
        assert later.failure is not None and str(hung.mountpoint) in later.failure
        assert [r.path for r in later.runs] == [str(healthy)]
    finally:
        past.close()
