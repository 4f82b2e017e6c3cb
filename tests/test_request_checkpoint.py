"""The request_checkpoint action with real parts: a torch training loop in its own process polling
checkpoint_requested() answers each request no later than its first poll after the action returned; whatever is
planted at the request file's name (a symbolic link, a FIFO, a hard link, someone else's file) or in the run's path is
neither followed nor replaced, and the action fails saying what it found; the opt-in signal reaches a real process
holding a file open for writing under the run, and no other."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from storwatch.actions.base import ActionRequest, ActionResult, Entity
from storwatch.actions.checkpoint_request import RequestCheckpointAction
from storwatch.training import REQUEST_NAME

pytestmark = pytest.mark.realpart
REPO = Path(__file__).resolve().parent.parent

try:
    import torch  # noqa: F401

    HAVE_TORCH = True
except ImportError:
    HAVE_TORCH = False


@pytest.fixture
def action() -> Iterator[RequestCheckpointAction]:
    made = RequestCheckpointAction()
    yield made
    made.close()


def ask(
    action: RequestCheckpointAction,
    run_dir: Path,
    *,
    root: Path | None = None,
    pids: tuple[int, ...] = (),
    **params: object,
) -> ActionResult:
    entity = Entity("run", run_dir.name, {}, run_dir=str(run_dir), writer_pids=pids, run_root=root and str(root))
    request = ActionRequest("drain-soon", "request_checkpoint", params, entity, "critical", "node drain in 5 minutes")
    return action.run(request, timeout=10)


def read_line(proc: subprocess.Popen[str], timeout: float = 60) -> str:
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    assert ready, f"no line from PID {proc.pid} within {timeout} s"
    return proc.stdout.readline().strip()


@pytest.mark.skipif(not HAVE_TORCH, reason="torch is not installed (pip install torch==2.13.0, CPU wheel)")
def test_a_polling_training_loop_answers_at_its_first_poll_after_the_request(
    action: RequestCheckpointAction, tmp_path: Path
) -> None:
    run = tmp_path / "run1"
    run.mkdir()
    result_file = tmp_path / "loop.json"
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.request_loop", str(run), str(result_file), "--answers", "2"],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert read_line(proc) == "ready"
        asked: list[tuple[float, float]] = []
        for expected in ("created", "renewed"):
            before = time.time()
            result = ask(action, run)
            asked.append((before, time.time()))
            assert result.outcome == "ok" and f"request file {expected}" in result.detail, result.detail
            _, _step, start = read_line(proc).split()
            # The next request must be newer than this save's start by the filesystem's coarse clock too.
            while time.time() < float(start) + 0.05:
                time.sleep(0.01)
        proc.wait(60)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 0
    loop = json.loads(result_file.read_text())
    assert len(loop["answers"]) == 2
    polls = loop["polls"]
    for answer, (before, after) in zip(loop["answers"], asked, strict=True):
        # The request file exists from some moment inside the action, so the poll that answers it is the last one that
        # started before the action did (its stat may come after the file was made) or a later one, and no later than
        # the first poll that started after the action returned. The loop may answer while the action is still
        # returning; then, with its answers done, it polls no more.
        earliest = max((p for p in polls if p < before), default=polls[0])
        latest = min((p for p in polls if p >= after), default=answer["poll"])
        assert earliest <= answer["poll"] <= latest, (answer, before, after)
    assert "storwatch asks for a checkpoint" in (run / REQUEST_NAME).read_text()


def unchanged(path: Path) -> tuple[bytes, int, int]:
    st = path.stat()
    return path.read_bytes(), st.st_mtime_ns, st.st_nlink


def test_a_planted_symlink_is_neither_followed_nor_replaced(action: RequestCheckpointAction, tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    victim = tmp_path / "victim"
    victim.write_text("do not touch")
    os.utime(victim, ns=(1_000_000_000, 1_000_000_000))
    before = unchanged(victim)
    (run / REQUEST_NAME).symlink_to(victim)
    result = ask(action, run)
    assert result.outcome == "failed"
    assert "a symbolic link is at" in result.detail and "not followed, not replaced" in result.detail
    assert unchanged(victim) == before
    assert os.readlink(run / REQUEST_NAME) == str(victim)
    # A dangling link is no different: nothing is created where it points.
    (run / REQUEST_NAME).unlink()
    (run / REQUEST_NAME).symlink_to(tmp_path / "made-through-the-link")
    assert ask(action, run).outcome == "failed"
    assert not (tmp_path / "made-through-the-link").exists()


def test_a_fifo_and_a_hard_link_are_left_as_they_are(action: RequestCheckpointAction, tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    os.mkfifo(run / REQUEST_NAME)
    result = ask(action, run)  # returns: a FIFO is never opened
    assert result.outcome == "failed" and "a FIFO is at" in result.detail, result.detail
    (run / REQUEST_NAME).unlink()
    victim = tmp_path / "victim"
    victim.write_text("someone's file")
    os.utime(victim, ns=(1_000_000_000, 1_000_000_000))
    os.link(victim, run / REQUEST_NAME)
    before = unchanged(victim)
    result = ask(action, run)
    assert result.outcome == "failed" and "a file with 2 links is at" in result.detail, result.detail
    assert unchanged(victim) == before


def test_only_a_file_it_could_have_made_is_renewed(action: RequestCheckpointAction, tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    assert ask(action, run).detail.startswith("request file created")
    request = run / REQUEST_NAME
    os.utime(request, ns=(1_000_000_000, 1_000_000_000))
    assert ask(action, run).detail.startswith("request file renewed")
    assert request.stat().st_mtime_ns > 1_000_000_000 and request.stat().st_nlink == 1
    assert "node drain in 5 minutes" in request.read_text()
    # The same file owned by another user is not one we made.
    os.chown(request, 1000, 1000)
    os.utime(request, ns=(1_000_000_000, 1_000_000_000))
    result = ask(action, run)
    assert result.outcome == "failed" and "owned by uid 1000" in result.detail
    assert request.stat().st_mtime_ns == 1_000_000_000


def test_links_in_the_run_path_are_not_followed(action: RequestCheckpointAction, tmp_path: Path) -> None:
    root, elsewhere = tmp_path / "root", tmp_path / "elsewhere"
    (elsewhere / "run").mkdir(parents=True)
    root.mkdir()
    (root / "team").symlink_to(elsewhere)
    # Below the scan root, a link anywhere in the path stops the request.
    result = ask(action, root / "team" / "run", root=root)
    assert result.outcome == "failed" and "is a symbolic link: never followed" in result.detail
    assert not (elsewhere / "run" / REQUEST_NAME).exists()
    # Without a root, the run directory's own last component is held.
    (root / "run").symlink_to(elsewhere / "run")
    assert ask(action, root / "run").outcome == "failed"
    assert not (elsewhere / "run" / REQUEST_NAME).exists()
    # A run outside its root is refused.
    result = ask(action, elsewhere / "run", root=root)
    assert result.outcome == "failed" and "not under its scan root" in result.detail
    # And a real path below the root works.
    (root / "real" / "run").mkdir(parents=True)
    assert ask(action, root / "real" / "run", root=root).outcome == "ok"
    assert (root / "real" / "run" / REQUEST_NAME).is_file()


TARGET = """
import os, signal, sys, time
marker, path, mode, handler = sys.argv[1:5]
def answer(sig, frame):
    open(marker, "w").write(signal.Signals(sig).name)
    sys.exit(0)
if handler == "catches":
    signal.signal(signal.SIGUSR1, answer)
held = open(path, mode)
print("ready", flush=True)
time.sleep(60)
"""


def target(tmp_path: Path, name: str, path: Path, mode: str, handler: str = "catches") -> subprocess.Popen[str]:
    marker = tmp_path / f"{name}.signalled"
    proc = subprocess.Popen(
        [sys.executable, "-c", TARGET, str(marker), str(path), mode, handler], stdout=subprocess.PIPE, text=True
    )
    assert read_line(proc, 20) == "ready"
    return proc


def ask_writers(
    action: RequestCheckpointAction, run_dir: Path, seen: dict[int, float], pids: tuple[int, ...] = ()
) -> ActionResult:
    """Ask with ``seen``: the writers the agent's own looks saw writing the run's checkpoints, and when."""
    entity = Entity("run", run_dir.name, {}, run_dir=str(run_dir), writer_pids=pids, writers_seen=seen)
    request = ActionRequest(
        "drain-soon", "request_checkpoint", {"signal": True}, entity, "critical", "node drain in 5 minutes"
    )
    return action.run(request, timeout=10)


def test_the_signal_reaches_the_writer_and_no_other_process(action: RequestCheckpointAction, tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "step-1.pt").write_bytes(b"old")
    (tmp_path / "elsewhere").write_bytes(b"")
    writer = target(tmp_path, "writer", run / ".step-2.pt.tmp", "wb")
    reader = target(tmp_path, "reader", run / "step-1.pt", "rb")
    other = target(tmp_path, "other", tmp_path / "elsewhere", "wb")
    try:
        seen = {writer.pid: time.time()}
        result = ask_writers(action, run, seen, pids=(reader.pid, other.pid))
        assert result.outcome == "ok", result.detail
        assert f"SIGUSR1 sent to PID {writer.pid}" in result.detail
        never = "the agent's own looks never saw it writing the run's checkpoints"
        assert f"PID {reader.pid}: {never}" in result.detail and f"PID {other.pid}: {never}" in result.detail
        assert writer.wait(20) == 0
        assert (tmp_path / "writer.signalled").read_text() == "SIGUSR1"
        assert reader.poll() is None and other.poll() is None
        assert not (tmp_path / "reader.signalled").exists() and not (tmp_path / "other.signalled").exists()
        # Named writers that are not: refused, the request file still placed and asking alone.
        result = ask_writers(action, run, {1: time.time(), os.getpid(): time.time()}, pids=(reader.pid,))
        assert result.outcome == "ok" and "request file renewed" in result.detail
        assert "sent to no process: the request file alone asks" in result.detail
        assert "PID 1: it is PID 1" in result.detail and f"PID {os.getpid()}: it is this agent" in result.detail
        assert reader.poll() is None
        # The exited writer's PID names no process now.
        result = ask_writers(action, run, seen)
        assert f"PID {writer.pid}: no such process" in result.detail
    finally:
        for proc in (writer, reader, other):
            proc.send_signal(signal.SIGKILL)
            proc.wait()


def test_a_pid_that_names_a_process_started_after_the_look_is_not_signalled(
    action: RequestCheckpointAction, tmp_path: Path
) -> None:
    """A writer seen an hour ago whose PID now names a process that started a minute ago: another process (the PID
    was reused), never signalled."""
    run = tmp_path / "run"
    run.mkdir()
    newcomer = target(tmp_path, "newcomer", run / "step-2.pt", "wb")
    try:
        result = ask_writers(action, run, {newcomer.pid: time.time() - 3600})
        assert f"PID {newcomer.pid}: the PID names a process started after the writer was seen" in result.detail
        assert newcomer.poll() is None and not (tmp_path / "newcomer.signalled").exists()
    finally:
        newcomer.send_signal(signal.SIGKILL)
        newcomer.wait()


def test_a_writer_that_does_not_catch_the_signal_is_left_alone(action: RequestCheckpointAction, tmp_path: Path) -> None:
    """SIGUSR1's default action ends a process: a job that installed no handler is asked by the request file alone
    (it exited 138 when signalled)."""
    run = tmp_path / "run"
    run.mkdir()
    plain = target(tmp_path, "plain", run / "step-2.pt", "wb", handler="default")
    try:
        result = ask_writers(action, run, {plain.pid: time.time()})
        assert result.outcome == "ok", result.detail
        assert f"PID {plain.pid}: it does not catch SIGUSR1 (SigCgt)" in result.detail
        assert "request file created" in result.detail
    finally:
        plain.send_signal(signal.SIGTERM)
        # A SIGUSR1 sent before would have ended it first (the kernel delivers the lower-numbered pending signal).
        assert plain.wait() == -signal.SIGTERM


@pytest.mark.parametrize("mode", [0o777, 0o1777, 0o1755], ids=["world-writable", "sticky-shared", "sticky"])
def test_no_signal_for_a_run_directory_others_may_write(
    action: RequestCheckpointAction, tmp_path: Path, mode: int
) -> None:
    """Anyone may make a shared directory a run, and name in it a victim whose files lie there: never a signal."""
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, mode)
    victim = target(tmp_path, "victim", shared / "model.pt", "wb")
    try:
        result = ask_writers(action, shared, {victim.pid: time.time()})
        assert result.outcome == "ok" and "request file created" in result.detail
        assert "sent to no process: the run's directory is" in result.detail
    finally:
        victim.send_signal(signal.SIGTERM)
        assert victim.wait() == -signal.SIGTERM  # not 0: its SIGUSR1 handler never ran
    assert not (tmp_path / "victim.signalled").exists()


def test_params_and_what_needs_no_request(action: RequestCheckpointAction, tmp_path: Path) -> None:
    assert action.check({"signal": True, "signal_name": "SIGUSR2"}) == []
    assert action.check({"signal": "yes"}) == ["params.signal: must be true or false"]
    assert action.check({"signal": True, "signal_name": "SIGKILL"}) == [
        "params.signal_name: must be one of SIGTERM, SIGUSR1, SIGUSR2"
    ]
    assert action.check({"signal_name": "SIGUSR2"}) == [
        "params.signal_name: given without signal: true (no signal would be sent)"
    ]
    entity = Entity("node", "node-a", {})
    result = action.run(ActionRequest("r", "request_checkpoint", {}, entity, "info", "m"), 5)
    assert result.outcome == "failed" and "names no run directory" in result.detail
    run = tmp_path / "run"
    run.mkdir()
    entity = Entity("run", "run", {}, run_dir=str(run))
    resolved = ActionRequest("r", "request_checkpoint", {}, entity, "info", "m", transition="resolved")
    assert action.run(resolved, 5).outcome == "skipped"
    assert not (run / REQUEST_NAME).exists()


def test_an_alerts_rule_asks_the_run_the_alert_names(action: RequestCheckpointAction, tmp_path: Path) -> None:
    """A rule ``on: alert`` asks in the directory of the run its labels name (``Entity.subject``); an alert naming no
    run of this node names no directory."""
    run = tmp_path / "run1"
    run.mkdir()
    subject = Entity("run", "run1", {"run": "run1"}, run_dir=str(run))
    fields = {"alertname": "StorwatchRecoveryPointOverBudget", "entity_kind": "run", "entity_key": "run1"}
    alert = Entity("alert", "4f1a", fields, subject=subject)
    request = ActionRequest("on-alert", "request_checkpoint", {}, alert, "critical", "over budget")
    result = action.run(request, timeout=10)
    assert result.outcome == "ok" and (run / REQUEST_NAME).is_file(), result
    alone = Entity("alert", "9e2b", {"alertname": "StorwatchRecoveryPointOverBudget"})
    result = action.run(ActionRequest("on-alert", "request_checkpoint", {}, alone, "critical", "m"), timeout=10)
    assert result == ActionResult("failed", "the alert names no run of this node")
