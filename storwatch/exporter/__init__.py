"""The exporter: renders a View to Prometheus exposition text; /metrics serves the bytes.

Every metric is declared once, in :mod:`.catalog` (name, type, help, labels and the bound on each label's values).
One module per area writes that area's families (:mod:`.mounts`, :mod:`.io`, :mod:`.nfs`, :mod:`.lustre`,
:mod:`.gpu`, :mod:`.checkpoints`, :mod:`.kube`, :mod:`.access`, :mod:`.agent`), each a
:class:`~storwatch.exporter.text.Family` made from its catalog entry; the writer (:mod:`.text`) joins their lines.
An area is a function ``(view, state) -> families`` (:data:`.area.Area`); :class:`Exporter` renders the areas it is
given, in order: the agent gives it those of the source registry (``storwatch.registry.exporter_areas``), each
source's area declared with the source.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Iterator, Sequence

from prometheus_client import ProcessCollector

from storwatch.analysis.view import View
from storwatch.config import DEFAULT_MAX_MOUNT_SERIES, DEFAULT_NFS_OPERATIONS
from storwatch.exporter.area import AlertmanagerCounts, Area, ConfigReloads, ExportState
from storwatch.exporter.text import Family, render_text

__all__ = ["AlertmanagerCounts", "Area", "ConfigReloads", "ExportState", "Exporter", "Family", "render_text"]


class Exporter:
    """Renders a View with its areas; keeps what they remember between renders (``state``)."""

    def __init__(
        self,
        areas: Sequence[Area],
        process_metrics: bool = True,
        nfs_operations: Iterable[str] = DEFAULT_NFS_OPERATIONS,
        reloads: ConfigReloads | None = None,
        alertmanager: AlertmanagerCounts | None = None,
        max_mount_series: int = DEFAULT_MAX_MOUNT_SERIES,
    ) -> None:
        """``reloads``: the agent's reload record, exported as storwatch_config_* (left out without it);
        ``alertmanager``: the Alertmanager receiver's counts, as storwatch_alertmanager_* (likewise)."""
        process = ProcessCollector(registry=None) if process_metrics else None
        self.state = ExportState(nfs_operations, reloads, process, alertmanager, max_mount_series)
        self.areas = tuple(areas)
        names = [_area_name(a) for a in self.areas]
        names += ["agent.policy", "agent.sync"]  # the parts of the agent's own area that read other threads
        self.state.area_errors.update(dict.fromkeys(names, 0))  # each series there at 0 before anything fails

    def configure(self, nfs_operations: Iterable[str], max_mount_series: int = DEFAULT_MAX_MOUNT_SERIES) -> None:
        self.state.configure(nfs_operations, max_mount_series)

    def families(self, view: View | None) -> Iterator[Family]:
        """Every area's families for ``view``, in order (None: the agent is starting, and has no View yet); an area
        that raises is left out of this render and counted (ExportState.isolated)."""
        for area in self.areas:
            yield from self.state.isolated(_area_name(area), functools.partial(area, view, self.state))

    def render(self, view: View | None) -> bytes:
        return render_text(self.families(view))


def _area_name(area: Area) -> str:
    """``module.function`` of an area (``mounts.families``, ``agent.health_families``): the label its errors carry."""
    return f"{area.__module__.rpartition('.')[2]}.{getattr(area, '__name__', 'area')}"
