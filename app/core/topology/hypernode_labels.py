"""Volcano HyperNodes as node labels: one label per HyperNode tier holding a node.

With the tiers as labels, every topology rule (levels, domains, packing)
treats a HyperNode tier like any label-based level. A burst of HyperNode
events is noted first and applied at once, so it costs one relabelling of
the nodes, not one per event.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any

from app.core.records import NodeRecord
from app.core.topology.hypernode import HyperNode, HyperNodeError, HyperNodeIndex, hypernode_from

log = logging.getLogger(__name__)


class HyperNodeLabels:
    def __init__(self) -> None:
        # Only when their API is served: their tiers are topology levels.
        self.index = HyperNodeIndex()
        # HyperNode name -> why it is not used (logged once per change).
        self.errors: dict[str, str] = {}
        # The HyperNodes as the watch delivered them; `index` once relabelled.
        self._seen: dict[str, HyperNode] = {}

    def label(self, record: NodeRecord) -> NodeRecord:
        """The record with a label per HyperNode tier holding the node (topology/hypernode.py)."""
        own = record.own_labels if record.own_labels is not None else record.labels
        record.own_labels = own
        if not self.index.hypernodes:
            record.labels = own
            return record
        extra = self.index.labels_for(record.name, own)
        record.labels = {**own, **extra} if extra else own
        return record

    def note(self, raw: Mapping[str, Any]) -> None:
        name = (raw.get("metadata") or {}).get("name") or ""
        hypernode = self._read(raw)
        if hypernode is None:
            self._seen.pop(name, None)
        else:
            self._seen[name] = hypernode

    def forget(self, name: str) -> None:
        self.errors.pop(name, None)
        self._seen.pop(name, None)

    def replace(self, objects: Iterable[Mapping[str, Any]]) -> None:
        self.errors.clear()
        read = (self._read(raw) for raw in objects)
        self._seen = {h.name: h for h in read if h is not None}

    def relabel(self, nodes: Iterable[NodeRecord]) -> list[str]:
        """Make the node labels follow the HyperNodes seen; the nodes whose labels changed."""
        if self._seen == self.index.hypernodes:
            return []
        self.index = HyperNodeIndex.build(dict(self._seen).values())
        for problem in self.index.problems:
            log.warning("HyperNodes: %s", problem)
        changed: list[str] = []
        for record in nodes:
            before = record.labels
            if self.label(record).labels != before:
                changed.append(record.name)
        return changed

    def _read(self, raw: Mapping[str, Any]) -> HyperNode | None:
        name = (raw.get("metadata") or {}).get("name") or ""
        try:
            hypernode = hypernode_from(raw)
        except HyperNodeError as err:
            if self.errors.get(name) != str(err):
                log.warning("%s; it is left out of the topology until fixed", err)
            self.errors[name] = str(err)
            return None
        self.errors.pop(name, None)
        return hypernode
