"""The extender leader's live state (/debug/gangs) through the API server's service proxy.

Reservations in the permit gate, the denied cache, claims, the line and
preemption plans exist only in the extender's memory. The chart's ops
Service (label `app.kubernetes.io/component: gang-extender-ops`) serves
/debug/gangs; the API server proxies to it (`get` on `services/proxy`, the
chart's `<release>-kubectl-gang` ClusterRole). The service proxy picks a
ready endpoint at random, so with several replicas the answer may come from a
standby (`"leader": false`): it is asked again a few times and, if no leader
answers, the standby's view is shown with a note. Unreachable: the reason,
and the rest of the output comes from the objects alone.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import quote

from app.kubectl.api import ApiError, PluginError

OPS_SELECTOR = "app.kubernetes.io/component=gang-extender-ops"
DEBUG_PATH = "/debug/gangs"
# Tries through the service proxy to land on the leader (random endpoint each time).
LEADER_TRIES = 6


class Getter(Protocol):
    """What reading the live state needs of app/kubectl/api.py's Api: GET, and its timeout."""

    timeout_seconds: float

    def get(self, path: str, query: Mapping[str, str] | None = None) -> Any: ...


@dataclass(frozen=True, slots=True)
class Live:
    """The snapshot (None when unreachable), where it came from, and what to tell the user."""

    doc: dict[str, Any] | None
    via: str
    problem: str = ""

    @property
    def reachable(self) -> bool:
        return self.doc is not None

    def gate(self, key: str) -> list[dict[str, Any]]:
        gate = (self.doc or {}).get("gate") or {}
        return [w for w in gate.get(key) or () if isinstance(w, dict)]

    def group(self, key: str) -> dict[str, Any] | None:
        return next((g for g in self._list("groups") if g.get("key") == key), None)

    def denial(self, key: str) -> dict[str, Any] | None:
        return next((d for d in self._list("denied") if d.get("group") == key), None)

    def plans(self, key: str) -> list[dict[str, Any]]:
        return [p for p in self._list("preemptionPlans") if p.get("group") == key]

    def claim(self, key: str) -> dict[str, Any] | None:
        claims = ((self.doc or {}).get("contention") or {}).get("claims") or ()
        return next((c for c in claims if isinstance(c, dict) and c.get("group") == key), None)

    def queues(self) -> list[dict[str, Any]]:
        queues = ((self.doc or {}).get("contention") or {}).get("queues") or ()
        return [q for q in queues if isinstance(q, dict)]

    def _list(self, name: str) -> list[dict[str, Any]]:
        return [x for x in (self.doc or {}).get(name) or () if isinstance(x, dict)]


@dataclass(frozen=True, slots=True)
class Endpoint:
    """How to reach the extender: a Service through the API server, or a direct URL."""

    namespace: str
    service: str | None = None
    url: str | None = None


def read_live(api: Getter, where: Endpoint) -> Live:
    """The snapshot, or why there is none; never raises for an unreachable extender."""
    if where.url:
        return _direct(where.url, api)
    try:
        name, port = _find_service(api, where)
    except ApiError as err:
        return Live(None, f"namespace {where.namespace}", f"cannot look up the service: {err}")
    except PluginError as err:
        return Live(None, f"namespace {where.namespace}", str(err))
    via = f"service {where.namespace}/{name}:{port}"
    path = (
        f"/api/v1/namespaces/{quote(where.namespace, safe='')}/services/"
        f"{quote(name, safe='')}:{port}/proxy{DEBUG_PATH}"
    )
    doc: dict[str, Any] | None = None
    for _ in range(LEADER_TRIES):
        try:
            answer = api.get(path)
        except PluginError as err:
            return Live(None, via, f"the extender did not answer through the API server: {err}")
        doc = answer if isinstance(answer, dict) else None
        if doc is None or doc.get("leader", True):
            break
    if doc is None:
        return Live(None, via, "the extender's answer is not a /debug/gangs document")
    if not doc.get("leader", True):
        return Live(doc, via, f"only standby replicas answered in {LEADER_TRIES} tries")
    return Live(doc, via)


def _find_service(api: Getter, where: Endpoint) -> tuple[str, str]:
    """The ops Service's name and port (the port named `metrics`, else the first)."""
    ns = quote(where.namespace, safe="")
    if where.service:
        services = [api.get(f"/api/v1/namespaces/{ns}/services/{quote(where.service, safe='')}")]
    else:
        listed = api.get(f"/api/v1/namespaces/{ns}/services", {"labelSelector": OPS_SELECTOR})
        services = list(listed.get("items") or ())
    if not services:
        raise PluginError(
            f"no service labelled {OPS_SELECTOR} in namespace {where.namespace} "
            "(install the chart there, or pass --extender-namespace/--extender-service)"
        )
    if len(services) > 1:
        names = ", ".join(sorted(str(s["metadata"]["name"]) for s in services))
        raise PluginError(f"several extender services ({names}): pick one with --extender-service")
    service = services[0]
    ports = (service.get("spec") or {}).get("ports") or []
    if not ports:
        raise PluginError(f"service {where.namespace}/{service['metadata']['name']} has no port")
    port = next((p for p in ports if p.get("name") == "metrics"), ports[0])
    return str(service["metadata"]["name"]), str(port.get("name") or port.get("port"))


def _direct(url: str, api: Getter) -> Live:
    """--extender-url (a port-forward, or the local cluster's host process)."""
    full = url.rstrip("/") + DEBUG_PATH
    try:
        with urllib.request.urlopen(full, timeout=api.timeout_seconds) as response:
            doc = json.loads(response.read())
    except (urllib.error.URLError, OSError, ValueError) as err:
        return Live(None, full, f"the extender did not answer: {err}")
    if not isinstance(doc, dict):
        return Live(None, full, "the extender's answer is not a /debug/gangs document")
    return Live(doc, full)
