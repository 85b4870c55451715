"""What the permit gate is built from: its collaborators and its policy, grouped."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Protocol

from app.core.clock import Clock, monotonic
from app.core.observer import GangObserver, NullObserver
from app.runtime.wakeup import SiblingWaker

# A gate-held member that kube-scheduler chose as a preemption victim is
# answered only once its pod is deleted (or after VICTIM_HOLD_SECONDS, if the
# scheduler picked another candidate), and then VICTIM_ANSWER_DELAY_SECONDS
# later (app/runtime/preemption/held_victims.py says why).
VICTIM_HOLD_SECONDS = 5.0
VICTIM_ANSWER_DELAY_SECONDS = 0.5


class PartialBindPolicy(enum.StrEnum):
    """What the gate does when some bindings of an admitted wave fail (--on-partial-bind).

    DELETE_BOUND deletes the members this admission bound, so their
    controllers recreate them and the gang is retried whole; LEAVE keeps them
    bound and lets the failed members join them when kube-scheduler retries.
    Either way it applies only when the gang is left below minMember bound.
    """

    DELETE_BOUND = "delete-bound"
    LEAVE = "leave"


class Binder(Protocol):
    async def bind(self, namespace: str, name: str, uid: str, node: str) -> None:
        """Create the pods/binding; raise ApiError on failure."""


class VictimCheck(Protocol):
    def is_victim(self, uid: str) -> bool:
        """Was this pod handed to kube-scheduler as a preemption victim lately?"""
        ...


class PodDeleter(Protocol):
    async def evict_pod(self, namespace: str, name: str, uid: str) -> None:
        """Delete the pod (uid-guarded); raise ApiError on failure."""


@dataclass(frozen=True, slots=True)
class GatePolicy:
    partial_bind: PartialBindPolicy = PartialBindPolicy.DELETE_BOUND
    victim_hold_seconds: float = VICTIM_HOLD_SECONDS
    victim_answer_delay_seconds: float = VICTIM_ANSWER_DELAY_SECONDS


@dataclass(slots=True)
class GateLinks:
    """The gate's optional collaborators; without them it neither wakes, reports nor deletes."""

    # Brings members parked in kube-scheduler's unschedulable queue back to the gate.
    waker: SiblingWaker | None = None
    observer: GangObserver = field(default_factory=NullObserver)
    # Deletes the members of a partly bound gang (--on-partial-bind=delete-bound).
    deleter: PodDeleter | None = None
    # Which pods the preempt verb handed to kube-scheduler as victims (runtime/preemption.py).
    victims: VictimCheck | None = None
    clock: Clock = monotonic
