"""The PodGroup and Queue status writers: read a group object, merge-patch its status.

app/ops/status_reconciler.py decides what to write and when; this is only the
API side, for one source's objects (coordinates from app/core/groups.py).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

import orjson

from app.core.groups import XK8S_API, GroupApi
from app.core.queues import QUEUE_GROUP, QUEUE_PLURAL, QUEUE_VERSION
from app.kube.errors import NotFound
from app.kube.http import Requests


class KubeStatusApi:
    """Status of one source's objects: the status subresource, or the object itself (Volcano).

    Plain requests on the API client: the generated client's per-call
    validation cost more CPU than the request itself.
    """

    def __init__(
        self,
        requests: Requests,
        api: GroupApi = XK8S_API,
        *,
        timeout_seconds: float = 10,
    ) -> None:
        self._requests = requests
        self._api = api
        self._timeout = timeout_seconds

    def _path(self, namespace: str, name: str) -> str:
        api = self._api
        path = (
            f"/apis/{api.group}/{api.version}/namespaces/{quote(namespace, safe='')}"
            f"/{api.plural}/{quote(name, safe='')}"
        )
        return path + "/status" if api.status_subresource else path

    async def read(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The object as JSON, None if it does not exist."""
        try:
            data = await self._requests.request(
                "GET", self._path(namespace, name), timeout_seconds=self._timeout
            )
        except NotFound:
            return None
        obj: dict[str, Any] = orjson.loads(data)
        return obj

    async def patch(self, namespace: str, name: str, body: dict[str, Any]) -> None:
        """JSON merge patch; Conflict (app/kube/errors.py) on 409."""
        await self._requests.request(
            "PATCH",
            self._path(namespace, name),
            body,
            content_type="application/merge-patch+json",
            timeout_seconds=self._timeout,
        )


class QueueStatusApi:
    """Volcano Queues' status subresource (cluster-scoped): merge-patched counts."""

    def __init__(self, requests: Requests, *, timeout_seconds: float = 10) -> None:
        self._requests = requests
        self._timeout = timeout_seconds

    async def patch(self, name: str, status: dict[str, Any]) -> None:
        """Merge-patch `status`; NotFound when the Queue is gone."""
        await self._requests.request(
            "PATCH",
            f"/apis/{QUEUE_GROUP}/{QUEUE_VERSION}/{QUEUE_PLURAL}/{quote(name, safe='')}/status",
            {"status": status},
            content_type="application/merge-patch+json",
            timeout_seconds=self._timeout,
        )
