"""What a failed API call raises: ApiError, one subclass per case a caller tells apart.

The subclass fixes `reason`, a short metric label (gang_extender_bind_errors
and logs use it), so a reason can never disagree with the class; the
message is one a user can act on ("API server answered 403: ..."). Callers
catch the subclass they handle (NotFound for a pod read, Conflict for a
status write raced by another writer, Transient for a binding retry) and
ApiError for everything else.
"""

from __future__ import annotations

from typing import ClassVar

import orjson


class ApiError(Exception):
    """A call to the API server failed."""

    reason: ClassVar[str] = "rejected"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class NotFound(ApiError):
    """404: the object does not exist (deleted, or an Event expired)."""

    reason = "not-found"


class Conflict(ApiError):
    """409: the object changed since we read it, or a precondition (uid) failed."""

    reason = "conflict"


class Forbidden(ApiError):
    """401/403: our ServiceAccount may not do this (RBAC, or an admission webhook)."""

    reason = "forbidden"


class Rejected(ApiError):
    """Any other 4xx: the API server refused the request as sent."""


class Gone(Rejected):
    """410: a resourceVersion or continue token too old (compacted away); list again."""

    reason = "gone"


class Invalid(Rejected):
    """422: the request failed validation (a patch of a pod that changed under us)."""


class Transient(ApiError):
    """429, 5xx, or no answer at all: trying again later may work."""

    reason = "transient"


def error_for(status: int, reason: str | None, body: bytes | str | None) -> ApiError:
    """The ApiError for an answer with HTTP `status`, its message read from the Status body."""
    try:
        message = orjson.loads(body or b"{}").get("message")
    except (ValueError, AttributeError):
        message = None
    text = f"API server answered {status}: {message or reason}"
    if status == 404:
        return NotFound(text)
    if status == 409:
        return Conflict(text)
    if status in (401, 403):
        return Forbidden(text)
    if status == 410:
        return Gone(text)
    if status == 422:
        return Invalid(text)
    if status == 429 or status >= 500:
        return Transient(text)
    return Rejected(text)
