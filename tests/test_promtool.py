"""A real scrape of a running agent passes ``promtool check metrics`` (Debian's ``prometheus`` package) cleanly."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from tests.agentproc import running_agent, wait_until

pytestmark = pytest.mark.realpart


@pytest.fixture(scope="module")
def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        pytest.skip("promtool not found on PATH (Debian package 'prometheus')")
    return path


def check_metrics(promtool: str, exposition: bytes) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [promtool, "check", "metrics"],
        input=exposition.decode("utf-8"),
        capture_output=True,
        text=True,
        timeout=30,
    )


def test_promtool_flags_a_bad_exposition(promtool: str) -> None:
    """The linter is live: a counter without _total and without HELP is reported (so a clean run means something)."""
    result = check_metrics(promtool, b"# TYPE storwatch_bad counter\nstorwatch_bad 1\n")
    assert result.returncode != 0
    assert "storwatch_bad" in result.stdout + result.stderr


def test_real_scrape_passes_promtool_check_metrics(promtool: str) -> None:
    with running_agent("--listen", "127.0.0.1:0") as agent:

        def full_scrape() -> bytes | None:
            resp = agent.fetch("/metrics")
            ok = (
                resp.status == 200
                and b"storwatch_mount_info{" in resp.body
                and b"storwatch_collector_success{" in resp.body
            )
            return resp.body if ok else None

        body = wait_until(full_scrape, timeout=15.0, what="a full /metrics scrape")
    assert b"storwatch_collector_duration_seconds{" in body
    assert b"storwatch_collector_last_success_timestamp_seconds{" in body
    result = check_metrics(promtool, body)
    assert (result.returncode, result.stdout, result.stderr) == (0, "", ""), body.decode()[:4000]
