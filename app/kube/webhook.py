"""The admission webhook's API calls: its configuration's caBundle and its certificate Secret.

A few times a minute at most, from app/web/webhook.py, which decides what to
write; app/core/certs.py makes the certificates.
"""

from __future__ import annotations

import base64
from typing import Any
from urllib.parse import quote

import orjson

from app.kube.errors import NotFound
from app.kube.http import Requests

_WEBHOOKS = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"


class WebhookApi:
    def __init__(self, requests: Requests, *, timeout_seconds: float = 10) -> None:
        self._requests = requests
        self._timeout = timeout_seconds

    async def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> bytes:
        return await self._requests.request(method, path, body, timeout_seconds=self._timeout)

    async def register_ca(self, configuration: str, ca_pem: str) -> bool:
        """Put `ca_pem` in the caBundle of every webhook of the configuration.

        Returns whether anything was written (False: already there). NotFound
        when the configuration does not exist; Conflict when it changed
        between our read and our write (the caller tries again later).
        """
        path = f"{_WEBHOOKS}/{quote(configuration, safe='')}"
        obj: dict[str, Any] = orjson.loads(await self._call("GET", path))
        bundle = base64.b64encode(ca_pem.encode()).decode()
        changed = False
        for webhook in obj.get("webhooks") or ():
            client_config = webhook.setdefault("clientConfig", {})
            if client_config.get("caBundle") != bundle:
                client_config["caBundle"] = bundle
                changed = True
        if changed:
            # PUT with the resourceVersion we read: a concurrent change is a 409.
            await self._call("PUT", path, obj)
        return changed

    def _secret_path(self, namespace: str, name: str = "") -> str:
        path = f"/api/v1/namespaces/{quote(namespace, safe='')}/secrets"
        return f"{path}/{quote(name, safe='')}" if name else path

    async def read_secret(self, namespace: str, name: str) -> tuple[dict[str, str], str] | None:
        """The Secret's decoded data and resourceVersion; None when it does not exist."""
        try:
            obj = orjson.loads(await self._call("GET", self._secret_path(namespace, name)))
        except NotFound:
            return None
        data = {
            key: base64.b64decode(value).decode(errors="replace")
            for key, value in (obj.get("data") or {}).items()
        }
        return data, str((obj.get("metadata") or {}).get("resourceVersion") or "")

    async def write_secret(
        self, namespace: str, name: str, data: dict[str, str], resource_version: str | None
    ) -> None:
        """Create the Secret (no resource_version) or replace it; Conflict if another was first."""
        body: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "Secret",
            "type": "kubernetes.io/tls",
            "metadata": {
                "name": name,
                "namespace": namespace,
                "labels": {"app.kubernetes.io/managed-by": "gang-extender"},
            },
            "data": {key: base64.b64encode(value.encode()).decode() for key, value in data.items()},
        }
        if resource_version is None:
            await self._call("POST", self._secret_path(namespace), body)
            return
        body["metadata"]["resourceVersion"] = resource_version
        await self._call("PUT", self._secret_path(namespace, name), body)
