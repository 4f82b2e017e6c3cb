"""The agent with exactly the capabilities its DaemonSet gives it (read from daemonset/base/daemonset.yaml), against
a tenant's 0700 home holding a 0600 checkpoint of another uid: judged with them; without them an honest collector
error naming the directory, never a node that looks empty."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from tests.agentproc import REPO_ROOT, AgentProcess, running_agent, wait_until

DAEMONSET = REPO_ROOT / "daemonset" / "base" / "daemonset.yaml"
TENANT_UID = 64123  # no account needed: the kernel only compares numbers

pytestmark = pytest.mark.realpart

# Bits of /proc/PID/status CapEff (linux/capability.h).
CAPABILITY_BITS = {"DAC_OVERRIDE": 1, "DAC_READ_SEARCH": 2, "KILL": 5, "SYS_PTRACE": 19, "SYS_ADMIN": 21}


def manifest_capabilities() -> list[str]:
    (container,) = yaml.safe_load(DAEMONSET.read_text(encoding="utf-8"))["spec"]["template"]["spec"]["containers"]
    caps = container["securityContext"]["capabilities"]
    assert caps["drop"] == ["ALL"]
    return list(caps["add"])


def setpriv(capabilities: list[str]) -> tuple[str, ...]:
    """A command prefix running root with only these capabilities and no_new_privs, as the container runtime runs
    the DaemonSet's container (drop ALL, add these, allowPrivilegeEscalation false): root's permitted and effective
    sets after exec are its bounding set."""
    if shutil.which("setpriv") is None:
        pytest.skip("setpriv (util-linux) is needed to drop capabilities")
    if os.geteuid() != 0:
        pytest.skip("needs root, as the DaemonSet's container runs")
    bounding = ",".join(["-all", *(f"+{c.lower()}" for c in capabilities)])
    return ("setpriv", f"--bounding-set={bounding}", "--inh-caps=-all", "--no-new-privs")


def tenant_home(tmp_path: Path) -> tuple[Path, Path]:
    """root/alice (0700, the tenant's) with run/step-1.pt (0600, a real torch.save), and root/open with one the agent
    can always read."""
    root = tmp_path / "home"
    home = root / "alice"
    (home / "run").mkdir(parents=True)
    (root / "open" / "run").mkdir(parents=True)
    for where in (home, root / "open"):
        torch.save({"w": torch.arange(16, dtype=torch.float32)}, where / "run" / "step-1.pt")
    for p in (home, home / "run", home / "run" / "step-1.pt"):
        os.chown(p, TENANT_UID, TENANT_UID)
    (home / "run" / "step-1.pt").chmod(0o600)
    (home / "run").chmod(0o700)
    home.chmod(0o700)
    return root, home


def _config(tmp_path: Path, root: Path) -> Path:
    cfg = tmp_path / "storwatch.yaml"
    cfg.write_text(
        "tick_seconds: 0.2\nkube: {enabled: false}\ngpu: {enabled: false}\n"
        f"checkpoints: {{roots: [{json.dumps(str(root))}], interval_seconds: 0.5, kubelet: false, settle_seconds: 0}}\n"
    )
    return cfg


def _uid(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line for line in status.splitlines() if line.startswith("Uid:")).split()[1])


def _effective(agent: AgentProcess) -> int:
    status = Path(f"/proc/{agent.proc.pid}/status").read_text()
    return int(next(line for line in status.splitlines() if line.startswith("CapEff:")).split()[1], 16)


def _report(agent: AgentProcess) -> dict[str, Any] | None:
    status = json.loads(agent.fetch("/api/status").text())
    collector = {c["name"]: c for c in status["collectors"]}["checkpoints"]
    return status if collector["last_success_timestamp"] is not None or collector["error"] else None


def test_with_the_manifests_capabilities_a_closed_home_is_judged(tmp_path: Path) -> None:
    capabilities = manifest_capabilities()
    assert capabilities == ["DAC_READ_SEARCH"]  # what docs/kubernetes.md and the manifest's comment say, nothing more
    root, home = tenant_home(tmp_path)
    with running_agent(
        "--config", str(_config(tmp_path, root)), "--listen", "127.0.0.1:0", prefix=setpriv(capabilities), timeout=30
    ) as agent:
        # Exactly those: the kernel's own account of the running agent.
        assert _effective(agent) == sum(1 << CAPABILITY_BITS[c] for c in capabilities)

        def judged() -> dict[str, Any] | None:
            status = _report(agent)
            runs = {r["path"]: r for r in status["checkpoints"]} if status else {}
            return status if str(home / "run") in runs and str(root / "open" / "run") in runs else None

        status = wait_until(judged, 30, what="both runs judged")
        metrics = agent.fetch("/metrics").text()
    collector = {c["name"]: c for c in status["collectors"]}["checkpoints"]
    assert collector["success"] is True and collector["error"] is None, collector
    run = {r["path"]: r for r in status["checkpoints"]}[str(home / "run")]
    (checkpoint,) = run["checkpoints"]
    assert checkpoint["verdict"] == "complete", checkpoint
    unreadable = [line for line in metrics.splitlines() if line.startswith("storwatch_checkpoint_unreadable_entries{")]
    assert all(line.endswith(" 0.0") for line in unreadable), unreadable


def test_without_it_the_closed_home_is_a_collector_error_naming_the_path(tmp_path: Path) -> None:
    """The DaemonSet before this capability (drop ALL, nothing added): not an empty node, an error."""
    root, home = tenant_home(tmp_path)
    with running_agent(
        "--config", str(_config(tmp_path, root)), "--listen", "127.0.0.1:0", prefix=setpriv([]), timeout=30
    ) as agent:
        assert _effective(agent) == 0

        def failed() -> dict[str, Any] | None:
            status = _report(agent)
            collector = {c["name"]: c for c in status["collectors"]}["checkpoints"] if status else None
            return status if collector and collector["error"] and status and status["checkpoints"] else None

        status = wait_until(failed, 30, what="the checkpoints collector's error")
        metrics = agent.fetch("/metrics").text()
    collector = {c["name"]: c for c in status["collectors"]}["checkpoints"]
    assert collector["success"] is False
    assert str(home) in collector["error"] and "permission denied" in collector["error"], collector["error"]
    assert [r["path"] for r in status["checkpoints"]] == [str(root / "open" / "run")]  # what it can read stays
    assert 'storwatch_collector_success{collector="checkpoints"} 0.0' in metrics
    assert f'storwatch_checkpoint_unreadable_entries{{root="{root}"}} 1.0' in metrics


def test_another_users_writer_is_not_visible_with_only_dac_read_search(tmp_path: Path) -> None:
    """What the one capability does not give, said as it is: a tenant's process writing under its run keeps its
    open files from an agent without CAP_SYS_PTRACE, so the claim that it writes there is refused as not_visible
    (neither backed nor refuted), not as not_writer; with every capability (root as tests run) it is backed."""
    run = tmp_path / "run"
    run.mkdir()
    os.chown(run, TENANT_UID, TENANT_UID)
    # The tenant's process holds the file open for writing from birth (an inherited descriptor): its path need not be
    # one the tenant could walk to, only the kernel's fd link counts.
    held = os.open(run / ".step-2.pt.tmp", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        writer = subprocess.Popen(
            ["setpriv", f"--reuid={TENANT_UID}", f"--regid={TENANT_UID}", "--clear-groups", "sleep", "600"],
            pass_fds=(held,),
        )
    finally:
        os.close(held)
    try:
        wait_until(lambda: _uid(writer.pid) == TENANT_UID or None, 10, what="the writer running as the tenant")
        look = "from storwatch.sources.writers import WriterCheck\n"
        look += f"print(WriterCheck().look({writer.pid}, {str(run)!r}))"

        def judged(prefix: tuple[str, ...]) -> str:
            done = subprocess.run(
                [*prefix, sys.executable, "-c", look], capture_output=True, text=True, timeout=60, cwd=REPO_ROOT
            )
            assert done.returncode == 0, done.stderr
            return done.stdout.strip()

        assert judged(setpriv(manifest_capabilities())) == "not_visible"
        assert judged(()) == "None"  # root with its capabilities sees the writer
    finally:
        writer.kill()
        writer.wait(10)
