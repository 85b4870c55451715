"""kubectl gang's live state: finding the ops Service, asking until the leader answers.

The API server is played by a recorder of GET requests (the service proxy's
random choice of replica is the part under test); the real proxy path is in
tests/cluster/test_kubectl_gang.py.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from app.kubectl.api import ApiError
from app.kubectl.live import LEADER_TRIES, OPS_SELECTOR, Endpoint, read_live

SERVICE = {
    "metadata": {"name": "gang-extender-metrics"},
    "spec": {"ports": [{"name": "metrics", "port": 9090}]},
}
PROXY = "/api/v1/namespaces/gang-extender/services/gang-extender-metrics:metrics/proxy/debug/gangs"


class Answers:
    """GET path -> the next answer; an ApiError is raised."""

    def __init__(self, services: list[dict[str, Any]], snapshots: Iterator[Any]) -> None:
        self.services = services
        self.snapshots = snapshots
        self.asked: list[tuple[str, Mapping[str, str] | None]] = []
        self.timeout_seconds = 1.0

    def get(self, path: str, query: Mapping[str, str] | None = None) -> Any:
        self.asked.append((path, query))
        if path.endswith("/services"):
            return {"items": self.services}
        answer = next(self.snapshots)
        if isinstance(answer, ApiError):
            raise answer
        return answer


def test_the_proxy_is_asked_again_until_the_leader_answers() -> None:
    api = Answers([SERVICE], iter([{"leader": False}, {"leader": False}, {"leader": True, "x": 1}]))
    live = read_live(api, Endpoint("gang-extender"))
    assert live.reachable and live.doc == {"leader": True, "x": 1} and live.problem == ""
    assert live.via == "service gang-extender/gang-extender-metrics:metrics"
    assert api.asked[0] == (
        "/api/v1/namespaces/gang-extender/services",
        {"labelSelector": OPS_SELECTOR},
    )
    assert [path for path, _ in api.asked[1:]] == [PROXY] * 3


def test_only_standbys_answering_is_said() -> None:
    api = Answers([SERVICE], iter([{"leader": False}] * LEADER_TRIES))
    live = read_live(api, Endpoint("gang-extender"))
    assert (
        live.reachable and live.problem == f"only standby replicas answered in {LEADER_TRIES} tries"
    )


def test_no_service_or_a_failing_proxy_is_unreachable_with_the_reason() -> None:
    none = read_live(Answers([], iter(())), Endpoint("ops"))
    assert not none.reachable
    assert none.problem.startswith(f"no service labelled {OPS_SELECTOR} in namespace ops")
    two = read_live(Answers([SERVICE, SERVICE], iter(())), Endpoint("ops"))
    assert "several extender services" in two.problem
    failing = Answers(
        [SERVICE], iter([ApiError(503, "GET ...: 503 Service Unavailable: no endpoints")])
    )
    down = read_live(failing, Endpoint("gang-extender"))
    assert not down.reachable
    assert down.problem == (
        "the extender did not answer through the API server: "
        "GET ...: 503 Service Unavailable: no endpoints"
    )


def test_a_direct_url_that_nobody_serves_is_unreachable() -> None:
    live = read_live(Answers([], iter(())), Endpoint("x", url="http://127.0.0.1:9"))
    assert not live.reachable and live.via == "http://127.0.0.1:9/debug/gangs"
    assert live.problem.startswith("the extender did not answer:")
