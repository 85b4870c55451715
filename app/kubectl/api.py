"""The API server, as the plugin sees it: the user's kubeconfig and plain GET requests.

Every request goes through the official client's ApiClient (its kubeconfig
handling: contexts, exec and token auth, client certificates, proxies) and
comes back as decoded JSON, the same dicts the extender's watches hand to
app/core. Failures become PluginError with one line a user can act on.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import urllib3
from kubernetes import config as kube_config
from kubernetes.client import ApiClient
from kubernetes.client.exceptions import ApiException
from kubernetes.config.config_exception import ConfigException


class PluginError(Exception):
    """A failure the plugin reports as one line on stderr and a non-zero exit."""


class ApiError(PluginError):
    """The API server answered with an error status."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True, slots=True)
class Connection:
    """A client for the chosen context, and that context's default namespace."""

    client: Any
    namespace: str
    server: str


def connect(kubeconfig: str | None, context: str | None) -> Connection:
    """Load the kubeconfig as kubectl does: --kubeconfig, else $KUBECONFIG, else ~/.kube/config."""
    try:
        load: Any = kube_config.new_client_from_config
        listing: Any = kube_config.list_kube_config_contexts
        client = load(config_file=kubeconfig, context=context)
        contexts, active = listing(config_file=kubeconfig)
    except (ConfigException, OSError) as err:
        where = kubeconfig or "$KUBECONFIG or ~/.kube/config"
        raise PluginError(f"cannot load a kubeconfig from {where}: {err}") from None
    chosen = active
    if context is not None:
        chosen = next((c for c in contexts or () if c.get("name") == context), active)
    namespace = ((chosen or {}).get("context") or {}).get("namespace") or "default"
    return Connection(client, str(namespace), str(client.configuration.host))


class Api:
    """GET requests against one API server; JSON in, JSON out."""

    def __init__(self, connection: Connection, timeout_seconds: float) -> None:
        self._client: ApiClient = connection.client
        self.server = connection.server
        self.timeout_seconds = timeout_seconds

    def get(self, path: str, query: Mapping[str, str] | None = None) -> Any:
        """The decoded JSON body of GET `path`; ApiError for an error status."""
        body = self.get_bytes(path, query)
        try:
            return json.loads(body)
        except ValueError:
            raise PluginError(f"GET {path}: the answer is not JSON: {body[:80]!r}") from None

    def get_bytes(self, path: str, query: Mapping[str, str] | None = None) -> bytes:
        try:
            method, url, headers, _, _ = self._client.param_serialize(
                "GET",
                path,
                query_params=list((query or {}).items()),
                header_params={"Accept": "application/json"},
                auth_settings=["BearerToken"],
            )
            response = self._client.call_api(
                method, url, header_params=headers, _request_timeout=self.timeout_seconds
            )
            data: bytes = response.data if response.data is not None else response.response.data
        except ApiException as err:
            raise PluginError(f"GET {path}: {err.reason or err}".strip()) from None
        except (urllib3.exceptions.HTTPError, OSError) as err:
            raise PluginError(f"cannot reach the API server at {self.server}: {err}") from None
        if not 200 <= response.status < 300:
            raise ApiError(response.status, _api_message(path, response.status, response, data))
        return data


def _api_message(path: str, status: int, response: Any, body: bytes) -> str:
    """The Status message the API server sent, else the HTTP reason."""
    try:
        detail = str(json.loads(body).get("message") or "")
    except (ValueError, AttributeError):
        detail = body[:200].decode(errors="replace").strip()
    reason = getattr(response, "reason", "") or ""
    return f"GET {path}: {status} {reason}".rstrip() + (f": {detail}" if detail else "")
