"""Reading the docs as the tests hold them to the code: a section of a markdown file, and the tables of
docs/metrics.md (its generated table of every metric, and the hand-written list of where ``+Inf`` is written)."""

from __future__ import annotations

import re
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
DOCS = REPO_ROOT / "docs"
METRICS_DOC = DOCS / "metrics.md"


def section(path: Path, heading: str) -> str:
    """The text of the section under ``heading`` (``## Title``, level included) up to the next heading of its level
    or above; an AssertionError naming the file when there is none."""
    level = len(heading) - len(heading.lstrip("#"))
    text = path.read_text(encoding="utf-8")
    assert f"\n{heading}\n" in text, f"{path.relative_to(REPO_ROOT)} has no section {heading!r}"
    body = text.split(f"\n{heading}\n", 1)[1]
    stop = re.search(rf"^#{{1,{level}}} ", body, re.M)
    return body if stop is None else body[: stop.start()]


def yaml_blocks(text: str) -> list[str]:
    return re.findall(r"```yaml\n(.*?)```", text, re.S)


def inf_metrics() -> set[str]:
    """The metrics docs/metrics.md says ``+Inf`` is written in (its "Where +Inf is written" table), each with a
    meaning."""
    out: set[str] = set()
    for line in section(METRICS_DOC, "## Where +Inf is written").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        name = re.fullmatch(r"`(storwatch_\w+)`", cells[0])
        if name is not None:
            assert len(cells) == 2 and cells[1], f"a row without what +Inf means: {line}"
            out.add(name.group(1))
    return out
