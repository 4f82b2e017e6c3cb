"""Real Prometheus and Alertmanager for the tests: a free port, the binaries (skipped where missing, a failure in CI),
a server on loopback waited on until ready and always stopped, a Prometheus configuration scraping agents."""

from __future__ import annotations

import contextlib
import json
import shutil
import socket
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.agentproc import wait_until


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def binary(*names: str) -> str:
    for name in names:
        path = shutil.which(name)
        if path is not None:
            return path
    pytest.skip(f"{names[0]} not found on PATH (scripts/system-deps installs it)")


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return json.load(resp)


@contextlib.contextmanager
def server(cmd: list[str], log: Path, ready_url: str) -> Iterator[subprocess.Popen[bytes]]:
    """A server on loopback, ready once ``ready_url`` answers 200; stopped at the end, failed test or not."""
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True)
    try:

        def ready() -> bool:
            assert proc.poll() is None, f"{cmd[0]} exited with {proc.returncode}:\n{log.read_text(errors='replace')}"
            with urllib.request.urlopen(ready_url, timeout=2) as resp:
                return resp.status == 200

        wait_until(ready, timeout=30.0, what=f"{cmd[0]} ready")
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def prometheus_config(path: Path, rules: Path, am_port: int, targets: dict[str, int]) -> Path:
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(rules)],
        "alerting": {"alertmanagers": [{"static_configs": [{"targets": [f"127.0.0.1:{am_port}"]}]}]},
        "scrape_configs": [
            {
                "job_name": "storwatch",
                "scrape_timeout": "1s",
                "static_configs": [
                    {"targets": [f"127.0.0.1:{port}"], "labels": {"cluster": "e2e", "node": node}}
                    for node, port in targets.items()
                ],
            }
        ],
    }
    path.write_text(yaml.safe_dump(config))
    return path
