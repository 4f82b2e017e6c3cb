"""What each command imports: ``--help`` only the parser and the vocabulary, ``verify`` the checkpoint checks and no
client of the outside world, ``scan`` the sources it collects and nothing of the agent's exporter or server; and that
the helper processes the agent keeps running leave OpenSSL out.

Read from ``python -X importtime -m storwatch ...`` in a fresh interpreter, as a user runs the command: every module
imported is listed once, whoever imported it. How long the commands take is bench/scan_time.py's to say.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.builders import sync_checkpoint

REPO_ROOT = Path(__file__).resolve().parents[1]

AGENT_ONLY = (
    "prometheus_client",
    "http.server",
    "storwatch.agent",
    "storwatch.exporter",
    "storwatch.web",
    "storwatch.policy",
    "storwatch.actions",
    "storwatch.sources.checkpoints",
    "storwatch._checkpoint_worker",
)
"""What only the running agent uses: the exposition, the HTTP server, the checkpoint source's helper process."""

CLIENTS = ("kubernetes", "pynvml", "torch", "storwatch.sources.kube", "storwatch.kube.client")
"""Clients of the outside world, each loaded by the source that talks to it, when it is on."""

PARSER = {
    "storwatch",
    "storwatch.__main__",
    "storwatch.cli",
    "storwatch.vocabulary",
    "storwatch.commands",
    *(f"storwatch.commands.{m}" for m in ("agent", "common", "plan", "policy", "scan", "sync", "verify")),
}
"""All of storwatch that the argument parser needs: the command modules, each declaring its arguments (their work
imports what it uses), and the vocabulary (the platform names)."""

NO_CLUSTER = {"KUBECONFIG": "", "KUBERNETES_SERVICE_HOST": ""}
"""No Kubernetes credentials: the kube source is then off by itself, whatever the host has."""


def run_command(*args: str, home: Path) -> tuple[subprocess.CompletedProcess[str], set[str]]:
    """The command's result, and every module its interpreter imported."""
    env = {**os.environ, **NO_CLUSTER, "HOME": str(home)}
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "storwatch", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO_ROOT,
        env=env,
        check=False,
    )
    lines = [line for line in proc.stderr.splitlines() if line.startswith("import time:")]
    assert lines, f"no -X importtime lines: {proc.stderr[-2000:]}"
    modules = {line.rsplit("|", 1)[1].strip() for line in lines[1:]}  # the first line is the table's header
    assert "storwatch.cli" in modules
    return proc, modules


def loaded(modules: set[str], *packages: str) -> list[str]:
    """Those of ``packages`` imported, themselves or any module in them."""
    return [p for p in packages if any(m == p or m.startswith(p + ".") for m in modules)]


@pytest.mark.parametrize(
    "args",
    [
        pytest.param(("--help",), id="help"),
        pytest.param(("scan", "--help"), id="scan-help"),
        pytest.param(("verify", "--help"), id="verify-help"),
        pytest.param(("agent", "--help"), id="agent-help"),
        pytest.param(("plan", "--help"), id="plan-help"),
        pytest.param(("policy", "--help"), id="policy-help"),
        pytest.param(("sync", "--help"), id="sync-help"),
    ],
)
def test_help_imports_only_the_parser(args: tuple[str, ...], tmp_path: Path) -> None:
    proc, modules = run_command(*args, home=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.startswith("usage: storwatch")
    assert {m for m in modules if m.split(".")[0] == "storwatch"} <= PARSER
    assert loaded(modules, "yaml", *AGENT_ONLY, *CLIENTS) == []


def torch_checkpoint(path: Path) -> Path:
    torch = pytest.importorskip("torch", reason="torch is not installed (pip install torch==2.13.0, CPU wheel)")
    torch.save({"w": torch.zeros(4, 4), "step": 3}, path)
    return path


@pytest.mark.parametrize("with_config", [False, True], ids=["defaults", "config-file"])
def test_verify_imports_the_checks_and_no_client(with_config: bool, tmp_path: Path) -> None:
    checkpoint = torch_checkpoint(tmp_path / "model.pt")
    config = tmp_path / "storwatch.yaml"
    # A file with a section that only the registry declares (lustre's): reading it needs every source's section.
    config.write_text("checkpoints:\n  max_entries: 1000\nlustre:\n  enabled: false\n")
    args = ("verify", *(("--config", str(config)) if with_config else ()), str(checkpoint))
    proc, modules = run_command(*args, home=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.startswith("COMPLETE") and str(checkpoint) in proc.stdout
    assert "storwatch.checkpoints.formats" in modules
    assert loaded(modules, *AGENT_ONLY, *CLIENTS, "storwatch.analysis") == []
    # The registry, and with it every source's module, only to read a file's sections; yaml only to read a file.
    assert ("storwatch.registry" in modules) is with_config
    assert ("yaml" in modules) is with_config


def scan_args(tmp_path: Path, config: str) -> tuple[str, ...]:
    """A scan of a fixture node's mount table (nothing of the host's mounts), with ``config`` as its file."""
    (tmp_path / "root").mkdir()
    (tmp_path / "storwatch.yaml").write_text(config)
    return (
        "scan",
        "--config",
        str(tmp_path / "storwatch.yaml"),
        "--path.procfs",
        str(REPO_ROOT / "tests" / "fixtures" / "gpu-node" / "proc"),
        "--path.rootfs",
        str(tmp_path / "root"),
        "--timeout",
        "1",
        "--json",
    )


def test_scan_imports_what_it_collects_and_nothing_of_the_agent(tmp_path: Path) -> None:
    proc, modules = run_command(*scan_args(tmp_path, "# the defaults\n"), home=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert '"mounts"' in proc.stdout
    assert {"storwatch.registry", "storwatch.sources.mounts", "storwatch.analysis.build"} <= modules
    assert loaded(modules, *AGENT_ONLY, "kubernetes", "torch") == []
    # The GPU and Kubernetes sources are on by default: scan runs them, so it loads their clients' modules (the
    # official Kubernetes client only where there are credentials, which NO_CLUSTER takes away).
    assert "storwatch.sources.kube" in modules


def test_scan_leaves_a_source_that_is_off_unloaded(tmp_path: Path) -> None:
    config = "gpu:\n  enabled: false\nkube:\n  enabled: false\n"
    proc, modules = run_command(*scan_args(tmp_path, config), home=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert loaded(modules, *AGENT_ONLY, *CLIENTS) == []


def test_sync_imports_nothing_of_the_agent_and_no_client(tmp_path: Path) -> None:
    src = sync_checkpoint(tmp_path / "src", shards=1, shard_bytes=1000)
    (tmp_path / "dst").mkdir()
    proc, modules = run_command("sync", str(src), str(tmp_path / "dst" / "ck"), home=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "storwatch.sync" in modules
    assert loaded(modules, *AGENT_ONLY, *CLIENTS, "storwatch.analysis", "storwatch.registry", "yaml") == []


@pytest.mark.parametrize(
    ("module", "flags"),
    [
        pytest.param("storwatch._checkpoint_worker", ("-I",), id="checkpoint-walks"),
        pytest.param("storwatch._events_worker", ("-I", "-S"), id="file-events"),
        pytest.param("storwatch.calls._blocking_worker", ("-I", "-S"), id="blocking-calls"),
    ],
)
def test_a_helper_process_leaves_openssl_and_library_searches_unloaded(module: str, flags: tuple[str, ...]) -> None:
    """The helpers the agent keeps running (started as their ``command()`` starts them) hash nothing and speak no TLS:
    ``hashlib`` or ``ssl`` would map OpenSSL's libcrypto into each, 3.4 MB resident apiece. Nor do they search for a
    shared library: ``ctypes.util.find_library`` runs ldconfig in a child process and imports ``shutil`` and
    ``tempfile`` (with ``bz2`` and ``lzma``), 1.5 MB in the checkpoint helper; the C library they need is their own."""
    code = f"import sys; sys.path.insert(0, {str(REPO_ROOT)!r}); import {module}; print(' '.join(sys.modules))"
    proc = subprocess.run([sys.executable, *flags, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    modules = set(proc.stdout.split())
    assert module in modules
    assert sorted(modules & {"_hashlib", "hashlib", "_ssl", "ssl", "secrets", "hmac"}) == []
    assert sorted(modules & {"ctypes.util", "shutil", "tempfile", "bz2", "lzma"}) == []
