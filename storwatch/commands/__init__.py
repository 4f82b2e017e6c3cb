"""Command line: ``storwatch agent`` runs the node agent, ``storwatch scan`` prints a one-shot report of this node,
``storwatch plan`` measures its mounts and plans checkpoint intervals, ``storwatch verify`` checks checkpoint files,
``storwatch sync`` copies a checkpoint to durable storage, verified, and ``storwatch policy`` checks, tests, shows and
explains policies. One module per command (its arguments in ``add_parser``, its work in ``cmd_*``), what they share
in :mod:`.common`.

Each command imports what it uses, inside its own function; the parser needs only the vocabulary, so ``--help`` loads
nothing else of storwatch (tests/test_command_imports.py holds each command to what it uses)."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from storwatch import __version__
from storwatch.commands import agent, plan, policy, scan, sync, verify
from storwatch.commands.common import EXIT_OK, EXIT_USAGE


def build_parser() -> argparse.ArgumentParser:
    """Every command's arguments."""
    parser = argparse.ArgumentParser(
        prog="storwatch",
        description="A node agent for GPU clusters: mount durability, storage latency, GPUs and checkpoints. "
        "Commands: agent, scan, verify, plan, sync, policy (storwatch COMMAND --help describes each).",
    )
    parser.add_argument("--version", action="version", version=f"storwatch {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    for command in (agent, scan, plan, verify, sync, policy):
        command.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from storwatch.config import ConfigError
    from storwatch.printable import printable_lines

    run = {
        "agent": agent.cmd_agent,
        "scan": scan.cmd_scan,
        "plan": plan.cmd_plan,
        "verify": verify.cmd_verify,
        "sync": sync.cmd_sync,
        "policy": policy.cmd_policy,
    }[args.command]
    try:
        return run(args)
    except ConfigError as err:
        print(f"storwatch: configuration error:\n{printable_lines(str(err), indent='')}", file=sys.stderr)
        return EXIT_USAGE
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK
