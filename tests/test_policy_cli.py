"""``storwatch policy test``, ``check`` and ``show``: the shipped default set's own cases pass, a case that expects a
wrong action or a wrong time fails (exit 1, naming the line), ``check`` refuses issue 36's condition naming the bound
it passes, and ``show`` prints docs/policy.md."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from storwatch.cli import main
from storwatch.policy.testing import run_test_file

REPO_ROOT = Path(__file__).resolve().parents[1]
POLICIES = REPO_ROOT / "storwatch" / "policies"
CASES = len(yaml.safe_load((POLICIES / "default_test.yaml").read_text(encoding="utf-8"))["tests"])


def test_the_default_sets_cases_pass(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["policy", "test", str(POLICIES / "default_test.yaml")]) == 0
    out = capsys.readouterr()
    assert out.out.strip() == f"{POLICIES / 'default_test.yaml'}: {CASES} cases, 0 failures: passed"
    assert out.err == ""


def test_every_default_rule_has_a_case_that_makes_it_fire() -> None:
    from storwatch.policy.load import load_policy

    text = (POLICIES / "default_test.yaml").read_text()
    names = [r.name for r in load_policy([str(POLICIES / "default.yaml")]).rules]
    assert [n for n in names if f"rule: {n}, key:" not in text] == []


def copy_with(tmp_path: Path, old: str, new: str) -> Path:
    shutil.copy(POLICIES / "default.yaml", tmp_path / "default.yaml")
    text = (POLICIES / "default_test.yaml").read_text()
    assert text.count(old) == 1
    path = tmp_path / "default_test.yaml"
    path.write_text(text.replace(old, new))
    return path


def test_a_case_expecting_a_wrong_action_fails(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = copy_with(
        tmp_path,
        "{rule: orphaned-temporaries-piling-up, action: log, key: litter}",
        "{rule: orphaned-temporaries-piling-up, action: webhook, key: litter}",
    )
    assert main(["policy", "test", str(path)]) == 1
    out = capsys.readouterr()
    line = next(i for i, t in enumerate(path.read_text().splitlines(), 1) if "- at: 30m" in t)
    assert out.err.splitlines() == [
        f"{path}:{line}: tests[8].expect[1]: case 'orphaned temporaries piling up fire after 30 minutes, logged only' "
        "at 1800s: actions: expected [orphaned-temporaries-piling-up webhook litter firing], got "
        "[orphaned-temporaries-piling-up log litter firing]"
    ]
    assert out.out.strip().endswith(f"{CASES} cases, 1 failures: FAILED")


def test_a_case_expecting_a_firing_too_early_fails(tmp_path: Path) -> None:
    path = copy_with(
        tmp_path,
        "      - at: 9m\n        firing: []\n      - at: 10m\n        firing: [{rule: next",
        "      - at: 9m\n        firing: [{rule: next-checkpoint-will-not-fit, key: full}]\n      - at: 10m\n"
        "        firing: [{rule: next",
    )
    result = run_test_file(str(path))
    (failure,) = result.failures
    assert "at 540s: firing: expected [next-checkpoint-will-not-fit full], got []" in failure


def test_a_bad_test_file_is_named_with_its_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    shutil.copy(POLICIES / "default.yaml", tmp_path / "default.yaml")
    path = tmp_path / "t.yaml"
    path.write_text(
        "rule_files: [default.yaml]\ntests:\n  - name: x\n    duration: 5m\n    entities:\n"
        "      - kind: run\n        fields: {run: a, recovery_points: 5}\n    expect:\n      - at: 90s\n"
    )
    assert main(["policy", "test", str(path)]) == 1
    assert capsys.readouterr().err.splitlines() == [
        f"{path}:7: tests[0].entities[0].fields.recovery_points: not a field of run",
        f"{path}:9: tests[0].expect[0].at: not an evaluation time (a multiple of 60s up to 300s)",
    ]


def test_check_refuses_a_chain_of_macros_that_doubles_a_list_naming_the_bound(
    capsys: pytest.CaptureFixture[str],
) -> None:
    path = REPO_ROOT / "tests" / "fixtures" / "policy" / "chained_doubling.yaml"
    when = path.read_text().splitlines()[6]
    assert main(["policy", "check", str(path)]) == 1
    out = capsys.readouterr()
    assert out.out == ""
    # 18 links: the estimate's figure doubles with each (9 links hold 3,579 elements, 10 links 7,163); the column is
    # the tenth link's, where it first passes the bound
    assert out.err.splitlines() == [
        f"{path}:7: rules[0].when: CEL: the condition can build lists and maps holding up to 1835003 elements at "
        "once, more than the bound of 4096 (every item of a nested list counts) "
        f"(column {when.index('map(x_09') - when.index('[0]') + 1})"
    ]


def test_show_prints_the_policy_doc(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["policy", "show"]) == 0
    assert capsys.readouterr().out == (REPO_ROOT / "docs" / "policy.md").read_text()
