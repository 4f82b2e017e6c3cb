"""The Kubernetes API client: where the credentials are (in-cluster service account, else a kubeconfig), which node
this agent runs on, and one connection pool for everything that talks to the API server (the kube source's watches,
the Events action).

The only module that imports ``kubernetes``, and only where credentials exist. Everything else sends its requests
through :meth:`KubeClient.request`: the client's ``ApiClient`` (its credentials, TLS, token refresh, connection pool)
without its generated API classes. Those validate every argument with pydantic and import a model module for every
kind the API has: building ``CoreV1Api`` alone added about 20 MB to the agent (254 modules), where the agent sends five
kinds of list or watch and two of Event, and reads the JSON itself.
"""

from __future__ import annotations

import calendar
import contextlib
import logging
import os
import socket
import time
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import quote

from storwatch.printable import shown_data

log = logging.getLogger(__name__)

REQUEST_TIMEOUT = (3.0, 30.0)
"""(connect, read) seconds for every request: a read waits at most this long for the next byte of a watch."""
SERVICE_ACCOUNT_TOKEN = "/var/run/secrets/kubernetes.io/serviceaccount/token"
NO_CREDENTIALS = "no in-cluster service account token and no kubeconfig (KUBECONFIG, ~/.kube/config)"


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
    """A UNIX time as the API writes timestamps (RFC 3339, UTC, whole seconds)."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))


def path_part(value: str) -> str:
    """One segment of a request path (a namespace, a name), escaped so that it stays one segment."""
    return quote(value, safe="")


class ApiError(OSError):
    """The API server answered outside 2xx; ``status`` is its HTTP status (404, 410, ...)."""

    def __init__(self, status: int, body: bytes) -> None:
        super().__init__(f"HTTP {status}: {body[:200].decode(errors='replace')}")
        self.status = status


ERROR_BODY_BYTES = 4096
"""The most of an error answer's body read (for its message); the connection is then closed, not reused."""


def error_of(resp: Any) -> ApiError:
    """An answer outside 2xx as an ApiError: the start of its body read, the response closed."""
    try:
        body: bytes = resp.read(ERROR_BODY_BYTES)
    except Exception:  # a connection that broke while reading the error: the status says enough
        body = b""
    finally:
        resp.close()
    return ApiError(resp.status, body)


class KubeClient:
    """A connection to the API server, or the reason there is none (``off_reason``): no credentials, no client
    installed, credentials that do not load. Never raises for any of these. A missing ``NODE_NAME`` falls back to the
    host name."""

    def __init__(
        self,
        *,
        environ: Mapping[str, str] | None = None,
        kubeconfig: str | None = None,
        node_name: str | None = None,
        request_timeout: tuple[float, float] = REQUEST_TIMEOUT,
    ) -> None:
        """``kubeconfig``: a file to use even where in-cluster credentials exist (else KUBECONFIG, then
        ~/.kube/config, each only when no service account token is mounted)."""
        self.environ = os.environ if environ is None else environ
        self.request_timeout = request_timeout
        """(connect, read) seconds; every caller passes it with each request."""
        self.node_name = node_name or self.environ.get("NODE_NAME") or ""
        self.off_reason: str | None = None
        self.where: str | None = None
        """Where the credentials came from (for the log): "in-cluster service account" or "kubeconfig PATH"."""
        self._api_client: Any = None
        self._connect(kubeconfig)

    @property
    def enabled(self) -> bool:
        return self.off_reason is None

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

    def _connect(self, explicit: str | None) -> None:
        in_cluster = bool(self.environ.get("KUBERNETES_SERVICE_HOST")) and os.path.exists(SERVICE_ACCOUNT_TOKEN)
        if not explicit and not in_cluster and self._kubeconfig_path(None) is None:
            # Decided before importing the client, which alone costs ~20 MB of memory on a node that has no cluster.
            self.off_reason = NO_CREDENTIALS
            return
        try:
            import kubernetes.client
            import kubernetes.config
        except ImportError:
            self.off_reason = "the kubernetes client is not installed (pip install kubernetes)"
            return
        client: Any = kubernetes.client
        config: Any = kubernetes.config
        configuration = client.Configuration()
        try:
            if in_cluster and not explicit:
                config.load_incluster_config(client_configuration=configuration)
                self.where = "in-cluster service account"
            else:
                path = self._kubeconfig_path(explicit)
                if path is None:
                    self.off_reason = NO_CREDENTIALS
                    return
                config.load_kube_config(config_file=path, client_configuration=configuration)
                self.where = f"kubeconfig {path}"
        except Exception as err:  # a malformed kubeconfig or token must not stop the agent
            self.off_reason = f"cannot load Kubernetes credentials: {err}"
            return
        # The client's own retries would hide an outage behind minutes of attempts; callers back off instead.
        configuration.retries = False
        self._api_client = client.ApiClient(configuration)
        if not self.node_name:
            self.node_name = socket.gethostname()
            log.warning(
                "kube: NODE_NAME is not set (downward API spec.nodeName); using the host name %r", self.node_name
            )

    def request(
        self,
        method: str,
        path: str,
        query: Iterable[tuple[str, str]] = (),
        body: Mapping[str, Any] | None = None,
        content_type: str | None = None,
    ) -> Any:
        """Send one request (``path`` as the API names it, its segments from data escaped with :func:`path_part`);
        the response (urllib3's) with its body not yet read, whatever its status: the caller reads or streams it,
        then closes it. Raises OSError when the server cannot be reached, RuntimeError when the client is off."""
        if self._api_client is None:
            raise RuntimeError(f"the Kubernetes client is off: {self.off_reason}")
        headers = {"Accept": "application/json"}
        if content_type is not None:
            headers["Content-Type"] = content_type
        args = self._api_client.param_serialize(
            method=method,
            resource_path=path,
            query_params=list(query),
            header_params=headers,
            body=dict(body) if body is not None else None,
            auth_settings=["BearerToken"],
        )
        return self._api_client.call_api(*args, _request_timeout=self.request_timeout).response

    def send(self, method: str, path: str, body: Mapping[str, Any], content_type: str = "application/json") -> bytes:
        """A request whose answer is read whole: its body, or ApiError for a status outside 2xx. Names from disk in
        ``body`` go as :func:`printable.shown` text (a byte that is not UTF-8 as ``\\xNN``)."""
        resp = self.request(method, path, body=shown_data(body), content_type=content_type)
        if not 200 <= resp.status <= 299:
            raise error_of(resp)
        try:
            data: bytes = resp.data
        finally:
            resp.release_conn()
        return data

    def close(self) -> None:
        """Close the connection pool (whoever made the client closes it, once every user is done)."""
        if self._api_client is not None:
            with contextlib.suppress(Exception):  # closing a pool that is already gone
                self._api_client.close()


__all__ = [
    "NO_CREDENTIALS",
    "REQUEST_TIMEOUT",
    "SERVICE_ACCOUNT_TOKEN",
    "ApiError",
    "KubeClient",
    "error_of",
    "format_time",
    "parse_time",
    "path_part",
]
