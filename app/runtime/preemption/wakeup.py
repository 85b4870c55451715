"""Waking the preemptors that wait for room once their victims are gone.

A gang member answered "wait" sits in kube-scheduler's unschedulable queue
until something touches it. A plain preemptor whose victim kube-scheduler
only held (never bound) is not retried by that victim's deletion either.
"""

from __future__ import annotations

import asyncio
import contextlib

from app.core.state import ClusterState
from app.runtime.wakeup import SiblingWaker

# After a held (never bound) victim is gone, its preemptor is woken again this
# much later: kube-scheduler forgets the assumed victim only once it handled
# the bind verb's answer, and a preemptor woken before that fails once more.
PREEMPTOR_RETRY_SECONDS = 2.0


class PreemptorWakeup:
    def __init__(self, state: ClusterState, waker: SiblingWaker | None) -> None:
        self._state = state
        self._waker = waker

    def room_freed(self, group_key: str) -> None:
        """Every victim of the gang's plan is gone: wake its members waiting for the room."""
        if self._waker is not None:
            self._waker.wake(group_key)

    def held_victim_gone(self) -> None:
        """Wake the nominated preemptors now, and again once kube-scheduler forgot the victim."""
        if self._waker is None:
            return
        nominated = [p for p in self._state.nominated.values() if not p.node_name]
        self._waker.wake_pods("preemptor-wakeup", nominated)
        with contextlib.suppress(RuntimeError):
            asyncio.get_running_loop().call_later(
                PREEMPTOR_RETRY_SECONDS, self._wake_again, {p.uid for p in nominated}
            )

    def _wake_again(self, uids: set[str]) -> None:
        if self._waker is None:
            return
        still = [p for p in self._state.nominated.values() if p.uid in uids and not p.node_name]
        self._waker.wake_pods("preemptor-wakeup", still)
