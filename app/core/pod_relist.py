"""A fresh list of pods adopted a slice at a time (PodRelist.of(state, objects)).

The watches land a relist in slices (app/runtime/watches.land_pods), the event
loop free between them; ClusterState.replace_pods adopts one at once.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from app.core.devices.book import DeviceBook
from app.core.pod_index import Gone
from app.core.records import PodRecord

if TYPE_CHECKING:
    from app.core.state import ClusterState

# Pods present looked at (is it listed?) per pod landed in a slice: a set lookup against
# reading a pod, so a slice of the last part takes about as long as one of the first.
_SORTED_PER_POD = 50


class PodRelist:
    """A fresh list of pods, adopted a slice at a time; verbs may read the state between slices.

    A relist of 90,000 pods done at once held the event loop 2.7 s (BENCHMARKS.md): every
    verb and watch waited. Between two slices the state is a defined merge of the old
    view and the new list: each pod is either as it was or as the list has it (applied
    exactly as a watch event would be: the gate's reservation and our own binding kept),
    pods the list brings are in from their slice on, and the pods it left out leave only
    after every pod of the list is in, in the last slices. No pod is lost or counted twice
    at any point, so free room is always that of the pods present; meanwhile a pod gone
    while we did not watch may still hold its room (the cautious side: a gang may wait a
    little longer, never be admitted onto room that is taken).
    """

    def __init__(
        self,
        devices: DeviceBook,
        pods: Mapping[str, PodRecord],
        read: Callable[[Mapping[str, Any]], PodRecord],
        objects: Sequence[Mapping[str, Any]],
    ) -> None:
        """`pods`: the state's pods by key, as they change; `read`: a pod's record
        as the state keys it (ClusterState.pod_record)."""
        self._devices = devices
        self._pods = pods
        self._read = read
        self._objects = objects
        self._next = 0
        self._seen: set[str] = set()
        # The pods present once every listed pod is in, and how many of them were looked at.
        self._present: list[PodRecord] | None = None
        self._sorted = 0
        self._left: list[tuple[str, str]] = []
        # (key, uid) of those the list left out, once all of them were looked at.
        self._gone: list[tuple[str, str]] | None = None
        # The state's record of deleted pods (app/core/pod_index.Gone), counted at both ends.
        self._gone_pods: Gone | None = None
        self.done = False

    @classmethod
    def of(cls, state: ClusterState, objects: Sequence[Mapping[str, Any]]) -> PodRelist:
        """A fresh list for `state` to adopt a slice at a time, the state usable between."""
        relist = cls(
            state.devices,
            state.pods,
            functools.partial(state.trees.pod_record, sources=state.sources),
            objects,
        )
        relist._gone_pods = state.gone
        state.gone.relists += 1  # a pod read in flight across a relist is not stored (Gone)
        return relist

    def advance(self, most: int) -> bool:
        """Land at most `most` pods (listed ones, then the left-out ones' removal); True: done."""
        devices = self._devices
        budget = max(1, most)
        objects = self._objects
        while budget and self._next < len(objects):
            record = self._read(objects[self._next])
            self._next += 1
            budget -= 1
            devices.store_pod(record)
            self._seen.add(record.key)
        if self._next < len(objects) or not self._left_out(budget * _SORTED_PER_POD):
            return False
        gone = self._gone
        assert gone is not None
        while budget and gone:
            key, uid = gone.pop()
            budget -= 1
            # That very pod: one a verb read from the API since has another uid, and stays.
            devices.delete_pod(key, uid)
        if gone:
            return False
        if not self.done:
            self.done = True
            devices.relisted()
            if self._gone_pods is not None:
                self._gone_pods.relists += 1  # and a read that spans its end
        return True

    def _left_out(self, most: int) -> bool:
        """Note at most `most` more of the pods present when every listed pod was in that the
        list left out (their uid then: a pod read from the API since, another incarnation,
        stays); True: all noted (_gone). At once, over 90,000 pods, this held the event
        loop 10-17 ms in the relist's last slice (BENCHMARKS.md, issue 46)."""
        if self._gone is not None:
            return True
        if self._present is None:
            self._present = list(self._pods.values())  # these and no others may leave
        present, seen, start = self._present, self._seen, self._sorted
        self._sorted = start + most
        self._left += [(p.key, p.uid) for p in present[start : self._sorted] if p.key not in seen]
        if self._sorted < len(present):
            return False
        self._gone, self._left, self._present, self._seen = self._left, [], [], set()
        return True
