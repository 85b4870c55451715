"""The device pools published for many nodes, as the SharedPool objects bins carry. Pure.

A pool whose ResourceSlices name no node (spec.nodeSelector, spec.allNodes)
shows in full on every node it serves (app/core/devices/counting.py); a
packing holds a gang's members to it once (app/core/shared_pools.py). Here
each such pool of the newest generation is one SharedPool, the same object
in every bin of the nodes it serves, its counts brought up to date in place
when the book changed (refresh): what it offers, what allocated claims hold
of it and what gangs admitted ahead were promised of it (free: the claim
ledger's `promised`, app/runtime/claims.py), and per node what the claims
counted on the pods placed there hold of it (their part of the node's
requested that is not the node's own).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Set

from app.core.devices.counting import DeviceModel, held_of
from app.core.devices.distinct import own_labels
from app.core.devices.records import ClaimRecord, SliceRecord
from app.core.pod_index import PodIndex
from app.core.records import NodeRecord, PodRecord
from app.core.resources import DEVICE_PREFIX, add, subtract
from app.core.shared_pools import PoolHold, PoolShare, SharedPool

# What the gangs admitted ahead hold of the shared pools (their claims, app/runtime/claims.py):
# a version that changes whenever it does, and each member's share.
Promised = Callable[[], tuple[int, Iterable[PoolShare]]]


class SharedPools:
    """Kept by the DeviceBook, counted when the bins are asked for (refresh)."""

    def __init__(
        self,
        model: DeviceModel,
        version: Callable[[], tuple[int, int, int]],
        placed_users: Callable[[], Iterable[tuple[PodRecord, ClaimRecord]]],
    ) -> None:
        """`version`: the slices' (the model's slices_version), the book's and the change
        log's stamp (a pod placed or gone); `placed_users`: each placed pod with each
        allocated claim counted on it."""
        self._model = model
        self._version = version
        self._placed_users = placed_users
        self._seen: tuple[int, ...] = (-1, -1, -1, -1)
        # Set by the claim ledger: what admitted gangs not placed yet were promised.
        self.promised: Promised | None = None
        # (driver, pool) -> its object now, and one for the empty cluster (nothing held).
        self._pools: dict[tuple[str, str], SharedPool] = {}
        self._empty: dict[tuple[str, str], SharedPool] = {}
        self._slices: dict[tuple[str, str], list[SliceRecord]] = {}

    def for_node(self, record: NodeRecord, *, empty: bool = False) -> tuple[SharedPool, ...]:
        """The shared pools a node may use (`empty`: as in the empty cluster)."""
        self.refresh()
        if not self._slices:
            return ()
        labels = own_labels(record)
        table = self._empty if empty else self._pools
        return tuple(
            table[key]
            for key, slices in self._slices.items()
            if key in table
            and any(
                s.all_nodes
                or (s.node_selector is not None and s.node_selector.allows(record.name, labels, ()))
                for s in slices
            )
        )

    def holds(self, pods: Iterable[PodRecord]) -> list[PoolHold]:
        """What each allocated claim holds of each shared pool, with the pods using it
        (`pods`: the pods with claims): what a preemption's victims may give back."""
        self.refresh()
        if not self._pools:
            return []
        model = self._model
        users: dict[str, set[str]] = {}
        for record in pods:
            if record.terminal:
                continue  # a finished pod uses no claim (its devices wait for the controller)
            for pod_claim in record.claims:
                key = f"{record.namespace}/{pod_claim.claim}"
                claim = model.claims.get(key) if pod_claim.claim else None
                if claim is not None and claim.allocated:
                    users.setdefault(key, set()).add(record.key)
        counted_on = {claim.key: pod.placed_node for pod, claim in self._placed_users()}
        holds: list[PoolHold] = []
        for key, who in sorted(users.items()):
            claim = model.claims[key]
            for pool_key in sorted({(driver, pool) for _r, driver, pool, _d in claim.allocated}):
                pool = self._pools.get(pool_key)
                held = held_of(model, claim, pool_key) if pool is not None else {}
                if pool is not None and held:
                    holds.append(PoolHold(pool, held, frozenset(who), counted_on.get(key, "")))
        return holds

    def refresh(self) -> None:
        """Count every shared pool anew if the book changed since the last count."""
        promised_version, promised = self.promised() if self.promised is not None else (0, ())
        version = (*self._version(), promised_version)
        if version == self._seen:
            return
        model = self._model
        if version[0] != self._seen[0]:  # the slices or classes changed
            self._slices = {}
            for s in model.newest_slices():
                if not s.node:
                    self._slices.setdefault(s.pool_key, []).append(s)
            for key in [k for k in self._pools if k not in self._slices]:
                del self._pools[key], self._empty[key]
        self._seen = version
        if not self._slices:
            return
        for key, slices in self._slices.items():
            devices = {d.name: d for s in slices for d in s.devices}.values()
            offer = {
                r: v for r, v in model.offer_of(devices).items() if r.startswith(DEVICE_PREFIX)
            }
            name = "/".join(key)
            pool = self._pools.setdefault(key, SharedPool(name))
            empty = self._empty.setdefault(key, SharedPool(name))
            pool.offer, pool.free, pool.used_on = offer, dict(offer), {}
            empty.offer, empty.free, empty.used_on = offer, dict(offer), {}
        for claim in model.claims.values():
            for key in {(driver, pool) for _r, driver, pool, _d in claim.allocated}:
                if key in self._pools:
                    subtract(self._pools[key].free, held_of(model, claim, key))
        for pod, claim in self._placed_users():
            for key in {(driver, pool) for _r, driver, pool, _d in claim.allocated}:
                if key in self._pools:
                    used = self._pools[key].used_on.setdefault(pod.placed_node, {})
                    add(used, held_of(model, claim, key))
        by_name = {pool.name: pool for pool in self._pools.values()}
        for name, _node, amounts in promised:
            # A share promised to an admitted gang's member is the pool's no more for anyone
            # else. Not its node's used_on: the node's requested does not hold the member
            # yet, so its own devices read as they are (a decision that takes the claim's
            # promise off the node reads them short by the share: a delay, never a promise
            # of devices that are not there).
            promised_to = by_name.get(name)
            if promised_to is not None:
                subtract(promised_to.free, amounts)
        for pool in self._pools.values():
            pool.free = {r: max(0, v) for r, v in pool.free.items()}


def placed_claims(
    model: DeviceModel, pods: PodIndex, device_pods: Set[str]
) -> Iterable[tuple[PodRecord, ClaimRecord]]:
    """Each placed pod with each allocated claim counted on it (a shared one: its first user)."""
    for key in device_pods:
        record = pods.pods.get(key)
        if record is None or record.terminal or not record.placed_node:
            continue
        for pod_claim in record.claims:
            claim = model.claims.get(f"{record.namespace}/{pod_claim.claim}")
            if claim is None or not claim.allocated:
                continue
            if pod_claim.template or min(model.users.get(claim.key) or {key}) == key:
                yield record, claim
