"""Kubernetes Events, how they repeat: aggregation of identical ones, and a spam filter.

Aggregation behaves like client-go's: an identical (object, type, reason,
message) seen again within `window_seconds` raises `count` and
`lastTimestamp` of the Event already written instead of creating another;
and a per-object token bucket (client-go's spam filter: burst 25, one more
every 5 minutes) drops events of a hot loop before they reach the API
server. Pure: the clock is passed in, the writing is app/ops/event_recorder.py's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cachetools import LRUCache

from app.core.timestamps import rfc3339

COMPONENT = "gang-extender"

# events.k8s.io caps notes at 1 kB; core/v1 accepts more, but kubectl shows
# one line per event and nobody reads further.
_MAX_MESSAGE = 1024


@dataclass(frozen=True, slots=True)
class ObjectRef:
    """The Event's involvedObject."""

    kind: str
    api_version: str
    namespace: str
    name: str
    uid: str

    def as_dict(self) -> dict[str, str]:
        return {
            "kind": self.kind,
            "apiVersion": self.api_version,
            "namespace": self.namespace,
            "name": self.name,
            "uid": self.uid,
        }


@dataclass(slots=True)
class TokenBucket:
    """`burst` tokens, one more every `refill_seconds`; each event takes one."""

    burst: float
    refill_seconds: float
    tokens: float
    updated: float

    def take(self, now: float) -> bool:
        elapsed = max(0.0, now - self.updated)
        self.tokens = min(self.burst, self.tokens + elapsed / self.refill_seconds)
        self.updated = now
        if self.tokens < 1:
            return False
        self.tokens -= 1
        return True


@dataclass(slots=True)
class EventEntry:
    """One Event object: what it says, and (kept by the recorder) what was sent of it."""

    ref: ObjectRef
    type: str
    reason: str
    message: str
    name: str
    first: float
    last: float
    count: int = 1
    sent_count: int = 0
    created: bool = False
    in_flight: bool = False


# What became of one occurrence (the label of gang_extender_events_total).
CREATED, AGGREGATED, RATE_LIMITED = "created", "aggregated", "rate-limited"


class EventAggregator:
    """Which Event an occurrence becomes: a new one, a count on a recent one, or none."""

    def __init__(
        self, *, window_seconds: float, burst: int, refill_seconds: float, cache_size: int
    ) -> None:
        self._window = window_seconds
        self._burst = burst
        self._refill = refill_seconds
        self._entries: LRUCache[tuple[ObjectRef, str, str, str], EventEntry] = LRUCache(cache_size)
        self._buckets: LRUCache[tuple[ObjectRef, str], TokenBucket] = LRUCache(cache_size)
        self._last_ns = 0

    def add(
        self, ref: ObjectRef, type_: str, reason: str, message: str, now: float
    ) -> tuple[str, EventEntry | None]:
        """The outcome, and the Event to write (None when rate-limited)."""
        message = _truncate(message)
        # The spam filter is per object and reason: a hot loop of one reason
        # (WaitingForSiblings on every scheduling attempt) cannot starve the
        # rare ones (GangTimedOut) of the same PodGroup.
        bucket = self._buckets.get((ref, reason))
        if bucket is None:
            bucket = TokenBucket(self._burst, self._refill, float(self._burst), now)
            self._buckets[(ref, reason)] = bucket
        if not bucket.take(now):
            return RATE_LIMITED, None
        key = (ref, type_, reason, message)
        entry = self._entries.get(key)
        if entry is not None and now - entry.last <= self._window:
            entry.count += 1
            entry.last = now
            return AGGREGATED, entry
        entry = EventEntry(ref, type_, reason, message, self._new_name(ref, now), now, now)
        self._entries[key] = entry
        return CREATED, entry

    def _new_name(self, ref: ObjectRef, now: float) -> str:
        # client-go's naming: <object>.<hex nanoseconds>, kept unique within this process.
        ns = max(int(now * 1e9), self._last_ns + 1)
        self._last_ns = ns
        return f"{ref.name[:200]}.{ns:x}"


def event_body(entry: EventEntry) -> dict[str, Any]:
    """The core/v1 Event as written (created whole, or its count and lastTimestamp patched)."""
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": entry.name, "namespace": entry.ref.namespace},
        "involvedObject": entry.ref.as_dict(),
        "type": entry.type,
        "reason": entry.reason,
        "message": entry.message,
        "source": {"component": COMPONENT},
        "count": entry.count,
        "firstTimestamp": rfc3339(entry.first),
        "lastTimestamp": rfc3339(entry.last),
    }


def _truncate(message: str) -> str:
    return message if len(message) <= _MAX_MESSAGE else message[: _MAX_MESSAGE - 3] + "..."
