"""Every metric the agent exports, assembled from the areas that write them: each exporter area declares its metrics
at the top of its own module (storwatch/exporter/AREA.py, with :mod:`.spec`'s helpers), beside the code that fills
them, and this module imports every module of the package and gathers what they declared. A metric's name, help and
label names are written in its area's declaration and nowhere else. :data:`CATALOG` is the list to generate or check
the metrics reference (docs/metrics.md), dashboards and alert rules against; ``python -m storwatch.exporter.catalog``
prints it as markdown rows (``--labels``: each label's bound).
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys
from collections.abc import Iterator, Mapping, Sequence

import storwatch.exporter
from storwatch.exporter.spec import Label, MetricSpec, declared

__all__ = ["BY_NAME", "CATALOG", "Label", "MetricSpec", "label_rows", "markdown_rows"]

for _module in pkgutil.iter_modules(storwatch.exporter.__path__):
    importlib.import_module(f"storwatch.exporter.{_module.name}")  # each area module declares its metrics

SCRAPE_FIRST = "agent"
"""The agent's area is listed first (its build and platform open a scrape); the others by name."""
CATALOG: tuple[MetricSpec, ...] = tuple(
    sorted(declared(), key=lambda s: (s.area != SCRAPE_FIRST, s.area if s.area != SCRAPE_FIRST else ""))
)
"""Every metric: the agent's first, then each area's by name, each area's in the order it declares them."""
BY_NAME: Mapping[str, MetricSpec] = {spec.name: spec for spec in CATALOG}
if len(BY_NAME) != len(CATALOG):
    raise RuntimeError("storwatch.exporter.catalog declares a metric name twice")


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _labels_cell(spec: MetricSpec) -> str:
    return ", ".join(
        label.name if label.values is None else f"{label.name} ({', '.join(label.values)})" for label in spec.labels
    )


def markdown_rows(specs: Sequence[MetricSpec] = CATALOG) -> Iterator[str]:
    """The metrics as rows of docs/metrics.md's table (metric, labels, meaning), fixed label values in brackets."""
    yield "| metric | labels | meaning |"
    yield "|---|---|---|"
    for spec in specs:
        kind = " (histogram)" if spec.type == "histogram" else ""
        yield f"| `{spec.name}`{kind} | {_cell(_labels_cell(spec))} | {_cell(spec.help)} |"


def label_rows(specs: Sequence[MetricSpec] = CATALOG) -> Iterator[str]:
    """Each label of each metric with what bounds its values (and the values, where they are a fixed set)."""
    yield "| metric | label | bound |"
    yield "|---|---|---|"
    for spec in specs:
        for label in spec.labels:
            values = "" if label.values is None else f": {', '.join(label.values)}"
            yield f"| `{spec.name}` | {label.name} | {_cell(label.bound + values)} |"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m storwatch.exporter.catalog", description="Print every metric storwatch exports."
    )
    parser.add_argument("--labels", action="store_true", help="each label's bound instead of the metrics table")
    args = parser.parse_args(argv)
    rows = label_rows() if args.labels else markdown_rows()
    sys.stdout.write("".join(row + "\n" for row in rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
