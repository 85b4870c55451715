"""Gate-held members that kube-scheduler chose as preemption victims: answered late, on purpose.

Such a member is answered only once its pod is deleted (or after the hold,
if the scheduler picked another candidate), and then a moment later.
kube-scheduler retries the preemptor only when the victim's deletion frees
an *assumed* pod: a victim answered (and so forgotten) before its deletion
arrives leaves the preemptor parked for minutes (seen in the
scheduler-plugins integration case "mid pg1 and 3 high regular pods").
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from app.core.records import PodRecord
from app.runtime.gate_settings import GatePolicy, VictimCheck

if TYPE_CHECKING:
    from app.runtime.waiting_room import Waiter

log = logging.getLogger(__name__)


class HeldVictims:
    def __init__(
        self,
        check: VictimCheck | None,
        policy: GatePolicy,
        release: Callable[[Waiter, str], None],
    ) -> None:
        # Which pods the preempt verb handed to kube-scheduler as victims (runtime/preemption.py).
        self._check = check
        self._policy = policy
        self._release = release
        # pod key -> a released victim's waiter and its message, not answered yet.
        self._held: dict[str, tuple[Waiter, str]] = {}

    def is_victim(self, waiter: Waiter) -> bool:
        return self._check is not None and self._check.is_victim(waiter.uid)

    def hold(self, waiter: Waiter, message: str, *, gone: bool) -> None:
        """Answer the victim a moment after its pod is `gone`, else when the hold runs out."""
        policy = self._policy
        seconds = policy.victim_answer_delay_seconds if gone else policy.victim_hold_seconds
        self._hold(waiter, message, seconds)

    def answer_now(self, pod_key: str) -> None:
        """The pod asks to be bound again: its held answer is given at once."""
        held = self._held.pop(pod_key, None)
        if held is not None:
            self._release(*held)

    def on_pod_change(self, old: PodRecord | None, new: PodRecord | None) -> None:
        pod = old or new
        if pod is None:
            return
        held = self._held.get(pod.key)
        if held is not None and (new is None or new.deleting or new.uid != held[0].uid):
            # Gone: answer once kube-scheduler has seen the deletion of its assumed pod.
            self._hold(held[0], held[1], self._policy.victim_answer_delay_seconds)

    def release_all(self, reason: str) -> None:
        for waiter, _ in self._held.values():
            self._release(waiter, reason)
        self._held.clear()

    def _hold(self, waiter: Waiter, message: str, seconds: float) -> None:
        if waiter.timer is not None:
            waiter.timer.cancel()
        log.debug(
            "preemption victim answered in %gs",
            seconds,
            extra={"pod": waiter.pod_key, "node": waiter.node, "verb": "bind"},
        )
        self._held[waiter.pod_key] = (waiter, message)
        waiter.timer = asyncio.get_running_loop().call_later(seconds, self._answer, waiter, message)

    def _answer(self, waiter: Waiter, message: str) -> None:
        if self._held.get(waiter.pod_key, (None, ""))[0] is waiter:
            del self._held[waiter.pod_key]
            self._release(waiter, message)
