"""API timestamps: the one place that writes and reads RFC 3339 times.

Events, PodGroup status, the wake-up annotation, the Lease and the pods'
creationTimestamp all use the API server's second-precision UTC form
(`2006-01-02T15:04:05Z`); writing it in one place keeps every writer's
output comparable, and reading it in one place keeps the "Z" quirk of
older Pythons' fromisoformat out of the callers.
"""

from __future__ import annotations

from datetime import UTC, datetime


def rfc3339(t: float) -> str:
    """Epoch seconds as the API server writes them (whole seconds, UTC, `Z`)."""
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_rfc3339(value: object) -> float | None:
    """An RFC 3339 string as epoch seconds; None if `value` is not one."""
    if not isinstance(value, str) or not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def wakeup_stamp(now: float, sequence: int) -> str:
    """A value for the wake-up annotation: `now` (wall) for people, `sequence` to differ.

    Two wake-ups within one second must still change the pod (an unchanged
    annotation is no update, and requeues nothing), so the caller numbers them.
    """
    return f"{rfc3339(now)}#{sequence}"
