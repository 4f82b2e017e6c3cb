"""Every exit status the docs and the commands' ``--help`` document, from the real command line: each case runs
``python -m storwatch ...`` as a user does and checks the status and what the command says.

Documented where: ``verify`` (docs/checkpoints.md, ``verify --help``: 0 complete, 1 incomplete/corrupt/unsafe, 2 usage,
3 nothing verified); ``sync`` (docs/sync.md, ``sync --help``: 0 verified, 1 failed or aborted, 2 usage or refused, 130
interrupted); ``scan`` (docs/commands.md: a bad ``--sample`` or ``--timeout`` is a usage error, exit 2); the agent
(docs/agent.md: a port in use, or a bad configuration file, each problem as ``FILE:LINE: FIELD: message``, exit 2);
``policy check`` and ``policy test`` (``--help``: 1 for a problem or a failed case). A procfs that is not there is a
usage error (2) for every command that reads the node. ``sync``'s other 1s (the source changing under the copy, a
read-back that differs, too little space) need a writer racing the copy or a real mount: tests/test_sync_cli.py,
tests/test_sync_mounts.py and tests/test_sync.py hold them.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.builders import SYNC_LEFTOVER
from tests.builders import sync_checkpoint as make_checkpoint

REPO_ROOT = Path(__file__).resolve().parents[1]
SHIPPED = REPO_ROOT / "storwatch" / "policies"
WAIT = 120.0
"""A bound against a command that never ends, generous for a loaded machine."""

NO_CLUSTER = {"KUBECONFIG": "", "KUBERNETES_SERVICE_HOST": ""}

SAFETENSORS_HEADER = b'{"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}}'
SAFETENSORS = len(SAFETENSORS_HEADER).to_bytes(8, "little") + SAFETENSORS_HEADER + bytes(16)
"""A whole safetensors file: one tensor of four floats."""

BAD_CONFIG = "listen: nowhere\nmounts:\n  intervl_seconds: 5\ntick_seconds: -1\n"
BAD_CONFIG_LAST = "bad.yaml:4: tick_seconds: must be 0.1 to 3600, got -1.0"
"""The last of its three problems: said in the same run as the first."""


@dataclass(frozen=True)
class Case:
    args: tuple[str, ...]
    """The command line after ``storwatch``; ``{tmp}`` is the test's directory, ``{port}`` a port in use."""
    status: int
    says: str
    """Text the command writes (stdout or stderr); ``{tmp}`` as in args."""
    make: Callable[[Path], None] = lambda tmp: None
    """What the case needs in the test's directory."""


def complete(tmp: Path) -> None:
    (tmp / "good.safetensors").write_bytes(SAFETENSORS)


def complete_and_cut_short(tmp: Path) -> None:
    complete(tmp)
    (tmp / "cut.safetensors").write_bytes(SAFETENSORS[:-5])


def no_checkpoint(tmp: Path) -> None:
    (tmp / "empty").mkdir()


def bad_config(tmp: Path) -> None:
    (tmp / "bad.yaml").write_text(BAD_CONFIG)
    complete(tmp)


def checkpoint_and_destination(tmp: Path) -> None:
    make_checkpoint(tmp / "src", shards=1, shard_bytes=1000)
    (tmp / "dst").mkdir()


def copied_once(tmp: Path) -> None:
    from storwatch.sync import copy_verified

    checkpoint_and_destination(tmp)
    assert copy_verified(str(tmp / "src"), str(tmp / "dst" / "ck")).outcome == "verified"


def copied_once_whole_shards(tmp: Path) -> None:
    """As copied_once, the shards directory a checkpoint of its own (no link out of it)."""
    from storwatch.sync import copy_verified

    checkpoint_and_destination(tmp)
    (tmp / "src" / "shards" / "up.link").unlink()
    assert copy_verified(str(tmp / "src"), str(tmp / "dst" / "ck")).outcome == "verified"


def allowlist(tmp: Path) -> None:
    checkpoint_and_destination(tmp)
    (tmp / "durable").mkdir()
    (tmp / "c.yaml").write_text(f"sync:\n  destinations: [{tmp / 'durable'}]\n")


def link_out(tmp: Path) -> None:
    checkpoint_and_destination(tmp)
    os.symlink("/etc/hostname", tmp / "src" / "out.link")


def not_ours(tmp: Path) -> None:
    checkpoint_and_destination(tmp)
    (tmp / "dst" / "theirs").mkdir()


def large_file(tmp: Path) -> None:
    """8 MiB: at 1 MiB/s (--bandwidth 1M) its copy takes about 8 s, past a 1 s deadline whatever the machine."""
    (tmp / "dst").mkdir()
    (tmp / "big.bin").write_bytes(os.urandom(8 << 20))


def fixture_node(tmp: Path) -> None:
    shutil.copytree(REPO_ROOT / "tests" / "fixtures" / "gpu-node" / "proc", tmp / "proc")
    (tmp / "root").mkdir()
    (tmp / "off.yaml").write_text("gpu: {enabled: false}\nkube: {enabled: false}\n")


def policy_files(tmp: Path) -> None:
    shutil.copy(SHIPPED / "default.yaml", tmp / "default.yaml")
    (tmp / "bad_policy.yaml").write_text(
        "rules:\n  - name: a\n    on: mount\n    when: nope > 1\n  - name: b\n    on: nothing\n    when: 'true'\n"
    )
    (tmp / "failing_test.yaml").write_text(
        "rule_files: [default.yaml]\ninterval: 1m\ntests:\n  - name: says a rule fires on an empty node\n"
        "    duration: 2m\n    entities: []\n    expect:\n      - at: 1m\n"
        "        firing: [{rule: important-data-only-on-ephemeral-storage, key: nope}]\n"
    )


SCAN_NODE = ("--path.procfs", "{tmp}/proc", "--path.rootfs", "{tmp}/root", "--config", "{tmp}/off.yaml")

CASES = [
    # verify: docs/checkpoints.md "0 all complete, 1 some incomplete, corrupt or unsafe, 2 usage error, 3 nothing ..."
    pytest.param(Case(("verify", "{tmp}/good.safetensors"), 0, "COMPLETE", complete), id="verify-0-complete"),
    pytest.param(
        Case(("verify", "{tmp}/good.safetensors", "{tmp}/cut.safetensors"), 1, "INCOMPLETE", complete_and_cut_short),
        id="verify-1-incomplete",
    ),
    pytest.param(Case(("verify", "{tmp}/gone.pt"), 2, "no such file or directory"), id="verify-2-no-path"),
    pytest.param(Case(("verify", "--shallow", "{tmp}"), 2, "unrecognized arguments"), id="verify-2-bad-option"),
    pytest.param(
        Case(("verify", "--config", "{tmp}/bad.yaml", "{tmp}/good.safetensors"), 2, BAD_CONFIG_LAST, bad_config),
        id="verify-2-bad-config",
    ),
    pytest.param(Case(("verify", "{tmp}/empty"), 3, "UNKNOWN", no_checkpoint), id="verify-3-nothing-verified"),
    # sync: docs/sync.md, the table of exit statuses
    pytest.param(
        Case(("sync", "{tmp}/src", "{tmp}/dst/ck"), 0, "VERIFIED", checkpoint_and_destination), id="sync-0-verified"
    ),
    pytest.param(Case(("sync", "{tmp}/src", "{tmp}/dst/ck"), 0, "UNCHANGED", copied_once), id="sync-0-unchanged"),
    pytest.param(
        Case(
            ("sync", "{tmp}/big.bin", "{tmp}/dst/big", "--bandwidth", "1M", "--deadline", "1"),
            1,
            "abandoned: past its deadline of 1 s",
            large_file,
        ),
        id="sync-1-past-the-deadline",
    ),
    pytest.param(
        Case(("sync", "{tmp}/src", "{tmp}/dst/ck", "--bandwidth", "lots"), 2, "must be a size",
             checkpoint_and_destination),
        id="sync-2-bad-option",
    ),
    pytest.param(
        Case(("sync", "{tmp}/good.safetensors", "{tmp}/x", "--config", "{tmp}/bad.yaml"), 2, BAD_CONFIG_LAST,
             bad_config),
        id="sync-2-bad-config",
    ),
    pytest.param(
        Case(("sync", "{tmp}/gone", "{tmp}/dst/x"), 2, "'{tmp}/gone': no such file or directory",
             checkpoint_and_destination),
        id="sync-2-no-src",
    ),
    pytest.param(
        Case(("sync", "{tmp}/gone/src", "{tmp}/dst/x"), 2, "'{tmp}/gone/src': no such file or directory",
             checkpoint_and_destination),
        id="sync-2-no-src-nor-its-directory",
    ),
    pytest.param(
        Case(("sync", "{tmp}/src", "{tmp}/src/shards/copy"), 2,
             "DEST '{tmp}/src/shards/copy' lies inside SRC '{tmp}/src'", checkpoint_and_destination),
        id="sync-2-dest-inside-src",
    ),
    pytest.param(
        Case(("sync", "{tmp}/dst/ck/shards", "{tmp}/dst/ck"), 2,
             "SRC '{tmp}/dst/ck/shards' lies inside DEST '{tmp}/dst/ck'", copied_once_whole_shards),
        id="sync-2-src-inside-dest",
    ),
    pytest.param(
        Case(("sync", "{tmp}/src", "{tmp}/dst/x", "--config", "{tmp}/c.yaml"), 2, "not below an allowlisted",
             allowlist),
        id="sync-2-outside-destinations",
    ),
    pytest.param(
        Case(("sync", "{tmp}/src", "{tmp}/dst/x"), 2, "it leads out of the checkpoint", link_out),
        id="sync-2-symlink-out-of-src",
    ),
    pytest.param(
        Case(("sync", "{tmp}/src", "{tmp}/dst/theirs"), 2, "is not a copy storwatch made", not_ours),
        id="sync-2-not-ours-at-dest",
    ),
    # scan: docs/commands.md "anything else is a usage error (exit 2)"; a procfs that is not there is one too
    pytest.param(Case(("scan", *SCAN_NODE, "--timeout", "1"), 0, "mounts, ", fixture_node), id="scan-0"),
    pytest.param(Case(("scan", "--sample", "-1"), 2, "--sample: must be a number of seconds"), id="scan-2-sample"),
    pytest.param(Case(("scan", "--timeout", "0"), 2, "--timeout: must be a number of seconds"), id="scan-2-timeout"),
    pytest.param(
        Case(("scan", "--timeout", "61"), 2, "--timeout: must be a number of seconds"), id="scan-2-timeout-61"
    ),
    pytest.param(
        Case(("scan", "--path.procfs", "{tmp}/gone"), 2, "--path.procfs: '{tmp}/gone' cannot be read as procfs"),
        id="scan-2-no-procfs",
    ),
    pytest.param(Case(("scan", "--config", "{tmp}/bad.yaml"), 2, BAD_CONFIG_LAST, bad_config), id="scan-2-bad-config"),
    pytest.param(
        Case(("plan", "--all", "--path.procfs", "{tmp}/gone"), 2, "--path.procfs: '{tmp}/gone' cannot be read"),
        id="plan-2-no-procfs",
    ),
    # the agent: docs/agent.md "a port in use is one line ... and exit status 2, as is a bad configuration file"
    pytest.param(
        Case(("agent", "--listen", "127.0.0.1:{port}"), 2, "cannot serve on 127.0.0.1:{port}: Address already in use"),
        id="agent-2-port-in-use",
    ),
    pytest.param(
        Case(("agent", "--listen", "127.0.0.1:0", "--config", "{tmp}/bad.yaml"), 2, BAD_CONFIG_LAST, bad_config),
        id="agent-2-bad-config",
    ),
    pytest.param(
        Case(("agent", "--listen", "127.0.0.1:0", "--path.procfs", "{tmp}/gone"), 2,
             "--path.procfs: '{tmp}/gone' cannot be read as procfs"),
        id="agent-2-no-procfs",
    ),
    # policy: --help "print every problem as FILE:LINE: FIELD: message (exit 1)", "(exit 1 on a failure)"
    pytest.param(Case(("policy", "check", "{tmp}/default.yaml"), 0, "rules, ", policy_files), id="policy-check-0"),
    pytest.param(
        Case(("policy", "check", "{tmp}/bad_policy.yaml"), 1, "bad_policy.yaml:4: rules[0].when:", policy_files),
        id="policy-check-1",
    ),
    pytest.param(
        Case(("policy", "test", str(SHIPPED / "default_test.yaml")), 0, "0 failures: passed"),
        id="policy-test-0",
    ),
    pytest.param(
        Case(("policy", "test", "{tmp}/failing_test.yaml"), 1, "1 failures: FAILED", policy_files),
        id="policy-test-1",
    ),
    pytest.param(Case(("frobnicate",), 2, "invalid choice: 'frobnicate'"), id="no-such-command-2"),
]  # fmt: skip


@pytest.fixture
def port_in_use() -> Iterator[int]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


def storwatch(args: list[str], tmp: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "storwatch", *args],
        capture_output=True,
        text=True,
        timeout=WAIT,
        cwd=tmp,
        env={**os.environ, **NO_CLUSTER, "HOME": str(tmp), "PYTHONPATH": str(REPO_ROOT)},
        check=False,
    )


@pytest.mark.parametrize("case", CASES)
def test_each_documented_exit_status(case: Case, tmp_path: Path, port_in_use: int) -> None:
    case.make(tmp_path)
    fields = {"tmp": tmp_path, "port": port_in_use}
    out = storwatch([a.format(**fields) for a in case.args], tmp_path)
    said = out.stdout + out.stderr
    assert out.returncode == case.status, said
    assert case.says.format(**fields) in said, said
    assert "Traceback" not in said


def test_bad_configuration_is_named_whole_in_one_run(tmp_path: Path) -> None:
    """Every problem of the file, each as FILE:LINE: FIELD: message, in one run and in the order of the file."""
    bad_config(tmp_path)
    out = storwatch(["scan", "--config", "bad.yaml"], tmp_path)
    assert out.returncode == 2, out.stderr
    assert out.stdout == ""
    assert out.stderr.splitlines()[1:] == [
        "bad.yaml:1: listen: 'nowhere' is not HOST:PORT",
        "bad.yaml:3: mounts.intervl_seconds: unknown field; known: exclude_fstypes, interval_seconds, max_inflight, "
        "max_series, max_stuck, overrides, statvfs_timeout_seconds",
        BAD_CONFIG_LAST,
    ]


def test_an_interrupted_copy_exits_130_and_leaves_nothing(tmp_path: Path) -> None:
    """docs/sync.md: 130 interrupted (Ctrl-C): the copy stopped and removed its temporaries."""
    large_file(tmp_path)
    proc = subprocess.Popen(
        [sys.executable, "-m", "storwatch", "sync", "big.bin", "dst/big", "--bandwidth", "1M"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
        env={**os.environ, **NO_CLUSTER, "PYTHONPATH": str(REPO_ROOT)},
    )
    try:
        deadline = time.monotonic() + WAIT
        # Interrupted once the copy is under way: its temporary is beside DEST.
        while not any(SYNC_LEFTOVER.fullmatch(name) for name in os.listdir(tmp_path / "dst")):
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the copy's temporary never appeared"
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=WAIT)
    finally:
        proc.kill()
    assert proc.returncode == 130, out + err
    assert out.startswith("FAILED") and "stopped" in out, out
    assert os.listdir(tmp_path / "dst") == []
