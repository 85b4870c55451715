"""Whom each victim handed to kube-scheduler made room for, remembered for a while.

The gate holds a waiting pod that is a victim instead of binding it, and the
evictor's Events name the gang or pod a victim made room for.
"""

from __future__ import annotations

from collections.abc import Sequence

from app.core.clock import Clock

# How long a pod handed to kube-scheduler as a victim is remembered (gate hold, Events).
VICTIM_MEMORY_SECONDS = 30.0
# Past this many remembered victims, the ones older than the memory are forgotten.
_PRUNE_ABOVE = 10_000


class VictimMemory:
    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        # victim uid -> (whom it makes room for: a gang or pod key, when handed).
        self._victims: dict[str, tuple[str, float]] = {}

    def note(self, uids: Sequence[str], beneficiary: str) -> None:
        now = self._clock()
        if len(self._victims) > _PRUNE_ABOVE:
            cutoff = now - VICTIM_MEMORY_SECONDS
            self._victims = {u: v for u, v in self._victims.items() if v[1] >= cutoff}
        for uid in uids:
            self._victims[uid] = (beneficiary, now)

    def is_victim(self, uid: str) -> bool:
        noted = self._victims.get(uid)
        return noted is not None and self._clock() - noted[1] < VICTIM_MEMORY_SECONDS

    def beneficiary(self, uid: str) -> str | None:
        noted = self._victims.get(uid)
        return noted[0] if noted is not None else None
