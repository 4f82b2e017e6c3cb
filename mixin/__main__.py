"""``python -m mixin [--check] [--root DIR]``: write alerts/, dashboards/ and the agent's default policy
(storwatch/policies/default.yaml) from mixin/, or with ``--check`` exit 1 naming each file that differs
from what the code makes."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from mixin.dashboards import dashboards
from mixin.policy import policy_file
from mixin.rules import prometheus_rule, rules_file
from storwatch.docs import write_generated

REPO_ROOT = Path(__file__).resolve().parents[1]


def generated() -> dict[str, str]:
    """Every generated file, by its path below the repository's root."""
    files = {
        "alerts/storwatch.rules.yaml": rules_file(),
        "alerts/prometheusrule.yaml": prometheus_rule(),
        "storwatch/policies/default.yaml": policy_file(),
    }
    files.update({f"dashboards/{name}": text for name, text in dashboards().items()})
    return files


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m mixin", description=__doc__)
    ap.add_argument("--check", action="store_true", help="write nothing; exit 1 if a file differs")
    ap.add_argument("--root", type=Path, default=REPO_ROOT, help="the repository's root (default: this checkout)")
    args = ap.parse_args(argv)
    return write_generated(args.root, generated(), check=args.check)


if __name__ == "__main__":
    sys.exit(main())
