"""The agent's own area: its build and platform, how each collector's last run went, how configuration reloads went,
and its process's CPU, memory and file descriptors (storwatch_build_info, storwatch_platform_info,
storwatch_collector_*, storwatch_parse_errors_total, storwatch_config_*, process_*).

Two functions, because the scrape opens with the build and platform and closes with the rest: ``info_families`` and
``health_families``."""

from __future__ import annotations

import platform as _platform
from collections.abc import Iterator

from storwatch import __version__
from storwatch.analysis.view import View
from storwatch.exporter.area import ExportState
from storwatch.exporter.text import Family


def info_families(view: View | None, state: ExportState) -> Iterator[Family]:
    build = Family("storwatch_build_info", "storwatch version and Python runtime.", labels=("version", "python"))
    build.add((__version__, _platform.python_version()), 1)
    yield build
    if view is None:
        return
    plat = Family("storwatch_platform_info", "The platform preset in use and why.", labels=("platform", "detected_by"))
    plat.add((view.platform.name, view.platform.detected_by), 1)
    yield plat


def health_families(view: View | None, state: ExportState) -> Iterator[Family]:
    if view is not None:
        yield from _collectors(view)
    reloads = state.reloads
    if reloads is not None:
        errors = Family(
            "storwatch_config_reload_errors_total",
            "Configuration reloads (SIGHUP) that failed; the last good configuration stayed in force.",
            "counter",
        )
        errors.add((), reloads.errors_total)
        last = Family(
            "storwatch_config_last_reload_success",
            "1 when the last configuration reload succeeded (or none was asked for), 0 when it failed.",
        )
        last.add((), 1 if reloads.last_success else 0)
        yield from (errors, last)
    if state.process is not None:
        for metric in state.process.collect():
            yield from Family.from_metric(metric)


def _collectors(view: View) -> Iterator[Family]:
    collector = ("collector",)
    enabled = Family(
        "storwatch_collector_enabled",
        "1 when the collector runs; 0 when it is off (disabled in the config, or nothing for it on this node).",
        labels=collector,
    )
    parse_errors = Family(
        "storwatch_parse_errors_total",
        "Lines of the collector's input that could not be parsed, counted each time one is read.",
        "counter",
        labels=collector,
    )
    success = Family(
        "storwatch_collector_success",
        "1 when the collector's last run read and parsed its input; 0 with the error on /api/status.",
        labels=collector,
    )
    duration = Family(
        "storwatch_collector_duration_seconds", "How long the collector's last run took.", labels=collector
    )
    last = Family(
        "storwatch_collector_last_success_timestamp_seconds",
        "Unix time of the collector's last successful run.",
        labels=collector,
    )
    for c in view.collectors:
        name = (c.name,)
        enabled.add(name, 1 if c.enabled else 0)
        parse_errors.add(name, c.parse_errors)
        if not c.enabled:
            continue  # an off collector neither succeeds nor fails
        success.add(name, 1 if c.success else 0)
        duration.add(name, c.duration_seconds)
        last.add(name, c.last_success_timestamp)
    yield from (enabled, success, duration, last, parse_errors)
