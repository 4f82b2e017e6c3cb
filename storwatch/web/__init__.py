"""The agent's HTTP side: the server (:mod:`.server`) and the status page it serves (:mod:`.page`)."""

from __future__ import annotations

from storwatch.web.page import render_status_page
from storwatch.web.server import (
    METRICS_CONTENT_TYPE,
    NOT_CACHED,
    NotCached,
    ServerLimits,
    StatusHTTPServer,
    accepts_gzip,
    listen_backlog,
    parse_head,
)

__all__ = [
    "METRICS_CONTENT_TYPE",
    "NOT_CACHED",
    "NotCached",
    "ServerLimits",
    "StatusHTTPServer",
    "accepts_gzip",
    "listen_backlog",
    "parse_head",
    "render_status_page",
]
