"""Kubernetes source: watches this node's pods, PVCs, PVs, StorageClasses and this Node; posts Events for findings.

The only module that imports ``kubernetes``. Watch threads keep a snapshot current; ``collect()`` returns it without
touching the API, so a slow or absent API server never delays a tick. The snapshot types live in
``storwatch.sources.kubevolumes`` so every other module reads them without the client installed.
"""

from __future__ import annotations

import calendar
import contextlib
import json
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from storwatch.sources.kubevolumes import (
    CONFIG_MAP,
    DOWNWARD_API,
    EMPTY_DIR,
    EMPTY_DIR_MEMORY,
    EPHEMERAL,
    HOST_PATH,
    OTHER,
    PROJECTED,
    PVC,
    SECRET,
    ClusterObjects,
    KubeFacts,
    NodeInfo,
    PodInfo,
    PVCInfo,
    PVInfo,
    StorageClassInfo,
    VolumeInfo,
    is_removal_taint,
)

log = logging.getLogger(__name__)

Obj = dict[str, Any]
Clock = Callable[[], float]

REQUEST_TIMEOUT = (3.0, 30.0)
"""(connect, read) seconds for every request: a read waits at most this long for the next byte of a watch."""
WATCH_TIMEOUT_SECONDS = 25
"""Server-side watch duration, under the read timeout so a quiet healthy watch ends before the client gives up."""
BACKOFF_INITIAL = 1.0
BACKOFF_MAX = 30.0
EVENT_DEDUP_SECONDS = 600.0
SERVICE_ACCOUNT_TOKEN = "/var/run/secrets/kubernetes.io/serviceaccount/token"


class _Gone(Exception):
    """The watch's resourceVersion is too old (HTTP 410 or an ERROR event with code 410): relist."""


def parse_time(value: object) -> float | None:
    """An RFC 3339 timestamp of the API (``2026-11-22T10:00:00Z``, optional fraction) as a UNIX time."""
    if not isinstance(value, str) or not value:
        return None
    text = value.rstrip("Z")
    frac = 0.0
    if "." in text:
        text, _, digits = text.partition(".")
        frac = float("0." + "".join(c for c in digits if c.isdigit()) or "0")
    try:
        return calendar.timegm(time.strptime(text[:19], "%Y-%m-%dT%H:%M:%S")) + frac
    except ValueError:
        return None


def format_time(ts: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))


def _volume_info(vol: Obj, pod_name: str) -> VolumeInfo:
    name = str(vol.get("name", ""))
    if "emptyDir" in vol:
        medium = (vol.get("emptyDir") or {}).get("medium") or ""
        return VolumeInfo(name, EMPTY_DIR_MEMORY if medium == "Memory" else EMPTY_DIR)
    if "hostPath" in vol:
        return VolumeInfo(name, HOST_PATH, path=(vol.get("hostPath") or {}).get("path"))
    if "persistentVolumeClaim" in vol:
        return VolumeInfo(name, PVC, claim_name=(vol.get("persistentVolumeClaim") or {}).get("claimName"))
    if "ephemeral" in vol:
        # The ephemeral-volume controller names the PVC <pod>-<volume> and makes the pod its owner.
        return VolumeInfo(name, EPHEMERAL, claim_name=f"{pod_name}-{name}")
    for key, kind in (
        ("configMap", CONFIG_MAP),
        ("secret", SECRET),
        ("projected", PROJECTED),
        ("downwardAPI", DOWNWARD_API),
    ):
        if key in vol:
            return VolumeInfo(name, kind)
    if "csi" in vol:
        return VolumeInfo(name, OTHER, csi_driver=(vol.get("csi") or {}).get("driver"))
    return VolumeInfo(name, OTHER)


def pod_info(obj: Obj) -> PodInfo:
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    owner = next((o for o in meta.get("ownerReferences") or [] if o.get("controller")), None)
    grace = meta.get("deletionGracePeriodSeconds")
    name = str(meta.get("name", ""))
    return PodInfo(
        uid=str(meta.get("uid", "")).lower(),
        name=name,
        namespace=str(meta.get("namespace", "")),
        node_name=str(spec.get("nodeName") or ""),
        owner_kind=owner.get("kind") if owner else None,
        owner_name=owner.get("name") if owner else None,
        deletion_timestamp=parse_time(meta.get("deletionTimestamp")),
        grace_seconds=float(grace) if isinstance(grace, (int, float)) else None,
        volumes=tuple(_volume_info(v, name) for v in spec.get("volumes") or []),
        phase=str((obj.get("status") or {}).get("phase") or ""),
        labels=dict(meta.get("labels") or {}),
    )


def pvc_info(obj: Obj) -> PVCInfo:
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    return PVCInfo(
        namespace=str(meta.get("namespace", "")),
        name=str(meta.get("name", "")),
        volume_name=spec.get("volumeName") or None,
        storage_class=spec.get("storageClassName") or None,
    )


def pv_info(obj: Obj) -> PVInfo:
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    ref = spec.get("claimRef") or None
    return PVInfo(
        name=str(meta.get("name", "")),
        local_or_hostpath="local" in spec or "hostPath" in spec,
        csi_driver=(spec.get("csi") or {}).get("driver") or None,
        nfs="nfs" in spec,
        storage_class=spec.get("storageClassName") or None,
        claim=(str(ref.get("namespace", "")), str(ref.get("name", ""))) if ref else None,
    )


def storage_class_info(obj: Obj) -> StorageClassInfo:
    return StorageClassInfo(
        name=str((obj.get("metadata") or {}).get("name", "")), provisioner=str(obj.get("provisioner", ""))
    )


def node_info(obj: Obj) -> NodeInfo:
    spec = obj.get("spec") or {}
    taints = tuple((str(t.get("key", "")), str(t.get("effect", ""))) for t in spec.get("taints") or [])
    return NodeInfo(
        name=str((obj.get("metadata") or {}).get("name", "")),
        cordoned=bool(spec.get("unschedulable")),
        taints=taints,
        removal_taints=tuple(sorted({k for k, _ in taints if is_removal_taint(k)})),
    )


@dataclass
class _WatchState:
    kind: str
    items: dict[str, Any]
    resource_version: str | None = None
    ok: bool = False
    relists: int = 0
    errors: int = 0


class _Watcher:
    """One list+watch loop in its own thread; keeps ``state.items`` equal to the server's objects."""

    def __init__(
        self,
        source: KubeSource,
        kind: str,
        list_fn: Callable[..., Any],
        kwargs: Mapping[str, Any],
        convert: Callable[[Obj], Any],
        key: Callable[[Obj], str],
    ) -> None:
        self.source = source
        self.state = _WatchState(kind, {})
        self.list_fn = list_fn
        self.kwargs = dict(kwargs)
        self.convert = convert
        self.key = key
        self._resp: Any = None
        self.thread = threading.Thread(target=self._run, name=f"storwatch-kube-{kind}", daemon=True)

    def _call(self, **extra: Any) -> Any:
        resp = self.list_fn(
            **self.kwargs, _preload_content=False, _request_timeout=self.source.request_timeout, **extra
        )
        status = getattr(resp, "status", 200)
        if status == 410:
            resp.close()
            raise _Gone()
        if not 200 <= status <= 299:
            body = resp.data[:200].decode(errors="replace") if hasattr(resp, "data") else ""
            resp.close()
            raise OSError(f"HTTP {status}: {body}")
        return resp

    def _relist(self) -> None:
        resp = self._call()
        try:
            body = json.loads(resp.data)
        finally:
            resp.close()
        items = {}
        for obj in body.get("items") or []:
            items[self.key(obj)] = self.convert(obj)
        with self.source._lock:
            self.state.items = items
            self.state.resource_version = (body.get("metadata") or {}).get("resourceVersion")
            self.state.relists += 1
            self.state.ok = True
            self.source._changed()

    def _lines(self, resp: Any) -> Iterator[bytes]:
        buffer = b""
        for chunk in resp.stream(amt=None, decode_content=False):
            buffer += chunk
            while b"\n" in buffer:
                line, buffer = buffer.split(b"\n", 1)
                if line.strip():
                    yield line

    def _watch(self) -> None:
        resp = self._call(
            watch=True,
            resource_version=self.state.resource_version,
            timeout_seconds=self.source.watch_timeout_seconds,
            allow_watch_bookmarks=True,
        )
        self._resp = resp
        started = time.monotonic()
        with self.source._lock:
            if not self.state.ok:
                self.state.ok = True
                self.source._changed()
        try:
            for line in self._lines(resp):
                event = json.loads(line)
                etype, obj = event.get("type"), event.get("object") or {}
                if etype == "ERROR":
                    code = obj.get("code")
                    if code == 410:
                        raise _Gone()
                    raise OSError(f"watch error {code}: {obj.get('reason')}: {obj.get('message')}")
                rv = (obj.get("metadata") or {}).get("resourceVersion")
                with self.source._lock:
                    if etype in ("ADDED", "MODIFIED"):
                        self.state.items[self.key(obj)] = self.convert(obj)
                    elif etype == "DELETED":
                        self.state.items.pop(self.key(obj), None)
                    if rv:
                        self.state.resource_version = rv
                    if etype != "BOOKMARK":
                        self.source._changed()
                if self.source._stop.is_set():
                    return
        except (_Gone, OSError):
            raise
        except Exception as err:
            # A stream cut after it ran a while (server restart, load balancer idle cut) ends the watch like a
            # timeout: resume at once, and let the reconnect decide whether the API is down. A stream cut at once,
            # again and again, is an error and backs off.
            if time.monotonic() - started < 1.0:
                raise
            log.debug("kube: %s watch stream cut (%s); resuming", self.state.kind, err)
        finally:
            self._resp = None
            resp.release_conn()

    def _run(self) -> None:
        backoff = self.source.backoff_initial
        stop = self.source._stop
        while not stop.is_set():
            try:
                if self.state.resource_version is None:
                    self._relist()
                self._watch()
                backoff = self.source.backoff_initial
            except _Gone:
                log.info("kube: %s watch resourceVersion expired (410 Gone); relisting", self.state.kind)
                self.state.resource_version = None
            except Exception as err:  # every failure of the API or the network: keep the last snapshot, retry
                if stop.is_set():
                    return
                if getattr(err, "status", None) == 410:
                    self.state.resource_version = None
                    continue
                self.source._failed(self.state, f"{self.state.kind}: {type(err).__name__}: {err}")
                stop.wait(backoff)
                backoff = min(backoff * 2, self.source.backoff_max)

    def stop(self) -> None:
        resp = self._resp
        if resp is None:
            return
        # Unblock a read in progress: the watch would otherwise sit until the server ends it or the read times out.
        with contextlib.suppress(Exception):
            if hasattr(resp, "shutdown"):  # urllib3 >= 2.3
                resp.shutdown()
            else:
                sock = getattr(getattr(resp, "connection", None), "sock", None)
                if isinstance(sock, socket.socket):
                    sock.shutdown(socket.SHUT_RDWR)


class _TokenBucket:
    def __init__(self, burst: int, per_second: float, clock: Clock) -> None:
        self.capacity = float(burst)
        self.rate = per_second
        self.tokens = float(burst)
        self.clock = clock
        self.at = clock()

    def take(self) -> bool:
        now = self.clock()
        self.tokens = min(self.capacity, self.tokens + (now - self.at) * self.rate)
        self.at = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return True
        return False


@dataclass
class _PostedEvent:
    namespace: str
    name: str
    count: int
    first: float
    last: float


class KubeSource:
    """Kubernetes facts for this node. Off (``KubeFacts(enabled=False)``) where neither in-cluster credentials nor a
    kubeconfig exist; a missing ``NODE_NAME`` falls back to the host name."""

    name = "kube"

    def __init__(
        self,
        interval_seconds: float = 5.0,
        *,
        environ: Mapping[str, str] | None = None,
        kubeconfig: str | None = None,
        node_name: str | None = None,
        clock: Clock = time.time,
        request_timeout: tuple[float, float] = REQUEST_TIMEOUT,
        watch_timeout_seconds: int = WATCH_TIMEOUT_SECONDS,
        backoff_initial: float = BACKOFF_INITIAL,
        backoff_max: float = BACKOFF_MAX,
        event_burst: int = 10,
        events_per_second: float = 1 / 30,
        component: str = "storwatch",
    ) -> None:
        self.interval_seconds = interval_seconds
        self.environ = os.environ if environ is None else environ
        self.clock = clock
        self.request_timeout = request_timeout
        self.watch_timeout_seconds = watch_timeout_seconds
        self.backoff_initial = backoff_initial
        self.backoff_max = backoff_max
        self.component = component
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._watchers: list[_Watcher] = []
        self._version = 0
        self._built: tuple[int, KubeFacts] | None = None
        self._last_error: str | None = None
        self._last_sync: float | None = None
        self._events: dict[tuple[str, str, str, str], _PostedEvent] = {}
        self._bucket = _TokenBucket(event_burst, events_per_second, clock)
        self._started = False
        self.enabled = False
        self.disabled_reason: str | None = None
        self._api_client: Any = None
        self.node_name = node_name or self.environ.get("NODE_NAME") or ""
        self._configure(kubeconfig)

    # --- configuration ---------------------------------------------------------------------------------------------

    def _kubeconfig_path(self, explicit: str | None) -> str | None:
        if explicit:
            return explicit
        env = self.environ.get("KUBECONFIG", "")
        for path in env.split(os.pathsep):
            if path and os.path.exists(path):
                return path
        home = self.environ.get("HOME") or os.path.expanduser("~")
        default = os.path.join(home, ".kube", "config")
        return default if os.path.exists(default) else None

    def _configure(self, explicit: str | None) -> None:
        in_cluster = bool(self.environ.get("KUBERNETES_SERVICE_HOST")) and os.path.exists(SERVICE_ACCOUNT_TOKEN)
        if not explicit and not in_cluster and self._kubeconfig_path(None) is None:
            # Decided before importing the client, which alone costs ~20 MB of memory on a node that has no cluster.
            self._off("no in-cluster service account token and no kubeconfig (KUBECONFIG, ~/.kube/config)")
            return
        try:
            import kubernetes.client
            import kubernetes.config
        except ImportError:
            self._off("the kubernetes client is not installed (pip install kubernetes)")
            return
        # Typed as Any: the client's annotations (generated, changing between releases, models where plain dicts
        # are sent) would tie this module to one client version.
        client: Any = kubernetes.client
        config: Any = kubernetes.config
        configuration = client.Configuration()
        try:
            if self.environ.get("KUBERNETES_SERVICE_HOST") and os.path.exists(SERVICE_ACCOUNT_TOKEN) and not explicit:
                config.load_incluster_config(client_configuration=configuration)
                where = "in-cluster service account"
            else:
                path = self._kubeconfig_path(explicit)
                if path is None:
                    self._off("no in-cluster service account token and no kubeconfig (KUBECONFIG, ~/.kube/config)")
                    return
                config.load_kube_config(config_file=path, client_configuration=configuration)
                where = f"kubeconfig {path}"
        except Exception as err:  # a malformed kubeconfig or token must not stop the agent
            self._off(f"cannot load Kubernetes credentials: {err}")
            return
        # The client's own retries would hide an outage behind minutes of attempts; the watch loops back off instead.
        configuration.retries = False
        self._api_client = client.ApiClient(configuration)
        self.core = client.CoreV1Api(self._api_client)
        self.storage = client.StorageV1Api(self._api_client)
        if not self.node_name:
            self.node_name = socket.gethostname()
            log.warning(
                "kube: NODE_NAME is not set (downward API spec.nodeName); using the host name %r", self.node_name
            )
        self.enabled = True
        log.info("kube: watching the API through the %s as node %s", where, self.node_name)

    def _off(self, reason: str) -> None:
        self.enabled = False
        self.disabled_reason = reason
        log.info("kube: source off: %s", reason)

    # --- watches ---------------------------------------------------------------------------------------------------

    def start(self) -> None:
        """Start the watch threads (``collect()`` does on its first call)."""
        with self._lock:
            if self._started or not self.enabled:
                return
            self._started = True

        def meta_key(obj: Obj) -> str:
            meta = obj.get("metadata") or {}
            return f"{meta.get('namespace', '')}/{meta.get('name', '')}"

        def uid_key(obj: Obj) -> str:
            return str((obj.get("metadata") or {}).get("uid", "")).lower()

        node_selector = f"metadata.name={self.node_name}"
        self._watchers = [
            _Watcher(
                self,
                "pods",
                self.core.list_pod_for_all_namespaces,
                {"field_selector": f"spec.nodeName={self.node_name}"},
                pod_info,
                uid_key,
            ),
            _Watcher(
                self,
                "persistentvolumeclaims",
                self.core.list_persistent_volume_claim_for_all_namespaces,
                {},
                pvc_info,
                meta_key,
            ),
            _Watcher(self, "persistentvolumes", self.core.list_persistent_volume, {}, pv_info, meta_key),
            _Watcher(self, "storageclasses", self.storage.list_storage_class, {}, storage_class_info, meta_key),
            _Watcher(self, "nodes", self.core.list_node, {"field_selector": node_selector}, node_info, meta_key),
        ]
        for w in self._watchers:
            w.thread.start()

    def _changed(self) -> None:
        self._version += 1
        if all(w.state.ok for w in self._watchers):
            self._last_sync = self.clock()

    def _failed(self, state: _WatchState, message: str) -> None:
        with self._lock:
            state.errors += 1
            was_ok = state.ok
            state.ok = False
            self._last_error = message
            self._version += 1
        if was_ok:
            log.warning("kube: API unreachable or failing, keeping the last known objects: %s", message)

    @property
    def off_reason(self) -> str | None:
        """Why the source is off (no cluster credentials, no client), or None while it watches an API server. An
        off source exports no ``storwatch_kube_api_up``: a node without Kubernetes has no API server to be down."""
        return None if self.enabled else (self.disabled_reason or "off")

    @property
    def api_up(self) -> bool:
        with self._lock:
            return bool(self._watchers) and all(w.state.ok for w in self._watchers)

    def watch_stats(self) -> dict[str, tuple[int, int]]:
        """Per watch: (relists, errors)."""
        with self._lock:
            return {w.state.kind: (w.state.relists, w.state.errors) for w in self._watchers}

    def collect(self) -> KubeFacts:
        if not self.enabled:
            return KubeFacts(enabled=False, api_up=False, last_error=self.disabled_reason, timestamp=self.clock())
        self.start()
        now = self.clock()
        with self._lock:
            if self._built is not None and self._built[0] == self._version:
                return _with_time(self._built[1], now)
            by_kind = {w.state.kind: w.state.items for w in self._watchers}
            nodes = list(by_kind["nodes"].values())
            facts = KubeFacts(
                enabled=True,
                api_up=all(w.state.ok for w in self._watchers),
                last_error=self._last_error,
                cluster=ClusterObjects.of(
                    pods=list(by_kind["pods"].values()),
                    pvcs=list(by_kind["persistentvolumeclaims"].values()),
                    pvs=list(by_kind["persistentvolumes"].values()),
                    storage_classes=list(by_kind["storageclasses"].values()),
                ),
                node=nodes[0] if nodes else None,
                timestamp=now,
                last_sync_timestamp=self._last_sync,
            )
            self._built = (self._version, facts)
            return facts

    def close(self) -> None:
        self._stop.set()
        for w in self._watchers:
            w.stop()
        # Threads are daemons; a request still connecting ends within its connect timeout on its own.
        deadline = time.monotonic() + 1.0
        for w in self._watchers:
            w.thread.join(timeout=max(0.0, deadline - time.monotonic()))
        if self._api_client is not None:
            with contextlib.suppress(Exception):  # closing a pool that is already gone
                self._api_client.close()

    # --- events ----------------------------------------------------------------------------------------------------

    def post_event(
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
    ) -> str:
        """Post a core/v1 Event about an object (this Node by default). The same reason about the same object within
        10 minutes patches the first Event's count instead of creating another; a token bucket limits the rate.

        Returns "created", "patched", "rate-limited", "failed" or "disabled". Blocks for at most one request
        (``request_timeout``); call it from the policy worker, not from a scrape.
        """
        if not self.enabled:
            return "disabled"
        name = name or self.node_name
        # Events about cluster-scoped objects (the Node) live in "default", as the kubelet's do.
        event_ns = namespace or "default"
        now = self.clock()
        key = (reason, kind, namespace, name)
        with self._lock:
            for k, posted in list(self._events.items()):
                if now - posted.last > EVENT_DEDUP_SECONDS:
                    del self._events[k]
            previous = self._events.get(key)
            if not self._bucket.take():
                return "rate-limited"
        try:
            if previous is not None:
                body = {"count": previous.count + 1, "lastTimestamp": format_time(now), "message": message}
                self.core.patch_namespaced_event(
                    previous.name,
                    previous.namespace,
                    body,
                    _request_timeout=self.request_timeout,
                    _content_type="application/merge-patch+json",
                )
                with self._lock:
                    previous.count += 1
                    previous.last = now
                return "patched"
            event_name = f"{name}.{uuid.uuid4().hex[:16]}"
            involved: Obj = {"kind": kind, "name": name, "apiVersion": api_version}
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
                "source": {"component": self.component, "host": self.node_name},
                "reportingComponent": self.component,
                "reportingInstance": self.node_name,
            }
            self.core.create_namespaced_event(event_ns, body, _request_timeout=self.request_timeout)
            with self._lock:
                self._events[key] = _PostedEvent(event_ns, event_name, 1, now, now)
            return "created"
        except Exception as err:  # an Event is best effort: the finding is exported either way
            log.warning("kube: posting Event %s about %s %s failed: %s", reason, kind, name, err)
            return "failed"


def _with_time(facts: KubeFacts, now: float) -> KubeFacts:
    if facts.timestamp == now:
        return facts
    return KubeFacts(
        enabled=facts.enabled,
        api_up=facts.api_up,
        last_error=facts.last_error,
        cluster=facts.cluster,
        node=facts.node,
        timestamp=now,
        last_sync_timestamp=facts.last_sync_timestamp,
    )
