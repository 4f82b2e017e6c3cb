"""What the README and docs/ promise a user: the default configuration as it is, the generated parts as the code makes
them, links and names that lead somewhere, and a README a newcomer can read."""

from __future__ import annotations

import dataclasses
import re
import typing
from pathlib import Path
from typing import Any

import pytest
import yaml

from storwatch import docs
from storwatch.config import Config
from storwatch.registry import extra_sections, parse_config
from tests.docs_text import DOCS, REPO_ROOT, section, yaml_blocks

README = REPO_ROOT / "README.md"
EXAMPLE = DOCS / "config.example.yaml"
CONFIGURATION = DOCS / "configuration.md"
PAGES = [README, *sorted(DOCS.glob("*.md"))]
README_MAX_LINES = 300
"""The README is for a newcomer: what it is, the two commands, the first screen, the main commands, deployment in
brief, and links; the reference is in docs/ (issue 39)."""


def documented_default_config() -> str:
    blocks = yaml_blocks(section(CONFIGURATION, "## The whole file, with its defaults"))
    assert len(blocks) == 1, "docs/configuration.md's defaults section should hold one yaml block, the defaults"
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


def every_field() -> set[str]:
    wanted = field_paths(Config)
    for name, section_type in extra_sections().items():
        wanted |= {name} | field_paths(section_type, name + ".")
    return wanted


@pytest.mark.parametrize(
    "text",
    [
        pytest.param(documented_default_config, id="docs/configuration.md"),
        pytest.param(EXAMPLE.read_text, id="example"),
    ],
)
def test_the_documented_default_configuration_is_complete_and_true(text: Any) -> None:
    block = text()
    # True: it is exactly the built-in defaults (a source's own section, written out, is its defaults too).
    parsed = parse_config(block, "documented defaults")
    assert dataclasses.replace(parsed, extra_sections={}) == Config()
    assert all(section == extra_sections()[name]() for name, section in parsed.extra_sections.items())
    # Complete: every section and field is written out, so a user sees all there is to set.
    missing = every_field() - key_paths(yaml.safe_load(block))
    assert not missing, f"fields missing from the documented defaults: {sorted(missing)}"


# -- the generated parts


def test_the_generated_docs_are_what_the_code_makes() -> None:
    stale = [rel for rel, text in docs.generated().items() if (REPO_ROOT / rel).read_text(encoding="utf-8") != text]
    assert stale == [], f"stale: {stale}; run: python -m storwatch.docs"
    assert docs.main(["--check"]) == 0


def test_the_field_table_lists_every_field_with_its_default_and_range() -> None:
    rows = re.findall(r"^\| `([\w.]+)` \| `(.*?)` \| (.*) \|$", docs.configuration_table(), re.M)
    leaves = {path for path in every_field() if not any(other.startswith(path + ".") for other in every_field())}
    assert {name for name, _, _ in rows} == leaves
    table = {name: (default, accepts) for name, default, accepts in rows}
    assert table["tick_seconds"] == ("1.0", "0.1 to 3600")
    assert table["history_size"] == ("30", "1 to 86400 (a day at one tick a second)")
    assert table["checkpoints.dataset_min_bytes"] == ("1073741824 (1 GiB)", "1 to 1024 TiB")
    assert table["platform"][1] == "auto, generic, together-k8s, together-slurm, gradient"
    assert table["probes.classes"] == ("[]", "a list of volatile, node, cluster, region")
    assert table["mounts.overrides"][1] == "a list of {mountpoint, durability, reason}"
    assert table["access.max_workloads"] == ("64", "1 to 100000")  # a section a source declares


def test_the_shipped_rules_table_has_every_rule_and_refuses_one_without_a_sentence() -> None:
    rules = docs.shipped_rules()
    table = docs.shipped_rules_table(rules)
    assert [re.match(r"\| `([\w-]+)`", row).group(1) for row in table.splitlines()[2:]] == [r.name for r in rules]  # type: ignore[union-attr]
    assert (
        "| `mount-stuck` | mount | a mount whose statvfs or probe is past its deadline | 5 min | warning"
        " | `log`, `event` | every 1 h |" in table
    )
    assert "| at once | the run's | `sync` | each newer `checkpoint` |" in table
    unknown = dataclasses.replace(rules[0], name="a-rule-nobody-described")
    with pytest.raises(ValueError, match="no sentence for \\['a-rule-nobody-described'\\]"):
        docs.shipped_rules_table([*rules, unknown])


def test_a_block_is_replaced_between_its_markers_and_a_missing_one_is_named(tmp_path: Path) -> None:
    begin = "<!-- generated: metrics by `python -m storwatch.docs`; do not edit -->"
    end = "<!-- end generated: metrics -->"
    text = f"intro\n\n{begin}\nold rows\n{end}\n\nnotes\n"
    assert docs.with_block(text, "metrics", "| new |") == f"intro\n\n{begin}\n| new |\n{end}\n\nnotes\n"
    assert docs.with_block(f"{begin}\n{end}\n", "metrics", "x") == f"{begin}\nx\n{end}\n"
    with pytest.raises(docs.StaleMarkers, match="no block 'metrics'"):
        docs.with_block("intro\n", "metrics", "x")
    # --check names a stale file and writes nothing; a run writes it.
    (tmp_path / "docs").mkdir()
    for rel, text in docs.generated().items():
        (tmp_path / rel).write_text(text, encoding="utf-8")
    stale = tmp_path / "docs" / "metrics.md"
    stale.write_text(stale.read_text(encoding="utf-8").replace("storwatch_build_info", "storwatch_old_info"))
    assert docs.main(["--check", "--root", str(tmp_path)]) == 1
    assert "storwatch_old_info" in stale.read_text(encoding="utf-8")
    assert docs.main(["--root", str(tmp_path)]) == 0
    assert docs.main(["--check", "--root", str(tmp_path)]) == 0


# -- links and names


def slug(heading: str) -> str:
    """A heading's anchor as GitHub makes it: lower case, punctuation but - and _ dropped, spaces to -."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", path.read_text(encoding="utf-8"), flags=re.S)
    return {slug(h) for h in re.findall(r"^#+ (.+)$", text, flags=re.M)}


REPO_PATH = re.compile(
    r"`((?:docs|daemonset|deploy|bench|scripts|tests|storwatch|training|alerts|dashboards)/[\w./-]*(?:::\w+)?)`"
)
"""A path of the repository named in code (``tests/test_x.py::test_y`` names a test in its file)."""
PLACEHOLDER = re.compile(r"(^|/)[A-Z][A-Z_]+(\.\w+)?(/|$)")
"""A part of a path that stands for any name (``storwatch/exporter/AREA.py``, ``tests/fixtures/NAME/``)."""


def test_the_docs_send_users_only_to_files_and_sections_they_have() -> None:
    problems = []
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        if "../shared" in text:
            problems.append(f"{page.name} points outside the repository")
        for target in sorted(set(REPO_PATH.findall(text))):
            path, _, test = target.partition("::")
            if PLACEHOLDER.search(path):
                continue
            if not (REPO_ROOT / path).exists():
                problems.append(f"{page.name} names {target}, which is not in the repository")
            elif test and f"def {test}(" not in (REPO_ROOT / path).read_text(encoding="utf-8"):
                problems.append(f"{page.name} names {target}: no such test")
        # A markdown link to a page of the repository: the page, and the section its anchor names.
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if "://" in target:
                continue
            file, _, anchor = target.partition("#")
            linked = (page.parent / file).resolve() if file else page
            if not linked.exists():
                problems.append(f"{page.name} links to {target}: no such file")
            elif anchor and anchor not in anchors(linked):
                problems.append(f"{page.name} links to {target}: no such section")
    assert problems == []
    assert (DOCS / "architecture.md").is_file()


def test_no_page_sends_a_reader_to_a_section_by_a_name_it_does_not_have() -> None:
    """'see "Sync"' was how the one long README pointed within itself: a quoted section name must be one there."""
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        headings = {h.strip().lower() for h in re.findall(r"^#+ (.+)$", text, re.M)}
        for name in re.findall(r'[Ss]ee "([^"]+)"', text):
            assert name.lower() in headings, f'{page.name}: see "{name}", which is no section of it'


def test_the_readme_is_short_and_points_to_every_reference_page() -> None:
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= README_MAX_LINES
    linked = {Path(t.partition("#")[0]).name for t in re.findall(r"\]\((docs/[^)\s]+)\)", text)}
    pages = {p.name for p in DOCS.glob("*.md")}
    assert pages - linked == set(), f"pages of docs/ the README does not link to: {sorted(pages - linked)}"


def test_the_readme_runs_storwatch_from_where_make_run_puts_it() -> None:
    commands = [line for line in re.findall(r"```sh\n(.*?)```", section(README, "## Running it"), re.S)[0].splitlines()]
    commands = [line for line in commands if line.strip()]
    assert commands and all(line.startswith(".venv/bin/storwatch ") for line in commands), commands
