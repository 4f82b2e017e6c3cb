"""``storwatch agent``: the node agent, serving /metrics, /status and /api/status (storwatch/agent/)."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    pass
from storwatch.commands.common import EXIT_OK, EXIT_USAGE, add_common, load, setup_logging


def add_parser(sub: Any) -> None:
    """The ``agent`` command's arguments."""
    agent = sub.add_parser("agent", help="run the node agent and serve /metrics, /status and /api/status")
    add_common(agent)
    agent.add_argument("--listen", metavar="HOST:PORT", help="address to serve on (default :9477)")


def cmd_agent(args: argparse.Namespace) -> int:
    from storwatch.agent.malloc import tune_malloc

    tune_malloc()  # before any thread starts (storwatch/agent/malloc.py)
    from storwatch.agent import Agent
    from storwatch.config import parse_listen
    from storwatch.printable import printable
    from storwatch.web import StatusHTTPServer

    config, flags = load(args)
    setup_logging(config.log_level)
    # The port first: a busy port is one line and exit 2, before any source has started or said anything.
    try:
        server = StatusHTTPServer(config.listen, tls=config.tls)
    except OSError as err:
        host, port = parse_listen(config.listen)
        print(f"storwatch: cannot serve on {printable(host or '*')}:{port}: {err.strerror or err}", file=sys.stderr)
        return EXIT_USAGE
    try:
        agent = Agent(config, config_path=args.config, flags=flags, server=server)
    except ValueError as err:
        server.server_close()
        print(f"storwatch: {printable(str(err))}", file=sys.stderr)
        return EXIT_USAGE
    agent.run_until_signalled(exiting=True)
    return EXIT_OK
