"""``storwatch policy``: check policy files, run their test cases, show the language, explain the rules in force on
this node now."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    pass
from storwatch.commands.common import (
    EXIT_FINDINGS,
    EXIT_OK,
    MAX_SCAN_TIMEOUT_SECONDS,
    add_common,
    load,
    seconds_arg,
    setup_logging,
)
from storwatch.commands.scan import scan_view


def add_parser(sub: Any) -> None:
    """The ``policy`` command's arguments."""
    policy = sub.add_parser(
        "policy",
        help="check policy files, run their test cases, or show the fields rules can read",
        description="Policies are YAML files of rules over what the agent sees (docs/policy.md).",
    )
    policy_sub = policy.add_subparsers(dest="policy_command", required=True)
    check = policy_sub.add_parser(
        "check", help="load policy files in order and print every problem as FILE:LINE: FIELD: message (exit 1)"
    )
    check.add_argument("files", nargs="+", metavar="FILE", help="policy file, loaded in the order given")
    test = policy_sub.add_parser(
        "test", help="run the test cases of test files against the policy files they name (exit 1 on a failure)"
    )
    test.add_argument("files", nargs="+", metavar="FILE", help="policy test file (see docs/policy.md)")
    policy_sub.add_parser("show", help="print the policy language and every entity's fields (docs/policy.md)")
    explain = policy_sub.add_parser(
        "explain",
        help="the rules in force and what each would do on this node now, and why (a one-shot look; nothing is run)",
        description="Load the policy as the agent would (the shipped default set unless policy.default_set is false, "
        "then policy.files, then FILE...), look at this node once as `storwatch scan` does, and for each rule say "
        "which entities its condition holds for, with the values of the fields it reads, the message and the "
        "actions it would run.",
    )
    add_common(explain)
    explain.add_argument("files", nargs="*", metavar="FILE", help="more policy files, loaded after the configured ones")
    explain.add_argument(
        "--timeout",
        type=seconds_arg(0.1, MAX_SCAN_TIMEOUT_SECONDS, zero_ok=False),
        default=5.0,
        help="seconds to wait for each mount's statvfs (default 5)",
    )


def cmd_policy(args: argparse.Namespace) -> int:
    from storwatch.policy.load import PolicyError, load_policy
    from storwatch.printable import printable

    if args.policy_command == "show":
        from storwatch.policy.schema import markdown

        sys.stdout.write(markdown())
        return EXIT_OK
    if args.policy_command == "explain":
        return _policy_explain(args)
    if args.policy_command == "check":
        try:
            from storwatch.actions.registry import checks

            policy = load_policy(args.files, checks())
        except PolicyError as err:
            for line in err.errors:
                print(printable(line), file=sys.stderr)
            return EXIT_FINDINGS
        files = " ".join(map(printable, args.files))
        print(f"{files}: {len(policy.rules)} rules, {len(policy.lists)} lists: ok")
        return EXIT_OK
    from storwatch.policy.testing import run_test_file

    failed = False
    for path in args.files:
        try:
            result = run_test_file(path)
        except PolicyError as err:
            for line in err.errors:
                print(printable(line), file=sys.stderr)
            failed = True
            continue
        for line in result.failures:
            print(printable(line), file=sys.stderr)
        state = "FAILED" if result.failures else "passed"
        print(f"{printable(path)}: {result.cases} cases, {len(result.failures)} failures: {state}")
        failed = failed or bool(result.failures)
    return EXIT_FINDINGS if failed else EXIT_OK


def _policy_explain(args: argparse.Namespace) -> int:
    from storwatch.actions.registry import checks
    from storwatch.agent.policy import policy_files
    from storwatch.policy.explain import explain
    from storwatch.policy.load import PolicyError, load_policy
    from storwatch.policy.schema import entities
    from storwatch.printable import printable

    config, _ = load(args)
    setup_logging(config.log_level if args.log_level else "warning")
    files = [*policy_files(config.policy), *args.files]
    if not config.policy.enabled:
        print("the policy is off (policy.enabled is false): the agent evaluates no rule; as it would be if on:")
    try:
        policy = load_policy(files, checks())
    except PolicyError as err:
        for line in err.errors:
            print(printable(line), file=sys.stderr)
        return EXIT_FINDINGS
    view = scan_view(config, args.timeout)
    print(f"{len(policy.rules)} rules from {', '.join(map(printable, files))}; this node now ({view.platform.name}):")
    print()
    for line in explain(policy, entities(view)):
        print(line)
    return EXIT_OK
