"""The /status page as headless Chromium renders it: the mounts table matches /api/status, and a screenshot.

The agent runs with a mount table of "/" and a tmpfs of the test's own (tests/builders.own_mount_table), so what other
users have mounted on this machine (a name with a newline, a hung mount) never reaches the page, and its mount list
cannot change between the /api/status read and the page load.
"""

from __future__ import annotations

import contextlib
import json
import shutil
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from tests.agentproc import AgentProcess, running_agent, wait_until
from tests.browser import TableParser, run_chromium
from tests.builders import own_mount_table
from tests.realmounts import RealPartUnavailable, tmpfs_mount

pytestmark = pytest.mark.realpart

SCREENSHOT_COPY = Path("/tmp/storwatch-status.png")
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def status_agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[AgentProcess, dict[str, Any], Path]]:
    base = tmp_path_factory.mktemp("status")
    config = base / "storwatch.yaml"
    config.write_text("tick_seconds: 1\nmounts:\n  interval_seconds: 60\n", encoding="utf-8")
    with contextlib.ExitStack() as stack:
        try:
            scratch = stack.enter_context(tmpfs_mount(base / "scratch"))
        except RealPartUnavailable as err:
            pytest.skip(str(err))
        prefix = own_mount_table(base / "table", [scratch.mountpoint])
        agent = stack.enter_context(running_agent("--listen", "127.0.0.1:0", "--config", str(config), prefix=prefix))

        def ready_status() -> dict[str, Any] | None:
            resp = agent.fetch("/api/status")
            data: dict[str, Any] | None = json.loads(resp.body) if resp.status == 200 else None
            return data if data is not None and data["ready"] else None

        yield agent, wait_until(ready_status, timeout=15.0, what="/api/status ready"), scratch.mountpoint


def test_status_page_table_matches_api_status(
    chromium: str, status_agent: tuple[AgentProcess, dict[str, Any], Path], tmp_path: Path
) -> None:
    agent, api, scratch = status_agent
    url = agent.url("/status")
    shot = tmp_path / "status.png"
    # The DOM dump and the screenshot are independent browser runs; run them side by side.
    with ThreadPoolExecutor(max_workers=2) as pool:
        dom_run = pool.submit(run_chromium, chromium, tmp_path / "profile-dom", "--dump-dom", url)
        shot_run = pool.submit(
            run_chromium, chromium, tmp_path / "profile-shot", f"--screenshot={shot}", "--window-size=1400,900", url
        )
        dom, screenshot = dom_run.result(), shot_run.result()

    assert dom.returncode == 0, dom.stderr.decode(errors="replace")[-2000:]
    parser = TableParser("mounts")
    parser.feed(dom.stdout.decode("utf-8"))
    parser.close()
    assert parser.found, "no <table id='mounts'> in the DOM:\n" + dom.stdout.decode(errors="replace")[:2000]
    assert len(parser.head_rows) == 1
    header = parser.head_rows[0]
    for column in ("Mountpoint", "Durability", "Reason"):
        assert column in header, header
    mp_col, dur_col, reason_col = (header.index(c) for c in ("Mountpoint", "Durability", "Reason"))

    # The private table has no kernel interface mount (tests/test_status_render.py shows how those are left off).
    expected = [(m["mountpoint"], m["durability"], m["reason"]) for m in api["mounts"]]
    assert not any(m["pseudo"] for m in api["mounts"])
    page = " ".join(dom.stdout.decode("utf-8").split())
    shown = [(row[mp_col], row[dur_col], row[reason_col]) for row in parser.body_rows]
    assert len(expected) > 0
    assert [e[:2] for e in shown] == [e[:2] for e in expected]
    assert [e[2] for e in shown] == [" ".join(e[2].split()) for e in expected]
    assert all(len(row) == len(header) for row in parser.body_rows)
    assert sorted(mp for mp, _, _ in shown) == ["/", str(scratch)], shown
    # Empty tables say why (this machine has no GPU and no checkpoint roots; elsewhere the tables have rows).
    if not api["gpus"]:
        assert ("no GPUs: NVML answers" if api["nvml"]["nvml_up"] else "no GPUs: NVML not available") in page
    if not api["checkpoints"]:
        roots = api["checkpoint_roots"]
        assert ("no checkpoints under " + ", ".join(roots) if roots else "no checkpoints: no directories") in page

    assert screenshot.returncode == 0, screenshot.stderr.decode(errors="replace")[-2000:]
    assert shot.is_file(), "chromium wrote no screenshot"
    png = shot.read_bytes()
    assert png.startswith(PNG_SIGNATURE)
    # IHDR: width and height as big-endian 32-bit integers right after the signature and chunk header.
    width, height = int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")
    assert (width, height) == (1400, 900)
    assert len(png) > 20_000, f"screenshot only {len(png)} bytes: a blank page?"
    shutil.copyfile(shot, SCREENSHOT_COPY)
