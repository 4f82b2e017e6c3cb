"""Slurm and bare-metal nodes: the systemd unit passes ``systemd-analyze verify`` with its hardening and the same one
capability as the DaemonSet, the Slurm configuration loads, and the Prometheus scrape example is a valid config."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from storwatch.registry import parse_config

REPO_ROOT = Path(__file__).resolve().parents[1]
UNIT = REPO_ROOT / "deploy" / "systemd" / "storwatch.service"
SLURM_CONFIG = REPO_ROOT / "deploy" / "systemd" / "config.yaml"
SCRAPE = REPO_ROOT / "deploy" / "prometheus" / "scrape-slurm.yaml"
DAEMONSET = REPO_ROOT / "daemonset" / "base" / "daemonset.yaml"


def directives(text: str) -> dict[str, list[str]]:
    """Every Key=value of a unit file, by key (a key may repeat: DeviceAllow)."""
    out: dict[str, list[str]] = {}
    for line in text.splitlines():
        m = re.fullmatch(r"([A-Za-z]+)=(.*)", line.strip())
        if m:
            out.setdefault(m.group(1), []).append(m.group(2))
    return out


def _verify(tmp_path: Path, text: str) -> tuple[int, list[str]]:
    """systemd-analyze verify on the unit, as installed: the one change is ExecStart's executable, which verify
    requires to exist, pointed at this checkout's storwatch. Returns its exit status and its lines about the unit."""
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze (Debian's systemd) is needed to verify the unit")
    executable = Path(sys.executable).parent / "storwatch"
    assert executable.exists(), executable
    installed = directives(UNIT.read_text(encoding="utf-8"))["ExecStart"][0].split()[0]
    unit = tmp_path / "storwatch.service"
    unit.write_text(text.replace(f"ExecStart={installed} ", f"ExecStart={executable} "), encoding="utf-8")
    done = subprocess.run(
        ["systemd-analyze", "verify", "--man=no", str(unit)], capture_output=True, text=True, timeout=60
    )
    lines = [line for line in (done.stdout + done.stderr).splitlines() if "storwatch.service" in line]
    return done.returncode, lines


@pytest.mark.realpart
def test_systemd_analyze_verify_passes_on_the_unit(tmp_path: Path) -> None:
    assert _verify(tmp_path, UNIT.read_text(encoding="utf-8")) == (0, [])


@pytest.mark.realpart
@pytest.mark.parametrize(
    ("change", "found"),
    [
        pytest.param(("ProtectSystem=strict", "ProtectSystm=strict"), "Unknown key", id="misspelt-key"),
        pytest.param(("ProtectSystem=strict", "ProtectSystem=strictest"), "Failed to parse", id="bad-value"),
        pytest.param(("MemoryMax=256M", "MemoryMax=lots"), "Invalid memory limit", id="bad-limit"),
    ],
)
def test_verify_is_not_a_rubber_stamp(tmp_path: Path, change: tuple[str, str], found: str) -> None:
    """systemd-analyze exits 0 on a key it ignores: the test reads what it says, so a typo fails it."""
    text = UNIT.read_text(encoding="utf-8")
    assert change[0] in text
    _, lines = _verify(tmp_path, text.replace(change[0], change[1]))
    assert any(found in line for line in lines), lines


def test_the_unit_holds_the_daemonsets_least_privilege() -> None:
    unit = directives(UNIT.read_text(encoding="utf-8"))
    manifest = yaml.safe_load(DAEMONSET.read_text(encoding="utf-8"))
    (container,) = manifest["spec"]["template"]["spec"]["containers"]
    added = {f"CAP_{c}" for c in container["securityContext"]["capabilities"]["add"]}
    assert set(unit["CapabilityBoundingSet"][0].split()) == added == {"CAP_DAC_READ_SEARCH"}
    assert unit["AmbientCapabilities"] == [""]
    expected = {
        "NoNewPrivileges": "yes",  # allowPrivilegeEscalation: false
        "ProtectSystem": "strict",  # readOnlyRootFilesystem and read-only host mounts
        "ProtectHome": "read-only",
        "ProtectKernelTunables": "yes",
        "ProtectControlGroups": "yes",
        "PrivateTmp": "yes",
        "User": "root",  # runAsUser: 0
    }
    assert {k: unit[k][0] for k in expected} == expected
    # Resources from the same measurements as the DaemonSet's memory limit.
    limit = container["resources"]["limits"]["memory"]
    assert unit["MemoryMax"] == [limit.removesuffix("i")]
    assert re.fullmatch(r"\d+%", unit["CPUQuota"][0])
    assert "--config" in unit["ExecStart"][0] and "/etc/storwatch/config.yaml" in unit["ExecStart"][0]


def test_the_slurm_configuration_loads_with_its_preset() -> None:
    config = parse_config(SLURM_CONFIG.read_text(encoding="utf-8"), str(SLURM_CONFIG))
    assert config.platform == "together-slurm"
    assert config.checkpoints.roots and config.checkpoints.kubelet is False
    assert config.paths.procfs == "/proc" and config.paths.rootfs == "/"  # the host's own, no /host


@pytest.mark.realpart
def test_the_scrape_example_is_a_valid_prometheus_config(tmp_path: Path) -> None:
    if shutil.which("promtool") is None:
        pytest.skip("promtool (Debian's prometheus) is needed")
    done = subprocess.run(["promtool", "check", "config", str(SCRAPE)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    (job,) = yaml.safe_load(SCRAPE.read_text(encoding="utf-8"))["scrape_configs"]
    assert job["job_name"] == "storwatch"  # the alerts' up{job="storwatch"}
    (relabel,) = job["relabel_configs"]
    assert relabel["target_label"] == "node"
    # Prometheus anchors the regex at both ends; the replacement is $1 by default.
    node = re.fullmatch(relabel["regex"], "gpu-node-001:9477")
    assert node is not None and node.group(1) == "gpu-node-001"
