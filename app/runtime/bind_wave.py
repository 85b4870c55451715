"""The bind wave: once a gang is whole, every waiting member is bound at once.

Waves of one gang may overlap (members arriving while a wave binds open the
next), each counting the others as present; the admission's outcome is known
when the last binding in flight returns, and is settled then.
"""

from __future__ import annotations

import asyncio
import logging

from app.base.metrics import Metrics
from app.base.tasks import TaskSet
from app.core.observer import GangObserver, MemberRef
from app.kube.errors import ApiError
from app.runtime.gate_settings import Binder
from app.runtime.partial_bind import PartialBind
from app.runtime.waiting_room import (
    GangWait,
    SettleListener,
    SettleOutcome,
    Waiter,
    WaitingRoom,
    member_ref,
)

log = logging.getLogger(__name__)


class BindWaves:
    def __init__(
        self,
        room: WaitingRoom,
        binder: Binder,
        metrics: Metrics,
        observer: GangObserver,
        partial: PartialBind,
        settled: SettleListener,
    ) -> None:
        self._room = room
        self._binder = binder
        self._metrics = metrics
        self._observer = observer
        self._partial = partial
        self._settled = settled
        self._waves = TaskSet()

    async def drain(self) -> None:
        await self._waves.drain()

    def open(self, group_key: str) -> bool:
        """Bind the waiting wave if the gang is whole; True if it was."""
        group = self._room.groups.get(group_key)
        if group is None or not group.waiting or not self._room.permit(group).whole:
            return False
        wave = list(group.waiting.values())
        group.waiting.clear()
        for waiter in wave:
            if waiter.timer is not None:
                waiter.timer.cancel()
            group.binding[waiter.pod_key] = waiter.task
        log.info(
            "gang admitted: binding %d waiting members",
            len(wave),
            extra={"podgroup": group_key, "verb": "bind"},
        )
        self._waves.spawn(self._bind(group_key, group, wave))
        return True

    async def _bind(self, group_key: str, group: GangWait, wave: list[Waiter]) -> None:
        results = await asyncio.gather(
            *(self._binder.bind(w.namespace, w.name, w.uid, w.node) for w in wave),
            return_exceptions=True,
        )
        bound: list[MemberRef] = []
        for waiter, result in zip(wave, results, strict=True):
            group.binding.pop(waiter.pod_key, None)
            self._room.finish_wait(waiter)
            if isinstance(result, BaseException):
                self._failed(group_key, group, waiter, result)
            else:
                self._room.state.assume_bound(waiter.pod_key, waiter.node)
                bound.append(member_ref(waiter, self._room.now()))
                # The binding exists: kube-scheduler must not retry it, even if
                # the pod is deleted again by a roll-back.
                if not waiter.future.done():
                    waiter.future.set_result(None)
        group.episode_bound.extend(bound)
        if bound:
            self._observer.gang_admitted(group_key, bound)
            self._settled(group_key, SettleOutcome.BOUND)
        elif not group.binding:
            # Not one binding of the wave went through (its pods deleted while they
            # were admitted, say): the gang's claim ends now. No filter call may come
            # to prune it, once the gang is gone (found by the soak, issue 49).
            self._settled(group_key, SettleOutcome.RELEASED)
        if not group.binding:
            await self._partial.settle(group_key, group)
        if group.empty:
            self._room.groups.pop(group_key, None)
        else:
            # Members that arrived while this wave was binding may be complete now.
            self.open(group_key)

    def _failed(
        self, group_key: str, group: GangWait, waiter: Waiter, error: BaseException
    ) -> None:
        group.episode_failed.append((waiter, error))
        self._metrics.bind_errors.labels(
            error.reason if isinstance(error, ApiError) else "internal"
        ).inc()
        self._room.state.unreserve(waiter.pod_key)
        log.warning(
            "binding failed after the gang was admitted: %s",
            error,
            extra={"pod": waiter.pod_key, "podgroup": group_key, "node": waiter.node},
        )
