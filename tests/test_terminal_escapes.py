"""Names from data on a terminal: a checkpoint file, a mountpoint and a configuration file whose names hold terminal
control sequences, through the real commands (``verify``, ``scan``) and the running agent's log, read as the bytes a
terminal would receive."""

from __future__ import annotations

import json
import os
import re
import signal
import struct
import subprocess
import sys
from collections.abc import Callable
from contextlib import AbstractContextManager as ContextManager
from pathlib import Path
from typing import Any, TypeVar

import pytest

from tests.agentproc import REPO_ROOT, running_agent
from tests.realmounts import tmpfs_mount

T = TypeVar("T")
Enter = Callable[[ContextManager[T]], T]

RAW = (b"\x1b", b"\r", b"\x07", b"\x9b", "\u202e".encode())
"""What must never reach the terminal from a name: ESC, CR, BEL, a C1 CSI, a bidi override."""

# A name that, printed raw, moves up a line, wipes it and writes a verdict of its own, then hides what follows.
FORGED = (
    "step-9\r\x1b[1A\x1b[2KCOMPLETE    safetensors          ckpt~step-9.safetensors\n"
    "            all checks passed\x07\x1b[8m.safetensors"
)


def storwatch(*args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-m", "storwatch", *args],
        capture_output=True,
        timeout=120,
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        check=False,
    )


def corrupt_safetensors(path: Path) -> None:
    """A safetensors file that finished writing but whose header is not JSON: corrupt, whatever its name says."""
    header = b'{"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}'  # the closing brace is missing
    path.write_bytes(struct.pack("<Q", len(header)) + header + bytes(16))


def raw_in(output: bytes) -> list[bytes]:
    return [c for c in RAW if c in output]


@pytest.mark.parametrize("given", ["file", "run-directory"])
def test_verify_shows_a_forged_name_escaped_and_the_real_verdict(tmp_path: Path, given: str) -> None:
    corrupt_safetensors(tmp_path / FORGED)
    out = storwatch("verify", str(tmp_path / FORGED if given == "file" else tmp_path))
    shown = out.stdout + out.stderr
    assert out.returncode == 1, shown
    assert raw_in(shown) == []
    lines = out.stdout.decode("ascii").splitlines()
    # Two lines, as for any checkpoint: the real verdict and the escaped name, then the real reason.
    assert len(lines) == 2, lines
    assert lines[0].startswith("CORRUPT     safetensors")
    assert lines[0].endswith(
        "step-9\\x0d\\x1b[1A\\x1b[2KCOMPLETE    safetensors          ckpt~step-9.safetensors\\x0a"
        "            all checks passed\\x07\\x1b[8m.safetensors"
    )
    assert "safetensors header is invalid" in lines[1]
    assert not any(line.startswith("COMPLETE") for line in lines)


def test_verify_json_keeps_the_name_whole_as_strict_json(tmp_path: Path) -> None:
    corrupt_safetensors(tmp_path / FORGED)
    out = storwatch("verify", "--json", str(tmp_path / FORGED))
    assert out.returncode == 1 and raw_in(out.stdout + out.stderr) == []

    def refuse(word: str) -> Any:
        raise ValueError(f"not JSON: {word}")

    (result,) = json.loads(out.stdout, parse_constant=refuse)
    assert (result["path"], result["verdict"]) == (str(tmp_path / FORGED), "corrupt")


@pytest.mark.realpart
def test_scan_shows_a_mountpoint_holding_esc_and_a_newline_as_one_escaped_row(
    real_mounts: Enter[Any], tmp_path: Path
) -> None:
    name = "mnt\x1b[31m\nfake-row\x07\u202e"
    mount = real_mounts(tmpfs_mount(tmp_path / name, size="1m"))
    mp = str(mount.mountpoint)
    escaped = mp.replace("\x1b", "\\x1b").replace("\n", "\\x0a").replace("\x07", "\\x07").replace("\u202e", "\\u202e")

    table = storwatch("scan", "--timeout", "2")
    assert table.returncode == 0, table.stderr
    # Every mount of the machine is in the table, but none of its names can put a raw control character on screen.
    assert raw_in(table.stdout + table.stderr) == []
    lines = table.stdout.decode("utf-8").splitlines()
    rows = [line for line in lines if line.startswith(escaped + " ")]
    assert len(rows) == 1, lines
    assert rows[0].split()[1:3] == ["tmpfs", "volatile"]
    assert not any(line.startswith("fake-row") for line in lines)  # the name's own newline made no row of it

    data = json.loads(storwatch("scan", "--json", "--timeout", "2").stdout)
    assert [m["mountpoint"] for m in data["mounts"] if m["mountpoint"] == mp] == [mp]  # exact in JSON


def test_the_agents_log_shows_a_config_path_escaped_and_forges_no_record(tmp_path: Path) -> None:
    # The configuration file's name is data the log quotes (on reload, and in each error about the file).
    config = tmp_path / "storwatch\x1b[2J\r\n2099-01-01 00:00:00,000 INFO storwatch.agent: all well\x07.yaml"
    config.write_text("tick_seconds: 1\n", encoding="utf-8")
    shown = re.escape(
        str(config).replace("\x1b", "\\x1b").replace("\r", "\\x0d").replace("\n", "\\x0a").replace("\x07", "\\x07")
    )
    with running_agent("--listen", "127.0.0.1:0", "--config", str(config)) as agent:
        mark = agent.stderr_mark()
        agent.send_signal(signal.SIGHUP)
        agent.wait_for_stderr(rf"INFO storwatch\.agent: .*{shown}$", since=mark)
        config.write_text("mounts:\n  overrides: [unclosed\n", encoding="utf-8")
        mark = agent.stderr_mark()
        agent.send_signal(signal.SIGHUP)
        agent.wait_for_stderr(r"ERROR .*reload failed", since=mark)
        # The errors are a list, one a line (printable.Lines): the path in each is escaped but for its newline, which
        # starts one more indented line of the same record.
        agent.wait_for_stderr(
            r"^    2099-01-01 00:00:00,000 INFO storwatch\.agent: all well\\x07\.yaml:\d+: invalid YAML", since=mark
        )
        log = agent.stderr_text()
    assert raw_in(log.encode("utf-8", "surrogateescape")) == []
    assert not any(line.startswith("2099-01-01") for line in log.splitlines())
