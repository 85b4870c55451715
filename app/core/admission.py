"""Group admission: the gang rules, as a plain testable core.

Two questions, both without I/O:
- is a gang whole? `wholeness()` and `permit()` count its members against
  minMember (and Volcano's per-task minTaskMember). Every caller asks this
  one rule: the filter (enough siblings exist?), the permit gate (enough
  bound, binding or waiting to bind the wave?), wake-up, preemption and the
  contention arbiter (how many more are needed?);
- may a member be placed now? `Admission.check()`, the Coscheduling
  PreFilter rules. Given the siblings and (lazily) the cluster's free
  resources it decides. Its two TTL caches are those of scheduler-plugins'
  Coscheduling (pkg/coscheduling/core): lastDeniedPG keeps a hopeless group
  from overheating the scheduler, permittedPG skips repeating the resource
  check for every member of a group that just passed it. Time comes from
  `clock`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from enum import StrEnum

from cachetools import TTLCache

from app.core.clock import Clock, monotonic
from app.core.group_rules import task_shortfall
from app.core.groups import GroupSpec
from app.core.resources import Resources, format_resources, shortfall
from app.core.soft_timeouts import SoftTimeouts
from app.core.topology.subgroups import GangTree


class FilterReason(StrEnum):
    """Why the filter verb passed or turned a gang member away.

    The values are the `reason` label of the filter-decisions metric and the
    `reason` field of the logs: a fixed vocabulary, never renamed.
    """

    # Admission.check
    ADMITTED = "admitted"
    PERMITTED = "permitted"
    DENIED = "denied"
    TOO_FEW_SIBLINGS = "too-few-siblings"
    MIN_RESOURCES = "min-resources"
    # The pod names a group that cannot be used.
    BAD_GROUP = "bad-group"
    NO_GROUP = "no-group"
    # The contention arbiter (app/runtime/arbiter.py)
    CLAIMED = "claimed"
    HOLDING = "holding"
    COMPLETE = "complete"
    WAITING_BEHIND = "waiting-behind"
    INSUFFICIENT_CAPACITY = "insufficient-capacity"
    # Its queue is at its share while another queue below its share waits (app/core/queues.py).
    QUEUE_SHARE = "queue-share"


class DenyReason(StrEnum):
    """Why a group is denied for the TTL (shown in /debug/gangs and the logs)."""

    MIN_RESOURCES = "min-resources"
    # The gate's wait ran out before the gang was whole.
    TIMEOUT = "timeout"
    # Bindings of an admitted wave failed and its bound members were deleted.
    BIND_FAILED = "bind-failed"
    # A member of a gang holding capacity found no node (app/runtime/claim_release.py).
    CAPACITY = "capacity"


@dataclass(frozen=True, slots=True)
class Verdict:
    admitted: bool
    reason: FilterReason
    # Shown to the user in the pod's FailedScheduling event.
    message: str = ""


@dataclass(frozen=True, slots=True)
class Denial:
    reason: DenyReason
    message: str
    at: float


@dataclass(frozen=True)
class WaitPolicy:
    """How long a gang member may wait in the permit gate (--permit-waiting-time-seconds)."""

    default_seconds: float
    max_seconds: float

    def for_group(self, spec: GroupSpec) -> float:
        """Seed precedence: the group's scheduleTimeoutSeconds, else the default; capped."""
        wanted = spec.schedule_timeout_seconds or self.default_seconds
        return min(float(wanted), self.max_seconds)


# ---- is the gang whole? -------------------------------------------------------------


TaskGap = tuple[tuple[str, int, int], ...]
"""Volcano tasks below their own minimum: (task, have, need)."""


@dataclass(frozen=True, slots=True)
class PermitVerdict:
    """How a set of members measures up to the gang's minimums."""

    present: int
    min_member: int
    # Volcano minTaskMember: the tasks still short (empty for other sources).
    task_gap: TaskGap = ()
    # A gang made of groups: its slices or sub-groups below their own minimum
    # (GangTree.shortfall: "slice rack-1", have, need).
    group_gap: TaskGap = ()

    @property
    def missing(self) -> int:
        """Members short of minMember (0 once there are enough, whatever their tasks)."""
        return max(0, self.min_member - self.present)

    @property
    def whole(self) -> bool:
        """minMember members, every task's and every sub-group's own minimum: it may start."""
        return self.present >= self.min_member and not self.task_gap and not self.group_gap

    def describe_groups(self) -> str:
        """The sub-groups still short, for the gate's messages ("" when none is)."""
        return ", ".join(f"{name}: {have} of {need}" for name, have, need in self.group_gap)


def wholeness(
    spec: GroupSpec, present: int, tasks: Callable[[], Iterable[str]] = tuple
) -> PermitVerdict:
    """The gang rule for `present` counted members.

    `tasks` yields one task name per counted member ("" for none); it is
    called only when the spec has per-task minimums, so the common case
    costs no walk over the members.
    """
    gap = tuple(task_shortfall(spec, tasks())) if spec.min_task_member else ()
    return PermitVerdict(present, spec.min_member, gap)


def too_few_siblings(spec: GroupSpec, siblings: PermitVerdict) -> str:
    """Why a gang whose pods do not all exist yet waits (the filter's words, coscheduling's)."""
    return (
        f"cannot find enough sibling pods, current pods number: {siblings.present}, "
        f"minMember of group: {spec.min_member} (group {spec.key} waits until "
        f"{spec.min_member} of its pods exist)"
    )


def permit(
    spec: GroupSpec,
    bound: Mapping[str, str],
    in_flight: Mapping[str, str],
    waiting: Mapping[str, str],
    tree: GangTree | None = None,
) -> PermitVerdict:
    """May the permit gate bind its waiting wave? (Each mapping: pod key -> task.)

    Members bound by the API, members whose binding is in flight and members
    waiting in the gate all count, each once: a binding the watch has already
    echoed is not counted twice. A gang made of groups (`tree`) is whole only
    when each slice or sub-group meets its own minimum too: a gang whose
    minMember is below its sub-groups' total is never bound with a slice short.
    """
    counted = {**bound, **in_flight, **waiting}
    verdict = wholeness(spec, len(counted), counted.values)
    if tree is None:
        return verdict
    gap = tuple(tree.shortfall(counted))
    return replace(verdict, group_gap=gap) if gap else verdict


class Admission:
    def __init__(
        self,
        denied_ttl_seconds: float,
        *,
        maxsize: int = 100_000,
        clock: Clock = monotonic,
    ) -> None:
        self.denied_ttl_seconds = denied_ttl_seconds
        self._clock = clock
        self.denied: TTLCache[str, Denial] = TTLCache(maxsize, denied_ttl_seconds, timer=clock)
        self.permitted: TTLCache[str, float] = TTLCache(maxsize, denied_ttl_seconds, timer=clock)
        # Bumped whenever a denial is added or dropped (not when one expires: see
        # next_expiry): the arbiter reuses a verdict only while it stays put.
        self.denials_version = 0
        # Gangs that turn into plain pods once their wait runs out (YuniKorn's Soft style).
        self.soft = SoftTimeouts(clock)

    def check(
        self, spec: GroupSpec, siblings: PermitVerdict, free: Callable[[], Resources]
    ) -> Verdict:
        """The filter's admission rules (README "How a pod flows through the verbs"), in order.

        `siblings`: the group's existing pods measured by wholeness() (only
        their number counts here: the filter checks their tasks before).
        `free` is called only when minResources must be checked: it is the
        cluster's free resources not counting this group's own placed pods.
        """
        denial = self.denied.get(spec.key)
        if denial is not None:
            ago = max(0.0, self._clock() - denial.at)
            return Verdict(
                False,
                FilterReason.DENIED,
                f"pod with pgName: {spec.key} last failed in {self.denied_ttl_seconds:g}s, deny "
                f"(failed {ago:.0f}s ago: {denial.message}; retried after the "
                f"{self.denied_ttl_seconds:g}s denial expires)",
            )
        if siblings.missing:
            return Verdict(False, FilterReason.TOO_FEW_SIBLINGS, too_few_siblings(spec, siblings))
        if spec.key in self.permitted:
            return Verdict(True, FilterReason.PERMITTED)
        if spec.min_resources:
            available = free()
            gap = shortfall(spec.min_resources, available)
            if gap:
                message = (
                    f"PodGroup {spec.key} needs minResources "
                    f"{format_resources(spec.min_resources)} but the cluster has only "
                    f"{format_resources({n: available.get(n, 0) for n in spec.min_resources})} "
                    f"free: short by {format_resources(gap)}"
                )
                self.deny(spec.key, DenyReason.MIN_RESOURCES, message)
                return Verdict(False, FilterReason.MIN_RESOURCES, message)
        self.permitted[spec.key] = self._clock()
        return Verdict(True, FilterReason.ADMITTED)

    def deny(self, key: str, reason: DenyReason, message: str) -> None:
        """Remember a group as failed, so its members are turned away for the TTL."""
        self.permitted.pop(key, None)
        self.denied[key] = Denial(reason, message, self._clock())
        self.denials_version += 1

    def forget(self, key: str) -> None:
        if self.denied.pop(key, None) is not None:
            self.denials_version += 1
        self.permitted.pop(key, None)

    def next_expiry(self) -> float:
        """In how many seconds the first denial standing expires (inf: none stands).

        A denied gang in line fits nowhere (or is left out) until then.
        """
        first = min((d.at for d in self.denied.values()), default=math.inf)
        return first + self.denied_ttl_seconds - self._clock()

    def preemption_blocker(
        self, spec: GroupSpec, siblings: PermitVerdict, total_allocatable: Resources
    ) -> str | None:
        """Why evicting pods cannot help this group now (None if it might).

        Read-only: unlike check(), it never fills the caches, because a
        preempt call is not an admission.
        """
        denial = self.denied.get(spec.key)
        if denial is not None:
            return f"group {spec.key} is denied for now ({denial.message})"
        if siblings.missing:
            return (
                f"group {spec.key} has {siblings.present} of minMember {spec.min_member} pods; "
                "it cannot start whatever is evicted"
            )
        gap = shortfall(spec.min_resources, total_allocatable)
        if gap:
            return (
                f"group {spec.key} needs minResources beyond the whole cluster "
                f"(short by {format_resources(gap)} even with every pod evicted)"
            )
        return None
