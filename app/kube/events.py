"""The Events writer: core/v1 Events, created and patched (app/ops/event_recorder.py calls it)."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from app.kube.http import Requests


class KubeEventWriter:
    """Plain requests on the API client: the generated models cost more CPU than the call."""

    def __init__(self, requests: Requests, *, timeout_seconds: float = 10) -> None:
        self._requests = requests
        self._timeout = timeout_seconds

    async def create(self, namespace: str, body: dict[str, Any]) -> None:
        await self._requests.request(
            "POST", _events_path(namespace), body, timeout_seconds=self._timeout
        )

    async def patch(self, namespace: str, name: str, body: dict[str, Any]) -> None:
        """Merge-patch; NotFound (app/kube/errors.py) once the Event has expired."""
        await self._requests.request(
            "PATCH",
            f"{_events_path(namespace)}/{quote(name, safe='')}",
            body,
            content_type="application/merge-patch+json",
            timeout_seconds=self._timeout,
        )


def _events_path(namespace: str) -> str:
    return f"/api/v1/namespaces/{quote(namespace, safe='')}/events"
