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
from storwatch.exporter.area import (
    ALERTMANAGER_ALERT_RESULTS,
    ALERTMANAGER_REQUEST_RESULTS,
    AlertmanagerCounts,
    ExportState,
)
from storwatch.exporter.policy import families as policy_families
from storwatch.exporter.spec import Label, MetricSpec, MetricType, counter, gauge, metric
from storwatch.exporter.sync import families as sync_families
from storwatch.exporter.text import Family
from storwatch.vocabulary import PLATFORMS

# -- the metrics this area writes (storwatch/exporter/catalog.py assembles them)

COLLECTOR = Label("collector", "one per source declared in storwatch/registry.py (SOURCES)")

# -- agent: build and platform (the scrape opens with them)

BUILD_INFO = gauge(
    "agent",
    "storwatch_build_info",
    "storwatch version and Python runtime.",
    Label("version", "one: this agent's version"),
    Label("python", "one: the Python version the agent runs on"),
)
PLATFORM_INFO = gauge(
    "agent",
    "storwatch_platform_info",
    "The platform preset in use and why.",
    Label("platform", "the platform presets", PLATFORMS),
    Label("detected_by", "one: why this preset (configured, a flag, or what auto-detection saw)"),
)


# -- agent: its collectors, reloads and process (the scrape closes with them)

COLLECTOR_ENABLED = gauge(
    "agent",
    "storwatch_collector_enabled",
    "1 when the collector runs; 0 when it is off (disabled in the config, or nothing for it on this node).",
    COLLECTOR,
)
COLLECTOR_SUCCESS = gauge(
    "agent",
    "storwatch_collector_success",
    "1 when the collector's last run read and parsed its input; 0 with the error on /api/status.",
    COLLECTOR,
)
COLLECTOR_DURATION = gauge(
    "agent", "storwatch_collector_duration_seconds", "How long the collector's last run took.", COLLECTOR
)
COLLECTOR_LAST_SUCCESS = gauge(
    "agent",
    "storwatch_collector_last_success_timestamp_seconds",
    "Unix time of the collector's last successful run.",
    COLLECTOR,
)
EXPORTER_AREA_ERRORS = counter(
    "agent",
    "storwatch_exporter_area_errors_total",
    "Scrapes whose rendering of this exporter area raised: its families were left out of that scrape, every other "
    "area's written (the log has the error, at most once a minute per area).",
    Label("area", "one per exporter area (storwatch/registry.py exporter_areas) and two parts of the agent's own"),
)
COLLECTOR_FAILURES = counter(
    "agent",
    "storwatch_collector_failures_total",
    "Runs of the collector that failed (success 0) since the agent started; the log has the first of a failure "
    "that goes on, then lines at a backoff up to 300 s.",
    COLLECTOR,
)
PARSE_ERRORS = counter(
    "agent",
    "storwatch_parse_errors_total",
    "Lines of the collector's input that could not be parsed, counted each time one is read.",
    COLLECTOR,
)
CONFIG_RELOAD_ERRORS = counter(
    "agent",
    "storwatch_config_reload_errors_total",
    "Configuration reloads (SIGHUP) that failed; the last good configuration stayed in force.",
)
CONFIG_LAST_RELOAD_SUCCESS = gauge(
    "agent",
    "storwatch_config_last_reload_success",
    "1 when the last configuration reload succeeded (or none was asked for), 0 when it failed.",
)
TICK_INTERVAL = gauge(
    "agent",
    "storwatch_tick_interval_seconds",
    "Seconds between the agent's ticks now: tick_seconds, longer on a node where a tick and the reads that come with "
    "it cost more than tick_cpu_share of a core (at most tick_max_seconds), or quiet_seconds on a node without a GPU "
    "process for quiet_after_seconds (diskstats, NFS and GPU process reads follow the same pace).",
)
VIEW_INTERVAL = gauge(
    "agent",
    "storwatch_view_interval_seconds",
    "Seconds between the agent's Views now: view_seconds, longer where a View costs more than view_cpu_share of a "
    "core over it (at most view_max_seconds), or quiet_seconds on a quiet node.",
)


def _process(typ: MetricType, name: str, help_: str) -> MetricSpec:
    # Written by prometheus_client's ProcessCollector: name and help as it writes them (tested against it).
    return metric(typ, "agent", name, help_, written_by="prometheus_client")


PROCESS_VIRTUAL_MEMORY = _process("gauge", "process_virtual_memory_bytes", "Virtual memory size in bytes.")
PROCESS_RESIDENT_MEMORY = _process("gauge", "process_resident_memory_bytes", "Resident memory size in bytes.")
PROCESS_START_TIME = _process(
    "gauge", "process_start_time_seconds", "Start time of the process since unix epoch in seconds."
)
PROCESS_CPU_SECONDS = _process(
    "counter", "process_cpu_seconds_total", "Total user and system CPU time spent in seconds."
)
PROCESS_OPEN_FDS = _process("gauge", "process_open_fds", "Number of open file descriptors.")
PROCESS_MAX_FDS = _process("gauge", "process_max_fds", "Maximum number of open file descriptors.")


# -- agent: the Alertmanager receiver (POST /api/v1/alertmanager)

ALERTMANAGER_REQUESTS = counter(
    "agent",
    "storwatch_alertmanager_requests_total",
    "Requests to the Alertmanager receiver by what became of them: accepted (2xx), unauthorized (401), bad_request "
    "(400, 405, 411: the message names the field), too_large (413), busy (503: every body slot in use), off (404: "
    "alertmanager.enabled is false).",
    Label("result", "what can become of a request", ALERTMANAGER_REQUEST_RESULTS),
)
ALERTMANAGER_ALERTS = counter(
    "agent",
    "storwatch_alertmanager_alerts_total",
    "Alerts in accepted requests by what became of them: stored (new, or firing again with a later startsAt), "
    "updated (a repeat post of one held), stale (a late post of an earlier firing, ended before the held one "
    "began), ignored (another node's, or without the node label), evicted (held ones dropped to stay within "
    "alertmanager.max_alerts).",
    Label("result", "what can become of an alert", ALERTMANAGER_ALERT_RESULTS),
)


def info_families(view: View | None, state: ExportState) -> Iterator[Family]:
    build = BUILD_INFO.family()
    build.add((__version__, _platform.python_version()), 1)
    yield build
    if view is None:
        return
    plat = PLATFORM_INFO.family()
    plat.add((view.platform.name, view.platform.detected_by), 1)
    yield plat


def health_families(view: View | None, state: ExportState) -> Iterator[Family]:
    if view is not None:
        yield from _collectors(view)
    reloads = state.reloads
    if reloads is not None:
        errors = CONFIG_RELOAD_ERRORS.family()
        errors.add((), reloads.errors_total)
        last = CONFIG_LAST_RELOAD_SUCCESS.family()
        last.add((), 1 if reloads.last_success else 0)
        yield from (errors, last)
    if state.tick_interval is not None:
        tick = TICK_INTERVAL.family()
        tick.add((), state.tick_interval())
        yield tick
    if state.view_interval is not None:
        views = VIEW_INTERVAL.family()
        views.add((), state.view_interval())
        yield views
    if state.alertmanager is not None:
        yield from _alertmanager(state.alertmanager)
    policy, sync = state.policy, state.sync  # other threads' figures: each part fails alone
    if policy is not None:
        yield from state.isolated("agent.policy", lambda: policy_families(policy()))
    if sync is not None:
        yield from state.isolated("agent.sync", lambda: sync_families(sync()))
    errors = EXPORTER_AREA_ERRORS.family()
    for name, count in sorted(state.area_errors.items()):
        errors.add((name,), count)
    yield errors
    if state.process is not None:
        # prometheus_client writes these (PROCESS_*: its names and help, checked against it by the tests).
        for metric in state.process.collect():
            yield from Family.from_metric(metric)


def _alertmanager(counts: AlertmanagerCounts) -> Iterator[Family]:
    requests = ALERTMANAGER_REQUESTS.family()
    for result, count in counts.requests_total().items():
        requests.add((result,), count)
    alerts = ALERTMANAGER_ALERTS.family()
    for result, count in counts.alerts_total().items():
        alerts.add((result,), count)
    yield from (requests, alerts)


def _collectors(view: View) -> Iterator[Family]:
    enabled = COLLECTOR_ENABLED.family()
    parse_errors = PARSE_ERRORS.family()
    success = COLLECTOR_SUCCESS.family()
    duration = COLLECTOR_DURATION.family()
    last = COLLECTOR_LAST_SUCCESS.family()
    failures = COLLECTOR_FAILURES.family()
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
