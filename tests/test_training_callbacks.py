"""The framework callbacks with the real libraries (tests/callback_jobs.py: a Trainer on a tiny GPT-2, Lightning, an
Accelerate loop, each in a process of its own with its one line): the agent's request file, placed by the real
request_checkpoint action, is answered by a save at the very step boundary that first finds it, and removed; SIGUSR1
is caught (SigCgt shows it, so the action signals the job), the job lives on and saves at the next boundary; every
save's span lands in the run's event log, inside the step it was made in, and the agent's own check of event lines
against the kernel takes it. And end to end: a real agent finds the three runs, asks, each job answers at the step
that first sees the request, and the agent times those saves from their lines exactly.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from storwatch.actions.base import ActionRequest, ActionResult, Entity
from storwatch.actions.checkpoint_request import RequestCheckpointAction
from storwatch.actions.request_file import place_request
from storwatch.checkpoints.birth import statx_times
from storwatch.checkpoints.events import FileTimes, SaveRecord, judge
from storwatch.checkpoints.scan import CheckpointScanner
from storwatch.paths import HostPaths
from storwatch.sources.writers import catches
from storwatch_training import EVENT_LOG_NAME, REQUEST_NAME
from tests.agentproc import running_agent, wait_until

pytestmark = pytest.mark.realpart

REPO = Path(__file__).resolve().parent.parent
JOB_SCRIPT = REPO / "tests" / "callback_jobs.py"
FRAMEWORKS = ("transformers", "lightning", "accelerate")


def _traceback_starts(text: str) -> list[int]:
    """Where each Python traceback begins in a log (a torchrun rank's lines carry a ``[rankN]:`` prefix)."""
    starts, i = [], text.find("Traceback (most recent call last)")
    while i >= 0:
        starts.append(text.rfind("\n", 0, i) + 1)
        i = text.find("Traceback (most recent call last)", i + 1)
    return starts


class Job:
    """A running callback job (tests/callback_jobs.py), its stdout read line by line."""

    def __init__(
        self,
        python: str,
        framework: str,
        out: Path,
        *extra: str,
        sys_path: Path | None = REPO,
        prefix: Sequence[str] = ("-I",),
    ) -> None:
        """``prefix``: what comes between the interpreter and the script (``-I``, or torchrun's module and its
        options)."""
        self.out = out
        out.mkdir(parents=True, exist_ok=True)
        command = [python, *prefix, str(JOB_SCRIPT), framework, str(out), *extra]
        if sys_path is not None:
            command += ["--sys-path", str(sys_path)]
        self.stderr = open(out / "stderr.txt", "w")  # noqa: SIM115 - closed in close()
        # A session of its own: torchrun's and Lightning's worker processes go with it (close()).
        self.proc = subprocess.Popen(
            command, cwd=out, stdout=subprocess.PIPE, stderr=self.stderr, text=True, start_new_session=True
        )
        self.run_dir = Path()

    def line(self, key: str, timeout: float) -> dict[str, Any]:
        """The job's next JSON line holding ``key`` (the libraries print lines of their own)."""
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        while True:
            ready, _, _ = select.select([self.proc.stdout], [], [], max(deadline - time.monotonic(), 0))
            text = self.proc.stdout.readline() if ready else ""
            assert text, f"no {key} line from the job within {timeout} s; stderr: {self.stderr_text()[-3000:]}"
            with contextlib.suppress(ValueError):
                got = json.loads(text)
                if isinstance(got, dict) and key in got:
                    return got

    def ready(self) -> dict[str, Any]:
        """Its ready line: once it is past its first step (the framework and the callback set up)."""
        got = self.line("ready", 180)
        self.run_dir = Path(got["run_dir"])
        return got

    def stderr_text(self) -> str:
        self.stderr.flush()
        return (self.out / "stderr.txt").read_text(errors="replace")

    def failure(self) -> str:
        """Why the job failed, for an assertion's message: its exit status, each process's first traceback (the
        cause, where torchrun's own report and the other rank's warnings come after it) and the end of its stderr."""
        text = self.stderr_text()
        first = [text[i : i + 3000] for i in _traceback_starts(text)[:2]]
        return f"exit status {self.proc.returncode}\n" + "\n...\n".join([*first, text[-3000:]])

    def saves(self) -> list[dict[str, Any]]:
        try:
            text = (self.run_dir / EVENT_LOG_NAME).read_text()
        except FileNotFoundError:
            return []
        return [json.loads(line) for line in text.splitlines()]

    def boundaries(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in (self.out / "boundaries.jsonl").read_text().splitlines()]

    def stop(self) -> dict[str, Any]:
        """Ask it to stop at its next step's end; its last line."""
        (self.out / "stop").touch()
        done = self.line("done", 120)
        assert self.proc.wait(60) == 0, self.failure()
        return done

    def close(self) -> None:
        if self.proc.returncode is None:  # not reaped: its process group is still its own
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self.stderr.close()


@contextlib.contextmanager
def jobs(*started: Job) -> Iterator[None]:
    try:
        yield
    finally:
        for job in started:
            job.close()


@pytest.fixture
def action() -> Iterator[RequestCheckpointAction]:
    made = RequestCheckpointAction()
    yield made
    made.close()


def ask(
    action: RequestCheckpointAction, run_dir: Path, writers: dict[int, float] | None = None, **params: object
) -> ActionResult:
    """The agent's request_checkpoint action on the run, as a rule fires it."""
    entity = Entity(
        "run", run_dir.name, {}, run_dir=str(run_dir), writer_pids=tuple(writers or ()), writers_seen=writers or {}
    )
    request = ActionRequest("drain-soon", "request_checkpoint", params, entity, "critical", "node drain in 5 minutes")
    return action.run(request, timeout=10)


def first_seen(boundaries: Sequence[dict[str, Any]], after_step: int = 0, saves: Sequence[dict[str, Any]] = ()) -> int:
    """The first step boundary (past ``after_step``) at which the job found the request file. Where no boundary did,
    the request came between a boundary's record and the callback's look a moment later, which answered it there (the
    file stays until a save answers it, and every boundary records it): that boundary is the first of ``saves`` past
    ``after_step``."""
    seen = next((b["step"] for b in boundaries if b["step"] > after_step and b["request"]), None)
    if seen is not None:
        return int(seen)
    return next(s["step"] for s in saves if s["step"] is not None and s["step"] > after_step)


def agent_takes(line: dict[str, Any], root: Path) -> bool:
    """Whether the agent's own check of an event line against the kernel's times of its checkpoint (the scan's
    candidate, statx) takes it, as the checkpoint source does (_checkpoint_worker._event_log)."""
    candidates = {c.path: c for c in CheckpointScanner([str(root)], settle_seconds=0).scan().candidates}
    c = candidates[os.path.realpath(line["path"])]
    times = statx_times(c.path)
    assert times is not None, "statx is needed to check a line as the agent does"
    file = FileTimes(c.size_bytes, c.newest_mtime, times.birth, times.ctime)
    verdict = judge(line, file, time.time())
    assert isinstance(verdict, SaveRecord), (verdict, line, file)
    return line["bytes"] == c.size_bytes


@pytest.mark.timeout(600)
@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_the_callback_answers_the_request_file_and_the_signal_at_the_next_step(
    framework: str, tmp_path: Path, action: RequestCheckpointAction
) -> None:
    pytest.importorskip(framework, reason="the training libraries are installed by make test")
    job = Job(sys.executable, framework, tmp_path / "job")
    with jobs(job):
        pid = job.ready()["pid"]
        run_dir = job.run_dir
        request = run_dir / REQUEST_NAME
        # The handler is installed: the process catches SIGUSR1, so the agent may signal it.
        assert catches(HostPaths(), pid, signal.SIGUSR1) is True
        # 1. The request file alone, placed by the agent's action.
        result = ask(action, run_dir)
        assert result.outcome == "ok" and "request file created" in result.detail, result.detail
        wait_until(lambda: len(job.saves()) >= 1 and not request.exists(), 120, 0.1, "the request answered")
        # 2. SIGUSR1 alone: caught, the job lives on and saves at the next step.
        signalled = time.time()
        os.kill(pid, signal.SIGUSR1)
        wait_until(lambda: len(job.saves()) >= 2, 120, 0.1, "the signal answered")
        assert job.proc.poll() is None
        # 3. The action with its signal: sent (the job catches it), and answered with the file at one boundary.
        result = ask(action, run_dir, {pid: time.time()}, signal=True)
        assert result.outcome == "ok" and f"SIGUSR1 sent to PID {pid}" in result.detail, result.detail
        wait_until(lambda: len(job.saves()) >= 3 and not request.exists(), 120, 0.1, "the third request answered")
        done = job.stop()
    assert done["agent_imported"] == [], done  # the training side never imports the agent
    boundaries = job.boundaries()
    at = {b["step"]: b["t"] for b in boundaries}
    saves = job.saves()
    steps = [s["step"] for s in saves]
    asked_file = first_seen(boundaries, saves=saves)
    asked_signal = next(b["step"] for b in boundaries if b["t"] > signalled)
    asked_both = first_seen(boundaries, steps[1], saves)
    assert steps[0] == asked_file, (steps, boundaries)
    assert steps[1] in (asked_signal, asked_signal + 1), (steps, asked_signal)
    assert steps[2] == asked_both, (steps, boundaries)
    # The signal may land just after that save began: then it asks once more, at the next boundary, and no more.
    assert steps[3:] in ([], [asked_both + 1]), steps
    for line in saves:
        assert line["pid"] == pid
        assert at[line["step"]] <= line["start"] <= line["end"] <= at.get(line["step"] + 1, math.inf), line
        assert agent_takes(line, tmp_path / "job"), line
    assert not request.exists()


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_real_agent_asks_and_each_framework_answers_within_a_step_timed_exactly(tmp_path: Path) -> None:
    """The agent at its defaults (a checkpoint scan every 30 s) and one rule that asks every run it finds for a
    checkpoint; three jobs that save by themselves every 100 steps, so the agent finds their runs, and each stops once
    it answered."""
    for framework in FRAMEWORKS:
        pytest.importorskip(framework, reason="the training libraries are installed by make test")
    root = tmp_path / "root"
    save_every = 100
    every = ("--save-every", str(save_every), "--keep", "3", "--step-seconds", "0.1", "--max-steps", "100000")
    started = {f: Job(sys.executable, f, root / f, *every) for f in FRAMEWORKS}
    policy = tmp_path / "ask.yaml"
    policy.write_text(
        "rules:\n"
        "  - name: ask-every-run\n"
        "    on: run\n"
        "    when: complete + incomplete > 0\n"
        "    severity: info\n"
        "    message: 'run {run}: a checkpoint, please'\n"
        "    actions:\n"
        "      - action: request_checkpoint\n"
    )
    cfg = tmp_path / "storwatch.yaml"
    cfg.write_text(
        f"checkpoints: {{roots: [{json.dumps(str(root))}]}}\n"
        f"policy: {{files: [{json.dumps(str(policy))}]}}\n"
        "kube: {enabled: false}\n"
    )
    with jobs(*started.values()), running_agent("--config", str(cfg), "--listen", "127.0.0.1:0", timeout=60) as agent:
        for job in started.values():
            job.ready()

        def answer(job: Job) -> dict[str, Any] | None:
            """The save at the first step boundary that found the agent's request, once made. A request placed
            between a boundary's record and the callback's look, a moment later at the same boundary, is answered
            there and never recorded: then the answer is the first save the job did not schedule (it saves by itself
            only every ``save_every`` steps, and Accelerate's own saves name no step), made at a boundary no earlier
            record found the request at."""
            boundaries = job.boundaries()
            asked = next((b["step"] for b in boundaries if b["request"]), None)
            unscheduled = next((s for s in job.saves() if s["step"] is not None and s["step"] % save_every), None)
            if unscheduled is not None and (asked is None or unscheduled["step"] < asked):
                return unscheduled
            if asked is None or boundaries[-1]["step"] <= asked:
                return None
            return next((s for s in job.saves() if s["step"] == asked), {"missing": asked})

        answers: dict[str, dict[str, Any]] = {}
        stopped: dict[str, dict[str, Any]] = {}

        def all_answered() -> dict[str, dict[str, Any]] | None:
            for framework, job in started.items():
                if framework not in answers and (got := answer(job)) is not None:
                    answers[framework] = got
                    # Stopped at once, so that its own saves (it keeps 3) leave the answer for the agent's next scan.
                    stopped[framework] = job.stop()
            return answers if len(answers) == len(started) else None

        try:
            wait_until(all_answered, 300, 0.2, "each job asked and answering")
        except AssertionError as err:
            status = json.loads(agent.fetch("/api/status").body)
            raise AssertionError(f"{err}: {answers}; runs {status['checkpoints']}; {status['policy']}") from None
        assert not [a for a in answers.values() if "missing" in a], answers
        assert all(done["agent_imported"] == [] for done in stopped.values()), stopped

        seen: list[Any] = []

        def timed() -> dict[str, dict[str, Any]] | None:
            status = json.loads(agent.fetch("/api/status").body)
            seen[:] = status["checkpoints"]
            found: dict[str, dict[str, Any]] = {}
            for run in status["checkpoints"]:
                for c in run["checkpoints"]:
                    for framework, line in answers.items():
                        if os.path.realpath(c["path"]) == os.path.realpath(line["path"]):
                            found[framework] = c
            return found if all(f in found and found[f]["write_timed_by"] for f in FRAMEWORKS) else None

        try:
            shown = wait_until(timed, 120, 1.0, "the agent timing the answers")
        except AssertionError as err:
            raise AssertionError(f"{err}: answers {answers}, the agent's runs {seen}") from None
    for framework, line in answers.items():
        c = shown[framework]
        assert c["write_timed_by"] == "event_log", (framework, c)
        assert c["write_seconds"] == pytest.approx(line["end"] - line["start"], abs=1e-6), (framework, c, line)


def test_accelerate_keeps_its_total_limit_beside_the_event_log_and_the_agents_request(tmp_path: Path) -> None:
    """Accelerate's own total_limit takes every entry of ``<project_dir>/checkpoints`` for a checkpoint and fails on
    one without a number in its name (IndexError in save_state): the event log, or the agent's request file, would
    end the job at its next save. With the callback the limit holds and the job goes on."""
    pytest.importorskip("accelerate", reason="the training libraries are installed by make test")
    out = tmp_path / "job"
    run = out / "project" / "checkpoints"
    run.mkdir(parents=True)
    place_request(str(run), None, "a checkpoint, please")
    (run / "notes.txt").write_text("a file of the user's own, no checkpoint")
    options = ("--save-every", "1", "--keep", "2", "--max-steps", "5", "--step-seconds", "0", "--sys-path", str(REPO))
    job = subprocess.run(
        [sys.executable, "-I", str(JOB_SCRIPT), "accelerate", str(out), *options],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert job.returncode == 0, job.stderr[-3000:]
    saves = [json.loads(line) for line in (run / EVENT_LOG_NAME).read_text().splitlines()]
    assert len(saves) == 5, saves  # one a step: the first, begun after the request, answers it
    assert sorted(p.name for p in run.iterdir() if p.is_dir()) == ["checkpoint_3", "checkpoint_4"]
    assert (run / "notes.txt").exists() and not (run / REQUEST_NAME).exists()


PARTS = {
    "transformers": ("rng_state_0.pth", "rng_state_1.pth"),
    "accelerate": ("random_states_0.pkl", "random_states_1.pkl"),
    "lightning": (),
}


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_in_a_job_of_two_processes_a_signal_to_the_writer_makes_both_save(framework: str, tmp_path: Path) -> None:
    """The agent signals the process it saw writing (rank 0) and no other: every process must take part in the save
    (Lightning's and Accelerate's saves wait at a barrier, the Trainer saves each process's RNG state), so the
    decision is theirs together. Decided by rank 0 alone, the job would hang or lose rank 1's part. Two CPU processes
    over gloo: the Trainer and Accelerate under torchrun, Lightning with its own DDP launcher."""
    pytest.importorskip(framework, reason="the training libraries are installed by make test")
    out = tmp_path / "job"
    options = ["--max-steps", "30", "--step-seconds", "0.2"]
    if framework == "lightning":
        job = Job(sys.executable, framework, out, *options, "--processes", "2")
    else:
        torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
        job = Job(torchrun[0], framework, out, *options, prefix=torchrun[1:])
    with jobs(job):
        pid = job.ready()["pid"]
        wait_until(lambda: catches(HostPaths(), pid, signal.SIGUSR1), 60, 0.1, "the handler installed")
        os.kill(pid, signal.SIGUSR1)
        done = job.line("done", 600)
        assert job.proc.wait(60) == 0, job.failure()
    assert done["agent_imported"] == []
    (line,) = job.saves()
    saved = Path(line["path"])
    assert saved.exists() and all((saved / part).is_file() for part in PARTS[framework]), sorted(saved.iterdir())
    assert line["pid"] == pid and agent_takes(line, out)
