"""What the README and docs/ promise a user: the default configuration as it is, and links that lead somewhere."""

from __future__ import annotations

import dataclasses
import re
import typing
from pathlib import Path
from typing import Any

import pytest
import yaml

from storwatch.config import Config
from storwatch.registry import extra_sections, parse_config

REPO_ROOT = Path(__file__).resolve().parents[1]
README = REPO_ROOT / "README.md"
EXAMPLE = REPO_ROOT / "docs" / "config.example.yaml"


def readme_default_config() -> str:
    text = README.read_text(encoding="utf-8")
    section = text.split("\n## Configuration\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```yaml\n(.*?)```", section, re.S)
    assert len(blocks) == 1, "the Configuration section should hold one yaml block, the defaults"
    return blocks[0]


def field_paths(tp: Any, prefix: str = "") -> set[str]:
    """Every field of the configuration, as dotted paths (sections and their fields)."""
    out: set[str] = set()
    hints = typing.get_type_hints(tp)
    for f in dataclasses.fields(tp):
        if f.name == "extra_sections":  # not a key of the file: the sections sources declare (below)
            continue
        path = f"{prefix}{f.name}"
        out.add(path)
        if dataclasses.is_dataclass(hints[f.name]):
            out |= field_paths(hints[f.name], path + ".")
    return out


def key_paths(node: Any, prefix: str = "") -> set[str]:
    out: set[str] = set()
    if isinstance(node, dict):
        for key, value in node.items():
            out.add(f"{prefix}{key}")
            out |= key_paths(value, f"{prefix}{key}.")
    return out


@pytest.mark.parametrize(
    "text", [pytest.param(readme_default_config, id="README"), pytest.param(EXAMPLE.read_text, id="example")]
)
def test_the_documented_default_configuration_is_complete_and_true(text: Any) -> None:
    block = text()
    # True: it is exactly the built-in defaults (a source's own section, written out, is its defaults too).
    parsed = parse_config(block, "documented defaults")
    assert dataclasses.replace(parsed, extra_sections={}) == Config()
    assert all(section == extra_sections()[name]() for name, section in parsed.extra_sections.items())
    # Complete: every section and field is written out, so a user sees all there is to set.
    wanted = field_paths(Config)
    for name, section_type in extra_sections().items():
        wanted |= {name} | field_paths(section_type, name + ".")
    missing = wanted - key_paths(yaml.safe_load(block))
    assert not missing, f"fields missing from the documented defaults: {sorted(missing)}"


def test_the_readme_sends_users_only_to_files_they_have() -> None:
    text = README.read_text(encoding="utf-8")
    for doc in [README, *sorted((REPO_ROOT / "docs").glob("*.md"))]:
        assert "../shared" not in doc.read_text(encoding="utf-8"), f"{doc.name} points outside the repository"
    for target in sorted(set(re.findall(r"`((?:docs|daemonset|deploy|bench|scripts|tests)/[\w./-]+)`", text))):
        assert (REPO_ROOT / target).exists(), f"README names {target}, which is not in the repository"
    assert (REPO_ROOT / "docs" / "architecture.md").is_file()


def test_the_readme_runs_storwatch_from_where_make_run_puts_it() -> None:
    section = README.read_text(encoding="utf-8").split("\n## Running it\n", 1)[1].split("\n## ", 1)[0]
    commands = [line for line in re.findall(r"```sh\n(.*?)```", section, re.S)[0].splitlines() if line.strip()]
    assert commands and all(line.startswith(".venv/bin/storwatch ") for line in commands), commands
