import orjson
import pytest

from app.kube.errors import (
    ApiError,
    Conflict,
    Forbidden,
    Invalid,
    NotFound,
    Rejected,
    Transient,
    error_for,
)


@pytest.mark.parametrize(
    ("status", "kind", "reason"),
    [
        (404, NotFound, "not-found"),
        (409, Conflict, "conflict"),
        (401, Forbidden, "forbidden"),
        (403, Forbidden, "forbidden"),
        (422, Invalid, "rejected"),
        (400, Rejected, "rejected"),
        (429, Transient, "transient"),
        (500, Transient, "transient"),
        (503, Transient, "transient"),
    ],
)
def test_each_status_raises_its_class_and_metric_reason(
    status: int, kind: type[ApiError], reason: str
) -> None:
    err = error_for(status, "Reason", b"{}")
    assert type(err) is kind
    assert err.reason == reason


def test_the_message_is_the_status_bodys_message() -> None:
    body = orjson.dumps({"kind": "Status", "message": 'pods "p1" not found'})
    assert str(error_for(404, "Not Found", body)) == 'API server answered 404: pods "p1" not found'


def test_without_a_readable_message_the_http_reason_is_shown() -> None:
    for body in (None, b"", b"not json", b"[1]"):
        assert str(error_for(500, "Internal Server Error", body)) == (
            "API server answered 500: Internal Server Error"
        )


def test_invalid_is_a_rejection() -> None:
    assert isinstance(error_for(422, "Unprocessable Entity", None), Rejected)
