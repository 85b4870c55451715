"""Gangs refused preemption lately, asked again when the extender's view changes.

A refusal is made on the extender's view of the cluster, which may lag
kube-scheduler's: pods already gone still in view hold the room the gang
needs, or a member or the PodGroup kube-scheduler has is not in view yet.
kube-scheduler, whose view was right, then parks the gang's members until an
event frees room, and the events it would wait for it has seen already: the
gang would wait for its 5-minute flush. So the extender's own preemption
(app/runtime/preemption/unasked.py) asks again for these gangs when its view
frees room or gains a member.

A lagging view catches up within seconds, so a refusal is looked at again
only within REFUSED_SECONDS of the preempt verb's refusal (remember()). A
look that is refused again (renew()) keeps that window: a gang that cannot
preempt is not planned again each time a pod leaves, for ever. A new
refusal by the verb (kube-scheduler asked again) opens a new window.
"""

from __future__ import annotations

from app.core.clock import Clock, monotonic

__all__ = ["REFUSED_SECONDS", "Refusals"]

REFUSED_SECONDS = 60.0
_PRUNE_AT = 1024


class Refusals:
    def __init__(self, clock: Clock = monotonic) -> None:
        self._clock = clock
        # group -> when the verb refused it (the window's start), while the window is open.
        self._since: dict[str, float] = {}
        # Those to be asked again at the next change of the view (take()).
        self._open: set[str] = set()
        self._prune_at = _PRUNE_AT

    def remember(self, group_key: str) -> None:
        """The preempt verb refused the gang: ask again within a new window."""
        now = self._clock()
        if len(self._since) >= self._prune_at:
            # Closed windows forgotten; pruned again once the open ones have doubled.
            self._since = {k: t for k, t in self._since.items() if now - t < REFUSED_SECONDS}
            self._prune_at = max(_PRUNE_AT, 2 * len(self._since))
        self._since[group_key] = now
        self._open.add(group_key)

    def renew(self, group_key: str) -> None:
        """A look at a refused gang was refused again: once more, inside the first window."""
        since = self._since.get(group_key)
        if since is not None and self._clock() - since < REFUSED_SECONDS:
            self._open.add(group_key)

    def take(self, group_key: str | None = None) -> list[str]:
        """The gangs to ask again (all, or `group_key` if it is one), each handed out once."""
        if group_key is not None:
            if group_key not in self._open:
                return []
            self._open.discard(group_key)
            keys = [group_key]
        else:
            keys, self._open = list(self._open), set()
        now = self._clock()
        return [
            k for k in keys if now - self._since.get(k, now - REFUSED_SECONDS) < REFUSED_SECONDS
        ]
