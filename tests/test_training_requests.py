"""CheckpointRequests, what the framework callbacks share: a request file placed by the agent's own code is pending
until a save begins after it, and removed once that save is recorded unless renewed meanwhile; the answer never
rests on this process's clock agreeing with the file's (a shared filesystem's server keeps its own); SIGUSR1 is
caught, counted and answered like the file, the handler it replaced still called and put back afterwards; nothing
raises into a training loop. And record_save counts a checkpoint directory's bytes as the agent's scan does."""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import FrameType

import pytest

from storwatch.actions.request_file import place_request
from storwatch.checkpoints.scan import CheckpointScanner
from storwatch_training import EVENT_LOG_NAME, REQUEST_NAME, CheckpointRequests, checkpoint_requested, record_save


@pytest.fixture
def run(tmp_path: Path) -> Path:
    run = tmp_path / "run"
    run.mkdir()
    return run


@pytest.fixture
def requests(run: Path) -> Iterator[CheckpointRequests]:
    made = CheckpointRequests()
    made.watch(run)
    yield made
    made.uninstall()


def save(requests: CheckpointRequests, run: Path, name: str) -> None:
    """A save into the run, as a callback makes one: answering, the write, the record."""
    requests.answering()
    start = time.time()
    (run / name).write_bytes(b"x" * 100)
    assert requests.saved(str(run / name), start, time.time(), 1) is not None


def test_a_save_answers_the_request_there_when_it_began_and_a_renewal_asks_again(
    requests: CheckpointRequests, run: Path
) -> None:
    request = run / REQUEST_NAME
    assert requests.pending(1) is False
    assert place_request(str(run), None, "drain")[0] == "created"
    assert requests.pending(1) is True
    requests.answering()
    # The agent renews its request while the save is under way: a later mtime (by a second, as its clock moves on).
    assert place_request(str(run), None, "drain, again")[0] == "renewed"
    later = request.stat().st_mtime_ns + 1_000_000_000
    os.utime(request, ns=(later, later))
    (run / "a.pt").write_bytes(b"x" * 100)
    requests.saved(str(run / "a.pt"), time.time(), time.time(), 1)
    assert request.exists() and requests.pending(2) is True  # renewed after the save began: it asks again
    save(requests, run, "b.pt")
    assert not request.exists() and requests.pending(3) is False
    lines = [json.loads(line) for line in (run / EVENT_LOG_NAME).read_text().splitlines()]
    assert [Path(line["path"]).name for line in lines] == ["a.pt", "b.pt"] and lines[1]["bytes"] == 100


def test_an_answered_request_is_never_asked_again_whatever_the_clocks_say(
    requests: CheckpointRequests, run: Path
) -> None:
    """A request file on NFS carries the server's clock: an hour ahead, it is newer than any save this process
    starts. Compared by clock it would ask at every step, forever, wherever it cannot be removed."""
    place_request(str(run), None, "drain")
    ahead = time.time_ns() + 3600 * 10**9
    os.utime(run / REQUEST_NAME, ns=(ahead, ahead))
    assert requests.pending(1) is True
    requests.answering()  # the save begins (the writer, another process, will record it and remove the file)
    assert checkpoint_requested(str(run)) is True  # by the clocks, still asking
    assert requests.pending(2) is False  # by the file's identity, answered


def test_sigusr1_is_caught_and_answered_and_the_handler_it_replaced_still_runs(
    requests: CheckpointRequests, run: Path
) -> None:
    before: list[int] = []

    def theirs(signum: int, frame: FrameType | None) -> None:
        before.append(signum)

    previous = signal.signal(signal.SIGUSR1, theirs)
    try:
        assert requests.install() is True
        os.kill(os.getpid(), signal.SIGUSR1)
        assert requests.pending(1) is True and before == [signal.SIGUSR1]  # counted, and theirs called too
        save(requests, run, "a.pt")
        assert requests.pending(2) is False
        os.kill(os.getpid(), signal.SIGUSR1)
        assert requests.pending(3) is True  # a signal after the save began asks again
        requests.uninstall()
        assert signal.getsignal(signal.SIGUSR1) is theirs
    finally:
        signal.signal(signal.SIGUSR1, previous)


def test_without_a_handler_before_the_default_comes_back(requests: CheckpointRequests) -> None:
    assert signal.getsignal(signal.SIGUSR1) == signal.SIG_DFL
    requests.install()
    assert signal.getsignal(signal.SIGUSR1) != signal.SIG_DFL
    requests.uninstall()
    assert signal.getsignal(signal.SIGUSR1) == signal.SIG_DFL


def test_requests_are_read_every_nth_step(run: Path) -> None:
    requests = CheckpointRequests(poll_every_steps=5)
    requests.watch(run)
    place_request(str(run), None, "drain")
    assert [requests.pending(step) for step in range(1, 11)] == [False] * 4 + [True] + [False] * 4 + [True]
    with pytest.raises(ValueError, match="poll_every_steps"):
        CheckpointRequests(poll_every_steps=0)


def test_outside_the_main_thread_no_handler_and_no_error(requests: CheckpointRequests) -> None:
    got: list[bool] = []
    worker = threading.Thread(target=lambda: got.append(requests.install()))
    worker.start()
    worker.join()
    assert got == [False] and signal.getsignal(signal.SIGUSR1) == signal.SIG_DFL


def test_a_save_that_cannot_be_recorded_is_logged_not_raised(
    requests: CheckpointRequests, run: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="storwatch_training.requests"):
        assert requests.saved(str(run / "gone.pt"), time.time(), time.time(), 1) is None
    assert "gone.pt was not recorded" in caplog.text


def test_a_checkpoint_directorys_bytes_are_those_the_scan_counts(run: Path, tmp_path: Path) -> None:
    ckpt = run / "checkpoint-5"
    (ckpt / "sub").mkdir(parents=True)
    (ckpt / "model.safetensors").write_bytes(b"m" * 3000)
    (ckpt / "sub" / "optimizer.pt").write_bytes(b"o" * 500)
    (ckpt / "trainer_state.json").write_text("{}")
    (tmp_path / "elsewhere.dat").write_bytes(b"e" * 10_000)
    (ckpt / "link.bin").symlink_to(tmp_path / "elsewhere.dat")  # never followed
    event = record_save(str(ckpt), time.time() - 1, time.time(), 5)
    (candidate,) = CheckpointScanner([str(tmp_path)], settle_seconds=0).scan().candidates
    assert event.bytes == candidate.size_bytes == 3502
    assert json.loads((run / EVENT_LOG_NAME).read_text())["path"] == str(ckpt)


def test_a_save_decided_but_never_made_answers_nothing(requests: CheckpointRequests, run: Path) -> None:
    """The Trainer takes what has asked when it decides to save, and counts it answered only at on_save: a save that
    save_strategy="best" cancels after its evaluation leaves the request asking."""
    requests.install()
    place_request(str(run), None, "drain")
    os.kill(os.getpid(), signal.SIGUSR1)
    decided = requests.asked()
    assert requests.pending(1) is True  # decided, not made: still asking
    os.kill(os.getpid(), signal.SIGUSR1)  # a signal after the look: not answered by that save
    requests.answered(decided)
    assert requests.pending(2) is True
    requests.answered(requests.asked())
    assert requests.pending(3) is False
