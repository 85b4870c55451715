"""Group admission: the Coscheduling PreFilter rules, as a plain testable core.

Given a group's spec, how many siblings exist and (lazily) the cluster's free
resources, decide whether a member may be placed now. The two TTL caches are
the seed's lastDeniedPG (keeps a hopeless group from overheating the
scheduler) and permittedPG (skips repeating the resource check for every
member of a group that just passed it). No I/O; time comes from `clock`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from cachetools import TTLCache

from app.groups import GroupSpec
from app.resources import Resources, format_resources, shortfall


@dataclass(frozen=True, slots=True)
class Verdict:
    admitted: bool
    # Short, fixed vocabulary: used as a metric label and in logs.
    reason: str
    # Shown to the user in the pod's FailedScheduling event.
    message: str = ""


ADMITTED = "admitted"
PERMITTED = "permitted"
DENIED = "denied"
TOO_FEW_SIBLINGS = "too-few-siblings"
MIN_RESOURCES = "min-resources"


@dataclass(frozen=True, slots=True)
class Denial:
    reason: str
    message: str
    at: float


class Admission:
    def __init__(
        self,
        denied_ttl_seconds: float,
        *,
        maxsize: int = 100_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.denied_ttl_seconds = denied_ttl_seconds
        self._clock = clock
        self.denied: TTLCache[str, Denial] = TTLCache(maxsize, denied_ttl_seconds, timer=clock)
        self.permitted: TTLCache[str, float] = TTLCache(maxsize, denied_ttl_seconds, timer=clock)

    def check(self, spec: GroupSpec, siblings: int, free: Callable[[], Resources]) -> Verdict:
        """The admission rules of gang-semantics.md, in their order.

        `free` is called only when minResources must be checked: it is the
        cluster's free resources not counting this group's own placed pods.
        """
        denial = self.denied.get(spec.key)
        if denial is not None:
            ago = max(0.0, self._clock() - denial.at)
            return Verdict(
                False,
                DENIED,
                f"pod with pgName: {spec.key} last failed in {self.denied_ttl_seconds:g}s, deny "
                f"(failed {ago:.0f}s ago: {denial.message}; retried after the "
                f"{self.denied_ttl_seconds:g}s denial expires)",
            )
        if siblings < spec.min_member:
            return Verdict(
                False,
                TOO_FEW_SIBLINGS,
                f"cannot find enough sibling pods, current pods number: {siblings}, "
                f"minMember of group: {spec.min_member} (group {spec.key} waits until "
                f"{spec.min_member} of its pods exist)",
            )
        if spec.key in self.permitted:
            return Verdict(True, PERMITTED)
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
                self.deny(spec.key, MIN_RESOURCES, message)
                return Verdict(False, MIN_RESOURCES, message)
        self.permitted[spec.key] = self._clock()
        return Verdict(True, ADMITTED)

    def deny(self, key: str, reason: str, message: str) -> None:
        """Remember a group as failed, so its members are turned away for the TTL."""
        self.permitted.pop(key, None)
        self.denied[key] = Denial(reason, message, self._clock())

    def forget(self, key: str) -> None:
        self.denied.pop(key, None)
        self.permitted.pop(key, None)

    def preemption_blocker(
        self, spec: GroupSpec, siblings: int, total_allocatable: Resources
    ) -> str | None:
        """Why evicting pods cannot help this group now (None if it might).

        Read-only: unlike check(), it never fills the caches, because a
        preempt call is not an admission.
        """
        denial = self.denied.get(spec.key)
        if denial is not None:
            return f"group {spec.key} is denied for now ({denial.message})"
        if siblings < spec.min_member:
            return (
                f"group {spec.key} has {siblings} of minMember {spec.min_member} pods; "
                "it cannot start whatever is evicted"
            )
        gap = shortfall(spec.min_resources, total_allocatable)
        if gap:
            return (
                f"group {spec.key} needs minResources beyond the whole cluster "
                f"(short by {format_resources(gap)} even with every pod evicted)"
            )
        return None
