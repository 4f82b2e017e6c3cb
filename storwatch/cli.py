"""The command line's entry point (``storwatch``, ``python -m storwatch``): the commands are storwatch/commands/."""

from __future__ import annotations

import sys

from storwatch.commands import build_parser, main

__all__ = ["build_parser", "main"]

if __name__ == "__main__":
    sys.exit(main())
