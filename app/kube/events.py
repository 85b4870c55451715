"""The Events writer: core/v1 Events, created and patched (app/ops/event_recorder.py calls it)."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from kubernetes import client as k8s

from app.kube.client import raw_request


class KubeEventWriter:
    """Blocking; plain requests on the official client's connection pool."""

    def __init__(self, core: k8s.CoreV1Api, *, timeout_seconds: float = 10) -> None:
        self._client: k8s.ApiClient = core.api_client
        self._timeout = timeout_seconds

    def create(self, namespace: str, body: dict[str, Any]) -> None:
        raw_request(self._client, "POST", _events_path(namespace), body, timeout=self._timeout)

    def patch(self, namespace: str, name: str, body: dict[str, Any]) -> None:
        """Merge-patch; NotFound (app/kube/errors.py) once the Event has expired."""
        raw_request(
            self._client,
            "PATCH",
            f"{_events_path(namespace)}/{quote(name, safe='')}",
            body,
            content_type="application/merge-patch+json",
            timeout=self._timeout,
        )


def _events_path(namespace: str) -> str:
    return f"/api/v1/namespaces/{quote(namespace, safe='')}/events"
