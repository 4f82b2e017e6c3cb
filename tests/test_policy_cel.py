"""Conditions in CEL (storwatch/policy/cel.py): the bounds checked before the library sees an expression, each with
where it failed; macros expanded; evaluations that give no bool are errors; the library loaded without its command
line."""

from __future__ import annotations

import subprocess
import sys

import pytest

from storwatch.policy.cel import (
    DEFAULT_BOUNDS,
    MAX_LIST_ITEMS,
    CelError,
    EvalError,
    analyse,
    compile_expression,
    expand,
    tokens,
)

NAMES = {"stuck", "fstype", "workloads", "labels", "path", "bytes", "ratio", "maybe"}


@pytest.mark.parametrize(
    ("source", "message"),
    [
        pytest.param("x" * (DEFAULT_BOUNDS.max_chars + 1), "characters long, more than 1024", id="length"),
        pytest.param(
            "(" * 33 + "stuck" + ")" * 33, "nests 33 brackets and 0 conditionals, deeper than 32", id="parens"
        ),
        pytest.param(" || ".join(["stuck"] * 40), "nested deeper than 32 levels", id="operator-chain"),
        pytest.param(
            "workloads.all(a, workloads.exists(b, a == b))", ".exists() inside another comprehension", id="nested-loop"
        ),
        pytest.param(
            "workloads.map(a, [a].filter(b, b == a)).size() > 0", ".filter() inside another", id="nested-in-range"
        ),
        pytest.param(
            "fstype in [" + ", ".join(["'x'"] * 65) + "]", "a list literal of 65 items, more than 64", id="list"
        ),
        pytest.param("workloads.exists(w, w + w == path)", "'+' inside a comprehension", id="concat-in-loop"),
        pytest.param("path.matches(fstype)", ".matches() takes a string literal", id="tenant-regex"),
        pytest.param("path.split('/')", "function .split() is not allowed", id="method"),
        pytest.param("exec('x')", "function exec() is not allowed", id="function"),
        pytest.param("stuk", "'stuk' is not a variable (did you mean 'stuck'?)", id="unknown-name"),
        pytest.param("workloads.exists(stuck, stuck)", "the loop variable 'stuck' hides a name", id="shadow"),
        pytest.param("stuck &&", "unexpected 'end of the expression'", id="syntax"),
        pytest.param("'unclosed", "a string literal is not closed", id="string"),
        pytest.param("stuck # x", "unexpected character '#'", id="character"),
        pytest.param("google.api.Foo{a: 1}", "message construction", id="message"),
        pytest.param("if", "'if' is a reserved word", id="reserved"),
        pytest.param(".stuck", "a leading '.'", id="root-scope"),
    ],
)
def test_refused(source: str, message: str) -> None:
    with pytest.raises(CelError) as caught:
        compile_expression(source, NAMES)
    assert message in str(caught.value)


def test_a_refusal_says_where() -> None:
    with pytest.raises(CelError) as caught:
        analyse("stuck && workloads.exists(w, w.startsWith(pathx))", NAMES)
    assert (caught.value.message, caught.value.column) == ("'pathx' is not a variable (did you mean 'path'?)", 43)


def test_at_the_bounds_it_compiles() -> None:
    source = "(" * 32 + "stuck" + ")" * 32
    assert compile_expression(source, NAMES).evaluate({"stuck": True}) is True
    listed = "fstype in [" + ", ".join(f"'t{i}'" for i in range(MAX_LIST_ITEMS)) + "]"
    assert compile_expression(listed, NAMES).evaluate({"fstype": "t63"}) is True
    loops = "workloads.exists(w, w.startsWith('ns/')) && workloads.all(w, size(w) < 100)"
    a = analyse(loops, NAMES)
    assert (a.comprehension_nesting, a.names) == (1, frozenset({"workloads"}))


@pytest.mark.parametrize(
    ("source", "kinds"),
    [
        ("a_1 >= 0x1Fu", ["ident", "op", "uint"]),
        ("1.5e-3 + .5 - 2e3", ["double", "op", "double", "op", "double"]),
        ("r'a\\b' + b'x' + '''a'b''' + R\"\"\"q\"\"\"", ["string", "op", "bytes", "op", "string", "op", "string"]),
        ("x // a comment\n&& y", ["ident", "op", "ident"]),
        ("'a\\'b' == \"c\\\"d\"", ["string", "op", "string"]),
    ],
)
def test_tokens(source: str, kinds: list[str]) -> None:
    assert [t.kind for t in tokens(source)][:-1] == kinds


def test_evaluation() -> None:
    expr = compile_expression(
        "stuck && fstype in ['nfs', 'nfs4'] && labels.team == 'ml' && bytes > 10 && ratio > 0.5"
        " && workloads.exists(w, w.startsWith('ml/')) && path.matches('^/home/')",
        NAMES,
    )
    fields = {
        "stuck": True,
        "fstype": "nfs4",
        "labels": {"team": "ml"},
        "bytes": 11,
        "ratio": 0.75,
        "workloads": ("ml/a", "x"),
        "path": "/home/a",
    }
    assert expr.evaluate(fields) is True
    assert expr.evaluate({**fields, "ratio": 0.25}) is False


def test_an_evaluation_that_gives_no_bool_is_an_error() -> None:
    with pytest.raises(EvalError, match="not a bool"):
        compile_expression("bytes + 1", NAMES).evaluate({"bytes": 1})
    with pytest.raises(EvalError):
        compile_expression("maybe > 1.0", NAMES).evaluate({"maybe": None})
    # CEL's && absorbs an error on one side when the other is false: a null tested first never errs
    assert compile_expression("maybe != null && maybe > 1.0", NAMES).evaluate({"maybe": None}) is False


def test_macros_expand_in_brackets_and_not_after_a_dot_or_as_a_call() -> None:
    macros = {"m": "a || b", "n": "m && c"}
    assert expand("n && x.m && m(1) && 'm'", macros) == "((a || b) && c) && x.m && m(1) && 'm'"
    with pytest.raises(CelError, match="refers to itself"):
        expand("p", {"p": "q", "q": "p"})


def test_the_library_is_loaded_without_its_command_line() -> None:
    code = (
        "import sys\nfrom storwatch.policy.cel import compile_expression\n"
        "assert compile_expression('1 < 2').evaluate({}) is True\n"
        "print(sorted(m for m in ('rich', 'typer', 'prompt_toolkit', 'cel.cli') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[]"
