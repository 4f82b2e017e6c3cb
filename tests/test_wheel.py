"""The package carries what it needs: the wheel built from this tree, installed into a fresh virtual environment,
runs an agent that loads the shipped default policy (package data), found the same way as in the source tree.

Offline and quick: the wheel is built without build isolation (this environment's setuptools) from a copy of the
tree (so no build/ or egg-info lands in the checkout), and installed with ``--no-index --no-deps``; the agent's
dependencies come from this environment's site-packages, named by a ``.pth`` file in the new one. A path line in a
``.pth`` file adds that directory and nothing else (its own ``.pth`` files, an editable install's import hook among
them, are not run), so ``storwatch`` itself can only come from the wheel: the test checks where it was imported from.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.agentproc import REPO_ROOT, running_agent, wait_until

pytestmark = pytest.mark.realpart


def _run(*cmd: str | Path, cwd: Path | None = None) -> str:
    done = subprocess.run([str(c) for c in cmd], cwd=cwd, capture_output=True, text=True, timeout=300, env=_clean_env())
    assert done.returncode == 0, f"{' '.join(map(str, cmd))}: exit {done.returncode}\n{done.stdout}\n{done.stderr}"
    return done.stdout


def _clean_env() -> dict[str, str]:
    """This environment without what would lead an interpreter to the source tree."""
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP")}


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh virtual environment holding the wheel; its python."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO_ROOT / name, src / name)
    for package in ("storwatch", "storwatch_training"):  # the training side too: the agent reads its contract
        shutil.copytree(REPO_ROOT / package, src / package, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    dist = tmp / "dist"
    _run(sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation", "--no-index",
         "-w", dist, src)  # fmt: skip
    (wheel,) = dist.glob("storwatch-*.whl")
    venv = tmp / "venv"
    _run(sys.executable, "-m", "venv", "--without-pip", venv)
    python = venv / "bin" / "python"
    _run(sys.executable, "-m", "pip", "--python", python, "install", "--quiet", "--no-deps", "--no-index", wheel)
    purelib = Path(_run(python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])").strip())
    (purelib / "storwatch-test-dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return python


def test_the_wheel_holds_the_default_policy_and_its_tests(installed: Path) -> None:
    where = _run(installed, "-c", "import storwatch.agent.policy as p; print(p.SHIPPED_DEFAULT)", cwd=installed.parent)
    shipped = Path(where.strip())
    assert shipped.is_relative_to(installed.parents[1]), f"{shipped}: not from the fresh environment"
    assert shipped.read_text(encoding="utf-8") == (REPO_ROOT / "storwatch" / "policies" / "default.yaml").read_text(
        encoding="utf-8"
    )
    # Its test cases come along, and pass as the installed command runs them.
    tests = shipped.parent / "default_test.yaml"
    out = _run(installed, "-m", "storwatch", "policy", "test", tests, cwd=installed.parent)
    assert "0 failures: passed" in out, out


def test_the_agent_installed_from_the_wheel_loads_the_default_policy(installed: Path, tmp_path: Path) -> None:
    rules = yaml.safe_load((REPO_ROOT / "storwatch" / "policies" / "default.yaml").read_text(encoding="utf-8"))
    names = {r["name"] for r in rules["rules"]}
    config = tmp_path / "storwatch.yaml"
    config.write_text("gpu: {enabled: false}\nkube: {enabled: false}\n")
    env = {k: None for k in ("PYTHONPATH", "KUBECONFIG", "KUBERNETES_SERVICE_HOST")}
    with running_agent(
        "--config", str(config), "--listen", "127.0.0.1:0", env=env, cwd=tmp_path, python=str(installed), timeout=60
    ) as agent:
        m = agent.wait_for_stderr(r"policy: (\d+) rules from (\S+)", timeout=30)
        assert int(m.group(1)) == len(names), m.group(0)
        assert Path(m.group(2)).is_relative_to(installed.parents[1]), m.group(0)
        assert "policy not loaded" not in agent.stderr_text()

        def policy() -> dict[str, Any] | None:
            resp = agent.fetch("/api/status")
            return json.loads(resp.body)["policy"] if resp.status == 200 else None  # type: ignore[no-any-return]

        status = wait_until(policy, timeout=30, interval=0.2, what="/api/status")
        assert status["last_reload_success"] is True, status
        assert {r["name"] for r in status["rules"]} == names
        assert [re.sub(r"^.*/site-packages/", "", f) for f in status["files"]] == ["storwatch/policies/default.yaml"]
