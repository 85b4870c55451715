"""A preemptor in no gang: kube-scheduler's candidates, minus those that would break a
running gang or take the room a gang's preemption plan was promised.

kube-scheduler orders the candidates that survive; the victims on them are
remembered so the gate and the evictor know whom they made room for. Victims a
live plan is evicting already are not named again (app/core/preemption/victims.py
`_judge`: kube-scheduler would not retry the preemptor as they go).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from app.core.preemption.victim_pool import node_victims
from app.core.preemption.victims import Preemptor, VictimCandidate, VictimPolicy, select_victims
from app.core.state import ClusterState
from app.runtime.preemption.kept_waiters import KeptRoomWaiters
from app.runtime.preemption.plan_book import PlanBook
from app.runtime.preemption.room import PreemptionRoom
from app.runtime.preemption.victim_memory import VictimMemory

log = logging.getLogger(__name__)


class PlainPreemption:
    def __init__(
        self,
        state: ClusterState,
        policy: VictimPolicy,
        memory: VictimMemory,
        book: PlanBook,
        room: PreemptionRoom,
    ) -> None:
        self._state = state
        self._policy = policy
        self._memory = memory
        self._book = book
        self._room = room
        # Refused for a live plan's kept room: retried when a plan ends.
        self.waiters = KeptRoomWaiters(state)
        book.end_listeners.append(self.waiters.plans_ended)

    def candidates(
        self,
        preemptor: Preemptor,
        requests: Mapping[str, int],
        candidates: list[VictimCandidate],
    ) -> list[VictimCandidate]:
        going = {uid for plan in self._book if plan.live for uid in plan.handed}
        selection = select_victims(preemptor, candidates, self._state, self._policy, going)
        dropped = selection.dropped
        chosen = selection.candidates
        for candidate in (c for c in candidates if c.node in selection.for_gangs):
            # Other pods there may make the room instead (victim_pool.node_victims).
            victims = node_victims(
                self._state, self._policy, preemptor, requests, candidate.node, going
            )
            if victims is not None:
                del dropped[candidate.node]
                pdb = candidate.num_pdb_violations
                chosen.append(VictimCandidate(candidate.node, victims, pdb))
                log.info(
                    "candidate offered with other victims (%d) than kube-scheduler's, which "
                    "a running gang could not spare",
                    len(victims),
                    extra={"pod": preemptor.key, "node": candidate.node, "verb": "preempt"},
                )
        if self._book.plans:
            kept = self._room.kept_after(requests, preemptor.priority, chosen)
            dropped |= kept
            chosen = [c for c in chosen if c.node not in kept]
            for node in kept:
                self.waiters.refused(preemptor.uid, node)
        for node, why in dropped.items():
            log.info(
                "candidate dropped: %s",
                why,
                extra={"pod": preemptor.key, "node": node, "verb": "preempt"},
            )
        for candidate in chosen:
            self._memory.note(candidate.victim_uids, preemptor.key)
        return chosen
