"""The agent's threads carry their names to the OS (storwatch/threadname.py): ``top -H`` and
``/proc/PID/task/TID/comm`` show which part each thread is, on the real kernel."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import threading
from pathlib import Path

from storwatch.agent import Agent
from storwatch.config import Config
from storwatch.threadname import OS_NAME_BYTES, name_this_thread, os_name
from tests.agentproc import wait_until


def _comm(thread: threading.Thread) -> str:
    return Path(f"/proc/self/task/{thread.native_id}/comm").read_text().rstrip("\n")


def test_a_name_is_shortened_to_what_the_kernel_keeps() -> None:
    assert os_name("ticker") == b"ticker"
    assert os_name("source-file_events") == b"src-file_events"
    assert os_name("storwatch-kube-pods") == b"kube-pods"
    assert os_name("storwatch-kube-persistentvolumeclaims") == b"kube-persistent"
    assert os_name("http-worker-12") == b"http-worker-12"
    assert os_name("actions-emergency_checkpoint") == b"actions-emergen"
    assert len(os_name("x" * 40)) == OS_NAME_BYTES
    assert os_name("sörce") == b"s?rce"


def test_a_thread_that_names_itself_shows_that_name_in_proc() -> None:
    done = threading.Event()
    named: list[bool] = []

    def run() -> None:
        named.append(name_this_thread())
        done.wait(10.0)

    t = threading.Thread(target=run, name="source-file_events", daemon=True)
    t.start()
    try:
        wait_until(lambda: named, 10.0, what="the thread to name itself")
        assert named == [True]
        assert _comm(t) == "src-file_events"
        assert _comm(threading.current_thread()) != "src-file_events"  # the caller's own name is its own
    finally:
        done.set()
        t.join(10.0)


def test_the_main_thread_keeps_the_process_name() -> None:
    """A part run on a process's main thread must not rename the process (``ps`` and ``pgrep`` show the main
    thread's name)."""
    script = (
        "import threading\n"
        "from storwatch.threadname import name_this_thread\n"
        "comm = lambda: open('/proc/self/comm').read().strip()\n"
        "before = comm()\n"
        "threading.current_thread().name = 'source-nfs'\n"
        "print(before, name_this_thread(), comm())\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True)
    before, named, after = out.stdout.split()
    assert (named, after) == ("False", before), out


class _Source:
    """A source filed under the mount table's collector name; it says when it has been read."""

    name = "mounts"
    interval_seconds = 3600.0

    def __init__(self) -> None:
        self.read = threading.Event()

    def collect(self) -> None:
        self.read.set()

    def close(self) -> None:
        pass


def test_the_agents_threads_carry_their_names_to_the_os() -> None:
    config = dataclasses.replace(Config(), listen="127.0.0.1:0", platform="generic")
    source = _Source()
    agent = Agent(config, sources=[source], process_metrics=False)
    agent.start()
    try:
        assert source.read.wait(10.0)
        want = {"ticker": "ticker", "policy": "policy", "source-mounts": "src-mounts", "http": "http"}

        def named() -> dict[str, str] | None:
            seen = {t.name: _comm(t) for t in threading.enumerate() if t.name in want}
            return seen if seen == want else None

        wait_until(named, 10.0, what=f"the threads {sorted(want)} named so in /proc")
    finally:
        agent.stop()
