"""The training side installs without the agent: ``training/`` (the distribution ``storwatch-training``) built and
installed into a fresh virtual environment brings nothing but itself, works there (a request file, a signal, a save
recorded) where storwatch's agent cannot even be imported, and, beside only the frameworks and torch pinned as this
environment has them, each framework's callback answers a request placed by the agent's own code. pip takes the
packages from its configured index (PyPI, or a mirror), as ``make test`` does.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

from storwatch.actions.request_file import place_request

pytestmark = pytest.mark.realpart

REPO = Path(__file__).resolve().parent.parent
FRAMEWORKS = ("transformers", "lightning", "accelerate")


def agent_dependencies() -> set[str]:
    """The agent's own dependencies (its installed metadata, extras left out), by their normalised names."""
    required = [r for r in metadata.requires("storwatch") or [] if "extra ==" not in r]
    assert required, "storwatch's metadata names no dependency"
    return {_name(re.match(r"[A-Za-z0-9._-]+", r)[0]) for r in required}  # type: ignore[index]


def _name(requirement: str) -> str:
    return requirement.strip().lower().replace("_", "-").replace(".", "-")


def fresh_venv(tmp_path: Path) -> Path:
    """A new virtual environment of this interpreter's base Python; its python."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    return venv / "bin" / "python"


def installed(python: Path) -> set[str]:
    listed = subprocess.run(
        [str(python), "-m", "pip", "list", "--format", "json"], check=True, capture_output=True, text=True, timeout=300
    )
    return {_name(d["name"]) for d in json.loads(listed.stdout)}


def pip_install(python: Path, *what: str) -> None:
    done = subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", *what], capture_output=True, text=True, timeout=1200
    )
    assert done.returncode == 0, done.stderr[-3000:]


def training_source(tmp_path: Path) -> Path:
    """A copy of training/ with its link to storwatch_training/ made a directory (as an sdist holds it)."""
    src = tmp_path / "storwatch-training-src"
    shutil.copytree(REPO / "training", src, symlinks=False)
    assert (src / "storwatch_training" / "requests.py").is_file()
    return src


USE = r"""
import importlib.util, json, os, signal, sys, time
from storwatch_training import EVENT_LOG_NAME, REQUEST_NAME, CheckpointRequests, atomic_write_bytes
run = sys.argv[1]
requests = CheckpointRequests()
requests.watch(run)
installed = requests.install()
asked_file = requests.pending(1)
requests.answering()
start = time.time()
atomic_write_bytes(b"state" * 1000, os.path.join(run, "step-1.bin"))
event = requests.saved(os.path.join(run, "step-1.bin"), start, time.time(), 1)
answered = not requests.pending(2) and not os.path.exists(os.path.join(run, REQUEST_NAME))
os.kill(os.getpid(), signal.SIGUSR1)
asked_signal = requests.pending(3)
print(json.dumps({
    "installed": installed, "asked_file": asked_file, "answered": answered, "asked_signal": asked_signal,
    "line": json.loads(open(os.path.join(run, EVENT_LOG_NAME)).read()), "bytes": event.bytes,
    "agent": importlib.util.find_spec("storwatch") is not None,
    "transformers": importlib.util.find_spec("transformers") is not None,
}))
"""


NEEDS = r"""
import json, re
from importlib import metadata
def name(r):
    return re.match(r"[A-Za-z0-9._-]+", r)[0].lower().replace("_", "-").replace(".", "-")
needs = {"storwatch-training": [], "others": set()}
for d in metadata.distributions():
    required = [name(r) for r in d.requires or [] if "extra ==" not in r]
    if name(d.metadata["Name"]) == "storwatch-training":
        needs["storwatch-training"] = required
    else:
        needs["others"].update(required)
print(json.dumps({"storwatch-training": needs["storwatch-training"], "others": sorted(needs["others"])}))
"""


def test_the_training_side_installs_alone_and_works_without_the_agent(tmp_path: Path) -> None:
    python = fresh_venv(tmp_path)
    before = installed(python)
    pip_install(python, str(training_source(tmp_path)))
    assert installed(python) - before == {"storwatch-training"}  # nothing else came with it
    run = tmp_path / "run"
    run.mkdir()
    place_request(str(run), None, "a checkpoint, please")
    used = subprocess.run(
        [str(python), "-I", "-c", USE, str(run)], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert used.returncode == 0, used.stderr[-3000:]
    got = json.loads(used.stdout)
    assert got["installed"] and got["asked_file"] and got["answered"] and got["asked_signal"], got
    assert got["line"]["path"] == str(run / "step-1.bin") and got["line"]["bytes"] == got["bytes"] == 5000, got
    assert not got["agent"] and not got["transformers"], got
    # A callback's module says what is missing, and nothing else breaks.
    missing = subprocess.run(
        [str(python), "-I", "-c", "import storwatch_training.transformers"], capture_output=True, text=True, timeout=60
    )
    assert missing.returncode != 0 and "No module named 'transformers'" in missing.stderr, missing.stderr


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_each_framework_joins_from_a_fresh_venv_holding_only_it(tmp_path: Path) -> None:
    for framework in FRAMEWORKS:
        pytest.importorskip(framework, reason="the training libraries are installed by make test")
    python = fresh_venv(tmp_path)
    pins = [f"{d}=={metadata.version(d)}" for d in ("torch", *FRAMEWORKS)]  # as this environment has them
    pip_install(python, str(training_source(tmp_path)), *pins)
    present = installed(python)
    needs = json.loads(
        subprocess.run([str(python), "-I", "-c", NEEDS], capture_output=True, text=True, timeout=60, check=True).stdout
    )
    assert needs["storwatch-training"] == [], needs["storwatch-training"]  # it depends on nothing
    # So each of the agent's dependencies there came with a framework (PyYAML, psutil); the others stay out.
    assert "storwatch" not in present
    assert present & agent_dependencies() <= set(needs["others"]), (present & agent_dependencies(), needs["others"])
    assert agent_dependencies() - present, "none of the agent's own dependencies stayed out"
    for framework in FRAMEWORKS:
        out = tmp_path / framework
        run = out / ("project/checkpoints" if framework == "accelerate" else "run")
        run.mkdir(parents=True)
        place_request(str(run), None, "a checkpoint, please")  # asked before it starts: answered at its first step
        job = subprocess.run(
            [str(python), "-I", str(REPO / "tests" / "callback_jobs.py"), framework, str(out), "--max-steps", "3"],
            cwd=out,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert job.returncode == 0, (framework, job.stderr[-3000:])
        done = json.loads(job.stdout.strip().splitlines()[-1])
        assert done == {"done": True, "agent_imported": []}, done
        lines = [json.loads(line) for line in (run / ".storwatch-events.jsonl").read_text().splitlines()]
        assert [line["step"] for line in lines] == [1], (framework, lines)
        assert os.path.exists(lines[0]["path"]) and not (run / ".storwatch-checkpoint-request").exists()
