"""A small Kubernetes API client over urllib (stdlib-only), plus plain HTTP probes."""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

from .layout import Config
from .report import ClusterError

_NO_PROXY_HANDLER = urllib.request.ProxyHandler({})  # loopback must never go via $HTTPS_PROXY


def insecure_context() -> ssl.SSLContext:
    """For /healthz of controller-manager and scheduler, whose serving certs
    are self-signed at startup; fine for a loopback liveness probe."""
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx


def http_get(
    url: str, context: ssl.SSLContext | None = None, timeout: float = 3.0
) -> tuple[int, str]:
    handlers: list[urllib.request.BaseHandler] = [_NO_PROXY_HANDLER]
    if context is not None:
        handlers.append(urllib.request.HTTPSHandler(context=context))
    opener = urllib.request.build_opener(*handlers)
    try:
        with opener.open(url, timeout=timeout) as resp:
            return resp.status, resp.read().decode("utf-8", errors="replace")
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode("utf-8", errors="replace")


def message(body: Any) -> str:
    """The human part of an API error body, for error lines."""
    if isinstance(body, dict):
        return str(body.get("message", body))
    return str(body)[:500]


class Api:
    """Minimal Kubernetes API client authenticated with the admin client cert."""

    def __init__(self, config: Config) -> None:
        layout = config.layout
        ctx = ssl.create_default_context(cafile=str(layout.cert("ca.crt")))
        ctx.load_cert_chain(str(layout.cert("admin.crt")), str(layout.cert("admin.key")))
        self._url = config.ports.apiserver_url
        self._opener = urllib.request.build_opener(
            _NO_PROXY_HANDLER, urllib.request.HTTPSHandler(context=ctx)
        )

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        content_type: str = "application/json",
        timeout: float = 10.0,
    ) -> tuple[int, Any]:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self._url + path, data=data, method=method)
        req.add_header("Accept", "application/json")
        if data is not None:
            req.add_header("Content-Type", content_type)
        try:
            with self._opener.open(req, timeout=timeout) as resp:
                status, raw = resp.status, resp.read()
        except urllib.error.HTTPError as err:
            status, raw = err.code, err.read()
        try:
            return status, json.loads(raw) if raw else None
        except ValueError:
            return status, raw.decode("utf-8", errors="replace")

    def readyz(self, timeout: float = 3.0) -> bool:
        try:
            status, _ = self.request("GET", "/readyz", timeout=timeout)
        except (OSError, ssl.SSLError):
            return False
        return status == 200

    def stream(self, path: str, timeout: float) -> Iterator[dict[str, Any]]:
        """GET a watch and yield its events (one JSON object per line) as they arrive.

        `timeout` bounds each socket read, so it must exceed the watch's
        timeoutSeconds (bookmarks arrive about once a minute in between).
        """
        req = urllib.request.Request(self._url + path, method="GET")
        req.add_header("Accept", "application/json")
        try:
            resp = self._opener.open(req, timeout=timeout)
        except urllib.error.HTTPError as err:
            raise ClusterError(f"GET {path}: HTTP {err.code}: {err.read()[:300]!r}") from None
        with resp:
            for line in resp:
                if line.strip():
                    yield json.loads(line)
