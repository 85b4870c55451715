"""Gangs held in line (--hold-waiting-gangs): members out of kube-scheduler's queue until
their gang can be admitted as a whole.

Why: kube-scheduler retries a pod an extender turned away on every cluster event (its
"Extender" pseudo-plugin has no queueing hints, kubernetes/kubernetes#122019). With 1,000
gangs of 4 waiting, every bind made it retry 4,000 members, a filter call each: on a
2-CPU machine one pass took minutes, an admitted gang timed out in the permit gate before
kube-scheduler came back to its last member, and small gangs that fitted waited behind
the pass (BENCHMARKS.md, bench.deepline). A pod with a scheduling gate is not in
kube-scheduler's queue at all, and costs it nothing.

How: the webhook gives each member that cannot preempt the gate LINE_GATE
(app/core/marking.py). Here:

- a held gang whose minMember members are all there joins the line, as a gang the
  filter turned away does (it waits, and ages, from then), and the line is reconsidered;
- the line's wake-up (the arbiter's: the gangs in line admitted now, in line order)
  chooses it, and waking a chosen gang's held members removes their gate
  (app/runtime/wakeup.py): kube-scheduler then calls the filter, which admits the gang
  as it would any other. A gate cannot be put back, so a gang is chosen only once it fits
  in what kube-scheduler sees free (app/core/fit_now.py: pods leaving still hold their
  room, nominated pods theirs); one released onto room kube-scheduler gives to another
  was retried on every cluster event ahead of every lower-priority pod (issue 49's soak);
- a held gang whose members may preempt (priority above zero, preemptionPolicy not
  Never) and that the line does not admit is offered to the preemption planner, a few
  each sweep and each gang at most every few seconds (`preempting`, set by the server:
  app/runtime/preemption/unasked.py): kube-scheduler's dry run never tries a gated pod,
  so the extender starts its preemption. Once a plan lives (its victims named and
  going) the gang's members are released; a gang that cannot fit even with evictions
  stays held, costing kube-scheduler nothing (kept in its queue, such gangs were retried
  on every cluster event ahead of every lower-priority pod);
- the sweep, every second, releases what the line does not decide: a gang holding a
  claim or with a placed member (a member that was not held got it admitted: the rest
  must follow), a member another controller's gate holds too, a gang not in line
  GRACE_SECONDS after its first held member came (fewer than minMember members, its
  group object missing or invalid: the filter says why to its users), and every held
  member once holding is off (the flag turned off since, or Volcano queues decide
  admission: a queue's reclaim starts from the filter).
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from app.base.tasks import Periodic
from app.core.admission import wholeness
from app.core.clock import Clock, monotonic
from app.core.groups import GroupRef, PodGroupSpecError
from app.core.marking import LINE_GATE
from app.core.observer import GangObserver
from app.core.records import GroupNotFound, PodRecord
from app.core.state import ClusterState
from app.runtime.claims import ClaimLedger
from app.runtime.line import Line
from app.runtime.wakeup import SiblingWaker

log = logging.getLogger(__name__)

# How long a held gang may stay out of line before its members are released to the filter.
GRACE_SECONDS = 10.0
SWEEP_SECONDS = 1.0
# A release asked this long ago whose members are still held is asked again.
_RELEASE_AGAIN_SECONDS = 5.0
# A gang chosen this recently and still in line widens the next wake-up (it is set aside).
_CHOSEN_SECONDS = 30.0
# Where held pods that name no group we can read are noted (released at once).
_NO_GROUP = ""
# Groups listed by name in /debug/gangs.
_SHOWN = 50
# Held gangs that may preempt offered to the planner per sweep (each plan walks the nodes).
PREEMPTORS_PER_SWEEP = 4


@dataclass(frozen=True, slots=True)
class HoldPeers:
    """Whom the holds tell: the waker releases, the observer writes the Event, `reconsider`
    asks the arbiter to look at the line again."""

    waker: SiblingWaker
    observer: GangObserver
    reconsider: Callable[[], None]


class LineHolds:
    """Which gangs are held, when each joins the line, and when its members are released."""

    def __init__(
        self,
        state: ClusterState,
        line_and_claims: tuple[Line, ClaimLedger],
        peers: HoldPeers,
        *,
        enabled: bool,
        clock: Clock = monotonic,
    ) -> None:
        self._state = state
        self._line, self._ledger = line_and_claims
        self._waker = waker = peers.waker
        self._observer = peers.observer
        self._reconsider = peers.reconsider
        self._enabled = enabled
        self._clock = clock
        # group key -> pod key -> when it was first seen held.
        self._held: dict[str, dict[str, float]] = {}
        # group key -> when the line chose it (its members may go to kube-scheduler).
        self._chosen: dict[str, float] = {}
        # pod key -> when its release was last asked.
        self._asked: dict[str, float] = {}
        self._told: set[str] = set()
        # Held gangs whose members may preempt, in the order they are offered to the planner.
        self._preemptors: deque[str] = deque()
        self._preemptor_keys: set[str] = set()
        # group key -> True when its plan lives (its members may go); set by the server.
        self.preempting: Callable[[str], Awaitable[bool]] | None = None
        waker.release_held = self._woken
        self._loop = Periodic(
            self._sweep_step,
            SWEEP_SECONDS,
            name="line-holds",
            logger=log,
            failure="sweeping the held gangs failed",
        )

    @property
    def enabled(self) -> bool:
        """Gangs are held: the flag is on and no Volcano queue decides admission."""
        return self._enabled and self._line.queues is None

    def gangs_wait(self) -> bool:
        """--hold-waiting-gangs=auto: does a member created now get the line's gate? While
        gangs wait in line (or are held) its gang would most likely wait too; on an idle
        cluster it goes straight to kube-scheduler, without the release's API write."""
        return self.enabled and bool(self._line.waiting or self._held)

    @property
    def members(self) -> int:
        """Members held now."""
        return sum(len(pods) for pods in self._held.values())

    def start(self) -> None:
        self._loop.start()

    async def stop(self) -> None:
        await self._loop.stop()

    # ---- what the line and the waker ask -------------------------------------------------

    def may_release(self, group_key: str) -> bool:
        """May the gang's held members go to kube-scheduler now (the waker asks)?"""
        return (
            not self.enabled
            or group_key in self._chosen
            or group_key in self._ledger.held
            or any(p.placed_node for p in self._state.members(group_key))
        )

    def _woken(self, group_key: str, pods: list[PodRecord]) -> None:
        """The waker woke the gang: its held members go if it may go now."""
        if self.may_release(group_key):
            self._release(group_key, pods, self._clock())

    def chosen(self, keys: Sequence[str]) -> None:
        """The line admits these gangs now (in line order): their held members go (when
        woken), if the gang fits in what kube-scheduler sees free now (Line.fit_now); one
        that fits only once leaving pods are gone, or in room kept for a nominated pod,
        stays held until a later look."""
        now = self._clock()
        fit = set(self._line.fit_now(keys)) if any(k in self._held for k in keys) else set()
        for key in keys:
            if key in fit or key not in self._held:
                self._chosen.setdefault(key, now)

    def set_aside(self, now: float) -> int:
        """Gangs chosen lately and still in line: the wake-up looks that many further."""
        waiting = self._line.waiting
        return sum(
            1 for key, at in self._chosen.items() if key in waiting and now - at < _CHOSEN_SECONDS
        )

    # ---- the watch -----------------------------------------------------------------------

    def on_pod_change(self, old: PodRecord | None, new: PodRecord | None) -> None:
        """Note held members as they come and go; a held gang with all its members joins the
        line."""
        if not ((old is not None and old.held) or (new is not None and new.held)):
            return
        held = (
            new is not None and new.held and not (new.placed_node or new.deleting or new.terminal)
        )
        if old is not None and old.held and (new is None or not held or new.uid != old.uid):
            self._forget(old.group.key if old.group is not None else _NO_GROUP, old.key)
        if new is None or not held:
            return
        now = self._clock()
        if new.group is None:
            # Not a member by our reading of its labels: the filter says why, once released
            # (the sweep asks again while it stays held).
            self._held.setdefault(_NO_GROUP, {}).setdefault(new.key, now)
            self._release(_NO_GROUP, [new], now)
            return
        key = new.group.key
        if new.may_preempt and new.priority > 0 and key not in self._preemptor_keys:
            self._preemptor_keys.add(key)
            self._preemptors.append(key)
        self._held.setdefault(key, {}).setdefault(new.key, now)
        if self.may_release(key):
            # A gang admitted or running already (a member beyond minMember, one created
            # late): it follows its siblings at once.
            self._release(key, [new], now)
        else:
            self._join(key, new.group)

    def _forget(self, group_key: str, pod_key: str) -> None:
        pods = self._held.get(group_key)
        if pods is None:
            return
        pods.pop(pod_key, None)
        if not pods:
            del self._held[group_key]
            self._chosen.pop(group_key, None)
            self._told.discard(group_key)

    def _join(self, key: str, ref: GroupRef) -> None:
        """All its members are there: it waits in line from now, and the line is looked at."""
        if key in self._line.waiting or key in self._ledger.held:
            return
        try:
            spec = self._state.group_spec(ref)
        except (GroupNotFound, PodGroupSpecError):
            return  # the sweep releases it to the filter, which says why
        members = self._state.members(key)
        if wholeness(spec, len(members)).missing:
            return
        self._line.join(key, ref, self._clock())
        self._reconsider()
        if key not in self._told:
            self._told.add(key)
            held = sum(1 for p in members if p.held)
            self._observer.gang_held(
                key,
                f"gang {key} waits in line; its {held} member(s) are held out of "
                f"kube-scheduler's queue (scheduling gate {LINE_GATE}) and are released "
                "together as soon as the gang can be admitted as a whole, in line order; "
                f"`kubectl gang describe {key}` shows what it waits for",
            )

    # ---- the sweep -----------------------------------------------------------------------

    async def _sweep_step(self) -> None:
        self.sweep()
        await self.offer_preemptors()

    async def offer_preemptors(self) -> None:
        """Offer a few held gangs that may preempt to the planner (see the module docstring);
        release those whose plan lives."""
        queue, offered = self._preemptors, 0
        for _ in range(len(queue)):
            if offered >= PREEMPTORS_PER_SWEEP or self.preempting is None or not self.enabled:
                return
            key = queue.popleft()
            if key not in self._held:
                self._preemptor_keys.discard(key)
                continue  # its members are gone or released
            queue.append(key)
            if key not in self._line.waiting or key in self._chosen or key in self._ledger.held:
                continue  # not whole yet, or the line decides it
            offered += 1
            if await self.preempting(key):
                self._chosen[key] = now = self._clock()
                pods = self._state.pods
                held = [p for k in self._held.get(key, ()) if (p := pods.get(k)) is not None]
                self._release(key, [p for p in held if p.held and not p.gated], now)

    def sweep(self) -> None:
        """Release what the line does not decide (see the module docstring)."""
        now = self._clock()
        self._chosen = {k: t for k, t in self._chosen.items() if now - t < 2 * _CHOSEN_SECONDS}
        self._asked = {k: t for k, t in self._asked.items() if now - t < _RELEASE_AGAIN_SECONDS}
        pods_by_key, waiting, claims = self._state.pods, self._line.waiting, self._ledger.held
        enabled = self.enabled
        for key, pods in list(self._held.items()):
            if enabled and key in waiting and key not in self._chosen and key not in claims:
                continue  # it waits in line: the line's look releases it (10,000 cost nothing)
            held = [
                p
                for k in pods
                if (p := pods_by_key.get(k)) is not None and p.held and not p.placed_node
            ]
            # Another controller's gate too (no member yet), or no group: not ours to hold.
            self._release(key, [p for p in held if p.gated or key == _NO_GROUP], now)
            members = [p for p in held if not p.gated and key != _NO_GROUP]
            if not members:
                continue
            if self.may_release(key):
                self._release(key, members, now)
            elif key not in self._line.waiting and now - min(pods.values()) >= GRACE_SECONDS:
                ref = members[0].group
                if ref is not None:
                    self._join(key, ref)
                if key not in self._line.waiting:
                    self._chosen[key] = now  # the filter says why it cannot wait in line
                    self._release(key, members, now)

    def _release(self, key: str, pods: list[PodRecord], now: float) -> None:
        """Remove the gate of those `pods` whose release was not asked a moment ago."""
        due = [p for p in pods if p.key not in self._asked]
        for pod in due:
            self._asked[pod.key] = now
        self._waker.release(key, due)

    def snapshot(self) -> dict[str, Any]:
        """For /debug/gangs: how many members are held, and in which gangs."""
        groups = sorted(self._held)
        return {
            "enabled": self.enabled,
            "members": self.members,
            "groups": {k: len(self._held[k]) for k in groups[:_SHOWN]},
            "groupCount": len(groups),
        }
