"""Answers already given: a gang turned away hears its verdict again while nothing it weighed moved.

kube-scheduler retries every pending member on cluster events (a node
updated, a pod added anywhere), and each retry of a gang that waits would
pack the whole line again: with thousands of gangs in line that is most of
the filter's time, spent to give the same answer. A verdict is reused while
all of these hold:

- the arbiter's revision is the same (capacity, claims, the line's members,
  nodes, queues: app/runtime/revision.py);
- no group in line, holding a claim, or the gang itself changed (a member, its
  PodGroup: the state's change stamps, app/core/changes.py);
- no denial was added or dropped (a denied gang in line fits nowhere, or is left out);
- the gang is the same (its members, their requests and priority: the pod
  being filtered may be one the watch has not delivered yet);
- time alone has not changed the answer: no gang weighed has aged since, no
  denial has expired, and a verdict that started a reclaim is redone within
  the second (the reclaimer paces itself by the clock).

Anything else changing the answer would be a change one of these misses:
exactness comes first, so each is conservative (a change of any gang in line
forgets the verdict, whether it mattered or not).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from app.core.admission import Admission, Verdict
from app.core.contention import Gang
from app.core.state import ClusterState
from app.runtime.claims import ClaimLedger
from app.runtime.line import Line
from app.runtime.revision import Revision

# Verdicts kept at most (all are dropped past it: gangs come and go).
_KEPT_AT_MOST = 10_000


@dataclass(slots=True)
class _Answer:
    version: int
    denials: int
    # The state's change stamp the answer was last found current at.
    stamp: int
    gang: Gang
    # On the arbiter's clock: from then on time alone may change the answer.
    until: float
    verdict: Verdict


class Answers:
    """The last verdict per gang turned away, and whether it still holds."""

    def __init__(
        self,
        state: ClusterState,
        revision: Revision,
        admission: Admission,
        line: Line,
        ledger: ClaimLedger,
        aging_seconds: float,
    ) -> None:
        self._state = state
        self._aging_seconds = aging_seconds
        self._revision = revision
        self._admission = admission
        self._line = line
        # The gangs in line and those holding a claim, by group key: a change to one
        # of their groups may change any answer.
        self._watched = (line.waiting, ledger.held)
        self._answers: dict[str, _Answer] = {}
        # How many verdicts were reused, and how many were decided and kept (tests, bench).
        self.reused = 0
        self.kept = 0

    def forget(self) -> None:
        """Drop every verdict kept: the next call of each gang is decided afresh."""
        self._answers.clear()

    def recall(self, gang: Gang, now: float) -> Verdict | None:
        """The verdict given to `gang` last, if nothing it weighed changed since (else None)."""
        answer = self._answers.get(gang.key)
        if answer is None:
            return None
        if (
            answer.version != self._revision.version
            or answer.denials != self._admission.denials_version
            or now >= answer.until
            or answer.gang != gang
            or not self._unchanged_since(answer, gang.key)
        ):
            del self._answers[gang.key]
            return None
        self.reused += 1
        return answer.verdict

    def _unchanged_since(self, answer: _Answer, key: str) -> bool:
        """No group that may weigh in changed since the answer was last found current."""
        stamp, changed = self._state.groups_changed_since(answer.stamp)
        if changed is None:
            return False
        for name in changed:
            if name == key or any(name in watched for watched in self._watched):
                return False
        answer.stamp = stamp
        return True

    def keep(
        self, gang: Gang, since: float, verdict: Verdict, now: float, *, paced: bool = False
    ) -> None:
        """Remember the verdict just decided for `gang`.

        `since`: when the gang joined the line (what the next call's gang will say).
        `paced`: the queues' reclaimer was asked (what it says depends on the clock):
        the verdict is good for this second only.
        """
        gang = replace(gang, waiting_since=since)
        until = min(
            self._first_aging(now),
            now + self._admission.next_expiry(),
            math.floor(now) + 1 if paced else math.inf,
        )
        if until <= now:
            return
        if len(self._answers) >= _KEPT_AT_MOST:
            self._answers.clear()
        self._answers[gang.key] = _Answer(
            self._revision.version,
            self._admission.denials_version,
            self._state.change_stamp,
            gang,
            until,
            verdict,
        )
        self.kept += 1

    def _first_aging(self, now: float) -> float:
        """The first moment after `now` a gang in line ages (inf: none will).

        Every gang in line, the one just turned away among them: a superset of
        the gangs a decision weighs (some are left out of it, their ageing then
        moves nothing), so the verdict is never kept past a change of order.
        """
        aging = self._aging_seconds
        return min(
            (w.since + aging for w in self._line.waiting.values() if now - w.since < aging),
            default=math.inf,
        )
