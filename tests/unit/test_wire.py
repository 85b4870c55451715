import json

import pytest

from app.web.wire import (
    ExtenderArgsReader,
    WireError,
    filter_result,
    parse_binding_args,
    parse_extender_args,
    parse_preempt_args,
    preempt_result,
)
from tests.unit.builders import node, pod


def body(data: object) -> bytes:
    return json.dumps(data).encode()


def test_filter_args_in_node_cache_capable_mode() -> None:
    args = parse_extender_args(body({"Pod": pod("a"), "Nodes": None, "NodeNames": ["n1", "n2"]}))
    assert args.names == ["n1", "n2"] and args.nodes is None
    result = filter_result(args, ["n2"], {}, {"n1": "why"})
    assert result == {
        "Nodes": None,
        "NodeNames": ["n2"],
        "FailedNodes": {},
        "FailedAndUnresolvableNodes": {"n1": "why"},
        "Error": "",
    }


def test_filter_args_with_full_nodes_answer_with_nodes() -> None:
    args = parse_extender_args(
        body({"Pod": pod("a"), "Nodes": {"items": [node("n1"), node("n2")]}, "NodeNames": None})
    )
    assert args.names == ["n1", "n2"]
    result = filter_result(args, ["n1"], {}, {})
    assert result["NodeNames"] is None
    assert [n["metadata"]["name"] for n in result["Nodes"]["items"]] == ["n1"]
    # The node objects go back untouched.
    assert result["Nodes"]["items"][0] == node("n1")


def test_legacy_lower_case_field_names_are_accepted() -> None:
    args = parse_extender_args(body({"pod": pod("a"), "nodenames": ["n1"]}))
    assert args.names == ["n1"]
    binding = parse_binding_args(
        body({"podName": "a", "podNamespace": "ns", "podUID": "u", "node": "n1"})
    )
    assert (binding.pod_key, binding.pod_uid, binding.node) == ("ns/a", "u", "n1")


@pytest.mark.parametrize(
    ("raw", "hint"),
    [
        (b"{not json", "not valid JSON"),
        (b"[1]", "must be a JSON object"),
        (body({"NodeNames": ["n1"]}), "Pod must be a JSON object"),
        (body({"Pod": {"metadata": {}}, "NodeNames": ["n1"]}), "Pod.metadata.name"),
        (body({"Pod": pod("a"), "NodeNames": "n1"}), "NodeNames must be a list"),
        (body({"Pod": pod("a"), "NodeNames": ["n1", 2]}), "NodeNames must be a list of node"),
        (body({"Pod": pod("a"), "NodeNames": ["n1", None]}), "NodeNames must be a list of node"),
        (body({"Pod": pod("a"), "NodeNames": [["n1"]]}), "NodeNames must be a list of node"),
        (body({"Pod": pod("a")}), "neither NodeNames nor Nodes"),
        (
            body({"Pod": {"metadata": {"name": "a", "annotations": {"x": 1}}}, "NodeNames": []}),
            "Pod.metadata.annotations must map annotation names to strings",
        ),
        (
            body({"Pod": {**pod("a"), "spec": {"schedulingGroup": "g"}}, "NodeNames": []}),
            "Pod.spec.schedulingGroup must be a JSON object",
        ),
        (
            body(
                {
                    "Pod": {**pod("a"), "spec": {"schedulingGroup": {"podGroupName": 7}}},
                    "NodeNames": [],
                }
            ),
            "Pod.spec.schedulingGroup.podGroupName must be a non-empty string",
        ),
    ],
)
def test_malformed_filter_requests_say_what_is_wrong(raw: bytes, hint: str) -> None:
    with pytest.raises(WireError, match=hint):
        parse_extender_args(raw)


def test_preempt_full_victims_are_answered_as_meta_victims() -> None:
    victim = pod("v", node="n1", uid="uid-v")
    args = parse_preempt_args(
        body(
            {
                "Pod": pod("p"),
                "NodeNameToVictims": {"n1": {"Pods": [victim], "NumPDBViolations": 1}},
                "NodeNameToMetaVictims": None,
            }
        )
    )
    assert preempt_result(args.candidates) == {
        "NodeNameToMetaVictims": {"n1": {"Pods": [{"UID": "uid-v"}], "NumPDBViolations": 1}}
    }


def test_preempt_meta_victims_round_trip() -> None:
    request = {
        "Pod": pod("p"),
        "NodeNameToVictims": None,
        "NodeNameToMetaVictims": {
            "n1": {"Pods": [{"UID": "a"}, {"UID": "b"}], "NumPDBViolations": 0},
            "n2": {"Pods": [], "NumPDBViolations": 0},
        },
    }
    args = parse_preempt_args(body(request))
    assert (
        preempt_result(args.candidates)["NodeNameToMetaVictims"]
        == (request["NodeNameToMetaVictims"])
    )


def test_preempt_victim_uids_in_any_case_and_malformed_victims_named() -> None:
    def victims(pods: object) -> bytes:
        return body({"Pod": pod("p"), "NodeNameToMetaVictims": {"n1": {"Pods": pods}}})

    args = parse_preempt_args(victims([{"UID": "a"}, {"uid": "b"}, {"Uid": "c"}]))
    assert args.candidates[0].victim_uids == ["a", "b", "c"]
    for pods, hint in (
        (["a"], r"NodeNameToMetaVictims\[n1\].Pods\[\] must be a JSON object"),
        ([{"UID": ""}], r"NodeNameToMetaVictims\[n1\].Pods\[\] UID must be a non-empty"),
        ([{"Name": "x"}], r"NodeNameToMetaVictims\[n1\].Pods\[\] UID must be a non-empty"),
        ([{"UID": 7}], r"NodeNameToMetaVictims\[n1\].Pods\[\] UID must be a non-empty"),
        ({"UID": "a"}, r"NodeNameToMetaVictims\[n1\].Pods must be a list"),
    ):
        with pytest.raises(WireError, match=hint):
            parse_preempt_args(victims(pods))
    full = {"Pod": pod("p"), "NodeNameToVictims": {"n1": {"Pods": [{"metadata": "x"}]}}}
    with pytest.raises(WireError, match=r"NodeNameToVictims\[n1\].Pods\[\].metadata must"):
        parse_preempt_args(body(full))


def test_binding_requires_pod_and_node() -> None:
    with pytest.raises(WireError, match="Node must be a non-empty string"):
        parse_binding_args(body({"PodName": "a", "PodNamespace": "ns", "Node": ""}))


def test_the_args_reader_reads_a_repeated_body_once() -> None:
    """kube-scheduler's prioritize repeats its filter body when every node passed."""
    read = ExtenderArgsReader()
    filter_body = body({"Pod": pod("a"), "Nodes": None, "NodeNames": ["n1", "n2"]})
    first = read(filter_body)
    assert read(bytes(filter_body)) is first  # equal bytes, another object
    fewer = read(body({"Pod": pod("a"), "Nodes": None, "NodeNames": ["n2"]}))
    assert fewer is not first and fewer.names == ["n2"]
    with pytest.raises(WireError):
        read(b"{not json")
    assert read(body({"Pod": pod("a"), "Nodes": None, "NodeNames": ["n2"]})).names == ["n2"]
