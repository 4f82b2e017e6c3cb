"""The exporter: renders a View to Prometheus exposition text, once per tick; /metrics serves the cached bytes."""

from __future__ import annotations

import platform as _platform
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, ProcessCollector, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from storwatch import __version__
from storwatch.model import Durability, View
from storwatch.sources.mounts import display_path

EMPTY_VIEW_TIMESTAMP = 0.0


class ViewCollector(Collector):
    """Builds fresh metric families from the View it is given (client_python's custom collector pattern)."""

    def __init__(self) -> None:
        self.view: View | None = None

    def collect(self) -> Iterator[GaugeMetricFamily]:
        view = self.view
        build = GaugeMetricFamily(
            "storwatch_build_info", "storwatch version and Python runtime.", labels=["version", "python"]
        )
        build.add_metric([__version__, _platform.python_version()], 1)
        yield build
        if view is None:
            return
        plat = GaugeMetricFamily(
            "storwatch_platform_info", "The platform preset in use and why.", labels=["platform", "detected_by"]
        )
        plat.add_metric([view.platform.name, view.platform.detected_by], 1)
        yield plat
        yield from self._mounts(view)
        yield from self._collectors(view)

    def _mounts(self, view: View) -> Iterator[GaugeMetricFamily]:
        info = GaugeMetricFamily(
            "storwatch_mount_info",
            "A mount on this node with its durability class and the reason for it.",
            labels=["mountpoint", "device", "fstype", "durability", "reason"],
        )
        durability = GaugeMetricFamily(
            "storwatch_mount_durability",
            "1 for the durability class of each mount (volatile, node, cluster, region), 0 for the others.",
            labels=["mountpoint", "durability"],
        )
        size = GaugeMetricFamily("storwatch_mount_size_bytes", "Filesystem size in bytes.", labels=["mountpoint"])
        free = GaugeMetricFamily(
            "storwatch_mount_free_bytes", "Free bytes, root's reserve included.", labels=["mountpoint"]
        )
        avail = GaugeMetricFamily(
            "storwatch_mount_avail_bytes", "Bytes available to unprivileged users.", labels=["mountpoint"]
        )
        files = GaugeMetricFamily("storwatch_mount_files", "Inodes in the filesystem.", labels=["mountpoint"])
        files_free = GaugeMetricFamily("storwatch_mount_files_free", "Free inodes.", labels=["mountpoint"])
        stuck = GaugeMetricFamily(
            "storwatch_mount_stuck",
            "1 when a statvfs on the mount has not returned within its deadline.",
            labels=["mountpoint"],
        )
        stuck_for = GaugeMetricFamily(
            "storwatch_mount_stuck_seconds",
            "How long the oldest call on a stuck mount has been in flight.",
            labels=["mountpoint"],
        )
        readonly = GaugeMetricFamily(
            "storwatch_mount_readonly", "1 when the mount is read-only.", labels=["mountpoint"]
        )
        for mv in view.mounts:
            m = mv.mount
            mp = display_path(m.mountpoint)
            info.add_metric([mp, display_path(m.device), m.fstype, mv.verdict.durability.value, mv.verdict.reason], 1)
            for d in Durability:
                durability.add_metric([mp, d.value], 1 if d is mv.verdict.durability else 0)
            if m.usage is not None:
                size.add_metric([mp], m.usage.size_bytes)
                free.add_metric([mp], m.usage.free_bytes)
                avail.add_metric([mp], m.usage.avail_bytes)
                files.add_metric([mp], m.usage.files)
                files_free.add_metric([mp], m.usage.files_free)
            stuck.add_metric([mp], 1 if m.stuck else 0)
            stuck_for.add_metric([mp], m.stuck_seconds)
            readonly.add_metric([mp], 1 if m.readonly else 0)
        yield from (info, durability, size, free, avail, files, files_free, stuck, stuck_for, readonly)

    def _collectors(self, view: View) -> Iterator[GaugeMetricFamily]:
        success = GaugeMetricFamily(
            "storwatch_collector_success", "1 when the collector's last run succeeded.", labels=["collector"]
        )
        duration = GaugeMetricFamily(
            "storwatch_collector_duration_seconds", "How long the collector's last run took.", labels=["collector"]
        )
        last = GaugeMetricFamily(
            "storwatch_collector_last_success_timestamp_seconds",
            "Unix time of the collector's last successful run.",
            labels=["collector"],
        )
        for c in view.collectors:
            success.add_metric([c.name], 1 if c.success else 0)
            duration.add_metric([c.name], c.duration_seconds)
            if c.last_success_timestamp is not None:
                last.add_metric([c.name], c.last_success_timestamp)
        yield from (success, duration, last)


class Exporter:
    """Holds the registry; ``render`` turns a View into exposition bytes."""

    def __init__(self, process_metrics: bool = True) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self._view_collector = ViewCollector()
        self.registry.register(self._view_collector)
        if process_metrics:
            ProcessCollector(registry=self.registry)

    def render(self, view: View | None) -> bytes:
        self._view_collector.view = view
        return generate_latest(self.registry)
