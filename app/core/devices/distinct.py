"""The cluster's devices, each counted once: what a gang's devices are held to as a whole.

A node's allocatable offers it the whole of every pool published for it
(app/core/devices/book.py), as a pod there may take any of them; a pool
published for many nodes (nodeSelector, allNodes) so shows on each of them.
Summed over the nodes it would be counted many times. Here each device of
the newest generation of each pool counts once, if some schedulable node may
use it; less what the placed pods' claims take, it is what is free in the
cluster (app/core/devices/shortfall.py holds a gang to it).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from app.core.devices.counting import DeviceModel, unique_devices
from app.core.devices.records import SliceRecord
from app.core.pod_index import PodIndex
from app.core.records import NodeRecord
from app.core.resources import DEVICE_PREFIX, Resources


def own_labels(record: NodeRecord) -> Mapping[str, str]:
    """The labels a pool's nodeSelector reads (the node's own, not HyperNode tiers)."""
    return record.own_labels if record.own_labels is not None else record.labels


class DistinctDevices:
    """Counted again only when the book says the slices, classes or nodes changed
    (`invalidate`), or a selector set was first asked for."""

    def __init__(
        self,
        model: DeviceModel,
        nodes: Callable[[], dict[str, NodeRecord]],
        pods: PodIndex,
    ) -> None:
        """`pods`: its running sum of the devices placed pods take (placed_devices)."""
        self._model = model
        self._nodes = nodes
        self._pods = pods
        # (selector sets counted for, the count); None: count anew.
        self._offer: tuple[int, Resources] | None = None

    def invalidate(self) -> None:
        self._offer = None

    def node_changed(self, known: NodeRecord | None, record: NodeRecord) -> None:
        """A node stored anew: counted again if it is new, or which pools serve a
        schedulable node may have changed (its schedulability, its labels)."""
        if (
            known is None
            or known.unschedulable != record.unschedulable
            or own_labels(known) != own_labels(record)
        ):
            self._offer = None

    def offer(self) -> Resources:
        """The device resources of the whole cluster, each device counted once."""
        signatures = len(self._model.signatures)
        if self._offer is not None and self._offer[0] == signatures:
            return self._offer[1]
        nodes = [r for r in self._nodes().values() if not r.unschedulable]
        slices = self._model.newest_slices()
        if all(s.node for s in slices):
            # Every pool is a node's own: the nodes' offers, summed, count each device once.
            offer: Resources = {}
            for record in nodes:
                for name, amount in self._model.offered.get(record.name, {}).items():
                    if name.startswith(DEVICE_PREFIX):
                        offer[name] = offer.get(name, 0) + amount
            self._offer = (signatures, offer)
            return offer
        names = {r.name for r in nodes}

        def serves_one(s: SliceRecord) -> bool:
            if s.node:
                return s.node in names
            return bool(nodes) and (
                s.all_nodes
                or (
                    s.node_selector is not None
                    and any(s.node_selector.allows(r.name, own_labels(r), ()) for r in nodes)
                )
            )

        devices = unique_devices(slices, serves_one)
        offer = {
            k: v for k, v in self._model.offer_of(devices).items() if k.startswith(DEVICE_PREFIX)
        }
        self._offer = (signatures, offer)
        return offer

    def placed(self) -> Mapping[str, int]:
        """The devices placed pods' claims take, per resource (a running sum)."""
        return self._pods.placed_devices

    def free(self, promised: Iterable[Mapping[str, int]] = ()) -> Resources:
        """offer() less what placed pods' claims take and `promised` (devices of gangs
        admitted but not placed yet): the devices free in the cluster, each once."""
        free = dict(self.offer())
        for requests in (self._pods.placed_devices, *promised):
            for resource, amount in requests.items():
                if resource in free:
                    free[resource] -= amount
        return {k: max(0, v) for k, v in free.items()}
