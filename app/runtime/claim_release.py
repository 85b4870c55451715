"""Ending a claim early: a gang gives way to a higher-priority one, or fails fast.

Either way the members the gate holds for it are released, it goes back in
line keeping its age, and the messages our filter and gate gave its pods
are remembered: a PodScheduled condition quoting one of them later is ours,
not kube-scheduler finding no node. A claim the gate settles (bound or
released) ends here too (`settled`).
"""

from __future__ import annotations

import logging

from cachetools import TTLCache

from app.core.admission import Admission, DenyReason
from app.core.clock import Clock
from app.core.observer import MemberRef
from app.core.records import PodRecord
from app.runtime.arbiter_setup import ArbiterPeers
from app.runtime.claims import Claim, ClaimLedger
from app.runtime.gate import PermitGate
from app.runtime.line import Line

log = logging.getLogger(__name__)

# In kube-scheduler's FitError when its preemption found victims for the pod.
_PREEMPTING = "preemption: found a potential placement"


class ClaimRelease:
    """Releases claiming gangs that must give way or that kube-scheduler found no node for."""

    def __init__(
        self,
        ledger: ClaimLedger,
        line: Line,
        gate: PermitGate,
        admission: Admission,
        peers: ArbiterPeers,
        clock: Clock,
    ) -> None:
        self._ledger = ledger
        self._line = line
        self._gate = gate
        self._admission = admission
        self._peers = peers
        self._clock = clock
        # pod uid -> recent messages our filter or gate gave it: its PodScheduled
        # condition quoting one of them is not a capacity failure.
        self._ours: TTLCache[str, tuple[str, ...]] = TTLCache(100_000, 300, timer=clock)

    def note_rejection(self, uid: str, message: str) -> None:
        """Our filter turned this pod away with `message` (not a capacity failure)."""
        if uid:
            self._ours[uid] = ((self._ours.get(uid) or ()) + (message,))[-4:]

    def settled(self, key: str, released: bool) -> bool:
        """The gate bound or `released` the gang's wave: its claim ends, and released, the gang
        goes back in line keeping its age. Unless its members are plain pods now (YuniKorn's
        Soft style, its timeout run out): no member asks for it any more, and aged it would
        hold back every gang behind it, so it leaves the line (True: the line changed)."""
        claim = self._ledger.end(key)
        if self._admission.soft.is_plain(key):
            return self._line.leave(key) is not None
        if released and claim is not None:
            self._line.rejoin(key, claim, failed=True)
        return False

    def give_way(self, key: str, winner: str, priority: int) -> None:
        """A gang of higher priority needs the capacity this claim holds."""
        claim = self._ledger.end(key)
        if claim is None:
            return
        message = (
            f"gang {key} (priority {claim.priority}) gave way to gang {winner} (priority "
            f"{priority}), which became complete and needs the capacity it held; its "
            f"reserved members were released and it waits behind {winner}"
        )
        log.info(message, extra={"podgroup": key, "verb": "filter"})
        released = self._release(key, claim, message, failed=False)
        self._peers.observer.gang_released(key, released, message)

    def fail_fast(self, old: PodRecord, new: PodRecord) -> bool:
        """A claiming gang's member found no node: release the whole gang now. True: it was."""
        assert new.group is not None
        claim = self._ledger.held.get(new.group.key)
        message = new.unschedulable_message
        if (
            claim is None
            or new.placed_node
            or not message
            or message == old.unschedulable_message
            or message == claim.baseline.get(new.key)
            or any(ours in message for ours in self._ours.get(new.uid) or ())
            # kube-scheduler is evicting pods to make room for it: it will be placed.
            or (new.nominated_node and not _ours(claim, new))
            or _PREEMPTING in message
            or self._clock() < claim.released_others_until
        ):
            return False
        self._fail(new.group.key, claim, new, message)
        return True

    def _fail(self, key: str, claim: Claim, pod: PodRecord, why: str) -> None:
        self._ledger.end(key)
        ttl = self._admission.denied_ttl_seconds
        message = (
            f"gang {key} released its reservations at once: member {pod.name} found no node "
            f"({why}); the whole gang is retried in {ttl:g}s"
        )
        log.info(message, extra={"podgroup": key, "pod": pod.key, "reason": DenyReason.CAPACITY})
        released = self._release(key, claim, message, failed=True)
        self._admission.deny(key, DenyReason.CAPACITY, message)
        self._peers.observer.gang_released(key, released, message)
        if self._peers.waker is not None:
            self._peers.waker.wake_after(key, ttl + 0.1)

    def _release(self, key: str, claim: Claim, message: str, *, failed: bool) -> list[MemberRef]:
        """Back in line (`failed`: its attempt failed, see Line.rejoin); the members the gate
        holds are let go, with `message` as ours."""
        self._line.rejoin(key, claim, failed=failed)
        released = self._gate.release_group(key, message)
        for member in released:
            self.note_rejection(member.uid, message)
        return released


def _ours(claim: Claim, pod: PodRecord) -> bool:
    """Is the pod's nomination the one the extender wrote for its late claim?"""
    return claim.nominated_late and pod.nominated_node == claim.plan.get(pod.key)
