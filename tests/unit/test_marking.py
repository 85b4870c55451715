"""The member mark: which pods the webhook marks, the JSONPatch, the AdmissionReview answer."""

from __future__ import annotations

import base64
from typing import Any

import orjson
import pytest

from app.core.marking import (
    LINE_GATE,
    MEMBER_QUANTITY,
    can_preempt,
    hold_patch,
    holds,
    is_marked,
    member_patch,
    names_a_group,
    needs_member_mark,
    review_response,
)
from app.core.resources import MEMBER_RESOURCE, PREEMPTOR_RESOURCE, pod_requests


def pod(
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    **spec: Any,
) -> dict[str, Any]:
    return {
        "metadata": {"name": "p", "labels": labels or {}, "annotations": annotations or {}},
        "spec": {
            "containers": [{"name": "main", "resources": {"requests": {"cpu": "1"}}}],
            **spec,
        },
    }


def apply_patch(obj: dict[str, Any], ops: list[dict[str, Any]]) -> dict[str, Any]:
    """A minimal RFC 6902 `add` (the only op the webhook emits), for checking the result."""
    obj = orjson.loads(orjson.dumps(obj))
    for op in ops:
        assert op["op"] == "add"
        tokens = [t.replace("~1", "/").replace("~0", "~") for t in op["path"].split("/")[1:]]
        target: Any = obj
        for token in tokens[:-1]:
            target = target[int(token)] if isinstance(target, list) else target[token]
        target[tokens[-1]] = op["value"]
    return obj


SOURCES = {
    "x-k8s": pod({"scheduling.x-k8s.io/pod-group": "g"}),
    "labels": pod(
        {
            "pod-group.scheduling.sigs.k8s.io/name": "g",
            "pod-group.scheduling.sigs.k8s.io/min-available": "2",
        }
    ),
    "volcano": pod(annotations={"scheduling.k8s.io/group-name": "g"}),
    "volcano-alt": pod(annotations={"scheduling.volcano.sh/group-name": "g"}),
    "native": pod(schedulingGroup={"podGroupName": "g"}),
    "kueue": pod(
        {"kueue.x-k8s.io/pod-group-name": "g"}, {"kueue.x-k8s.io/pod-group-total-count": "2"}
    ),
}


@pytest.mark.parametrize("source", sorted(SOURCES))
def test_every_group_source_is_marked_in_requests_and_limits(source: str) -> None:
    member = SOURCES[source]
    assert names_a_group(member)
    marked = apply_patch(member, member_patch(member))
    resources = marked["spec"]["containers"][0]["resources"]
    assert resources["requests"] == {"cpu": "1", MEMBER_RESOURCE: "0"}
    assert resources["limits"] == {MEMBER_RESOURCE: "0"}
    assert is_marked(marked) and not is_marked(member)
    # Idempotent: a marked pod needs nothing more.
    assert member_patch(marked) == []


def test_plain_pods_and_empty_native_groups_are_not_members() -> None:
    assert not names_a_group(pod())
    assert not names_a_group(pod(schedulingGroup={}))
    assert not names_a_group(pod({"app": "web"}, {"note": "x"}))


def test_every_container_is_marked_whatever_its_resources_look_like() -> None:
    member = pod({"scheduling.x-k8s.io/pod-group": "g"})
    member["spec"]["containers"] = [
        {"name": "a"},
        {"name": "b", "resources": {"limits": {"cpu": "1"}}},
        {"name": "c", "resources": {"requests": {MEMBER_RESOURCE: "3"}, "limits": {}}},
    ]
    marked = apply_patch(member, member_patch(member))
    for container in marked["spec"]["containers"]:
        assert container["resources"]["requests"][MEMBER_RESOURCE] == "0"
        assert container["resources"]["limits"][MEMBER_RESOURCE] == "0"
    assert marked["spec"]["containers"][1]["resources"]["limits"]["cpu"] == "1"
    assert member_patch(marked) == []


def test_the_resource_name_is_escaped_as_a_json_pointer() -> None:
    member = pod({"scheduling.x-k8s.io/pod-group": "g"})
    member["spec"]["containers"][0]["resources"]["limits"] = {"cpu": "1"}
    ops = member_patch(member)
    assert {op["path"] for op in ops} == {
        "/spec/containers/0/resources/requests/gang-extender.dev~1member",
        "/spec/containers/0/resources/limits/gang-extender.dev~1member",
    }


def test_only_the_named_schedulers_pods_are_marked() -> None:
    member = pod({"scheduling.x-k8s.io/pod-group": "g"}, schedulerName="gang-scheduler")
    assert needs_member_mark(member, ())
    assert needs_member_mark(member, {"gang-scheduler"})
    assert not needs_member_mark(member, {"default-scheduler"})
    # No schedulerName (never defaulted, e.g. a hand-made review): default-scheduler.
    unnamed = pod({"scheduling.x-k8s.io/pod-group": "g"})
    assert needs_member_mark(unnamed, {"default-scheduler"})


def plain(priority: int | None, policy: str | None = None, **spec: Any) -> dict[str, Any]:
    obj = pod(**spec)
    if priority is not None:
        obj["spec"]["priority"] = priority
    if policy is not None:
        obj["spec"]["preemptionPolicy"] = policy
    return obj


@pytest.mark.parametrize(
    ("obj", "expected"),
    [
        (plain(1000), True),
        (plain(1), True),
        (plain(1000, "PreemptLowerPriority"), True),
        (plain(1000, "Never"), False),
        (plain(0), False),
        (plain(-5), False),
        (plain(None), False),
    ],
)
def test_a_plain_pod_may_preempt_with_priority_above_zero_unless_its_policy_is_never(
    obj: dict[str, Any], expected: bool
) -> None:
    assert can_preempt(obj) is expected


def test_the_webhook_leaves_plain_pods_alone_whatever_their_priority() -> None:
    """Preemptors are the API server's policy's to mark, never the webhook's."""
    assert review_response(review(plain(1000)))[1] == "skipped"
    assert review_response(review(plain(0)))[1] == "skipped"


def test_capacity_checks_leave_the_preemptor_mark_out() -> None:
    vip = plain(1000)
    marked = apply_patch(vip, member_patch(vip, PREEMPTOR_RESOURCE))
    assert is_marked(marked, PREEMPTOR_RESOURCE) and not is_marked(marked)
    requests = marked["spec"]["containers"][0]["resources"]["requests"]
    assert requests[PREEMPTOR_RESOURCE] == MEMBER_QUANTITY == "0"
    assert pod_requests(marked["spec"]) == pod_requests(vip["spec"])


def review(obj: Any, operation: str = "CREATE") -> dict[str, Any]:
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {"uid": "u-1", "operation": operation, "namespace": "ns", "object": obj},
    }


def test_review_answers_carry_the_uid_and_a_base64_json_patch() -> None:
    member = SOURCES["volcano"]
    answer, result = review_response(review(member))
    assert result == "marked"
    response = answer["response"]
    assert answer["kind"] == "AdmissionReview"
    assert answer["apiVersion"] == "admission.k8s.io/v1"
    assert response["uid"] == "u-1" and response["allowed"] is True
    assert response["patchType"] == "JSONPatch"
    assert orjson.loads(base64.b64decode(response["patch"])) == member_patch(member)


@pytest.mark.parametrize(
    ("obj", "operation", "expected"),
    [
        (pod(), "CREATE", "skipped"),
        (None, "CREATE", "invalid"),
        (SOURCES["x-k8s"], "UPDATE", "invalid"),
    ],
)
def test_reviews_that_change_nothing_are_allowed_without_a_patch(
    obj: Any, operation: str, expected: str
) -> None:
    answer, result = review_response(review(obj, operation))
    assert result == expected
    assert answer["response"] == {"uid": "u-1", "allowed": True}


def test_an_already_marked_member_is_unchanged() -> None:
    member = SOURCES["native"]
    marked = apply_patch(member, member_patch(member))
    answer, result = review_response(review(marked))
    assert result == "unchanged"
    assert "patch" not in answer["response"]


def test_capacity_checks_leave_the_mark_out() -> None:
    member = SOURCES["x-k8s"]
    marked = apply_patch(member, member_patch(member))
    assert (
        pod_requests(marked["spec"])
        == pod_requests(member["spec"])
        == {
            "cpu": 1000,
            "pods": 1000,
        }
    )


UNSCHEDULED = "!has(object.spec.nodeName) || object.spec.nodeName == ''"


def test_deploy_webhook_yaml_carries_the_expressions_and_message_of_marking() -> None:
    from pathlib import Path

    import yaml

    from app.core.marking import (
        SYSTEM_NAMESPACES,
        member_expression,
        preemptor_expression,
        preemptor_mutation,
        refusal_message,
    )

    docs = list(yaml.safe_load_all(Path("deploy/webhook.yaml").read_text()))
    webhook, policy = docs[0]["webhooks"][0], docs[1]["spec"]
    expressions = member_expression()
    assert webhook["matchConditions"] == [
        {"name": "gang-member", "expression": expressions["isMember"]},
        {"name": "our-schedulers", "expression": "object.spec.schedulerName in @SCHEDULER_NAMES@"},
    ]
    assert policy["matchConditions"] == webhook["matchConditions"]
    assert policy["validations"] == [
        {"expression": expressions["valid"], "message": refusal_message(), "reason": "Forbidden"}
    ]
    (excluded,) = webhook["namespaceSelector"]["matchExpressions"]
    assert set(excluded["values"]) == SYSTEM_NAMESPACES
    assert [d["kind"] for d in docs[3:]] == [
        "MutatingAdmissionPolicy",
        "MutatingAdmissionPolicyBinding",
    ]
    marker = docs[3]["spec"]
    assert marker["matchConditions"] == [
        {"name": "may-preempt", "expression": preemptor_expression()},
        {"name": "not-a-gang-member", "expression": f"!({expressions['isMember']})"},
        {"name": "unscheduled", "expression": UNSCHEDULED},
        {"name": "our-schedulers", "expression": "object.spec.schedulerName in @SCHEDULER_NAMES@"},
    ]
    assert marker["mutations"] == [
        {
            "patchType": "ApplyConfiguration",
            "applyConfiguration": {"expression": preemptor_mutation()},
        }
    ]
    assert docs[4]["spec"] == {"policyName": docs[3]["metadata"]["name"]}


def _gates(obj: dict[str, Any], ops: list[dict[str, Any]]) -> list[str]:
    """The gate names after the webhook's schedulingGates operations."""
    gates = [g["name"] for g in obj["spec"].get("schedulingGates") or ()]
    for op in ops:
        if op["path"] == "/spec/schedulingGates":
            gates = [g["name"] for g in op["value"]]
        elif op["path"] == "/spec/schedulingGates/-":
            gates.append(op["value"]["name"])
    return gates


@pytest.mark.parametrize("source", sorted(SOURCES))
def test_holding_gates_every_member(source: str) -> None:
    member = SOURCES[source]
    answer, result = review_response(review(member), hold=True)
    assert result == "held"
    ops = orjson.loads(base64.b64decode(answer["response"]["patch"]))
    assert ops[: len(member_patch(member))] == member_patch(member)
    assert _gates(member, ops) == [LINE_GATE]
    # Off (the default): marked only.
    assert review_response(review(member))[1] == "marked"


def test_holding_keeps_other_gates_and_never_gates_twice() -> None:
    member = pod({"scheduling.x-k8s.io/pod-group": "g"}, schedulingGates=[{"name": "a.io/x"}])
    ops = hold_patch(member)
    assert _gates(member, ops) == ["a.io/x", LINE_GATE]
    gated = pod({"scheduling.x-k8s.io/pod-group": "g"}, schedulingGates=[{"name": LINE_GATE}])
    assert not holds(gated)


def test_holding_leaves_a_pod_created_bound_ungated() -> None:
    """The API server refuses gates on a pod created with spec.nodeName."""
    member = pod({"scheduling.x-k8s.io/pod-group": "g"}, nodeName="n1")
    assert not holds(member)
    answer, result = review_response(review(member), hold=True)
    assert result == "marked"
    ops = orjson.loads(base64.b64decode(answer["response"]["patch"]))
    assert _gates(member, ops) == []


@pytest.mark.parametrize(
    "spec", [{"priority": 1000}, {"priority": 1000, "preemptionPolicy": "Never"}]
)
def test_a_member_is_held_whether_or_not_it_may_preempt(spec: dict[str, Any]) -> None:
    """A held gang's preemption is started by the extender (app/runtime/holds.py)."""
    member = pod({"scheduling.x-k8s.io/pod-group": "g"}, **spec)
    assert holds(member)
    assert review_response(review(member), hold=True)[1] == "held"


def test_holding_leaves_a_leaderworkerset_pod_ungated() -> None:
    """LWS creates the workers once the leader has a node: a held leader waits for ever."""
    lws = pod({"leaderworkerset.sigs.k8s.io/name": "lw"})
    answer, result = review_response(
        review(lws), member_labels=("leaderworkerset.sigs.k8s.io/name",), hold=True
    )
    assert result == "marked"
    assert _gates(lws, orjson.loads(base64.b64decode(answer["response"]["patch"]))) == []
