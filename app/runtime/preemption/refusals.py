"""Gangs refused preemption lately, asked again once when the extender's view changes.

A refusal is made on the extender's view of the cluster, which may lag
kube-scheduler's: pods already gone still in view hold the room the gang
needs, or a member or the PodGroup kube-scheduler has is not in view yet.
kube-scheduler, whose view was right, then parks the gang's members until an
event frees room, and the events it would wait for it has seen already: the
gang would wait for its 5-minute flush. So the extender's own preemption
(app/runtime/preemption/unasked.py) asks again for these gangs when its view
frees room or gains a member. Each refusal is worth one more look, not a
standing retry: take() hands a gang out once, and a refusal is forgotten
after REFUSED_SECONDS (a lagging watch catches up within seconds; an older
refusal was read on today's view).
"""

from __future__ import annotations

from cachetools import TTLCache

from app.core.clock import Clock, monotonic

__all__ = ["REFUSED_SECONDS", "Refusals"]

REFUSED_SECONDS = 60.0
_KEPT = 10_000


class Refusals:
    def __init__(self, clock: Clock = monotonic) -> None:
        self._refused: TTLCache[str, None] = TTLCache(_KEPT, REFUSED_SECONDS, timer=clock)

    def remember(self, group_key: str) -> None:
        """The gang was refused on the extender's view of now."""
        self._refused[group_key] = None

    def take(self, group_key: str | None = None) -> list[str]:
        """The gangs refused lately (or only `group_key`, if it was), each handed out once."""
        if group_key is not None:
            if group_key not in self._refused:
                return []
            del self._refused[group_key]
            return [group_key]
        keys = list(self._refused.keys())
        self._refused.clear()
        return keys
