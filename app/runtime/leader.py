"""Leader awareness: only the replica whose kube-scheduler holds the Lease writes.

With several replicas of the chart's pod, kube-scheduler's leader election
picks one; only that kube-scheduler schedules, so only its sidecar gets verb
calls. The other sidecars still watch the cluster, and without this check
their status reconciler, sibling wake-ups, whole-gang evictions and events
would write too (and fight the leader's). Each sidecar watches the Lease and
compares its holderIdentity with its own pod's name: kube-scheduler's
identity is `<hostname>_<uuid>`, and a pod's hostname is its name.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any, Protocol

from app.core.clock import Clock, wall
from app.core.event_aggregation import ObjectRef
from app.core.events import Recorder
from app.core.timestamps import parse_rfc3339

log = logging.getLogger(__name__)


def holds_lease(spec: Mapping[str, Any] | None, identity: str, now: float) -> bool:
    """True if the Lease `spec` is held by the kube-scheduler of `identity` and not expired."""
    spec = spec or {}
    holder = spec.get("holderIdentity")
    if not isinstance(holder, str) or not holder:
        return False
    if holder != identity and holder.split("_", 1)[0] != identity:
        return False
    renewed = parse_rfc3339(spec.get("renewTime"))
    duration = spec.get("leaseDurationSeconds")
    if renewed is None or not isinstance(duration, int):
        return True  # no expiry information: trust the holder
    return now <= renewed + duration


class LeaderElection:
    """The Lease as our watch last saw it; is_leader() is what writers ask."""

    def __init__(
        self,
        identity: str,
        *,
        clock: Clock = wall,
    ) -> None:
        self.identity = identity
        self._clock = clock
        self._spec: Mapping[str, Any] | None = None
        self._leading = False

    def is_leader(self) -> bool:
        leading = holds_lease(self._spec, self.identity, self._clock())
        if leading != self._leading:
            self._leading = leading
            log.info(
                "this replica %s the leader (Lease held by %s)",
                "is now" if leading else "is no longer",
                (self._spec or {}).get("holderIdentity") or "nobody",
            )
        return leading

    # ---- reflector sink (on the event loop) ---------------------------------------

    def replace(self, objects: Iterable[Mapping[str, Any]]) -> None:
        self._spec = None
        for obj in objects:
            self.apply(obj)

    def apply(self, obj: Mapping[str, Any]) -> None:
        self._spec = obj.get("spec") or {}
        self.is_leader()

    def delete(self, obj: Mapping[str, Any]) -> None:
        self._spec = None
        self.is_leader()


class AlwaysLeader:
    """One replica (no --leader-election-lease): this process always writes."""

    def is_leader(self) -> bool:
        return True


class LeaderCheck(Protocol):
    def is_leader(self) -> bool: ...


class LeaderOnlyRecorder:
    """Events are written by the leader only; a standby drops them."""

    def __init__(self, inner: Recorder, leader: LeaderCheck) -> None:
        self._inner = inner
        self._leader = leader

    def record(self, ref: ObjectRef, type_: str, reason: str, message: str) -> None:
        if self._leader.is_leader():
            self._inner.record(ref, type_, reason, message)


class PodWriter(Protocol):
    async def touch_pod(self, namespace: str, name: str, uid: str, value: str) -> None: ...

    async def release_pod(self, namespace: str, name: str, uid: str) -> None: ...

    async def nominate_pod(self, namespace: str, name: str, uid: str, node: str) -> None: ...

    async def evict_pod(self, namespace: str, name: str, uid: str) -> None: ...


class LeaderOnlyPodWrites:
    """Pod writes that follow the watch (wake-ups, whole-gang evictions): the leader's only."""

    def __init__(self, inner: PodWriter, leader: LeaderCheck) -> None:
        self._inner = inner
        self._leader = leader

    async def touch_pod(self, namespace: str, name: str, uid: str, value: str) -> None:
        if self._leader.is_leader():
            await self._inner.touch_pod(namespace, name, uid, value)

    async def release_pod(self, namespace: str, name: str, uid: str) -> None:
        if self._leader.is_leader():
            await self._inner.release_pod(namespace, name, uid)

    async def nominate_pod(self, namespace: str, name: str, uid: str, node: str) -> None:
        if self._leader.is_leader():
            await self._inner.nominate_pod(namespace, name, uid, node)

    async def evict_pod(self, namespace: str, name: str, uid: str) -> None:
        if self._leader.is_leader():
            await self._inner.evict_pod(namespace, name, uid)
        else:
            log.info(
                "not evicting %s/%s: this replica is a standby (the leader evicts)",
                namespace,
                name,
            )
