"""A local Kubernetes API server for tests: list and watch of pods, nodes, PVCs, PVs and StorageClasses, and Events.

It speaks enough of the JSON API for the official Python client: lists with ``fieldSelector``, ``?watch=true`` streams
of newline-delimited JSON events that resume from a resourceVersion, and POST/PATCH of core/v1 Events. Tests drive it:
add, modify and delete objects (each pushes a watch event), drop every watch, answer the next watch with 410 Gone,
go away for a while (listener closed, connections refused), read back the Events the client created or patched, delete
an Event, and refuse Event writes with an HTTP status.
"""

from __future__ import annotations

import copy
import json
import re
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

Obj = dict[str, Any]

# URL path -> kind. Namespaced list paths (/api/v1/namespaces/NS/pods) are served too.
COLLECTIONS = {
    "/api/v1/pods": "Pod",
    "/api/v1/nodes": "Node",
    "/api/v1/persistentvolumeclaims": "PersistentVolumeClaim",
    "/api/v1/persistentvolumes": "PersistentVolume",
    "/apis/storage.k8s.io/v1/storageclasses": "StorageClass",
}
API_VERSION = {
    "Pod": "v1",
    "Node": "v1",
    "PersistentVolumeClaim": "v1",
    "PersistentVolume": "v1",
    "StorageClass": "storage.k8s.io/v1",
    "Event": "v1",
}
_NODE_GET = re.compile(r"^/api/v1/nodes/(?P<name>[^/]+)$")
_EVENTS = re.compile(r"^/api/v1/namespaces/(?P<ns>[^/]+)/events(?:/(?P<name>[^/]+))?$")
_NS_LIST = re.compile(r"^/api/v1/namespaces/(?P<ns>[^/]+)/(?P<res>pods|persistentvolumeclaims)$")


def _key(obj: Obj) -> tuple[str, str]:
    meta = obj.get("metadata", {})
    return meta.get("namespace", ""), meta["name"]


def _field(obj: Obj, path: str) -> str:
    cur: Any = obj
    for part in path.split("."):
        cur = cur.get(part) if isinstance(cur, dict) else None
    return "" if cur is None else str(cur)


def _selected(obj: Obj, selector: str | None) -> bool:
    if not selector:
        return True
    for term in selector.split(","):
        name, _, want = term.partition("=")
        if _field(obj, name.strip().rstrip("=")) != want.lstrip("="):
            return False
    return True


@dataclass
class _Watcher:
    kind: str
    selector: str | None
    conn: socket.socket
    events: list[Obj] = field(default_factory=list)
    cond: threading.Condition = field(default_factory=threading.Condition)
    closed: bool = False

    def push(self, event: Obj) -> None:
        with self.cond:
            self.events.append(event)
            self.cond.notify_all()

    def end(self) -> None:
        """End the stream cleanly, as the API server does when a watch times out."""
        with self.cond:
            self.closed = True
            self.cond.notify_all()

    def abort(self) -> None:
        """Cut the connection, as a crashing server or a network failure does."""
        self.end()
        with suppress(OSError):
            self.conn.shutdown(socket.SHUT_RDWR)


@dataclass
class RecordedEvent:
    verb: str
    """"create" or "patch"."""
    namespace: str
    name: str
    body: Obj


class FakeKubeAPI:
    """The server. ``start()`` binds 127.0.0.1 on a free port (kept across ``go_away``)."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.objects: dict[str, dict[tuple[str, str], Obj]] = {k: {} for k in COLLECTIONS.values()}
        self.history: list[tuple[int, str, str, Obj]] = []
        """(resourceVersion, kind, event type, object) of every change, for watches that resume."""
        self.rv = 1000
        self.compacted_rv = 0
        """Watches from below this resourceVersion are answered 410 Gone, as after etcd compaction."""
        self.watchers: list[_Watcher] = []
        self.gone_next: dict[str, int] = {}
        """Per kind, how many of its next watch requests are answered 410 Gone."""
        self.events: dict[tuple[str, str], Obj] = {}
        self.recorded: list[RecordedEvent] = []
        self.events_status: int | None = None
        self.refusal_message = ""
        """Added to the message of every refused Event write (a large one: a server's long error answer)."""
        self.refusals_read_whole: list[bool] = []
        """Per refused Event write: whether the client took the whole answer (False: it closed the connection
        first)."""
        """Answer every Event create and patch with this HTTP status instead (403: the agent's RBAC has no events)."""
        self.requests: list[tuple[str, str]] = []
        """(method, path with query) of every request, for assertions."""
        self.port = 0
        self.serving = False
        """False once stopped: a request the listener took before it closed is not answered (a server gone away
        answers nothing), and its watch not opened."""
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._up_timer: threading.Timer | None = None

    # --- lifecycle -------------------------------------------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> FakeKubeAPI:
        api = self

        class Handler(_Handler):
            server_api = api

        server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        server.daemon_threads = True
        self.port = server.server_address[1]
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, name="fake-kube-api", daemon=True)
        with self.lock:
            self.serving = True
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._up_timer is not None:
            self._up_timer.cancel()
        with self.lock:
            self.serving = False
        server = self._server
        self._server = None
        if server is not None:
            server.shutdown()
            server.server_close()
        with self.lock:
            watchers, self.watchers = self.watchers, []
        for w in watchers:
            w.abort()

    def go_away(self, seconds: float) -> None:
        """Close the listener and every connection; refuse connections for ``seconds``, then listen again."""
        self.stop()
        self._up_timer = threading.Timer(seconds, self.start)
        self._up_timer.daemon = True
        self._up_timer.start()

    def come_back(self) -> None:
        """Listen again now (after ``go_away``)."""
        if self._up_timer is not None:
            self._up_timer.cancel()
        self.start()

    @property
    def up(self) -> bool:
        return self._server is not None

    # --- controls --------------------------------------------------------------------------------------------------

    def _next_rv(self) -> str:
        self.rv += 1
        return str(self.rv)

    def _notify(self, kind: str, etype: str, obj: Obj) -> None:
        self.history.append((self.rv, kind, etype, copy.deepcopy(obj)))
        for w in list(self.watchers):
            if w.kind == kind and _selected(obj, w.selector):
                w.push({"type": etype, "object": copy.deepcopy(obj)})

    def add(self, obj: Obj) -> Obj:
        """Create or replace an object (ADDED or MODIFIED to watchers)."""
        kind = obj["kind"]
        with self.lock:
            obj = copy.deepcopy(obj)
            obj.setdefault("apiVersion", API_VERSION[kind])
            meta = obj.setdefault("metadata", {})
            meta.setdefault("uid", f"{kind.lower()}-{meta['name']}")
            meta["resourceVersion"] = self._next_rv()
            store = self.objects[kind]
            etype = "MODIFIED" if _key(obj) in store else "ADDED"
            store[_key(obj)] = obj
            self._notify(kind, etype, obj)
            return copy.deepcopy(obj)

    def get(self, kind: str, name: str, namespace: str = "") -> Obj:
        with self.lock:
            return copy.deepcopy(self.objects[kind][(namespace, name)])

    def modify(self, kind: str, name: str, namespace: str = "", **changes: Any) -> Obj:
        """Merge ``changes`` (top-level keys such as spec or metadata, merged one level deep) into an object."""
        with self.lock:
            obj = self.get(kind, name, namespace)
            for key, value in changes.items():
                if isinstance(value, dict) and isinstance(obj.get(key), dict):
                    obj[key].update(value)
                else:
                    obj[key] = value
            return self.add(obj)

    def cordon(self, node: str, taint: str = "node.kubernetes.io/unschedulable") -> Obj:
        """What ``kubectl drain`` does to the Node first: unschedulable, with ``taint`` (NoSchedule)."""
        return self.modify(
            "Node", node, spec={"unschedulable": True, "taints": [{"key": taint, "effect": "NoSchedule"}]}
        )

    def delete(self, kind: str, name: str, namespace: str = "") -> None:
        with self.lock:
            obj = self.objects[kind].pop((namespace, name))
            obj["metadata"]["resourceVersion"] = self._next_rv()
            self._notify(kind, "DELETED", obj)

    def drop_watches(self) -> None:
        """End every open watch stream (cleanly: the client must resume from its resourceVersion)."""
        with self.lock:
            watchers, self.watchers = self.watchers, []
        for w in watchers:
            w.end()

    def delete_event(self, namespace: str, name: str) -> None:
        """Delete an Event, as ``kubectl delete event`` or the API server's event TTL (an hour by default) does."""
        with self.lock:
            del self.events[(namespace, name)]

    def gone_on_next_watch(self, count: int = 1, kinds: tuple[str, ...] = tuple(COLLECTIONS.values())) -> None:
        """Answer the next ``count`` watch requests of each of ``kinds`` with an ERROR event of code 410, as after
        compaction. Per kind: a kind that relists and watches again quickly must not use up another kind's 410."""
        with self.lock:
            for kind in kinds:
                self.gone_next[kind] = self.gone_next.get(kind, 0) + count

    def compact(self) -> None:
        """Forget history: every watch resuming from an older resourceVersion gets 410 Gone."""
        with self.lock:
            self.compacted_rv = self.rv
            self.history.clear()

    def count_requests(self, path: str, watch: bool | None = None) -> int:
        with self.lock:
            n = 0
            for _, url in self.requests:
                parts = urlsplit(url)
                if parts.path != path:
                    continue
                is_watch = parse_qs(parts.query).get("watch", [""])[0] in ("true", "1")
                if watch is None or watch == is_watch:
                    n += 1
            return n

    def kubeconfig(self, directory: Path) -> Path:
        return write_kubeconfig(directory / "kubeconfig", self.url)


class _Handler(BaseHTTPRequestHandler):
    server_api: FakeKubeAPI
    # HTTP/1.1 for chunked watch streams; every response closes its connection, so going away leaves no idle
    # keep-alive connection behind that would still be served.
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _send(self, code: int, body: Obj) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True
        self.wfile.write(data)

    def _refuse(self, code: int, message: str) -> None:
        api = self.server_api
        try:
            self._send(code, self._status(code, "Refused", message))
            whole = True
        except OSError:  # the client closed the connection before taking it all
            whole = False
        with api.lock:
            api.refusals_read_whole.append(whole)

    def _status(self, code: int, reason: str, message: str) -> Obj:
        return {
            "kind": "Status",
            "apiVersion": "v1",
            "status": "Failure",
            "reason": reason,
            "message": message,
            "code": code,
            "metadata": {},
        }

    def _body(self) -> Obj:
        length = int(self.headers.get("Content-Length") or 0)
        data: Obj = json.loads(self.rfile.read(length) or b"{}")
        return data

    def _gone_away(self) -> bool:
        """The server was stopped after this request's connection was taken: close it unanswered."""
        if self.server_api.serving:
            return False
        self.close_connection = True
        return True

    def do_GET(self) -> None:
        api = self.server_api
        parts = urlsplit(self.path)
        query = {k: v[0] for k, v in parse_qs(parts.query).items()}
        with api.lock:
            api.requests.append(("GET", self.path))
        if self._gone_away():
            return
        path = parts.path
        namespace: str | None = None
        m = _NS_LIST.match(path)
        if m:
            namespace, path = m.group("ns"), "/api/v1/" + m.group("res")
        kind = COLLECTIONS.get(path)
        if kind is None:
            m = _NODE_GET.match(path)
            if m:
                with api.lock:
                    obj = api.objects["Node"].get(("", m.group("name")))
                if obj is None:
                    self._send(404, self._status(404, "NotFound", f'nodes "{m.group("name")}" not found'))
                else:
                    self._send(200, obj)
                return
            self._send(404, self._status(404, "NotFound", f"no such path {path}"))
            return
        selector = query.get("fieldSelector")
        if namespace is not None:
            selector = f"metadata.namespace={namespace}" + (f",{selector}" if selector else "")
        if query.get("watch") in ("true", "1"):
            self._watch(kind, selector, query)
            return
        with api.lock:
            items = [copy.deepcopy(o) for o in api.objects[kind].values() if _selected(o, selector)]
            rv = str(api.rv)
        self._send(
            200,
            {
                "kind": f"{kind}List",
                "apiVersion": API_VERSION[kind],
                "metadata": {"resourceVersion": rv},
                "items": items,
            },
        )

    def _watch(self, kind: str, selector: str | None, query: dict[str, str]) -> None:
        api = self.server_api
        timeout = float(query.get("timeoutSeconds") or 300)
        since = int(query.get("resourceVersion") or 0)
        watcher = _Watcher(kind, selector, self.connection)
        with api.lock:
            # Checked as the watch is added: a stop after this aborts it, one before it means no watch is opened.
            if self._gone_away():
                return
            gone = api.gone_next.get(kind, 0) > 0 or (since and since < api.compacted_rv)
            if api.gone_next.get(kind, 0) > 0:
                api.gone_next[kind] -= 1
            if not gone:
                for rv, k, etype, obj in api.history:
                    if rv > since and k == kind and _selected(obj, selector):
                        watcher.events.append({"type": etype, "object": copy.deepcopy(obj)})
                api.watchers.append(watcher)
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True
        try:
            if gone:
                status = self._status(410, "Expired", f"too old resource version: {since} ({api.compacted_rv})")
                self._chunk({"type": "ERROR", "object": status})
                return
            deadline = time.monotonic() + timeout
            while True:
                with watcher.cond:
                    while not watcher.events and not watcher.closed:
                        left = deadline - time.monotonic()
                        if left <= 0:
                            break
                        watcher.cond.wait(min(left, 0.5))
                    pending, watcher.events = watcher.events, []
                    closed = watcher.closed
                for event in pending:
                    self._chunk(event)
                if closed or time.monotonic() >= deadline:
                    break
        except OSError:
            return
        finally:
            with api.lock:
                if watcher in api.watchers:
                    api.watchers.remove(watcher)
        with suppress(OSError):
            self.wfile.write(b"0\r\n\r\n")

    def _chunk(self, event: Obj) -> None:
        data = json.dumps(event).encode() + b"\n"
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")

    def do_POST(self) -> None:
        api = self.server_api
        with api.lock:
            api.requests.append(("POST", self.path))
            refused = api.events_status
        if self._gone_away():
            return
        if refused is not None:
            self._body()
            self._refuse(refused, "POST refused by the test" + api.refusal_message)
            return
        m = _EVENTS.match(urlsplit(self.path).path)
        if not m or m.group("name"):
            self._send(404, self._status(404, "NotFound", self.path))
            return
        body = self._body()
        ns, name = m.group("ns"), body.get("metadata", {}).get("name", "")
        with api.lock:
            if (ns, name) in api.events:
                self._send(409, self._status(409, "AlreadyExists", f'events "{name}" already exists'))
                return
            body.setdefault("metadata", {})["resourceVersion"] = api._next_rv()
            body["metadata"]["namespace"] = ns
            api.events[(ns, name)] = body
            api.recorded.append(RecordedEvent("create", ns, name, copy.deepcopy(body)))
        self._send(201, body)

    def do_PATCH(self) -> None:
        api = self.server_api
        with api.lock:
            api.requests.append(("PATCH", self.path))
            refused = api.events_status
        if self._gone_away():
            return
        if refused is not None:
            self._body()
            self._refuse(refused, "PATCH refused by the test" + api.refusal_message)
            return
        m = _EVENTS.match(urlsplit(self.path).path)
        if not m or not m.group("name"):
            self._send(404, self._status(404, "NotFound", self.path))
            return
        body = self._body()
        ns, name = m.group("ns"), m.group("name")
        with api.lock:
            current = api.events.get((ns, name))
            if current is None:
                self._send(404, self._status(404, "NotFound", f'events "{name}" not found'))
                return
            current.update({k: v for k, v in body.items() if k != "metadata"})
            current["metadata"]["resourceVersion"] = api._next_rv()
            api.recorded.append(RecordedEvent("patch", ns, name, copy.deepcopy(body)))
            out = copy.deepcopy(current)
        self._send(200, out)


def write_kubeconfig(path: Path, server: str, namespace: str = "default") -> Path:
    """A kubeconfig that points the official client at ``server`` with no credentials."""
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "fake", "cluster": {"server": server}}],
        "users": [{"name": "fake", "user": {"token": "fake-token"}}],
        "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake", "namespace": namespace}}],
        "current-context": "fake",
    }
    path.write_text(json.dumps(config))
    return path


@contextmanager
def fake_kube_api() -> Iterator[FakeKubeAPI]:
    api = FakeKubeAPI().start()
    try:
        yield api
    finally:
        api.stop()


# --- fixture objects: node "gpu-node-1" and the pods whose volumes tests/fixtures/k8s-node/proc/1/mountinfo mounts ---

NODE = "gpu-node-1"
TRAINER_UID = "5a1e7c3b-2f4d-4e8a-9b6c-0d1e2f3a4b5c"
LOADER_UID = "9b2d4f6a-8c1e-4a3b-b5d7-e9f1a3c5d7e9"
AGENT_UID = "c0ffee00-1111-4222-8333-444455556666"
PV_NFS = "pvc-0a6f2e1d-3c4b-4a59-8e7f-112233445566"
PV_LOCAL = "pvc-1b7e3f2a-4d5c-4b6a-9f8e-223344556677"
PV_EPHEMERAL = "pvc-2c8f4a3b-5e6d-4c7b-8a9f-334455667788"


def k8s_node_objects() -> list[Obj]:
    """A GPU node, a trainer pod with one volume of each kind (hostPaths onto a local disk, Lustre and NFS among
    them), a second pod, this agent's pod, and the storage objects behind them."""
    trainer = {
        "kind": "Pod",
        "metadata": {
            "name": "trainer-0",
            "namespace": "train",
            "uid": TRAINER_UID,
            "ownerReferences": [
                {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "trainer", "uid": "sts-1", "controller": True}
            ],
        },
        "spec": {
            "nodeName": NODE,
            "volumes": [
                {"name": "scratch", "emptyDir": {}},
                {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "256Gi"}},
                {"name": "nvme", "hostPath": {"path": "/mnt/local-nvme", "type": "Directory"}},
                {"name": "fsx", "hostPath": {"path": "/fsx", "type": "Directory"}},
                {"name": "datasets", "hostPath": {"path": "/shared/"}},
                {"name": "shared", "persistentVolumeClaim": {"claimName": "ckpt-shared"}},
                {"name": "local", "persistentVolumeClaim": {"claimName": "ckpt-local"}},
                {
                    "name": "cache",
                    "ephemeral": {
                        "volumeClaimTemplate": {
                            "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "ebs-gp3"}
                        }
                    },
                },
                {"name": "kube-api-access-x2k9p", "projected": {"sources": []}},
            ],
        },
        "status": {"phase": "Running"},
    }
    loader = {
        "kind": "Pod",
        "metadata": {
            "name": "loader-7d9f",
            "namespace": "data",
            "uid": LOADER_UID,
            "ownerReferences": [{"kind": "ReplicaSet", "name": "loader-7d9f", "uid": "rs-1", "controller": True}],
        },
        "spec": {"nodeName": NODE, "volumes": [{"name": "kube-api-access-7hq2m", "projected": {"sources": []}}]},
        "status": {"phase": "Running"},
    }
    # This agent's own pod, as daemonset/base/daemonset.yaml runs it: the host's /, /proc and /sys as hostPaths.
    agent = {
        "kind": "Pod",
        "metadata": {
            "name": "storwatch-x7k2p",
            "namespace": "storwatch",
            "uid": AGENT_UID,
            "ownerReferences": [{"kind": "DaemonSet", "name": "storwatch", "uid": "ds-1", "controller": True}],
        },
        "spec": {
            "nodeName": NODE,
            "volumes": [
                {"name": "proc", "hostPath": {"path": "/proc"}},
                {"name": "sys", "hostPath": {"path": "/sys"}},
                {"name": "root", "hostPath": {"path": "/"}},
            ],
        },
        "status": {"phase": "Running"},
    }
    elsewhere = {
        "kind": "Pod",
        "metadata": {"name": "other", "namespace": "train", "uid": "00000000-0000-4000-8000-0000000000ff"},
        "spec": {"nodeName": "gpu-node-2", "volumes": []},
    }
    return [
        {"kind": "Node", "metadata": {"name": NODE}, "spec": {}},
        {"kind": "Node", "metadata": {"name": "gpu-node-2"}, "spec": {}},
        trainer,
        loader,
        agent,
        elsewhere,
        {"kind": "StorageClass", "metadata": {"name": "nfs"}, "provisioner": "nfs.csi.k8s.io"},
        {"kind": "StorageClass", "metadata": {"name": "local-path"}, "provisioner": "rancher.io/local-path"},
        {"kind": "StorageClass", "metadata": {"name": "ebs-gp3"}, "provisioner": "ebs.csi.aws.com"},
        _pvc("train", "ckpt-shared", PV_NFS, "nfs"),
        _pvc("train", "ckpt-local", PV_LOCAL, "local-path"),
        _pvc("train", "trainer-0-cache", PV_EPHEMERAL, "ebs-gp3"),
        {
            "kind": "PersistentVolume",
            "metadata": {"name": PV_NFS},
            "spec": {
                "storageClassName": "nfs",
                "csi": {"driver": "nfs.csi.k8s.io", "volumeHandle": "10.0.0.5#exports#" + PV_NFS},
                "claimRef": {"namespace": "train", "name": "ckpt-shared"},
            },
        },
        {
            "kind": "PersistentVolume",
            "metadata": {"name": PV_LOCAL},
            "spec": {
                "storageClassName": "local-path",
                "local": {"path": f"/opt/local-path-provisioner/{PV_LOCAL}_train_ckpt-local"},
                "claimRef": {"namespace": "train", "name": "ckpt-local"},
            },
        },
        {
            "kind": "PersistentVolume",
            "metadata": {"name": PV_EPHEMERAL},
            "spec": {
                "storageClassName": "ebs-gp3",
                "csi": {"driver": "ebs.csi.aws.com", "volumeHandle": "vol-0123456789abcdef0"},
                "claimRef": {"namespace": "train", "name": "trainer-0-cache"},
            },
        },
    ]


def _pvc(namespace: str, name: str, volume: str, storage_class: str) -> Obj:
    return {
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"volumeName": volume, "storageClassName": storage_class, "accessModes": ["ReadWriteOnce"]},
        "status": {"phase": "Bound"},
    }
