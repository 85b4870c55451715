"""A preemptor in no gang: kube-scheduler's candidates, minus those that would break a running gang.

kube-scheduler orders the candidates that survive; the victims on them are
remembered so the gate and the evictor know whom they made room for.
"""

from __future__ import annotations

import logging

from app.core.preemption.victims import Preemptor, VictimCandidate, VictimPolicy, select_victims
from app.core.state import ClusterState
from app.runtime.preemption.victim_memory import VictimMemory

log = logging.getLogger(__name__)


class PlainPreemption:
    def __init__(self, state: ClusterState, policy: VictimPolicy, memory: VictimMemory) -> None:
        self._state = state
        self._policy = policy
        self._memory = memory

    def candidates(
        self, preemptor: Preemptor, candidates: list[VictimCandidate]
    ) -> list[VictimCandidate]:
        selection = select_victims(preemptor, candidates, self._state, self._policy)
        for node, why in selection.dropped.items():
            log.info(
                "candidate dropped: %s",
                why,
                extra={"pod": preemptor.key, "node": node, "verb": "preempt"},
            )
        for candidate in selection.candidates:
            self._memory.note(candidate.victim_uids, preemptor.key)
        return selection.candidates
