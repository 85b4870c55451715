"""An admitted gang's members slow to reach the gate are nominated for the nodes promised them.

The arbiter admits a gang at one member's filter call and promises every member
a node (the claim's plan). kube-scheduler holds room only for the pods it has
assumed (those at our gate) and the pods nominated for a node. The members it has
not tried yet are neither, so until it tries them, their room looks free. In
gang-only mode a plain pod never reaches our filter, so a plain pod of no higher
priority created meanwhile takes that room. The member then finds no node, the
claim falls, and the gang is admitted again later, perhaps to lose the race again
(issue 49's soak, seed 1: a gang admitted several times while plain pods took
its third member's room each time).

kube-scheduler's filters count a nominated pod's requests on its node for every pod
of no higher priority, whoever wrote the nomination
(app/runtime/preemption/nominations.py). So a claim whose members have not all
reached the gate NOMINATE_AFTER_SECONDS after it was made has those members
nominated for their promised nodes, through the plans' Nominations (one writer
for every nomination the extender makes). When the claim ends the nominations go:
a member placed needs none (kube-scheduler forgets it), and one the claim released
must not keep room. Why wait at all: a gang's members are normally tried within
milliseconds of each other, and a write per member of every gang would add to the
API server's load what protects nothing; the wait bounds the window, it does not
open a new one.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator

from app.core.records import PodRecord
from app.core.state import ClusterState
from app.runtime.claims import Claim, ClaimLedger
from app.runtime.preemption.nominations import Nominations, Wanted

# How long after its admission a gang's members may take to reach the gate before
# those still short of it are nominated.
NOMINATE_AFTER_SECONDS = 0.5


class ClaimNominees:
    """The claims whose members are late, and what nominating them asks for."""

    def __init__(
        self,
        state: ClusterState,
        ledger: ClaimLedger,
        *,
        after: float = NOMINATE_AFTER_SECONDS,
    ) -> None:
        self._state = state
        self._ledger = ledger
        self._after = after
        # Gang key -> its claim, once some member was late: only these are walked.
        self._late: dict[str, Claim] = {}
        self._timers: dict[str, asyncio.TimerHandle] = {}
        # Writes what the sources want (Nominations.sync); set by `attach`.
        self._sync: Callable[[], None] = lambda: None
        ledger.listeners.append(self)

    def attach(self, nominations: Nominations) -> None:
        """Nominate through the plans' Nominations: one writer for every nomination."""
        nominations.add_source(self.wanted)
        self._sync = nominations.sync

    @property
    def late(self) -> list[str]:
        """The claiming gangs some member of which was late to the gate (/debug/gangs shows
        them as claims with lateMembersNominated)."""
        return sorted(self._late)

    def claim_made(self, key: str, claim: Claim) -> None:
        self._forget(key)
        loop = asyncio.get_running_loop()
        self._timers[key] = loop.call_later(self._after, self._check, key, claim)

    def claim_ended(self, key: str, claim: Claim) -> None:
        if self._forget(key):
            self._sync()

    def wanted(self) -> Wanted:
        """uid -> (member, promised node): the late claims' members not placed yet."""
        return {pod.uid: (pod, node) for c in self._late.values() for pod, node in self._short(c)}

    def _check(self, key: str, claim: Claim) -> None:
        """The claim's wait is over: if it still stands with a member short of the gate,
        its members are nominated."""
        self._timers.pop(key, None)
        if self._ledger.held.get(key) is not claim:
            return
        if next(self._short(claim), None) is not None:
            self._late[key] = claim
            claim.nominated_late = True
            self._sync()

    def _short(self, claim: Claim) -> Iterator[tuple[PodRecord, str]]:
        """The claim's members not at the gate nor bound, each with its promised node."""
        for pod_key, node in claim.plan.items():
            pod = self._state.pods.get(pod_key)
            if pod is not None and not pod.placed_node and pod.counts_as_member:
                yield pod, node

    def _forget(self, key: str) -> bool:
        """Drop the gang's timer and lateness; True if it was late (nominations to remove)."""
        timer = self._timers.pop(key, None)
        if timer is not None:
            timer.cancel()
        return self._late.pop(key, None) is not None
