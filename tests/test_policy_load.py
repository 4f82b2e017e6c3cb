"""Policy files (storwatch/policy/load.py): real YAML files, each problem named FILE:LINE: FIELD: message, through
the loader and through ``storwatch policy check``; overrides as Falco's; the shipped default set loads."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from storwatch.cli import main
from storwatch.policy.cel import DEFAULT_BOUNDS
from storwatch.policy.load import (
    MAX_RULES,
    PolicyError,
    load_policy,
    parse_duration,
    parse_policy,
    render_message,
    template_problems,
)

FIXTURES = Path(__file__).parent / "fixtures" / "policy"
REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT = REPO_ROOT / "storwatch" / "policies" / "default.yaml"


def errors_of(*paths: Path) -> list[str]:
    with pytest.raises(PolicyError) as caught:
        load_policy([str(p) for p in paths])
    return caught.value.errors


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        pytest.param(
            "python_object.yaml",
            ":5: rules[0].message: the tag !!python/object/apply:os.system is refused",
            id="python-object-tag",
        ),
        pytest.param(
            "unknown_field.yaml", ":6: rules[0].escalate_to: unknown field; known: name, on, when", id="unknown-field"
        ),
        pytest.param("cel_syntax.yaml", ":6: rules[0].when: CEL: ", id="cel-syntax"),
        pytest.param(
            "too_deep.yaml",
            ":5: rules[0].when: CEL: .exists() inside another comprehension: at most 1 level",
            id="nested-comprehension",
        ),
        pytest.param(
            "chained_doubling.yaml",
            ":7: rules[0].when: CEL: the condition can build lists and maps holding up to ",
            id="chained-doubling",
        ),
    ],
)
def test_check_rejects_with_file_and_line(name: str, expected: str, capsys: pytest.CaptureFixture[str]) -> None:
    path = FIXTURES / name
    errors = errors_of(path)
    assert len(errors) == 1, errors
    assert errors[0].startswith(f"{path}{expected}"), errors[0]
    assert main(["policy", "check", str(path)]) == 1
    out = capsys.readouterr()
    assert f"{path}{expected}" in out.err


def test_the_cel_syntax_error_names_the_line_of_the_block_it_is_on() -> None:
    """The condition is a literal block: its second line is line 6 of the file; the message is the library's."""
    (error,) = errors_of(FIXTURES / "cel_syntax.yaml")
    assert ":6: rules[0].when: CEL: CEL syntax error" in error or ":6: rules[0].when: CEL: unexpected '>'" in error


def test_an_expression_nested_past_the_limit_is_refused(tmp_path: Path) -> None:
    depth = DEFAULT_BOUNDS.max_depth + 1
    path = tmp_path / "deep.yaml"
    path.write_text(f"rules:\n  - name: deep\n    on: mount\n    when: {'(' * depth}stuck{')' * depth}\n")
    (error,) = errors_of(path)
    assert error.startswith(f"{path}:4: rules[0].when: CEL: the expression nests {depth} brackets"), error


def test_a_name_that_is_no_field_of_the_kind_is_refused_with_a_hint(tmp_path: Path) -> None:
    path = tmp_path / "typo.yaml"
    path.write_text("rules:\n  - name: t\n    on: mount\n    when: stuk\n")
    (error,) = errors_of(path)
    assert error == (
        f"{path}:4: rules[0].when: CEL: 'stuk' is not a field of mount or a list (did you mean 'stuck'?) (column 1)"
    )


def test_every_problem_of_every_file_is_listed(tmp_path: Path) -> None:
    a = tmp_path / "a.yaml"
    a.write_text(
        "rules:\n"
        "  - name: one\n    on: disk\n    when: 'true'\n"
        "  - name: two\n    on: gpu\n    when: up\n    for: soon\n"
        "  - name: three\n    on: gpu\n    when: up\n    actions: [{action: page}]\n"
    )
    b = tmp_path / "b.yaml"
    b.write_text("rules:\n  - name: four\n    on: node\n    when: ready\n    message: 'node {nodename}'\n")
    errors = errors_of(a, b)
    assert errors == [
        f"{a}:3: rules[0].on: 'disk' is not one of mount, run, gpu, workload, finding, node, alert",
        f"{a}:8: rules[1].for: expected a duration (seconds, or such as 90s, 5m, 1h30m), got 'soon'",
        f"{a}:12: rules[2].actions[0].action: unknown action 'page'; known: log, event, webhook, request_checkpoint, "
        "sync",
        f"{b}:5: rules[0].message: {{nodename}}: not a field of the entity",
    ]


def test_an_entitys_own_severity_and_repeat_on_are_checked_against_its_kind(tmp_path: Path) -> None:
    good = tmp_path / "good.yaml"
    good.write_text(
        "rules:\n  - name: copy\n    on: run\n    when: complete > 0\n    severity: '{severity}'\n"
        "    repeat_on: [checkpoint]\n"
    )
    (rule,) = load_policy([str(good)]).rules
    assert (rule.severity_field, rule.severity_shown, rule.repeat_on) == ("severity", "{severity}", ("checkpoint",))
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "rules:\n"
        "  - name: a\n    on: mount\n    when: stuck\n    severity: '{severity}'\n"
        "  - name: b\n    on: run\n    when: complete > 0\n    severity: '{newest_verdict}'\n"
        "  - name: c\n    on: run\n    when: complete > 0\n    repeat_on: [checkpoint, chekpoint]\n"
        "  - name: d\n    on: run\n    when: complete > 0\n    repeat_on: checkpoint\n"
    )
    assert errors_of(bad) == [
        f"{bad}:5: rules[0].severity: '{{severity}}' is not one of info, warning, critical",
        f"{bad}:9: rules[1].severity: '{{newest_verdict}}' is not one of info, warning, critical, or \"{{severity}}\" "
        "(each run's own)",
        f"{bad}:13: rules[2].repeat_on: 'chekpoint': not a field of run",
        f"{bad}:17: rules[3].repeat_on: expected a list of 1 to 8 fields of run",
    ]


def test_action_params_are_checked_by_the_check_passed_in(tmp_path: Path) -> None:
    def webhook(params: object) -> list[str]:
        return [] if isinstance(params, dict) and "url" in params else ["url: required"]

    text = "rules:\n  - name: w\n    on: node\n    when: ready\n    actions:\n      - action: webhook\n"
    text += "        params: {}\n"
    with pytest.raises(PolicyError) as caught:
        parse_policy([("w.yaml", text)], checks={"webhook": webhook})
    assert caught.value.errors == ["w.yaml:7: rules[0].actions[0].params: url: required"]
    ok = text.replace("{}", "{url: 'https://hooks.example/x'}")
    (rule,) = parse_policy([("w.yaml", ok)], checks={"webhook": webhook}).rules
    assert rule.actions[0].params == {"url": "https://hooks.example/x"}


def test_keys_given_twice_and_a_rule_defined_twice_are_errors(tmp_path: Path) -> None:
    a = tmp_path / "a.yaml"
    a.write_text("rules:\n  - name: x\n    on: node\n    when: ready\n    when: draining == true\n")
    assert errors_of(a) == [f"{a}:5: rules[0].when: given twice (first on line 4)"]
    b = tmp_path / "b.yaml"
    b.write_text("rules:\n  - name: x\n    on: node\n    when: ready\n")
    c = tmp_path / "c.yaml"
    c.write_text("rules:\n  - name: x\n    on: node\n    when: '!ready'\n")
    (error,) = errors_of(b, c)
    assert error.startswith(f"{c}:2: rules[0].name: rule defined twice (first at {b}:2); to change it, give override")


def test_override_append_ands_the_condition_and_adds_actions_and_labels() -> None:
    policy = load_policy([str(FIXTURES / "base.yaml"), str(FIXTURES / "override_append.yaml")])
    (rule,) = policy.rules
    assert rule.when == "(stuck && fstype in local_fstypes) && (stuck_seconds > 30.0)"
    assert [a.action for a in rule.actions] == ["log", "event"]
    assert dict(rule.labels) == {"team": "storage", "page": "yes"}
    assert rule.severity == "warning"
    fields = {"stuck": True, "fstype": "ext4", "stuck_seconds": 12.0}
    assert rule.expression.evaluate({**policy.lists, **fields}) is False
    assert rule.expression.evaluate({**policy.lists, **fields, "stuck_seconds": 31.0}) is True


def test_override_replace_replaces_only_the_fields_named() -> None:
    policy = load_policy([str(FIXTURES / "base.yaml"), str(FIXTURES / "override_replace.yaml")])
    (rule,) = policy.rules
    assert (rule.when, rule.severity) == ("stuck", "critical")
    assert [a.action for a in rule.actions] == ["log"] and dict(rule.labels) == {"team": "storage"}


def test_override_errors(tmp_path: Path) -> None:
    a = tmp_path / "a.yaml"
    a.write_text("rules:\n  - name: nobody\n    override: {when: append}\n    when: ready\n")
    assert errors_of(a) == [f"{a}:3: rules[0].override: no rule 'nobody' defined before to override"]
    b = tmp_path / "b.yaml"
    b.write_text(
        "rules:\n  - name: local-mount-stuck\n    override: {severity: append, on: replace}\n"
        "    severity: critical\n    on: gpu\n    message: hi\n"
    )
    assert errors_of(FIXTURES / "base.yaml", b) == [
        f"{b}:3: rules[0].override.severity: expected replace",
        f"{b}:3: rules[0].override.on: cannot be overridden",
        f"{b}:6: rules[0].message: give it in override as append or replace",
    ]


def test_macros_expand_and_a_cycle_is_refused(tmp_path: Path) -> None:
    a = tmp_path / "a.yaml"
    a.write_text(
        "macros:\n  busy: 'utilization_ratio != null && utilization_ratio > limit'\n  limit: '0.5'\n"
        "rules:\n  - name: busy\n    on: gpu\n    when: busy && up\n"
    )
    (rule,) = load_policy([str(a)]).rules
    assert rule.when == "(utilization_ratio != null && utilization_ratio > (0.5)) && up"
    b = tmp_path / "b.yaml"
    b.write_text("macros:\n  x: 'y'\n  y: 'x'\nrules:\n  - name: loop\n    on: gpu\n    when: x\n")
    (error,) = errors_of(b)
    assert "macro 'x' refers to itself (x -> y -> x)" in error and error.startswith(f"{b}:7: rules[0].when: CEL")


def test_what_a_rule_can_build_is_bounded_with_its_lists_sizes_and_its_macros_expanded(tmp_path: Path) -> None:
    many = ", ".join(f"n{i}" for i in range(64))
    a = tmp_path / "a.yaml"
    a.write_text(
        f"lists:\n  few: [a, b]\n  many: [{many}]\n"
        "rules:\n  - name: few\n    on: node\n    when: few.map(x, few).size() > 0\n"
        "  - name: many\n    on: node\n    when: many.map(x, many).size() > 0\n"
    )
    (error,) = errors_of(a)
    assert error.startswith(f"{a}:10: rules[1].when: CEL: the condition can build lists and maps holding up to 8320 ")
    assert "more than the bound of 4096" in error
    # a macro alone is checked for its syntax; what it builds, in each rule that uses it, with that rule's fields
    links = "".join(f".map(x{i}, [x{i}, x{i}])" for i in range(12))
    b = tmp_path / "b.yaml"
    b.write_text(f"macros:\n  grow: '[0]{links}'\nrules:\n  - name: g\n    on: gpu\n    when: grow.size() > 0\n")
    (error,) = errors_of(b)
    assert error.startswith(f"{b}:6: rules[0].when: CEL (macros expanded): the condition can build lists and maps ")


def test_a_macro_or_list_may_not_take_a_fields_name(tmp_path: Path) -> None:
    a = tmp_path / "a.yaml"
    a.write_text("macros:\n  stuck: 'true'\nlists:\n  fstype: [ext4]\n")
    assert errors_of(a) == [
        f"{a}:4: lists.fstype: 'fstype' is the name of an entity's field",
        f"{a}:2: macros.stuck: 'stuck' is the name of an entity's field",
    ]


def test_too_many_rules_are_refused(tmp_path: Path) -> None:
    rules = "".join(f"  - name: r{i}\n    on: node\n    when: ready\n" for i in range(MAX_RULES + 1))
    path = tmp_path / "many.yaml"
    path.write_text("rules:\n" + rules)
    (error,) = errors_of(path)
    assert f"rules[{MAX_RULES}]: more than {MAX_RULES} rules" in error


def test_an_unreadable_or_invalid_file_names_itself(tmp_path: Path) -> None:
    missing = tmp_path / "missing.yaml"
    bad = tmp_path / "bad.yaml"
    bad.write_text("rules: [\n")
    errors = errors_of(missing, bad)
    assert errors[0].startswith(f"{missing}: cannot read:")
    assert len(errors) == 1  # the loader stops before parsing once a file cannot be read
    (error,) = errors_of(bad)
    assert error.startswith(f"{bad}:2: (top level): invalid YAML:")


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("90s", 90.0), ("5m", 300.0), ("1h30m", 5400.0), ("250ms", 0.25), (0, 0.0), (12.5, 12.5), ("2d", 172800.0)],
)
def test_durations(text: object, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["5 minutes", "-1", -1, True, "1y", "31d", ""])
def test_bad_durations(text: object) -> None:
    with pytest.raises(ValueError):
        parse_duration(text)


def test_message_templates_fill_fields_and_nothing_else() -> None:
    names = frozenset({"run", "bytes"})
    assert template_problems("{run} {{literal}} {bytes}", names) == []
    assert template_problems("{run.__class__} {bytes:>10} {0} { run", names) == [
        "{run.__class__}: only a field's name may stand in braces",
        "{bytes:>10}: only a field's name may stand in braces",
        "{0}: only a field's name may stand in braces",
        "a lone '{' (write {{ for a brace)",
    ]
    fields = {"run": "a\x1b[31mb", "bytes": 3, "missing": None, "ratio": 0.25, "big": 3600.0, "l": ("x", "y")}
    assert render_message("{run} {bytes} {missing} {ratio} {big} {l} {{x}}", fields) == (
        "a\\x1b[31mb 3 B unknown 0.25 3600 x, y {x}"
    )


def test_a_message_says_figures_in_words_by_the_unit_their_name_carries() -> None:
    """A field's name says its unit (``_seconds``, ``bytes``, ``_ratio``, ``_share``): a message says the figure in
    words, an unknown as unknown and an infinite one as unbounded, never null, None, inf or nan."""
    fields = {
        "age_seconds": 5400.0,
        "left_seconds": 12.0,
        "rp_seconds": math.inf,
        "size_bytes": 3 << 30,
        "headroom_bytes": -(1 << 20),
        "utilization_ratio": 0.5,
        "stall_share_10m": 0.25,
        "gone": None,
        "odd": math.nan,
        "flag": True,
        "none": (),
    }
    text = render_message(
        "{age_seconds}|{left_seconds}|{rp_seconds}|{size_bytes}|{headroom_bytes}|{utilization_ratio}|"
        "{stall_share_10m}|{gone}|{odd}|{flag}|{none}",
        fields,
    )
    assert text == "2 h|12 s|unbounded|3.0 GiB|-1.0 MiB|50%|25%|unknown|unknown|yes|none"


def test_the_default_policy_loads_and_check_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    policy = load_policy([str(DEFAULT)])
    assert len(policy.rules) == 13
    assert main(["policy", "check", str(DEFAULT)]) == 0
    assert "13 rules" in capsys.readouterr().out
