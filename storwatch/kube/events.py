"""The Kubernetes Events action: posts a core/v1 Event about an object (this Node by default) for a finding, so that
``kubectl describe`` and event exporters show it beside the pod or node it concerns.

The same reason about the same object within ``dedup_seconds`` raises the count of the first Event (a merge patch),
as the kubelet's own event recorder does, instead of creating another; a token bucket (storwatch/pace.py) bounds the
rate of requests, and so the memory kept of posted Events. A post makes one request with the client's timeouts, two
when its patch finds the Event gone (then it is created again). Through the shared client of ``storwatch.kube.client``.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from storwatch.kube.client import KubeClient, format_time, path_part
from storwatch.pace import TokenBucket

log = logging.getLogger(__name__)

Clock = Callable[[], float]
PostResult = Literal["created", "patched", "rate-limited", "failed", "disabled"]

EVENT_DEDUP_SECONDS = 600.0
"""How long the same reason about the same object counts as a repeat of the Event already posted."""
EVENT_BURST = 10
EVENTS_PER_SECOND = 1 / 30


@dataclass
class _PostedEvent:
    namespace: str
    name: str
    count: int
    first: float
    last: float


class KubeEvents:
    """Posts Events through ``client``; ``disabled`` for every post while the client has no connection."""

    def __init__(
        self,
        client: KubeClient,
        *,
        clock: Clock = time.time,
        burst: int = EVENT_BURST,
        per_second: float = EVENTS_PER_SECOND,
        dedup_seconds: float = EVENT_DEDUP_SECONDS,
        component: str = "storwatch",
    ) -> None:
        self.client = client
        self.clock = clock
        self.dedup_seconds = dedup_seconds
        self.component = component
        """The Event's source.component and reportingComponent."""
        self._lock = threading.Lock()
        self._posted: dict[tuple[str, str, str, str], _PostedEvent] = {}
        self._bucket = TokenBucket(burst, per_second, clock)

    def post(
        self,
        reason: str,
        message: str,
        *,
        kind: str = "Node",
        name: str | None = None,
        namespace: str = "",
        uid: str | None = None,
        event_type: str = "Warning",
        api_version: str = "v1",
    ) -> PostResult:
        """Post an Event about the object ``kind``/``name`` (in ``namespace`` when it is namespaced; this Node by
        default). "created" or "patched" (a repeat); "rate-limited" (nothing sent); "failed" (the API refused or
        did not answer: logged, never raised, the finding is exported either way); "disabled" (no cluster)."""
        client = self.client
        if not client.enabled:
            return "disabled"
        name = name or client.node_name
        # Events about cluster-scoped objects (the Node) live in "default", as the kubelet's do.
        event_ns = namespace or "default"
        now = self.clock()
        key = (reason, kind, namespace, name)
        with self._lock:
            for k, posted in list(self._posted.items()):
                if now - posted.last > self.dedup_seconds:
                    del self._posted[k]
            previous = self._posted.get(key)
            if not self._bucket.take():
                return "rate-limited"
        try:
            if previous is not None:
                if self._patch(previous, message, now):
                    return "patched"
                # Deleted since (by hand, or by the API server's event TTL): post it afresh.
                with self._lock:
                    self._posted.pop(key, None)
            event_name = f"{name}.{uuid.uuid4().hex[:16]}"
            involved: dict[str, Any] = {"kind": kind, "name": name, "apiVersion": api_version}
            if namespace:
                involved["namespace"] = namespace
            if uid:
                involved["uid"] = uid
            body = {
                "apiVersion": "v1",
                "kind": "Event",
                "metadata": {"name": event_name, "namespace": event_ns},
                "involvedObject": involved,
                "reason": reason,
                "message": message,
                "type": event_type,
                "count": 1,
                "firstTimestamp": format_time(now),
                "lastTimestamp": format_time(now),
                "source": {"component": self.component, "host": client.node_name},
                "reportingComponent": self.component,
                "reportingInstance": client.node_name,
            }
            client.send("POST", f"/api/v1/namespaces/{path_part(event_ns)}/events", body)
            with self._lock:
                self._posted[key] = _PostedEvent(event_ns, event_name, 1, now, now)
            return "created"
        except Exception as err:  # an Event is best effort: the finding is exported either way
            log.warning("kube: posting Event %s about %s %s failed: %s", reason, kind, name, err)
            return "failed"

    def _patch(self, previous: _PostedEvent, message: str, now: float) -> bool:
        """Count one more of ``previous``; False when it is gone from the API (404), raise for any other failure."""
        body = {"count": previous.count + 1, "lastTimestamp": format_time(now), "message": message}
        try:
            self.client.send(
                "PATCH",
                f"/api/v1/namespaces/{path_part(previous.namespace)}/events/{path_part(previous.name)}",
                body,
                content_type="application/merge-patch+json",
            )
        except Exception as err:
            if getattr(err, "status", None) == 404:
                return False
            raise
        with self._lock:
            previous.count += 1
            previous.last = now
        return True


__all__ = ["EVENTS_PER_SECOND", "EVENT_BURST", "EVENT_DEDUP_SECONDS", "KubeEvents", "PostResult"]
