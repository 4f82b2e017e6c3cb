"""Kubernetes source: watches this node's pods, PVCs, PVs, StorageClasses and this Node. Read-only: Events are posted
by the action in ``storwatch.kube.events``.

Watch threads keep a snapshot current; ``collect()`` returns it without touching the API, so a slow or absent API
server never delays a tick. The client and its credentials come from ``storwatch.kube.client`` (the only module that
imports ``kubernetes``); the snapshot types live in ``storwatch.sources.kubevolumes`` so every other module reads them
without the client installed.
"""

from __future__ import annotations

import contextlib
import json
import logging
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from storwatch.kube.client import REQUEST_TIMEOUT, KubeClient, error_of, parse_time
from storwatch.pace import Backoff
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
from storwatch.threadname import name_this_thread

log = logging.getLogger(__name__)

Obj = dict[str, Any]
Clock = Callable[[], float]

WATCH_TIMEOUT_SECONDS = 25
"""Server-side watch duration, under the read timeout so a quiet healthy watch ends before the client gives up."""
BACKOFF_INITIAL = 1.0
BACKOFF_MAX = 30.0


class _Gone(Exception):
    """The watch's resourceVersion is too old (HTTP 410 or an ERROR event with code 410): relist."""


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


def _seconds(value: object) -> float | None:
    """A grace period from the API: a whole number of seconds, never negative (``bool`` is no number here)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < 1e9:
        return None
    return float(value)


def pod_info(obj: Obj) -> PodInfo:
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    owner = next((o for o in meta.get("ownerReferences") or [] if o.get("controller")), None)
    grace = meta.get("deletionGracePeriodSeconds")
    termination = spec.get("terminationGracePeriodSeconds")
    name = str(meta.get("name", ""))
    return PodInfo(
        uid=str(meta.get("uid", "")).lower(),
        name=name,
        namespace=str(meta.get("namespace", "")),
        node_name=str(spec.get("nodeName") or ""),
        owner_kind=owner.get("kind") if owner else None,
        owner_name=owner.get("name") if owner else None,
        deletion_timestamp=parse_time(meta.get("deletionTimestamp")),
        grace_seconds=_seconds(grace),
        termination_grace_seconds=_seconds(termination),
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
        path: str,
        query: Mapping[str, str],
        convert: Callable[[Obj], Any],
        key: Callable[[Obj], str],
    ) -> None:
        self.source = source
        self.state = _WatchState(kind, {})
        self.path = path
        self.query = dict(query)
        self.convert = convert
        self.key = key
        self._resp: Any = None
        self.thread = threading.Thread(target=self._run, name=f"storwatch-kube-{kind}", daemon=True)

    def _call(self, **extra: str) -> Any:
        resp = self.source.client.request("GET", self.path, {**self.query, **extra}.items())
        status = resp.status
        if status == 410:
            resp.close()
            raise _Gone()
        if not 200 <= status <= 299:
            raise error_of(resp)
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
        since = {"resourceVersion": self.state.resource_version} if self.state.resource_version else {}
        resp = self._call(
            watch="true", timeoutSeconds=str(self.source.watch_timeout_seconds), allowWatchBookmarks="true", **since
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
        name_this_thread()
        backoff = Backoff(self.source.backoff_initial, self.source.backoff_max)
        stop = self.source._stop
        while not stop.is_set():
            try:
                if self.state.resource_version is None:
                    self._relist()
                self._watch()
                backoff.reset()
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
                stop.wait(backoff.failed())

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


class KubeSource:
    """Kubernetes facts for this node. Off (``KubeFacts(enabled=False)``) where the client has no connection (no
    in-cluster credentials and no kubeconfig, no client installed, credentials that do not load)."""

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
        client: KubeClient | None = None,
    ) -> None:
        """``client``: a connection shared with others (the Events action), closed by whoever made it; without one,
        the source makes its own from ``environ``, ``kubeconfig``, ``node_name`` and ``request_timeout`` (see
        :class:`~storwatch.kube.client.KubeClient`), and closes it."""
        self.interval_seconds = interval_seconds
        self.clock = clock
        self.watch_timeout_seconds = watch_timeout_seconds
        self.backoff_initial = backoff_initial
        self.backoff_max = backoff_max
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._watchers: list[_Watcher] = []
        self._version = 0
        self._built: tuple[int, KubeFacts] | None = None
        self._last_error: str | None = None
        self._last_sync: float | None = None
        self._started = False
        self._owns_client = client is None
        if client is None:
            client = KubeClient(
                environ=environ, kubeconfig=kubeconfig, node_name=node_name, request_timeout=request_timeout
            )
        self.client = client
        """The connection the watches use: hand it to the Events action to share its pool."""
        self.request_timeout = client.request_timeout
        self.node_name = client.node_name
        self.enabled = client.enabled
        self.disabled_reason = client.off_reason
        if client.enabled:
            log.info("kube: watching the API through the %s as node %s", client.where, self.node_name)
        else:
            log.info("kube: source off: %s", self.disabled_reason)

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
                self, "pods", "/api/v1/pods", {"fieldSelector": f"spec.nodeName={self.node_name}"}, pod_info, uid_key
            ),
            _Watcher(self, "persistentvolumeclaims", "/api/v1/persistentvolumeclaims", {}, pvc_info, meta_key),
            _Watcher(self, "persistentvolumes", "/api/v1/persistentvolumes", {}, pv_info, meta_key),
            _Watcher(
                self, "storageclasses", "/apis/storage.k8s.io/v1/storageclasses", {}, storage_class_info, meta_key
            ),
            _Watcher(self, "nodes", "/api/v1/nodes", {"fieldSelector": node_selector}, node_info, meta_key),
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
        if self._owns_client:
            self.client.close()


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
