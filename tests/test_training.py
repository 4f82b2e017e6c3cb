"""Training-side helpers: atomic saves (also under SIGKILL), the event log, and the checkpoint request contract."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from storwatch import training
from storwatch.checkpoints import DeepLimits, check
from storwatch.training import (
    EVENT_LOG_NAME,
    REQUEST_NAME,
    acknowledge_request,
    atomic_save,
    atomic_write_bytes,
    checkpoint_requested,
    is_temp_name,
    temp_name,
)

try:
    import torch
except ImportError:  # pragma: no cover - depends on the environment
    torch = None  # type: ignore[assignment]

needs_torch = pytest.mark.skipif(torch is None, reason="torch is not installed (pip install torch==2.13.0, CPU wheel)")
REPO = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        (temp_name("model.pt"), True),
        (".model.pt.tmp-123-0badc0de", True),
        ("model.pt", False),
        (".model.pt.tmp-abc-0badc0de", False),
        ("model.pt.tmp-123-0badc0de", False),
        (".storwatch-events.jsonl", False),
    ],
    ids=["generated", "literal", "final", "bad-pid", "no-dot", "event-log"],
)
def test_is_temp_name(name: str, expected: bool) -> None:
    assert is_temp_name(name) is expected


def test_atomic_write_bytes_replaces_and_leaves_nothing_else(tmp_path: Path) -> None:
    target = tmp_path / "state.bin"
    assert atomic_write_bytes(b"one", str(target)) == 3
    assert atomic_write_bytes(b"second", str(target)) == 6
    assert target.read_bytes() == b"second"
    assert os.listdir(tmp_path) == ["state.bin"]


def test_atomic_write_failure_removes_temp_file(tmp_path: Path) -> None:
    target = tmp_path / "state.bin"
    target.write_bytes(b"old")

    def explode(f: object) -> None:
        raise RuntimeError("serialiser failed")

    with pytest.raises(RuntimeError):
        training._atomic_write(str(target), explode)
    assert os.listdir(tmp_path) == ["state.bin"]
    assert target.read_bytes() == b"old"


@pytest.mark.realpart
@needs_torch
def test_atomic_save_writes_event_log_and_verifies(tmp_path: Path) -> None:
    assert torch is not None
    target = tmp_path / "step-7.pt"
    event = atomic_save({"w": torch.randn(100)}, str(target), step=7)
    assert check(str(target), deep=True).verdict == "complete"
    lines = (tmp_path / EVENT_LOG_NAME).read_text().splitlines()
    assert len(lines) == 1
    record = json.loads(lines[0])
    assert set(record) == {"path", "start", "end", "bytes", "step", "pid"}
    assert record["path"] == str(target) and record["step"] == 7 and record["pid"] == os.getpid()
    assert record["bytes"] == target.stat().st_size == event.bytes
    assert record["start"] <= record["end"]
    custom = tmp_path / "events.jsonl"
    atomic_save({"w": torch.randn(3)}, str(tmp_path / "b.pt"), event_log=str(custom))
    assert json.loads(custom.read_text())["step"] is None


@pytest.mark.realpart
@needs_torch
def test_atomic_save_exception_removes_temp_file(tmp_path: Path) -> None:
    with pytest.raises(Exception):  # noqa: B017 - pickling a lambda fails with a type that varies
        atomic_save({"f": lambda: 0}, str(tmp_path / "model.pt"))
    assert os.listdir(tmp_path) == []


@pytest.mark.realpart
@needs_torch
def test_checkpoint_request_contract(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert torch is not None
    monkeypatch.setattr(training, "_last_run_dir", None)
    monkeypatch.delenv(training.RUN_DIR_ENV, raising=False)
    assert checkpoint_requested() is False  # no run directory known
    assert checkpoint_requested(str(tmp_path)) is False  # no request
    request = tmp_path / REQUEST_NAME
    request.write_text("node drain scheduled; newest checkpoint is on node-local storage")
    assert checkpoint_requested(str(tmp_path)) is True  # no save yet
    past = time.time() - 30
    os.utime(request, (past, past))
    atomic_save({"w": torch.zeros(2)}, str(tmp_path / "a.pt"))
    assert checkpoint_requested() is False  # defaults to the last save's directory; the save answered it
    future = time.time() + 5
    os.utime(request, (future, future))
    assert checkpoint_requested() is True
    acknowledge_request()
    assert not request.exists()
    assert checkpoint_requested() is False
    monkeypatch.setattr(training, "_last_run_dir", None)
    monkeypatch.setenv(training.RUN_DIR_ENV, str(tmp_path))
    request.write_text("again")
    os.utime(request, (future, future))
    assert checkpoint_requested() is True


_FORKER = """
import os, sys
import torch
from storwatch.training import atomic_save
state = {"w": torch.randn(1_250_000)}  # about 5 MB
print("ready", flush=True)
for line in sys.stdin:
    pid = os.fork()
    if pid == 0:
        step = 0
        while True:
            atomic_save(state, line.strip(), step=step)
            step += 1
    print(pid, flush=True)
    os.waitpid(pid, 0)
    print("reaped", flush=True)
"""


@pytest.mark.realpart
@needs_torch
def test_sigkill_inside_atomic_save_never_leaves_a_partial_file(tmp_path: Path) -> None:
    assert torch is not None
    rng = random.Random(99)
    forker = subprocess.Popen(
        [sys.executable, "-c", _FORKER],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert forker.stdin is not None and forker.stdout is not None
    outcomes = {"absent": 0, "complete": 0, "temp_left": 0}
    try:
        assert forker.stdout.readline().strip() == "ready"
        for i in range(100):
            run_dir = tmp_path / f"run{i}"
            run_dir.mkdir()
            final = run_dir / "model.pt"
            forker.stdin.write(f"{final}\n")
            forker.stdin.flush()
            pid = int(forker.stdout.readline())
            time.sleep(rng.uniform(0.0, 0.2))
            os.kill(pid, signal.SIGKILL)
            assert forker.stdout.readline().strip() == "reaped"
            for name in os.listdir(run_dir):
                assert name in ("model.pt", EVENT_LOG_NAME) or is_temp_name(name), name
                outcomes["temp_left"] += is_temp_name(name)
            if not final.exists():
                outcomes["absent"] += 1
                continue
            # Every CRC, without the torch-load child per file (the next line loads it with torch itself).
            result = check(str(final), deep=True, limits=DeepLimits(torch_load=False))
            assert result.verdict == "complete", result
            assert torch.load(final, weights_only=True)["w"].numel() == 1_250_000
            outcomes["complete"] += 1
    finally:
        forker.kill()
        forker.wait()
    print(f"SIGKILL outcomes: {outcomes}")
    assert outcomes["absent"] + outcomes["complete"] == 100
