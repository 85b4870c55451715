"""Gangs whose members become plain pods once their wait has run out. Pure.

YuniKorn's `gangSchedulingStyle: Soft` (its default, app/core/yunikorn.py):
a gang's clock starts when its first member holds room (in YuniKorn, when its
first placeholder is allocated); once `placeholderTimeoutInSeconds` has passed
and the gang is still not bound, YuniKorn gives the gang up and schedules its
pods as ordinary pods. Here:

- the clock starts when the gang's first member enters the permit gate
  (`start`), and runs across the gate's retries: one wait in the gate is
  capped by --max-permit-waiting-time-seconds (a member waits inside
  kube-scheduler's bind call), a YuniKorn timeout may be longer;
- it stops when a wave of the gang is bound (`stop`): the gang ran;
- once it is `due` when a gate wait runs out, the gang `falls back`: from then
  on the verbs treat its members as plain pods (no gate, no whole-gang check);
- that lasts until the gang has no pods left (`forget`): a new run under the
  same application id is a gang again.
"""

from __future__ import annotations

from app.core.clock import Clock, monotonic

# A timer may fire a hair before its time (asyncio's clock resolution).
_SLACK_SECONDS = 0.05


class SoftTimeouts:
    """The clocks of the gangs that fall back to plain pods, and those that did."""

    def __init__(self, clock: Clock = monotonic) -> None:
        self._clock = clock
        self._started: dict[str, float] = {}
        self._plain: dict[str, float] = {}

    def start(self, key: str) -> None:
        """A member entered the gate: the gang's clock runs from its first member on."""
        self._started.setdefault(key, self._clock())

    def stop(self, key: str) -> None:
        """The gang was bound: it no longer falls back."""
        self._started.pop(key, None)

    def due(self, key: str, seconds: float) -> bool:
        """Has the gang waited `seconds` since its clock started?"""
        started = self._started.get(key)
        return started is not None and self._clock() - started + _SLACK_SECONDS >= seconds

    def fall_back(self, key: str) -> None:
        """From now on the gang's members are plain pods."""
        self._started.pop(key, None)
        self._plain[key] = self._clock()

    def is_plain(self, key: str) -> bool:
        return key in self._plain

    def tracks(self, key: str) -> bool:
        """Is there anything to forget about this gang?"""
        return key in self._plain or key in self._started

    def forget(self, key: str) -> None:
        """The gang has no pods left."""
        self._started.pop(key, None)
        self._plain.pop(key, None)
