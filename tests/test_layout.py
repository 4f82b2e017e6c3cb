"""The test suite's own layout: no module under tests/ imports a test module (``test_*.py``). What several tests share
lives in helper modules (tests/builders.py, tests/browser.py, tests/golden_scrape.py and the real-part harnesses) and
fixtures in tests/conftest.py, so running or deselecting one test module never runs another's tests or set-up."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

TESTS = Path(__file__).parent


def imported_test_modules(source: str) -> list[str]:
    """The test modules that ``source`` imports, however spelled (absolute, relative, inside a function)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names if _is_test_module(a.name)]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if _is_test_module(base):
                found.append(base)
            else:  # "from tests import test_x", "from . import test_x"
                found += [f"{base}.{a.name}" if base else a.name for a in node.names if _is_test_module(a.name)]
    return sorted(set(found))


def _is_test_module(dotted: str) -> bool:
    return any(part.startswith("test_") for part in dotted.split("."))


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("from tests.test_rpo import ckpt", ["tests.test_rpo"]),
        ("import tests.test_rpo", ["tests.test_rpo"]),
        ("from tests import test_rpo", ["tests.test_rpo"]),
        ("from .test_rpo import ckpt", ["test_rpo"]),
        ("from . import test_rpo", ["test_rpo"]),
        ("def f():\n    from tests.test_checkpoint_source import torch_like_zip\n", ["tests.test_checkpoint_source"]),
        ("from tests.builders import ckpt, on, run", []),
        ("from storwatch.analysis.stalls import StallTracker", []),
        ("import pytest", []),
    ],
    ids=[
        "from-module",
        "import",
        "from-package",
        "relative",
        "relative-package",
        "in-function",
        "helper",
        "other",
        "pytest",
    ],
)
def test_imports_of_test_modules_are_found(source: str, expected: list[str]) -> None:
    assert imported_test_modules(source) == expected


def test_no_module_under_tests_imports_a_test_module() -> None:
    offenders = {
        str(path.relative_to(TESTS)): found
        for path in sorted(TESTS.rglob("*.py"))
        if "fixtures" not in path.relative_to(TESTS).parts
        and (found := imported_test_modules(path.read_text(encoding="utf-8")))
    }
    assert offenders == {}, "move what they share into tests/builders.py (fixtures into tests/conftest.py)"
