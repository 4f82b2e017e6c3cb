"""The agent's own area: its build and platform, how each collector's last run went, how configuration reloads went,
what the Alertmanager receiver took, and its process's CPU, memory and file descriptors (storwatch_build_info,
storwatch_platform_info, storwatch_collector_*, storwatch_parse_errors_total, storwatch_config_*,
storwatch_alertmanager_*, process_*), and the policy's and the sync action's figures (storwatch_policy_*,
storwatch_sync_*).

Two functions, because the scrape opens with the build and platform and closes with the rest: ``info_families`` and
``health_families``."""

from __future__ import annotations

import platform as _platform
from collections.abc import Iterator

from storwatch import __version__
from storwatch.analysis.view import View
from storwatch.exporter import catalog
from storwatch.exporter.area import AlertmanagerCounts, ExportState
from storwatch.exporter.policy import families as policy_families
from storwatch.exporter.sync import families as sync_families
from storwatch.exporter.text import Family


def info_families(view: View | None, state: ExportState) -> Iterator[Family]:
    build = catalog.BUILD_INFO.family()
    build.add((__version__, _platform.python_version()), 1)
    yield build
    if view is None:
        return
    plat = catalog.PLATFORM_INFO.family()
    plat.add((view.platform.name, view.platform.detected_by), 1)
    yield plat


def health_families(view: View | None, state: ExportState) -> Iterator[Family]:
    if view is not None:
        yield from _collectors(view)
    reloads = state.reloads
    if reloads is not None:
        errors = catalog.CONFIG_RELOAD_ERRORS.family()
        errors.add((), reloads.errors_total)
        last = catalog.CONFIG_LAST_RELOAD_SUCCESS.family()
        last.add((), 1 if reloads.last_success else 0)
        yield from (errors, last)
    if state.tick_interval is not None:
        tick = catalog.TICK_INTERVAL.family()
        tick.add((), state.tick_interval())
        yield tick
    if state.view_interval is not None:
        views = catalog.VIEW_INTERVAL.family()
        views.add((), state.view_interval())
        yield views
    if state.alertmanager is not None:
        yield from _alertmanager(state.alertmanager)
    policy, sync = state.policy, state.sync  # other threads' figures: each part fails alone
    if policy is not None:
        yield from state.isolated("agent.policy", lambda: policy_families(policy()))
    if sync is not None:
        yield from state.isolated("agent.sync", lambda: sync_families(sync()))
    errors = catalog.EXPORTER_AREA_ERRORS.family()
    for name, count in sorted(state.area_errors.items()):
        errors.add((name,), count)
    yield errors
    if state.process is not None:
        # prometheus_client writes these (catalog.PROCESS_*: its names and help, checked against it by the tests).
        for metric in state.process.collect():
            yield from Family.from_metric(metric)


def _alertmanager(counts: AlertmanagerCounts) -> Iterator[Family]:
    requests = catalog.ALERTMANAGER_REQUESTS.family()
    for result, count in counts.requests_total().items():
        requests.add((result,), count)
    alerts = catalog.ALERTMANAGER_ALERTS.family()
    for result, count in counts.alerts_total().items():
        alerts.add((result,), count)
    yield from (requests, alerts)


def _collectors(view: View) -> Iterator[Family]:
    enabled = catalog.COLLECTOR_ENABLED.family()
    parse_errors = catalog.PARSE_ERRORS.family()
    success = catalog.COLLECTOR_SUCCESS.family()
    duration = catalog.COLLECTOR_DURATION.family()
    last = catalog.COLLECTOR_LAST_SUCCESS.family()
    failures = catalog.COLLECTOR_FAILURES.family()
    for c in view.collectors:
        name = (c.name,)
        enabled.add(name, 1 if c.enabled else 0)
        parse_errors.add(name, c.parse_errors)
        if not c.enabled:
            continue  # an off collector neither succeeds nor fails
        success.add(name, 1 if c.success else 0)
        duration.add(name, c.duration_seconds)
        last.add(name, c.last_success_timestamp)
        failures.add(name, c.failures)
    yield from (enabled, success, duration, last, failures, parse_errors)
