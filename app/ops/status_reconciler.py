"""The PodGroup status runner: which groups to write, and when.

Writes are JSON merge patches carrying metadata.resourceVersion (on 409 we
read again and retry) and only the fields we own: never occupiedBy or
anything else another controller keeps there. They are batched: pod changes
and gate reports only mark a group dirty; a tick computes dirty groups and
writes one when its status differs from what we last wrote and its previous
write is at least `min_interval_seconds` old, so a gang of 100 pods starting
at once costs a few writes, not 100 per second. A periodic resync marks
every group dirty, which writes the first status of new PodGroups and
repairs anything a missed report left behind. Only the leader writes (see
app/runtime/leader.py). Label-only groups have no object: their status is kept in
memory, for /debug/gangs and the gang_extender_podgroups metric.

What the status is (phase, shapes, patch) is app/core/status.py, computed per
group by app/core/group_views.py; one write is app/ops/status_write.py and the
API calls are app/kube/status.py.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field

from app.base.metrics import Metrics
from app.base.tasks import Periodic, TaskSet
from app.core.clock import Clock, wall
from app.core.group_views import GroupViews
from app.core.observer import MemberRef, NullObserver
from app.core.records import PodRecord
from app.core.state import ClusterState
from app.core.status import PHASES, PRE_SCHEDULING, SHAPES, TERMINAL, GroupStatus, GroupView
from app.core.timestamps import rfc3339
from app.core.topology.domains import DEFAULT_LEVELS
from app.ops.status_write import CONFLICT, KEPT, WRITTEN, StatusApi, write_status
from app.ops.writes import finish_writes

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class StatusSettings:
    """How often the reconciler looks and writes (see the module docstring)."""

    # The least time between two writes of one group.
    min_interval_seconds: float = 1.0
    # Every group is looked at again this often.
    resync_seconds: float = 10.0
    tick_seconds: float = 0.2
    # --topology-levels, for the TopologyPlaced condition.
    levels: tuple[str, ...] = DEFAULT_LEVELS


@dataclass(slots=True)
class _Tracked:
    """What the reconciler keeps of one group between ticks."""

    # pod key -> record, every phase (ClusterState.members skips finished ones).
    pods: dict[str, PodRecord] = field(default_factory=dict)
    # The PodGroup object's uid: another one means it was recreated under the same name.
    uid: str | None = None
    # RFC 3339; when the first member started waiting in the gate.
    start_time: str | None = None
    # What the object shows, as we last wrote (or kept) it.
    written: GroupStatus | None = None
    in_flight: bool = False
    last_write: float = -math.inf


class PodGroupStatus(NullObserver):
    """GangObserver and periodic reconciler of PodGroup status (see the module docstring).

    Per group it keeps one _Tracked record; besides them, `groups` publishes
    each group's current view (read by /debug/gangs and the metric) and
    `_dirty` is the work queue of a tick, so a tick looks at the groups that
    changed, not at all of them. Reports it has no use for fall through to
    NullObserver.
    """

    def __init__(
        self,
        state: ClusterState,
        apis: Mapping[str, StatusApi],
        metrics: Metrics,
        *,
        settings: StatusSettings = StatusSettings(),
        is_leader: Callable[[], bool] = lambda: True,
        clock: Clock = wall,
    ) -> None:
        """apis: each source's status API; a source without one (native: kube-scheduler's)
        is not written."""
        self._state = state
        self._views = GroupViews(state, settings.levels)
        self._apis = dict(apis)
        self._is_leader = is_leader
        self._was_leader = False
        self._metrics = metrics
        self._clock = clock
        self._settings = settings
        self._tracked: dict[str, _Tracked] = {}
        self.groups: dict[str, GroupView] = {}
        self._dirty: set[str] = set()
        self._next_resync = -math.inf
        self._ticks = Periodic(
            self._reconcile,
            settings.tick_seconds,
            name="podgroup-status",
            logger=log,
            failure="PodGroup status reconcile failed",
        )
        self._writes = TaskSet()

    # ---- lifecycle --------------------------------------------------------------------

    def start(self) -> None:
        self._ticks.start()

    async def stop(self) -> None:
        """Stop ticking; let writes in flight finish (app/ops/writes.py)."""
        await self._ticks.stop()
        await finish_writes(self._writes, "PodGroup statuses")

    async def _reconcile(self) -> None:
        """One tick of the loop (reconcile() is synchronous; its writes are spawned)."""
        self.reconcile()

    # ---- observer: reports only mark groups dirty -----------------------------------------

    def member_rejected(self, member: MemberRef, group_key: str, reason: str, message: str) -> None:
        self._dirty.add(group_key)

    def member_held(self, member: MemberRef, group_key: str, reason: str, message: str) -> None:
        self._dirty.add(group_key)

    def member_waiting(self, member: MemberRef, group_key: str, present: int, needed: int) -> None:
        tracked = self._tracked.setdefault(group_key, _Tracked())
        if tracked.start_time is None:
            tracked.start_time = rfc3339(self._clock())
        self._dirty.add(group_key)

    def gang_admitted(self, group_key: str, bound: Sequence[MemberRef]) -> None:
        self._dirty.add(group_key)

    def bind_failed(self, member: MemberRef, group_key: str | None, message: str) -> None:
        if group_key is not None:
            self._dirty.add(group_key)

    def gang_timed_out(self, group_key: str, released: Sequence[MemberRef], message: str) -> None:
        self._dirty.add(group_key)

    def gang_partly_bound(
        self, group_key: str, bound: Sequence[MemberRef], message: str, rolled_back: bool
    ) -> None:
        self._dirty.add(group_key)

    def victim_preempted(self, victim: MemberRef, victim_group: str | None, by: str) -> None:
        if victim_group is not None:
            self._dirty.add(victim_group)

    def gang_released(self, group_key: str, released: Sequence[MemberRef], message: str) -> None:
        self._dirty.add(group_key)

    def gang_reclaimed(self, group_key: str, evicted: Sequence[MemberRef], message: str) -> None:
        self._dirty.add(group_key)

    def on_pod_change(self, old: PodRecord | None, new: PodRecord | None) -> None:
        if old is not None and old.group is not None:
            tracked = self._tracked.get(old.group.key)
            if tracked is not None and tracked.pods.get(old.key) is old:
                del tracked.pods[old.key]
            self._dirty.add(old.group.key)
        if new is not None and new.group is not None:
            self._tracked.setdefault(new.group.key, _Tracked()).pods[new.key] = new
            self._dirty.add(new.group.key)

    # ---- reconcile ----------------------------------------------------------------------

    def reconcile(self) -> None:
        """Compute dirty groups; write those that changed and may be written now."""
        now = self._clock()
        leader = self._is_leader()
        if leader and not self._was_leader:
            # Newly elected: the standby wrote nothing, so look at every group now.
            self._next_resync = -math.inf
        self._was_leader = leader
        if now >= self._next_resync:
            self._next_resync = now + self._settings.resync_seconds
            self._dirty.update(self._state.podgroups, self._tracked, self.groups)
        for key in list(self._dirty):
            tracked = self._tracked.setdefault(key, _Tracked())
            view = self._compute(key, tracked)
            if view is None:
                self._forget(key, tracked)
                continue
            self.groups[key] = view
            if not self._writable(key, view) or not leader or tracked.written == view.status:
                self._dirty.discard(key)
                continue
            if tracked.in_flight or now - tracked.last_write < self._settings.min_interval_seconds:
                continue  # stays dirty: written on a later tick
            self._dirty.discard(key)
            self._write(key, tracked, view, now)
        counts = dict.fromkeys(PHASES, 0)
        for view in self.groups.values():
            counts[view.status.phase] = counts.get(view.status.phase, 0) + 1
        for phase, count in counts.items():
            self._metrics.podgroups.labels(phase).set(count)

    def _writable(self, key: str, view: GroupView) -> bool:
        """A group object of a source we write: not a CompositePodGroup (its status is
        kube-scheduler's), whose gang's view would go to a PodGroup of its name."""
        record = self._state.podgroups.get(key)
        return view.source in self._apis and not (record is not None and record.composite)

    def _compute(self, key: str, tracked: _Tracked) -> GroupView | None:
        record = self._state.podgroups.get(key)
        if record is not None and tracked.uid != record.uid:
            # Recreated under the same name: nothing of the old object applies.
            if tracked.uid is not None:
                tracked.start_time = None
            tracked.written = None
            self.groups.pop(key, None)
            tracked.uid = record.uid
        previous = self.groups.get(key)
        return self._views.view(
            key,
            list(tracked.pods.values()),
            previous.status if previous else None,
            tracked.start_time,
        )

    def _forget(self, key: str, tracked: _Tracked) -> None:
        """Nothing to show for `key`: keep only its pods (a PodGroup may come for them later)
        and a write in flight (so none starts next to it)."""
        self._dirty.discard(key)
        self.groups.pop(key, None)
        if tracked.pods or tracked.in_flight:
            self._tracked[key] = _Tracked(pods=tracked.pods, in_flight=tracked.in_flight)
        else:
            del self._tracked[key]

    def _write(self, key: str, tracked: _Tracked, view: GroupView, now: float) -> None:
        record = self._state.podgroups[key]
        tracked.in_flight = True
        tracked.last_write = now
        # Nothing left that could run: a Finished/Failed outcome on the object stays.
        keep_terminal = view.members == 0 and view.status.phase not in (
            PRE_SCHEDULING,
            *TERMINAL,
        )
        write = write_status(
            self._apis[record.source],
            record.namespace,
            record.name,
            record.uid,
            view.status,
            shape=SHAPES[record.source],
            keep_terminal=keep_terminal,
            clock=self._clock,
        )
        self._writes.spawn(self._await_write(key, record.uid, write))

    async def _await_write(
        self, key: str, uid: str, write: Awaitable[tuple[str, GroupStatus | None]]
    ) -> None:
        """Run one write, then take its outcome in; the group's write is over either way."""
        error: Exception | None = None
        try:
            outcome, shown = await write
        except Exception as err:
            error, outcome, shown = err, "failed", None
        finally:
            tracked = self._tracked.get(key)
            if tracked is not None:
                tracked.in_flight = False
        self._written_back(key, uid, outcome, shown, error)

    def _written_back(
        self,
        key: str,
        uid: str,
        outcome: str,
        shown: GroupStatus | None,
        error: Exception | None,
    ) -> None:
        tracked = self._tracked.get(key)
        if outcome in ("failed", CONFLICT):
            self._metrics.status_writes.labels(outcome).inc()
            log.warning(
                "writing status of PodGroup %s failed, retrying: %s",
                key,
                error or "conflicting updates",
                extra={"podgroup": key},
            )
            self._dirty.add(key)  # retried after min_interval
            return
        if shown is None or tracked is None or tracked.uid != uid:
            return  # gone, or recreated meanwhile
        tracked.written = shown
        view = self.groups.get(key)
        if outcome == KEPT and view is not None:
            self.groups[key] = dataclasses.replace(view, status=shown)
        if outcome == WRITTEN:
            self._metrics.status_writes.labels(WRITTEN).inc()
            log.debug("PodGroup status: %s", shown.phase, extra={"podgroup": key})
