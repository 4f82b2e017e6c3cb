"""What a metric of the catalog is, and the helpers each exporter area declares its metrics with: :class:`MetricSpec`
(name, type, help, labels, the area that writes it), :class:`Label` (with what bounds its values), :func:`gauge`,
:func:`counter`, :func:`metric`, and the labels several areas share. Each area declares its own metrics at the top of
its module (storwatch/exporter/AREA.py), beside the code that fills them; :mod:`.catalog` assembles every area's
into CATALOG."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from storwatch.exporter.text import Family
from storwatch.vocabulary import Durability

MetricType = Literal["gauge", "counter", "histogram"]
WrittenBy = Literal["storwatch", "prometheus_client"]


@dataclass(frozen=True)
class Label:
    """A label of a metric, and what keeps its values few."""

    name: str
    bound: str
    """Why the label has few values, in a sentence: one per object of the node (mount, GPU, pod), a cap in the code,
    or one per agent."""
    values: tuple[str, ...] | None = None
    """The fixed set of values, where there is one: every exported value is one of these (tested)."""


@dataclass(frozen=True, eq=False)
class MetricSpec:
    """One metric family as a scrape shows it. Each is declared once, so one is equal only to itself (and hashed as
    cheaply: the areas key their families by spec)."""

    name: str
    """The name on every sample line (counters end in ``_total``; a histogram's lines add ``_bucket``, ``_count``,
    ``_sum``)."""
    type: MetricType
    help: str
    labels: tuple[Label, ...]
    """In the order an area passes their values (lines are written with the names sorted)."""
    area: str
    """The exporter module that writes it and declares it (storwatch/exporter/AREA.py)."""
    allow_inf: bool = False
    """``+Inf`` is written; docs/metrics.md says what it means there."""
    written_by: WrittenBy = "storwatch"
    """``prometheus_client``: its ProcessCollector writes the family (names and help are its own); the agent area
    passes it on."""

    @property
    def label_names(self) -> tuple[str, ...]:
        return tuple(label.name for label in self.labels)

    def label(self, name: str) -> Label:
        for label in self.labels:
            if label.name == name:
                return label
        raise KeyError(f"{self.name} has no label {name!r}")

    def values(self, label: str) -> tuple[str, ...]:
        """The fixed values of ``label`` (a KeyError where it has none: its values come from the node)."""
        values = self.label(label).values
        if values is None:
            raise KeyError(f"{self.name}: label {label!r} has no fixed set of values")
        return values

    def family(self) -> Family:
        """An empty family for this metric, for one render."""
        return Family(self.name, self.help, self.type, self.label_names, allow_inf=self.allow_inf)


_declared: list[MetricSpec] = []
"""Every metric declared, in the order its area module declared it (catalog.py assembles CATALOG from it)."""


def metric(
    typ: MetricType,
    area: str,
    name: str,
    help_: str,
    labels: Sequence[Label] = (),
    allow_inf: bool = False,
    written_by: WrittenBy = "storwatch",
) -> MetricSpec:
    spec = MetricSpec(name, typ, help_, tuple(labels), area, allow_inf, written_by)
    _declared.append(spec)
    return spec


def gauge(area: str, name: str, help_: str, *labels: Label, allow_inf: bool = False) -> MetricSpec:
    return metric("gauge", area, name, help_, labels, allow_inf)


def counter(area: str, name: str, help_: str, *labels: Label) -> MetricSpec:
    return metric("counter", area, name, help_, labels)


# -- labels shared by several areas

MOUNTPOINT = Label(
    "mountpoint",
    "one per mount in the node's mount table (its path, escaped where not UTF-8), at most mounts.max_series (256); "
    "the rest counted in storwatch_mount_series_dropped",
)
GPU = Label("gpu", "one per GPU on the node (its NVML index)")
DURABILITIES = tuple(d.value for d in Durability)


def declared() -> tuple[MetricSpec, ...]:
    """Every metric the modules imported so far declared, in the order they did."""
    return tuple(_declared)
