"""Plumbing for queues: the Queue objects we watch, and each queue's share at this moment.

The arbiter (app/runtime/arbiter.py) asks `assess()` on a gang's filter call:
what every queue holds (placed members of its gangs, plus what admitted gangs
were promised and have not placed yet), what its gangs in line ask for
(both tallied by app/runtime/queues/tally.py), and so what it deserves
(app/core/queues.py). The answer says whether the gang may be admitted now,
which gangs in line may, and the views reclaim works from.
Queue objects arrive through a reflector (app/server.py wires it); with none
at all `active` is False and the arbiter never calls here.

No I/O: the reflector feeds `replace`/`upsert`/`delete`, metrics are set in
memory.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from app.base.metrics import Metrics
from app.core.clock import Clock, monotonic
from app.core.contention import Gang, Holder
from app.core.queues import (
    DEFAULT_QUEUE,
    QueueSpec,
    QueueSpecError,
    QueueView,
    Running,
    deserved_shares,
    dims,
    dominant_share,
    queue_from,
)
from app.core.records import PodRecord
from app.core.resources import Resources, add, format_resources
from app.core.state import ClusterState
from app.runtime.queues.queue_lines import Apart, in_turn
from app.runtime.queues.tally import QueueTally
from app.runtime.queues.verdicts import LineVerdicts, request_of

log = logging.getLogger(__name__)

# Metrics are set at most this often: a storm of filter calls costs one update.
_PUBLISH_SECONDS = 1.0


@dataclass(slots=True)
class Assessment:
    """The queues at one filter call: the candidate's answer and the line it may join."""

    views: dict[str, QueueView]
    capacity: Resources
    # Why the candidate waits (None: its queue lets it in).
    message: str | None
    # The gangs in line whose queue lets them in (others cannot take room).
    line: list[Gang]
    queue: str
    # The gangs holding nodes (reclaim's victims), read only when reclaim asks: listing
    # thousands of running gangs at every admission was a few milliseconds for nothing.
    running_now: Callable[[], list[Running]] = list

    @property
    def running(self) -> list[Running]:
        return self.running_now()


class QueueBook:
    def __init__(
        self,
        state: ClusterState,
        *,
        overcommit: float = 1.2,
        metrics: Metrics | None = None,
        clock: Clock = monotonic,
    ) -> None:
        self._state = state
        self._tally = QueueTally(state)
        self._metrics = metrics
        self._clock = clock
        self.specs: dict[str, QueueSpec] = {}
        # name -> the status counts its object shows, to patch only what differs.
        self._observed: dict[str, dict[str, Any]] = {}
        self._published = -_PUBLISH_SECONDS
        self.last: dict[str, QueueView] = {}
        # The gangs' requests and the last verdict on a line (its gangs let in).
        self.verdicts = LineVerdicts(overcommit)

    @property
    def overcommit(self) -> float:
        """How far past the cluster's capacity a queue's gangs may be let in (Volcano's)."""
        return self.verdicts.overcommit

    # ---- the reflector's sink ------------------------------------------------------

    def replace(self, objects: Iterable[Mapping[str, Any]]) -> None:
        self.specs = {}
        self._observed = {}
        for obj in objects:
            self.upsert(obj)

    def upsert(self, obj: Mapping[str, Any]) -> None:
        try:
            spec = queue_from(obj)
        except QueueSpecError as err:
            log.warning("%s; the queue is left out until it is fixed", err, extra={"verb": None})
            return
        self.specs[spec.name] = spec
        status = obj.get("status") or {}
        self._observed[spec.name] = {
            "pending": status.get("pending"),
            "inqueue": status.get("inqueue"),
            "running": status.get("running"),
            "allocated": status.get("allocated") or {},
        }

    def delete(self, obj: Mapping[str, Any]) -> None:
        name = str((obj.get("metadata") or {}).get("name") or "")
        self.specs.pop(name, None)
        self._observed.pop(name, None)

    def observed_status(self, name: str) -> dict[str, Any] | None:
        """The counts the Queue's status shows now (from the watch), as statuses() has them."""
        return self._observed.get(name)

    @property
    def active(self) -> bool:
        """Queues count only once a Queue object exists."""
        return bool(self.specs)

    async def catch_up(self) -> None:
        """Keep the tally current in slices, the event loop free between them (once queues
        count): a verb's admission then redoes only what changed since the last slice."""
        if self.active:
            await self._tally.catch_up()

    def _queues(self) -> dict[str, QueueSpec]:
        queues = dict(self.specs)
        queues.setdefault(DEFAULT_QUEUE, QueueSpec(DEFAULT_QUEUE))
        return queues

    # ---- the filter's question ---------------------------------------------------------

    def assess(
        self,
        candidate: Gang | None,
        queue: str,
        line: Sequence[tuple[Gang, str]],
        holders: Sequence[Holder],
    ) -> Assessment:
        """May `candidate` (of `queue`) be admitted, and which gangs of `line` may?

        Without a candidate (waking the line) only the line is judged. Each queue's
        gangs waiting are read from the tally's kept sums (QueueLine), the claims and the
        candidate counted on top: nothing here walks every gang in line, except the
        verdict on `line` when it or a verdict changed since the last call.
        """
        views, capacity, out = self._views(candidate, queue, holders)
        message: str | None = None
        if candidate is None:
            pass
        elif queue not in views:
            message = (
                f"gang {candidate.key} names queue {queue}, which does not exist; create the "
                f"Queue (scheduling.volcano.sh/v1beta1) or name another, the gang waits until then"
            )
        else:
            message = in_turn(queue, out, views, capacity, self.overcommit)
        allowed = self.verdicts.judge(line, views, capacity)
        claims = list(holders)
        return Assessment(
            views, capacity, message, allowed, queue, lambda: self._tally.running(claims)
        )

    def admitted_steps(
        self, line: Sequence[tuple[Gang, str]], holders: Sequence[Holder], most: int
    ) -> Iterator[list[Gang] | None]:
        """assess(None, "", line, holders).line a slice at a time, kept as assess() keeps it:
        yields None after every `most` gangs judged (the caller may let others run), then
        the gangs let in. The line's warm-up (app/runtime/line_warmup.py) judges 10,000
        gangs so, where at once it held the event loop 20-32 ms; an admission after it with
        this very line then knows the verdict at once.

        Every verdict is taken at the queues as they are at this call: the list handed out
        and kept is the one assess() would give then. An admission meanwhile judges at once,
        as before; one after checks every verdict kept against the queues then
        (LineVerdicts.kept)."""
        views, capacity, _ = self._views(None, "", holders)
        return self.verdicts.steps(line, views, capacity, most)

    def _views(
        self, candidate: Gang | None, queue: str, holders: Sequence[Holder]
    ) -> tuple[dict[str, QueueView], Resources, Apart]:
        """Each queue's view with the claims and `candidate` counted (published), the
        cluster's capacity, and the queues' lines with the candidate set apart."""
        queues = self._queues()
        capacity, held, lines = self._tally.lines()
        mine = None
        if candidate is not None:
            mine = (-candidate.priority, candidate.created, candidate.key, request_of(candidate))
        out = Apart(mine, queue, lines)
        allocated: dict[str, Resources] = {n: dict(v) for n, v in held.items()}
        for holder in holders:
            name = self._tally.queue_of_holder(holder.key)
            for amounts in holder.remaining.values():
                add(allocated.setdefault(name, {}), amounts)
            out.claimed(holder.key)
        requests: dict[str, Resources] = {n: dict(v) for n, v in allocated.items()}
        for name in {*lines, *([queue] if candidate is not None else [])}:
            add(requests.setdefault(name, {}), out.asked(name))
        deserved = deserved_shares(queues, requests, capacity)
        views: dict[str, QueueView] = {}
        for name, spec in queues.items():
            first = out.first(name)
            views[name] = QueueView(
                spec,
                allocated.get(name, {}),
                deserved[name],
                first[3] if first is not None else None,
                out.count(name),
            )
        self._publish(views)
        return views, capacity, out

    def request(self, gang: Gang) -> Resources:
        """What a gang in line asks for, kept while the line hands out the same Gang."""
        return self.verdicts.request(gang)

    def share(self, placed: Iterable[PodRecord]) -> float:
        """DRF: the dominant share of the cluster a gang's placed members hold.

        Most gangs in line hold nothing: no walk over the nodes for them.
        """
        held: Resources = {}
        for pod in placed:
            add(held, pod.requests)
        if not held:
            return 0.0
        return dominant_share(held, self._state.total_allocatable())

    # ---- what users see ----------------------------------------------------------------

    def statuses(self, holders: Sequence[Holder]) -> dict[str, dict[str, Any]]:
        """Each Queue object's status counts, as Volcano's Queue status has them.

        pending: gangs waiting; inqueue: gangs admitted, on their way through
        the gate; running: gangs holding nodes; allocated: what they hold.
        """
        tally = self._tally.tally(holders)
        running: dict[str, int] = {}
        for gang in tally.running.values():
            running[gang.queue] = running.get(gang.queue, 0) + 1
        return {
            name: {
                "pending": len(tally.pending.get(name, ())),
                "inqueue": tally.admitted.get(name, 0),
                "running": running.get(name, 0),
                "allocated": {
                    r: _quantity(v)
                    for r, v in sorted(tally.allocated.get(name, {}).items())
                    if v > 0
                },
            }
            for name in self.specs
        }

    def _publish(self, views: Mapping[str, QueueView]) -> None:
        self.last = dict(views)
        now = self._clock()
        if self._metrics is None or now - self._published < _PUBLISH_SECONDS:
            return
        self._published = now
        m = self._metrics
        for gauge in (m.queue_weight, m.queue_deserved, m.queue_allocated, m.queue_pending_gangs):
            gauge.clear()
        for name, view in views.items():
            m.queue_weight.labels(name).set(view.spec.weight)
            m.queue_pending_gangs.labels(name).set(view.waiting)
            for r, amount in view.deserved.items():
                m.queue_deserved.labels(name, r).set(amount / 1000)
                m.queue_allocated.labels(name, r).set(view.allocated.get(r, 0) / 1000)

    def snapshot(self) -> list[dict[str, Any]]:
        """For /debug/gangs: every queue as of the last filter call that looked at queues."""
        capacity = self._state.total_allocatable()
        return [
            {
                "queue": name,
                "weight": view.spec.weight,
                "state": view.spec.state,
                "reclaimable": view.spec.reclaimable,
                "capability": format_resources(view.spec.capability or {}) or None,
                "guarantee": format_resources(view.spec.guarantee) or None,
                "deserved": format_resources(view.deserved),
                "allocated": format_resources(
                    {r: v for r, v in view.allocated.items() if r in dims(capacity)}
                ),
                "pendingGangs": view.waiting,
            }
            for name, view in sorted(self.last.items())
        ]


def _quantity(milli: int) -> str:
    """A Kubernetes quantity string for a milli-unit amount."""
    return str(milli // 1000) if milli % 1000 == 0 else f"{milli}m"
