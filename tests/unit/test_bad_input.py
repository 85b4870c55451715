"""Property-based tests: no input makes a verb answer 5xx, crash or hang.

The same request generator (tests/fuzz.py) runs against the live extender in
tests/cluster/test_faults.py. Here Hypothesis drives it against the real
ASGI app (decoders, verbs, gate) over an in-memory cluster state, and the
pure parsers get any value directly.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import re
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from app.base.metrics import Metrics
from app.core.admission import Admission, WaitPolicy
from app.core.group_specs import spec_from_podgroup
from app.core.groups import (
    LIGHT_MIN_AVAILABLE_LABEL,
    LIGHT_NAME_LABEL,
    POD_GROUP_LABEL,
    GroupLabelError,
    PodGroupSpecError,
    group_ref_of,
)
from app.core.records import podgroup_record_from
from app.core.resources import QuantityError, parse_resource_list, pod_requests
from app.core.state import ClusterState
from app.runtime.gate import PermitGate
from app.web.extender import GangExtender
from app.web.routes import create_app
from app.web.verb_context import VerbCore
from app.web.verbs_asgi import VerbGuard
from app.web.wire import WireError, parse_binding_args, parse_extender_args, parse_preempt_args
from tests.fuzz import any_json, fuzz_request
from tests.unit.builders import node, pod, podgroup
from tests.unit.fakes import FakePodApi

LIMIT = 256 * 1024
# Every 400 names what is wrong: a field of the verb's wire format, or the body itself.
FIELD = re.compile(
    r"Pod(\.|\b)|NodeNames|Nodes|NodeNameTo(Meta)?Victims|PodName|PodNamespace|PodUID|\bNode\b|"
    r"request body"
)

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=50),
    lambda children: (
        st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=20), children, max_size=5)
    ),
    max_leaves=30,
)


def world() -> tuple[ClusterState, httpx.AsyncClient]:
    state = ClusterState()
    state.replace_nodes([node("n1"), node("n2")])
    state.replace_podgroups([podgroup("g", 2, namespace="fuzz")])
    for i in range(2):
        state.apply_pod(pod(f"m{i}", namespace="fuzz", group="g"))
    api = FakePodApi()
    metrics = Metrics()
    admission = Admission(3)
    # Short gate waits: a fuzzed bind that reaches the gate must not hold the test.
    gate = PermitGate(state, admission, api, metrics)
    state.add_pod_listener(gate.on_pod_change)
    extender = GangExtender(VerbCore(state, admission, metrics, WaitPolicy(0.05, 0.05)), gate, api)
    app = create_app(
        extender,
        metrics,
        url_prefix="/scheduler",
        ready=lambda: (True, "ok"),
        guard=VerbGuard(max_request_bytes=LIMIT),
    )
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://x")
    return state, client


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    _, http = world()
    async with http:
        yield http


def assert_answer_is_clean(status: int, body: bytes, what: str) -> None:
    assert status < 500, f"{what}: HTTP {status} {body[:300]!r}"
    if status in (400, 413):
        error = json.loads(body)["Error"]
        assert FIELD.search(error), f"{what}: the error names no field: {error!r}"
    elif status == 200:
        json.loads(body)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.randoms(use_true_random=False))
def test_every_generated_request_gets_a_clean_answer(seed: random.Random) -> None:
    async def run() -> None:
        _, http = world()
        async with http:
            request = fuzz_request(seed)
            response = await asyncio.wait_for(
                http.request(request.method, request.path, content=request.body), 5
            )
            assert_answer_is_clean(response.status_code, response.content, request.what)

    asyncio.run(run())


@settings(max_examples=150, deadline=None)
@given(value=json_values, verb=st.sampled_from(["filter", "prioritize", "preempt", "bind"]))
def test_any_json_value_as_a_whole_body_is_a_4xx_or_an_answer(value: Any, verb: str) -> None:
    async def run() -> None:
        _, http = world()
        async with http:
            response = await http.post(f"/scheduler/{verb}", content=json.dumps(value))
            assert_answer_is_clean(response.status_code, response.content, repr(value))

    asyncio.run(run())


@settings(max_examples=300, deadline=None)
@given(value=json_values, field=st.sampled_from(["Pod", "NodeNames", "Nodes"]))
def test_decoders_raise_only_wire_errors(value: Any, field: str) -> None:
    """Any value in any top-level field: decoded, or WireError naming the field."""
    base: dict[str, Any] = {"Pod": pod("p"), "NodeNames": ["n1"]}
    base[field] = value
    body = json.dumps(base).encode()
    for parse in (parse_extender_args, parse_preempt_args):
        try:
            parse(body)
        except WireError as err:
            assert FIELD.search(str(err)), str(err)
    try:
        binding = {"PodName": value, "PodNamespace": "n", "Node": "x"}
        parse_binding_args(json.dumps(binding).encode())
    except WireError as err:
        # NaN and Infinity are not JSON (Python's json writes them; Go never does).
        assert "PodName" in str(err) or "not valid JSON" in str(err), str(err)


@settings(max_examples=300, deadline=None)
@given(spec=json_values)
@example(spec={"minMember": None})  # found by this test: null is an absent field
def test_podgroup_spec_parser_raises_only_spec_errors_naming_the_field(spec: Any) -> None:
    try:
        parsed = spec_from_podgroup("ns/pg", spec)
    except PodGroupSpecError as err:
        assert re.search(r"spec(\.minMember|\.scheduleTimeoutSeconds|\.minResources)?\b", str(err))
    else:
        assert 1 <= parsed.min_member <= 2**31 - 1
    # The watch feeds whole objects: a broken one becomes a record with the error.
    record = podgroup_record_from({"metadata": {"name": "pg", "namespace": "ns"}, "spec": spec})
    assert (record.spec is None) == (record.error is not None)


@settings(max_examples=300, deadline=None)
@given(
    labels=st.dictionaries(
        st.sampled_from(
            [
                POD_GROUP_LABEL,
                LIGHT_NAME_LABEL,
                LIGHT_MIN_AVAILABLE_LABEL,
                "app",
            ]
        ),
        st.text(max_size=12) | st.sampled_from(["0", "-3", "1", "9" * 5000, "1e3", " 2"]),
    )
)
def test_label_parser_raises_only_label_errors(labels: dict[str, str]) -> None:
    try:
        ref = group_ref_of("ns", labels)
    except GroupLabelError as err:
        assert "label" in str(err)
    else:
        assert ref is None or ref.min_available is None or ref.min_available >= 1


@settings(max_examples=300, deadline=None)
@given(value=json_values | st.sampled_from(["1e999999999", "-1e999999999", "1E40Ki", "∞"]))
def test_quantities_parse_or_raise_quantity_errors_quickly(value: Any) -> None:
    for raw in ({"cpu": value}, value):
        with contextlib.suppress(QuantityError):
            parse_resource_list(raw)
    with contextlib.suppress(QuantityError):
        pod_requests({"containers": [{"resources": {"requests": {"cpu": value}}}]})


def test_a_podgroup_with_absurd_values_turns_its_pods_away_with_the_reason() -> None:
    state = ClusterState()
    state.replace_nodes([node("n1")])
    state.replace_podgroups(
        [
            podgroup("huge-quantity", 2, min_resources={"cpu": "1e999999999"}),
            {**podgroup("huge-min", 2), "spec": {"minMember": 2**40}},
        ]
    )
    api = FakePodApi()
    metrics = Metrics()
    admission = Admission(3)
    gate = PermitGate(state, admission, api, metrics)
    state.add_pod_listener(gate.on_pod_change)
    extender = GangExtender(VerbCore(state, admission, metrics, WaitPolicy(1, 1)), gate, api)
    for name, expected in (
        ("huge-quantity", "spec.minResources: invalid quantity '1e999999999': larger than 1e30"),
        ("huge-min", "spec.minMember must be an integer between 1 and 2147483647"),
    ):
        args = parse_extender_args(
            json.dumps({"Pod": pod("p", group=name), "NodeNames": ["n1"]}).encode()
        )
        result = extender.filter(args)
        assert result["NodeNames"] == []
        assert expected in result["FailedAndUnresolvableNodes"]["n1"]


async def test_bodies_over_the_limit_get_413_whether_declared_or_streamed(
    client: httpx.AsyncClient,
) -> None:
    big = b"{" + b" " * (LIMIT + 10) + b"}"
    response = await client.post("/scheduler/filter", content=big)
    assert response.status_code == 413
    assert f"exceeds --max-request-bytes={LIMIT}" in response.json()["Error"]

    async def chunks() -> AsyncIterator[bytes]:
        for _ in range(LIMIT // 1024 + 2):
            yield b" " * 1024

    response = await client.post("/scheduler/bind", content=chunks())
    assert response.status_code == 413
    assert "more than" in response.json()["Error"]


async def test_wrong_methods_and_paths_are_4xx_with_a_message(client: httpx.AsyncClient) -> None:
    for method, path, status in (
        ("GET", "/scheduler/filter", 405),
        ("PUT", "/scheduler/bind", 405),
        ("POST", "/scheduler/filters", 404),
        ("POST", "/filter", 404),
    ):
        response = await client.request(method, path, content=b"{}")
        assert response.status_code == status, (method, path)
        assert response.json()["detail"]


async def test_a_stopping_extender_refuses_every_verb_with_503() -> None:
    state = ClusterState()
    api = FakePodApi()
    metrics = Metrics()
    admission = Admission(3)
    guard = VerbGuard()
    gate = PermitGate(state, admission, api, metrics)
    state.add_pod_listener(gate.on_pod_change)
    extender = GangExtender(VerbCore(state, admission, metrics, WaitPolicy(1, 1)), gate, api)
    app = create_app(
        extender, metrics, url_prefix="/scheduler", ready=lambda: (True, "ok"), guard=guard
    )
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://x") as http:
        guard.stopping = "gang-extender is shutting down"
        for verb in ("filter", "prioritize", "preempt", "bind"):
            response = await http.post(f"/scheduler/{verb}", content=b"{}")
            assert response.status_code == 503
            assert response.json()["Error"] == f"{verb} refused: gang-extender is shutting down"


def test_generator_is_deterministic_per_seed() -> None:
    """The live run replays seeds: the same seed must give the same request."""
    first = [fuzz_request(random.Random(seed)) for seed in range(50)]
    again = [fuzz_request(random.Random(seed)) for seed in range(50)]
    assert first == again
    assert any_json(random.Random(1)) == any_json(random.Random(1))
