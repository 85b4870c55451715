"""Each node's allocatable with the devices it is offered. Pure.

A node's allocatable is what the node advertises plus the devices of the
ResourceSlices published for it: its own pools, and the pools published for
many nodes that its labels let it use (app/core/devices/counting.py counts a
set of devices as resources). The device book (app/core/devices/book.py) asks
for a node's record as a watch delivers it, and for the nodes a DRA change
bears on again.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable

from app.core.changes import ChangeLog
from app.core.devices.counting import DeviceModel
from app.core.devices.distinct import own_labels
from app.core.devices.records import SliceRecord
from app.core.records import NodeRecord
from app.core.resources import Resources


class NodeOffers:
    def __init__(
        self, model: DeviceModel, nodes: Callable[[], dict[str, NodeRecord]], changes: ChangeLog
    ) -> None:
        """`nodes`: the state's node records, changed in place when their devices change."""
        self._model = model
        self._nodes = nodes
        self._changes = changes
        # Node -> allocatable as the node advertises it (devices are added on top).
        self._base: dict[str, Resources] = {}
        # Node ("" = pools for many) -> its slices of the newest generations; None: sort anew.
        self._newest: dict[str, list[SliceRecord]] | None = None

    def node(self, record: NodeRecord) -> NodeRecord:
        """The node's record with the devices it is offered added to its allocatable."""
        self._base[record.name] = record.allocatable
        record.allocatable = self._with_offer(record)
        return record

    def replace(self, records: Iterable[NodeRecord]) -> list[NodeRecord]:
        """A fresh list of nodes: each with its devices; those it left out are forgotten."""
        self._base.clear()
        self._model.offered.clear()
        return [self.node(record) for record in records]

    def gone(self, name: str) -> None:
        self._base.pop(name, None)
        self._model.offered.pop(name, None)

    def slices_changed(self) -> None:
        self._newest = None

    def refresh(self, only: set[str] | None = None) -> None:
        """Count the nodes' offers again (`only` these; None: every node); a node whose
        allocatable changed is stored anew and the state's node listeners are told."""
        nodes = self._nodes()
        changed = False
        for name in nodes if only is None else only & nodes.keys():
            record = nodes[name]
            allocatable = self._with_offer(record)
            if allocatable != record.allocatable:
                nodes[name] = dataclasses.replace(record, allocatable=allocatable)
                self._changes.node_touched(name)
                changed = True
        if changed:
            self._changes.nodes_changed()

    def _with_offer(self, record: NodeRecord) -> Resources:
        model = self._model
        base = self._base.get(record.name, record.allocatable)
        if self._newest is None:
            self._newest = {}
            for s in model.newest_slices():
                self._newest.setdefault(s.node, []).append(s)
        slices = [*self._newest.get(record.name, ()), *self._newest.get("", ())]
        if not slices:
            model.offered.pop(record.name, None)
            return base
        offer = model.offer_of(model.devices_for(record.name, own_labels(record), slices))
        model.offered[record.name] = offer
        allocatable = dict(base)
        for resource, amount in offer.items():
            allocatable.setdefault(resource, amount)  # a name the node advertises itself wins
        return allocatable
