"""The deadline worker: one thread, one job at a time, each waited for no longer than its deadline."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest

from storwatch.calls.deadline import DeadlineWorker


def wait_for(probe: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not probe():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.01)


def worker_threads(name: str) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == name]


class CallerWaits(threading.Condition):
    """The worker's condition, counting the waits made on it by the test's own thread (a caller of ``run``)."""

    def __init__(self) -> None:
        super().__init__()
        self.caller = threading.get_ident()
        self.waits = 0

    def wait(self, timeout: float | None = None) -> bool:
        if threading.get_ident() == self.caller:
            self.waits += 1
        return super().wait(timeout)


def test_worker_starts_no_second_job_while_one_is_stuck() -> None:
    worker = DeadlineWorker("test-worker-stuck")
    cond = worker._cond = CallerWaits()
    release = threading.Event()
    started: list[str] = []

    def stuck() -> str:
        started.append("stuck")
        release.wait(60)
        return "late"

    assert worker.run(stuck, timeout=0.2) is None  # its deadline passed: given up on, not waited for
    assert started == ["stuck"] and worker.busy and not release.is_set()  # still stuck when run() returned
    waits = cond.waits
    assert worker.run(lambda: started.append("second"), timeout=0.2) is None  # busy: not started, no wait
    assert cond.waits == waits
    assert started == ["stuck"]
    # The worker's own threads, by its name: other threads of this process (an earlier test's, ending late on a busy
    # machine) come and go meanwhile.
    [thread] = worker_threads("test-worker-stuck")
    assert thread.daemon  # a job stuck in a C call never keeps the process from exiting
    release.set()
    wait_for(lambda: not worker.busy, 5, "the stuck job to return")
    assert worker.run(lambda: 42, timeout=1.0) == (42, None)
    _, err = worker.run(lambda: 1 / 0, timeout=1.0) or (None, None)
    assert isinstance(err, ZeroDivisionError)
    assert worker_threads("test-worker-stuck") == [thread]  # the stuck job's thread went on to the later jobs

    # wait_idle: a job queued behind one in flight (the agent's collect() while close() runs) waits for it, within
    # the same timeout.
    short = threading.Thread(target=worker.run, args=(lambda: time.sleep(0.2), 1.0))
    short.start()
    wait_for(lambda: worker.busy, 2, "the short job to start")
    assert worker.run(lambda: "after", timeout=1.0, wait_idle=True) == ("after", None)
    short.join()
    worker.stop()


def test_wait_idle_gives_up_within_its_timeout_when_the_job_in_flight_is_stuck() -> None:
    worker = DeadlineWorker("test-worker-wait-idle")
    release = threading.Event()
    try:
        assert worker.run(lambda: release.wait(10), timeout=0.05) is None
        ran: list[bool] = []
        # had it waited past its timeout for the stuck job (which returns within 10 s), it would have run the next
        assert worker.run(lambda: ran.append(True), timeout=0.3, wait_idle=True) is None
        assert ran == [] and worker.busy
        release.set()
        wait_for(lambda: not worker.busy, 5, "the stuck job to return")
        assert ran == []  # given up on, it never runs later
    finally:
        release.set()
        worker.stop()


def test_stop_runs_nothing_more_and_the_thread_ends() -> None:
    worker = DeadlineWorker("test-worker-stop")
    assert worker.run(lambda: "one", timeout=1.0) == ("one", None)
    assert len(worker_threads("test-worker-stop")) == 1
    worker.stop()
    ran: list[bool] = []
    assert worker.run(lambda: ran.append(True), timeout=1.0) is None
    assert worker.run(lambda: ran.append(True), timeout=1.0, wait_idle=True) is None
    assert ran == []
    wait_for(lambda: not worker_threads("test-worker-stop"), 2, "the idle thread to end")


def test_no_thread_until_the_first_job() -> None:
    worker = DeadlineWorker("test-worker-lazy")
    assert worker_threads("test-worker-lazy") == []
    assert not worker.busy
    value, err = worker.run(threading.current_thread, timeout=1.0) or (None, None)
    assert err is None
    assert isinstance(value, threading.Thread) and value.name == "test-worker-lazy"  # ran on the worker's thread
    worker.stop()


@pytest.mark.parametrize("exc", [ValueError("bad"), OSError(5, "EIO")], ids=["value-error", "os-error"])
def test_an_exception_is_returned_and_the_worker_goes_on(exc: Exception) -> None:
    worker = DeadlineWorker("test-worker-raise")

    def fail() -> None:
        raise exc

    try:
        assert worker.run(fail, timeout=1.0) == (None, exc)
        assert worker.run(lambda: "next", timeout=1.0) == ("next", None)
    finally:
        worker.stop()
