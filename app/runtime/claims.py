"""Claims: the capacity the arbiter promised to gangs admitted as a whole, until they settle.

A claim lasts from a gang's admission until the gate binds or releases its
wave. Every fresh admission weighs itself against what each claim still
holds (`holders()`), and a claim that no longer stands (its PodGroup gone, a
member lost, no member at the gate in time) is dropped by `stale()`.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Protocol

from app.core.admission import wholeness
from app.core.contention import Decision, Gang, Holder, room_left
from app.core.groups import GroupRef, GroupSpec, PodGroupSpecError
from app.core.records import GroupNotFound, PodRecord
from app.core.resources import Resources, add
from app.core.shared_pools import PoolShare, pool_shares
from app.core.state import ClusterState
from app.core.topology.domains import Domain, TopologyConstraint
from app.core.topology.held import HeldGroup
from app.runtime.gate import PermitGate
from app.runtime.revision import Revision

log = logging.getLogger(__name__)

# How often the filter verb looks over every claim for one to drop (its
# PodGroup gone, or no member reached the gate in time). A claiming gang
# losing a member is looked at on the next filter call, whatever the time:
# that is the case where a stale claim would hold capacity for nothing.
PRUNE_INTERVAL_SECONDS = 0.25


@dataclass(slots=True)
class Claim:
    ref: GroupRef
    priority: int
    created: float
    # member key -> node the packing promised it.
    plan: dict[str, str]
    requests: dict[str, Resources]
    made_at: float
    # When the gang first waited in line (kept for aging if it is released), and how many of
    # its attempts before this one failed in a row (app/runtime/line_gangs.py Waiting).
    since: float | None
    failed: int = 0
    # Members' PodScheduled messages when the claim was made: only a change counts.
    baseline: dict[str, str] = field(default_factory=dict)
    # The topology domain the whole gang was admitted in (None: no constraint, or anywhere).
    domain: Domain | None = None
    constraint: TopologyConstraint | None = None
    # A gang made of groups: each constrained sub-group's domain and constraint, by path
    # (app/core/topology/tree.py); its members are held there.
    groups: dict[tuple[str, ...], HeldGroup] = field(default_factory=dict)
    # Made by taking room from gangs that gave way: until then, a member that
    # kube-scheduler finds no node for is not failed fast (its own cache still
    # holds the released members until it handles their refused binds, and
    # forgetting them retries the member; a NodeResourcesFit rejection is not
    # retried by anything else).
    released_others_until: float = 0.0
    # Member key -> what it was promised of the device pools published for many nodes
    # (app/core/shared_pools.py pool_shares): no other gang's while the member is not bound.
    pool_shares: dict[str, list[PoolShare]] = field(default_factory=dict)
    # Its members late to the gate were nominated for their planned nodes
    # (app/runtime/claim_nominees.py): such a nomination is no sign of kube-scheduler's
    # preemption.
    nominated_late: bool = False

    @property
    def waiting_since(self) -> float:
        """Where the gang stands in line if its claim ends without binding: it keeps its age."""
        return self.since or self.made_at


class ClaimListener(Protocol):
    """Told of each claim as it is made and as it ends (app/runtime/claim_nominees.py)."""

    def claim_made(self, key: str, claim: Claim) -> None: ...

    def claim_ended(self, key: str, claim: Claim) -> None: ...


class ClaimLedger:
    """Every claim standing, what each still holds, and which no longer stand."""

    def __init__(
        self,
        state: ClusterState,
        revision: Revision,
        gate: PermitGate,
        wait_seconds: Callable[[GroupSpec], float],
    ) -> None:
        self._state = state
        self._revision = revision
        self._gate = gate
        self._wait_seconds = wait_seconds
        self.held: dict[str, Claim] = {}
        # claim key -> (its members' stamp, the claim, what it holds): see holder().
        self._holders: dict[str, tuple[int, Claim, Holder]] = {}
        self._pruned_at = -math.inf
        # Claiming gangs that lost a member since the last prune.
        self._recheck: set[str] = set()
        # The claims promised devices of shared pools, and a version that moves with them:
        # the pools count those devices taken (app/core/devices/shared.py).
        self._pooled: set[str] = set()
        self._pool_version = 0
        state.devices.shared.promised = self.pool_promises
        self.listeners: list[ClaimListener] = []

    def make(
        self,
        gang: Gang,
        ref: GroupRef,
        decision: Decision,
        waited: tuple[float, int] | None,
        where: tuple[TopologyConstraint | None, Domain | None, dict[tuple[str, ...], HeldGroup]],
        times: tuple[float, float],
    ) -> Claim:
        """The gang is admitted as `decision` says, in `where` (constraint, domain, sub-groups'
        domains): its claim, standing from now. `waited`: since when it waited in line and
        its attempts failed in a row (None: it never waited). `times`: now, and until when
        the gangs that gave way for it are not failed fast (see Claim.released_others_until)."""
        constraint, domain, groups = where
        now, released_others_until = times
        self.held[gang.key] = claim = Claim(
            ref=ref,
            priority=gang.priority,
            created=gang.created,
            plan=dict(decision.plan),
            requests={d.key: d.requests for d in gang.demands},
            made_at=now,
            since=waited[0] if waited is not None else None,
            failed=waited[1] if waited is not None else 0,
            baseline={
                p.key: p.unschedulable_message
                for p in self._state.members(gang.key)
                if not p.placed_node
            },
            domain=domain,
            released_others_until=released_others_until,
            constraint=constraint,
            groups=groups,
        )
        claim.pool_shares = self._pool_shares(claim)
        if claim.pool_shares:
            self._pooled.add(gang.key)
            self._pool_version += 1
        for listener in self.listeners:
            listener.claim_made(gang.key, claim)
        return claim

    def _pool_shares(self, claim: Claim) -> dict[str, list[PoolShare]]:
        """What the claim's members take of the shared pools, drawn over the room the gang
        was admitted into (free less the other claims' promises)."""
        room = self._state.room()
        positions = self._state.room_positions()
        if not any(
            (i := positions.get(node)) is not None and room[i].pools for node in claim.plan.values()
        ):
            return {}
        others = [self.holder(k, c) for k, c in self.held.items() if c is not claim]
        return pool_shares(claim.requests, claim.plan, room_left(room, others, positions))

    def pool_promises(self) -> tuple[int, list[PoolShare]]:
        """What the claims promised of the shared pools to members not bound yet whose
        devices are not allocated yet (a version first: it moves when a claim comes or
        goes; the pools recount on every pod or claim change too)."""
        shares: list[PoolShare] = []
        for key in self._pooled:
            claim = self.held.get(key)
            if claim is None:
                continue
            for member, promised in claim.pool_shares.items():
                pod = self._state.pods.get(member)
                if pod is not None and (
                    pod.node_name or not pod.counts_as_member or self._allocated(pod)
                ):
                    continue
                shares.extend(promised)
        return self._pool_version, shares

    def _allocated(self, pod: PodRecord) -> bool:
        """Are the pod's claims allocated (the pools count their devices themselves)?"""
        claims = self._state.devices.model.claims
        return bool(pod.claims) and all(
            (claim := claims.get(f"{pod.namespace}/{c.claim}")) is not None and claim.allocated
            for c in pod.claims
        )

    def end(self, key: str) -> Claim | None:
        """The claim is over (whatever the reason): capacity and the line move."""
        self._revision.bump()
        if key in self._pooled:
            self._pooled.discard(key)
            self._pool_version += 1
        claim = self.held.pop(key, None)
        if claim is not None:
            for listener in self.listeners:
                listener.claim_ended(key, claim)
        return claim

    def recheck(self, key: str) -> None:
        """A member of this claiming gang went away: `stale()` looks at it at once."""
        self._recheck.add(key)

    def holders(self) -> list[Holder]:
        """What every admitted gang holds now (the queue status counts them)."""
        return [self.holder(k, c) for k, c in self.held.items()]

    def holder(self, key: str, claim: Claim) -> Holder:
        """What a claiming gang holds; reused while neither the claim nor a member changed.

        Every fresh admission weighs itself against all claims, and with
        hundreds of gangs arriving interleaved (bench/e2e.py case (c)) this
        was the largest part of a gang member's filter.
        """
        stamp = self._state.group_stamp(key)
        cached = self._holders.get(key)
        if cached is not None and cached[0] == stamp and cached[1] is claim:
            return cached[2]
        if len(self._holders) > 2 * len(self.held) + 64:
            self._holders = {k: v for k, v in self._holders.items() if k in self.held}
        holder = self.compute_holder(key, claim)
        self._holders[key] = (stamp, claim, holder)
        return holder

    def compute_holder(self, key: str, claim: Claim) -> Holder:
        remaining: dict[str, Resources] = {}
        for pod_key, node in claim.plan.items():
            pod = self._state.pods.get(pod_key)
            if pod is not None and (pod.placed_node or not pod.counts_as_member):
                continue
            add(remaining.setdefault(node, {}), claim.requests.get(pod_key, {}))
        reserved: dict[str, Resources] = {}
        for pod in self._state.members(key):
            if pod.reserved_node and not pod.node_name:
                add(reserved.setdefault(pod.reserved_node, {}), pod.requests)
        return Holder(key, claim.priority, claim.created, remaining, reserved)

    def stale(self, now: float) -> Iterator[str]:
        """The claims that no longer stand; every claim looked at once per PRUNE_INTERVAL_SECONDS.

        It runs on every filter call, so looking at hundreds of claims each
        time cost more than the rest of a gang member's filter.
        """
        if now - self._pruned_at >= PRUNE_INTERVAL_SECONDS:
            self._pruned_at = now
            keys = list(self.held)
        else:
            keys = [k for k in self._recheck if k in self.held]
        self._recheck.clear()
        for key in keys:
            claim = self.held[key]
            try:
                spec = self._state.group_spec(claim.ref)
            except (GroupNotFound, PodGroupSpecError):
                yield key
                continue
            if wholeness(spec, len(self._state.members(key))).missing:
                yield key
            elif not self._gate.waiting(key) and now - claim.made_at > self._wait_seconds(spec):
                log.info(
                    "claim dropped: no member reached the gate in time",
                    extra={"podgroup": key},
                )
                yield key

    def snapshot(self) -> list[dict[str, object]]:
        """For /debug/gangs: who holds capacity."""
        return [
            {"group": k, "priority": c.priority, "members": len(c.plan)}
            # The topology domain, only for gangs placed in one (app/core/topology/domains.py).
            | ({"domain": c.domain.to_json()} if c.domain is not None else {})
            # A gang made of groups: each sub-group's domain (app/core/topology/tree.py).
            | (
                {"subGroups": [h.to_json(p) for p, h in sorted(c.groups.items())]}
                if c.groups
                else {}
            )
            # Members late to the gate nominated for their nodes (app/runtime/claim_nominees.py).
            | ({"lateMembersNominated": True} if c.nominated_late else {})
            for k, c in self.held.items()
        ]
