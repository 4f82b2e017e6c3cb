"""Checkpoints written by the real training libraries (tests/framework_checkpoints.py: the Hugging Face Trainer with
Accelerate on a tiny GPT-2, Lightning's ModelCheckpoint, Accelerate's save_state, dcp.save, a legacy-format
torch.save), judged by ``storwatch verify`` as a process and by the checkpoint source the agent runs: every one is
found once, as the checkpoint it is (an Accelerate save_state directory is one checkpoint, not one per file), and
is complete. Written once per module; the files are dated two hours back, as a run's settled checkpoints are.

Then saves as a user meets them: checked by ``verify`` right after the save returned, the training process alive
(complete at once: no process holds them open); an Accelerate save_state stopped inside the library where a kill
would cut it, killed there for real, or cut by removing what a kill leaves unwritten (one incomplete checkpoint of
its run, never files of a run of their own); and one whose random states are still held open for writing (being
written, not incomplete)."""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from storwatch.checkpoints import check
from storwatch.config import CheckpointsConfig
from storwatch.sources.checkpoints import CheckpointSource
from tests.agentproc import REPO_ROOT

pytestmark = pytest.mark.realpart

LIBRARIES = ("torch", "transformers", "accelerate", "lightning")
SETTLED = 2 * 3600


def _missing_libraries() -> list[str]:
    import importlib.util

    return [name for name in LIBRARIES if importlib.util.find_spec(name) is None]


def _need_libraries() -> None:
    missing = _missing_libraries()
    if missing:
        pytest.skip(f"not installed: {', '.join(missing)} (make's install step adds them beside torch==2.13.0)")


def _settle(root: Path) -> None:
    """Date everything below ``root`` two hours back, as a run's settled checkpoints are."""
    settled = time.time() - SETTLED
    for top, dirs, files in os.walk(root):
        for name in [*dirs, *files]:
            os.utime(os.path.join(top, name), (settled, settled), follow_symlinks=False)


def _verify(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "storwatch", "verify", *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def _collect(root: Path) -> dict[str, dict[str, tuple[str | None, str]]]:
    """The agent's checkpoint source at its defaults: run -> {checkpoint: (format, verdict)}."""
    source = CheckpointSource([str(root)], CheckpointsConfig(deep_per_scan=0))
    try:
        facts = source.collect()
    finally:
        source.close()
    return {run.path: {c.path: (c.format, c.verdict) for c in run.checkpoints} for run in facts.runs}


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, list[str]]]:
    """The root the libraries wrote into, and what each wrote (kind -> checkpoint paths)."""
    _need_libraries()
    root = tmp_path_factory.mktemp("frameworks")
    proc = subprocess.run(
        [sys.executable, "-m", "tests.framework_checkpoints", str(root)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    kinds: dict[str, list[str]] = json.loads(proc.stdout.strip().splitlines()[-1])
    _settle(root)
    return root, kinds


def _expected(kinds: dict[str, list[str]]) -> dict[str, str]:
    """Checkpoint path -> the format it must be taken for."""
    fmt = {"lightning": "torch-zip"}
    return {path: fmt.get(kind, kind) for kind, paths in kinds.items() for path in paths}


def test_each_library_wrote_what_it_writes(written: tuple[Path, dict[str, list[str]]]) -> None:
    # The control: the layouts are the libraries' own, so the tests below judge what users have on disk.
    _, kinds = written
    assert [Path(p).name for p in kinds["hf-trainer"]] == ["checkpoint-10", "checkpoint-15", "checkpoint-5"]
    for step in kinds["hf-trainer"]:
        names = set(os.listdir(step))
        assert {"training_args.bin", "optimizer.pt", "rng_state.pth", "trainer_state.json"} <= names, names
    assert len(kinds["lightning"]) == 2
    assert len(kinds["accelerate"]) == 3
    for state in kinds["accelerate"]:
        names = set(os.listdir(state))
        assert {"optimizer.bin", "scheduler.bin", "random_states_0.pkl", "custom_checkpoint_0.pkl"} <= names, names
        assert names & {"model.safetensors", "pytorch_model.bin"}, names
    (legacy,) = kinds["torch-legacy"]
    assert not Path(legacy).read_bytes().startswith(b"PK")  # not a ZIP: the legacy format


def test_verify_calls_every_library_checkpoint_complete(written: tuple[Path, dict[str, list[str]]]) -> None:
    root, kinds = written
    proc = subprocess.run(
        [sys.executable, "-m", "storwatch", "verify", "--json", str(root)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    results = json.loads(proc.stdout)
    found = {r["path"]: (r["format"], r["verdict"]) for r in results}
    expected = _expected(kinds)
    assert found == {path: (fmt, "complete") for path, fmt in expected.items()}, proc.stdout
    assert proc.returncode == 0, proc.stderr
    for r in results:
        # What the Trainer pickles into training_args.bin (AcceleratorConfig among it) is on the allow-list.
        assert "transformers.trainer_pt_utils.AcceleratorConfig" not in r["unknown_globals"], r
        if r["notes"]:
            print(f"{r['path']}: {r['notes']}")


def test_verify_deep_loads_each_kind_with_torch(written: tuple[Path, dict[str, list[str]]]) -> None:
    _, kinds = written
    one_each = [kinds["hf-trainer"][1], kinds["lightning"][-1], kinds["accelerate"][0], *kinds["torch-legacy"]]
    proc = subprocess.run(
        [sys.executable, "-m", "storwatch", "verify", "--deep", "--json", *one_each],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    results = json.loads(proc.stdout)
    assert [(r["path"], r["verdict"], r["deep"]) for r in results] == [(p, "complete", True) for p in one_each]
    assert proc.returncode == 0


def test_the_agents_source_calls_every_library_checkpoint_complete(
    written: tuple[Path, dict[str, list[str]]],
) -> None:
    root, kinds = written
    source = CheckpointSource([str(root)], CheckpointsConfig(deep_per_scan=0))
    try:
        facts = source.collect()
    finally:
        source.close()
    found = {c.path: (c.format, c.verdict) for run in facts.runs for c in run.checkpoints}
    expected = _expected(kinds)
    assert found == {path: (fmt, "complete") for path, fmt in expected.items()}, found
    runs = {run.path: len(run.checkpoints) for run in facts.runs}
    # Accelerate's automatic naming keeps its series in checkpoints/; each save_state is one checkpoint of it.
    assert runs[str(root / "accelerate" / "auto" / "checkpoints")] == 2
    assert runs[str(root / "hf")] == 3
    assert all(run.unsafe == 0 and run.corrupt == 0 and run.incomplete == 0 for run in facts.runs)


def test_accelerate_state_without_its_random_states_is_not_complete(
    written: tuple[Path, dict[str, list[str]]], tmp_path: Path
) -> None:
    """A save_state cut off before random_states_0.pkl (written after the model, optimizer and scheduler states) is
    an incomplete save of Accelerate's, also in a directory of its own name with no sibling saves; one whose
    optimizer.bin is cut short is incomplete too."""
    _, kinds = written
    state = Path(kinds["accelerate"][0])
    partial = tmp_path / "ckpt"
    partial.mkdir()
    for name in os.listdir(state):
        data = (state / name).read_bytes()
        if name == "random_states_0.pkl":
            continue
        (partial / name).write_bytes(data)
    _settle(tmp_path)
    result = check(str(partial))
    assert (result.format, result.verdict) == ("accelerate", "incomplete"), result
    assert "no random_states_0.pkl" in result.reason
    (partial / "random_states_0.pkl").write_bytes((state / "random_states_0.pkl").read_bytes())
    optimizer = (state / "optimizer.bin").read_bytes()
    (partial / "optimizer.bin").write_bytes(optimizer[: len(optimizer) // 2])
    _settle(tmp_path)
    result = check(str(partial))
    assert (result.format, result.verdict) == ("accelerate", "incomplete")
    assert "optimizer.bin" in result.reason
    (partial / "optimizer.bin").write_bytes(optimizer)
    assert check(str(partial)).verdict == "incomplete"  # just written: not settled yet
    assert check(str(partial), closed=True).verdict == "complete"  # unless its writer is known to have closed it
    assert check(str(partial), now=time.time() + SETTLED).verdict == "complete"


# What a kill leaves of a save_state, at each point between the files it writes (accelerate 1.15,
# checkpointing.save_accelerator_state then save_custom_state): the directory, the model's weights, the optimizer's
# and the scheduler's states, the random states; the registered object's state (custom_checkpoint_0.pkl) comes last.
KILLED_AFTER = {
    "made-its-directory": [],
    "wrote-the-model": ["model.safetensors"],
    "wrote-the-optimizer": ["model.safetensors", "optimizer.bin"],
    "wrote-the-scheduler": ["model.safetensors", "optimizer.bin", "scheduler.bin"],
    "wrote-the-random-states": ["model.safetensors", "optimizer.bin", "scheduler.bin", "random_states_0.pkl"],
}


@pytest.mark.parametrize("kept", list(KILLED_AFTER.values()), ids=list(KILLED_AFTER))
def test_a_save_state_cut_short_is_one_incomplete_checkpoint_of_its_run(
    written: tuple[Path, dict[str, list[str]]], tmp_path: Path, kept: list[str]
) -> None:
    root, _ = written
    run = tmp_path / "auto" / "checkpoints"
    shutil.copytree(root / "accelerate" / "auto" / "checkpoints", run)
    saves = sorted(os.listdir(run), key=lambda name: int(name.removeprefix("checkpoint_")))
    last = run / saves[-1]
    assert set(kept) < set(os.listdir(last)), saves  # the control: a kill left less than a finished save writes
    cut = run / f"checkpoint_{len(saves) + 5}"
    cut.mkdir()
    for name in kept:
        shutil.copy2(last / name, cut / name)
    _settle(tmp_path)
    proc = _verify("--json", str(run))
    found = {r["path"]: (r["format"], r["verdict"]) for r in json.loads(proc.stdout)}
    expected = {str(run / name): ("accelerate", "complete") for name in saves} | {
        str(cut): ("accelerate", "incomplete")
    }
    assert found == expected, proc.stdout
    assert proc.returncode == 1
    assert _collect(tmp_path) == {str(run): expected}  # one run: no member file is a checkpoint of a run of its own


def _interrupted(tmp_path: Path, where: str) -> tuple[subprocess.Popen[str], Path]:
    """A process in Accelerate's save_state, stopped where a kill would cut it (tests/framework_checkpoints.py), and
    the directory of that save."""
    _need_libraries()
    log = (tmp_path / "stderr").open("w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.framework_checkpoints", str(tmp_path / "job"), "--interrupt", where],
        cwd=REPO_ROOT,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=log,
        text=True,
    )
    log.close()
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], 300)
    line = proc.stdout.readline() if ready else ""
    if not line:
        proc.kill()
        proc.wait()
        pytest.fail(f"the save_state process did not stop where asked:\n{(tmp_path / 'stderr').read_text()[-4000:]}")
    stopped = json.loads(line)
    assert stopped["pid"] == proc.pid
    return proc, Path(stopped["state"])


def _kill(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=60)


def test_a_save_state_killed_before_its_random_states_is_one_incomplete_checkpoint_of_its_run(tmp_path: Path) -> None:
    proc, state = _interrupted(tmp_path, "before")
    _kill(proc)
    assert sorted(os.listdir(state)) == ["model.safetensors", "optimizer.bin", "scheduler.bin"]  # what it left
    run = state.parent
    # Right after the kill: no process holds the saves, so verify judges them at once.
    result = _verify("--json", str(run))
    found = {r["path"]: r for r in json.loads(result.stdout)}
    assert {p: (r["format"], r["verdict"]) for p, r in found.items()} == {
        str(run / "checkpoint_0"): ("accelerate", "complete"),
        str(run / "checkpoint_1"): ("accelerate", "complete"),
        str(state): ("accelerate", "incomplete"),
    }, result.stdout
    assert "no random_states_0.pkl" in found[str(state)]["reason"]
    assert result.returncode == 1
    _settle(tmp_path)
    assert _collect(tmp_path) == {
        str(run): {
            str(run / "checkpoint_0"): ("accelerate", "complete"),
            str(run / "checkpoint_1"): ("accelerate", "complete"),
            str(state): ("accelerate", "incomplete"),
        }
    }


def test_a_save_state_still_writing_is_said_to_be_written_not_incomplete(tmp_path: Path) -> None:
    proc, state = _interrupted(tmp_path, "during")
    try:
        text = _verify(str(state))
        data = _verify("--json", str(state))
    finally:
        _kill(proc)
    assert text.returncode == 3, text.stdout  # nothing damaged; nothing verified yet
    assert text.stdout.startswith("WRITING") and "INCOMPLETE" not in text.stdout, text.stdout
    assert f"still being written by PID {proc.pid} (python)" in text.stdout
    assert f"{state}/random_states_0.pkl open for writing" in text.stdout
    (result,) = json.loads(data.stdout)
    assert (result["format"], result["verdict"]) == ("accelerate", "unknown")
    assert result["reason"].startswith(f"still being written by PID {proc.pid}")
    # Killed there: what it left is an incomplete save.
    after = _verify(str(state))
    assert after.returncode == 1 and after.stdout.startswith("INCOMPLETE"), after.stdout
    assert "random_states_0.pkl" in after.stdout


def test_verify_right_after_the_save_returns_calls_it_complete(tmp_path: Path) -> None:
    """The Trainer and Accelerate mark no end of a save: the agent waits for them to settle, but a person checking
    a save that has returned (its job still training, holding none of its files) gets the verdict at once."""
    _need_libraries()
    log = (tmp_path / "stderr").open("w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.framework_checkpoints", str(tmp_path / "job"), "--fresh"],
        cwd=REPO_ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=log,
        text=True,
    )
    log.close()
    assert proc.stdout is not None and proc.stdin is not None
    try:
        line = "{"
        while not line.startswith('{"'):  # the Trainer prints its metrics as a Python dict on stdout
            ready, _, _ = select.select([proc.stdout], [], [], 300)
            line = proc.stdout.readline() if ready else ""
            assert line, (tmp_path / "stderr").read_text()[-4000:]
        kinds: dict[str, list[str]] = json.loads(line)
        assert proc.poll() is None  # the job lives on
        paths = [*kinds["hf-trainer"], *kinds["accelerate"]]
        data = _verify("--json", *paths)
        text = _verify(kinds["hf-trainer"][-1], kinds["accelerate"][-1])
    finally:
        proc.stdin.close()
        proc.wait(timeout=60)
    results = json.loads(data.stdout)
    assert [(r["path"], r["verdict"]) for r in results] == [(p, "complete") for p in paths], data.stdout
    assert {r["format"] for r in results} == {"hf-trainer", "accelerate"}
    assert data.returncode == 0
    assert text.returncode == 0
    assert [line.split()[0] for line in text.stdout.splitlines() if not line.startswith(" ")] == ["COMPLETE"] * 2
