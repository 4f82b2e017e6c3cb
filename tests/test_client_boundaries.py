"""One module per outside library: only the NVML wrapper imports the NVML bindings, only the Kubernetes client module
imports the Kubernetes client, so each can be missing, replaced or upgraded in one place. Read from the source with
ast, so imports inside functions (all of these are lazy) count too."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "storwatch"


def importers(library: str, package: Path = PACKAGE) -> set[str]:
    """The modules of ``package`` (paths relative to it) that import ``library`` or one of its submodules."""
    out = set()
    for path in sorted(package.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            if any(n == library or n.startswith(library + ".") for n in names):
                out.add(path.relative_to(package).as_posix())
    return out


@pytest.mark.parametrize(
    ("library", "module"),
    [
        pytest.param("pynvml", "sources/gpu/nvml.py", id="nvml"),
        pytest.param("kubernetes", "kube/client.py", id="kubernetes"),
    ],
)
def test_only_one_module_imports_the_library(library: str, module: str) -> None:
    assert importers(library) == {module}


def test_the_scan_finds_every_form_of_import(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "a.py").write_text("def f():\n    from pynvml import nvmlInit\n")
    (tmp_path / "sub" / "b.py").write_text("import os, kubernetes.client as k\n")
    (tmp_path / "c.py").write_text("from . import pynvml\nimport pynvmlx\nimport kubernetesish\n")
    assert importers("pynvml", tmp_path) == {"a.py"}
    assert importers("kubernetes", tmp_path) == {"sub/b.py"}
