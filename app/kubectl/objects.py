"""What the API objects say: pods, group objects of every source, nodes, queues, events.

Read once per command (and per --watch refresh) as plain JSON. A group API
the API server does not serve (no Volcano CRD, GenericWorkload off) is a
source with no objects, as for the extender; a list the user may not read
(nodes, queues) is left empty and named in `unreadable`, so the output says
what it could not see instead of failing.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

from app.core.composite import COMPOSITE_API_VERSION, COMPOSITE_PLURAL
from app.core.groups import GROUP_APIS, SOURCE_NATIVE
from app.core.queues import QUEUE_GROUP, QUEUE_PLURAL, QUEUE_VERSION
from app.kubectl.api import Api, ApiError

Obj = dict[str, Any]


@dataclass(slots=True)
class Objects:
    """One read of the cluster, in one namespace or all of them."""

    pods: list[Obj]
    # Group objects per source (x-k8s, volcano, native).
    groups: dict[str, list[Obj]]
    # Node name -> its labels (for the topology domain of bound members).
    node_labels: dict[str, dict[str, str]]
    # Volcano Queue objects (cluster-scoped).
    queues: list[Obj]
    # Lists we could not read and why ("nodes: 403 Forbidden ..."), shown as a note.
    unreadable: list[str] = field(default_factory=list)
    # Group sources whose API the server does not serve.
    not_served: list[str] = field(default_factory=list)
    # Wall clock when read, for ages.
    now: float = 0.0
    # Kubernetes' CompositePodGroups (served with the gate CompositePodGroup): the trees
    # whose leaves' pods form one gang each (app/core/composite_trees.py).
    composites: list[Obj] = field(default_factory=list)


def _scoped(prefix: str, plural: str, namespace: str | None) -> str:
    if namespace is None:
        return f"{prefix}/{plural}"
    return f"{prefix}/namespaces/{quote(namespace, safe='')}/{plural}"


def _items(api: Api, path: str) -> list[Obj]:
    doc = api.get(path)
    items = doc.get("items") if isinstance(doc, dict) else None
    return [i for i in items or () if isinstance(i, dict)]


def read_objects(api: Api, namespace: str | None, *, nodes: bool = True) -> Objects:
    """Everything `get`, `describe` and `queues` show from objects. namespace None: all."""
    pods = _items(api, _scoped("/api/v1", "pods", namespace))
    found = Objects(pods, {}, {}, [], now=time.time())
    for source, group_api in GROUP_APIS.items():
        prefix = f"/apis/{group_api.group}/{group_api.version}"
        try:
            found.groups[source] = _items(api, _scoped(prefix, group_api.plural, namespace))
        except ApiError as err:
            if err.status != 404:
                raise
            found.not_served.append(source)
    if SOURCE_NATIVE in found.groups:
        prefix = f"/apis/{COMPOSITE_API_VERSION}"
        try:
            found.composites = _items(api, _scoped(prefix, COMPOSITE_PLURAL, namespace))
        except ApiError as err:
            if err.status != 404:  # not served: no trees; else said, as for nodes
                found.unreadable.append(f"{COMPOSITE_PLURAL} ({err})")
    if nodes:
        try:
            for node in _items(api, "/api/v1/nodes"):
                meta = node.get("metadata") or {}
                found.node_labels[str(meta.get("name") or "")] = dict(meta.get("labels") or {})
        except ApiError as err:
            found.unreadable.append(f"nodes ({err})")
    try:
        found.queues = _items(api, f"/apis/{QUEUE_GROUP}/{QUEUE_VERSION}/{QUEUE_PLURAL}")
    except ApiError as err:
        if err.status != 404:
            found.unreadable.append(f"queues ({err})")
    return found


def read_events(api: Api, namespace: str, about: set[tuple[str, str]]) -> list[Obj]:
    """The namespace's Events about any of `about` ((kind, name): the group object, its pods),
    oldest first."""
    try:
        events = _items(api, f"/api/v1/namespaces/{quote(namespace, safe='')}/events")
    except ApiError as err:
        if err.status == 403:
            return []
        raise
    mine = [e for e in events if _involved(e) in about]
    return sorted(mine, key=event_time)


def _involved(event: Obj) -> tuple[str, str]:
    involved = event.get("involvedObject") or {}
    return str(involved.get("kind") or ""), str(involved.get("name") or "")


def event_time(event: Obj) -> str:
    """When an Event last happened (RFC 3339; the fields differ between writers)."""
    meta = event.get("metadata") or {}
    return str(
        event.get("lastTimestamp")
        or event.get("eventTime")
        or event.get("firstTimestamp")
        or meta.get("creationTimestamp")
        or ""
    )
