"""The verbs through the real HTTP app, with an in-memory cluster state."""

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from app.base.metrics import Metrics
from app.core.admission import Admission, WaitPolicy
from app.core.groups import POD_GROUP_LABEL, VOLCANO_GROUP_ANNOTATIONS, VOLCANO_TASK_ANNOTATION
from app.core.state import ClusterState
from app.runtime.gate import PermitGate
from app.web.extender import GangExtender
from app.web.routes import create_app
from app.web.verb_context import VerbCore
from tests.unit.builders import node, pod, podgroup
from tests.unit.fakes import FakePodApi


class World:
    def __init__(self) -> None:
        self.state = ClusterState()
        self.state.replace_nodes([node("n1"), node("n2")])
        self.api = FakePodApi()
        self.metrics = Metrics()
        self.admission = Admission(3)
        self.gate = PermitGate(self.state, self.admission, self.api, self.metrics)
        self.state.add_pod_listener(self.gate.on_pod_change)
        self.extender = GangExtender(
            VerbCore(self.state, self.admission, self.metrics, WaitPolicy(60, 80)),
            self.gate,
            self.api,
        )
        self.state.add_pod_listener(self.extender.plans.on_pod_change)
        self.app = create_app(
            self.extender, self.metrics, url_prefix="/scheduler", ready=lambda: (True, "ok")
        )


@pytest.fixture
async def world() -> AsyncIterator[tuple[World, httpx.AsyncClient]]:
    w = World()
    transport = httpx.ASGITransport(app=w.app)
    async with httpx.AsyncClient(transport=transport, base_url="http://x") as client:
        yield w, client


async def post(client: httpx.AsyncClient, verb: str, data: Any) -> httpx.Response:
    return await client.post(f"/scheduler/{verb}", content=json.dumps(data))


async def test_plain_pod_passes_filter_and_is_bound_at_once(
    world: tuple[World, httpx.AsyncClient],
) -> None:
    w, client = world
    w.state.apply_pod(pod("web"))
    r = await post(client, "filter", {"Pod": pod("web"), "NodeNames": ["n1", "n2"]})
    assert r.status_code == 200
    assert r.json()["NodeNames"] == ["n1", "n2"]
    r = await post(
        client,
        "bind",
        {"PodName": "web", "PodNamespace": "default", "PodUID": "uid-default-web", "Node": "n2"},
    )
    assert r.json() == {"Error": ""}
    assert w.api.bound == [("web", "n2")]


async def test_gang_short_of_siblings_is_unresolvable_on_every_node(
    world: tuple[World, httpx.AsyncClient],
) -> None:
    w, client = world
    w.state.apply_podgroup(podgroup("nginx", 3))
    for name in ("a", "b"):
        w.state.apply_pod(pod(name, group="nginx"))
    r = await post(client, "filter", {"Pod": pod("a", group="nginx"), "NodeNames": ["n1", "n2"]})
    result = r.json()
    assert result["NodeNames"] == []
    assert result["FailedNodes"] == {}
    assert set(result["FailedAndUnresolvableNodes"]) == {"n1", "n2"}
    assert (
        "current pods number: 2, minMember of group: 3"
        in result["FailedAndUnresolvableNodes"]["n1"]
    )


async def test_pod_being_scheduled_counts_before_the_watch_delivers_it(
    world: tuple[World, httpx.AsyncClient],
) -> None:
    w, client = world
    w.state.apply_podgroup(podgroup("g", 2))
    w.state.apply_pod(pod("a", group="g"))
    r = await post(client, "filter", {"Pod": pod("b", group="g"), "NodeNames": ["n1"]})
    assert r.json()["NodeNames"] == ["n1"]


async def test_missing_podgroup_and_bad_labels_are_explained(
    world: tuple[World, httpx.AsyncClient],
) -> None:
    _, client = world
    r = await post(client, "filter", {"Pod": pod("a", group="ghost"), "NodeNames": ["n1"]})
    assert "PodGroup default/ghost not found" in r.json()["FailedAndUnresolvableNodes"]["n1"]
    r = await post(client, "filter", {"Pod": pod("a", light=("mpi", "x")), "NodeNames": ["n1"]})
    assert "whole number >= 1" in r.json()["FailedAndUnresolvableNodes"]["n1"]


async def test_gang_binds_through_the_gate(world: tuple[World, httpx.AsyncClient]) -> None:
    w, client = world
    w.state.apply_podgroup(podgroup("g", 2))
    for name in ("a", "b"):
        w.state.apply_pod(pod(name, group="g"))

    def bind(name: str, node_name: str) -> Any:
        return post(
            client,
            "bind",
            {
                "PodName": name,
                "PodNamespace": "default",
                "PodUID": f"uid-default-{name}",
                "Node": node_name,
            },
        )

    first = asyncio.create_task(bind("a", "n1"))
    await asyncio.sleep(0.05)
    assert not first.done()
    second = await bind("b", "n2")
    assert second.json() == {"Error": ""}
    assert (await first).json() == {"Error": ""}
    assert sorted(w.api.bound) == [("a", "n1"), ("b", "n2")]


async def test_an_admitted_member_is_given_one_node_unless_it_states_a_preference(
    world: tuple[World, httpx.AsyncClient],
) -> None:
    """One node in the answer: kube-scheduler skips its scoring and our prioritize."""
    w, client = world
    w.state.apply_podgroup(podgroup("g", 2))
    w.state.apply_pod(pod("busy", node="n2", cpu="2"))
    for name in ("a", "b"):
        w.state.apply_pod(pod(name, group="g"))
    r = await post(client, "filter", {"Pod": pod("a", group="g"), "NodeNames": ["n1", "n2"]})
    assert r.json()["NodeNames"] == ["n2"]  # the fuller node: binpack
    assert r.json()["FailedNodes"] == {} and r.json()["FailedAndUnresolvableNodes"] == {}
    # Full Node objects (no nodeCacheCapable): the same pick, among the objects sent.
    r = await post(
        client, "filter", {"Pod": pod("a", group="g"), "Nodes": {"items": [node("n1"), node("n2")]}}
    )
    assert [n["metadata"]["name"] for n in r.json()["Nodes"]["items"]] == ["n2"]
    # A preference only kube-scheduler's scoring weighs: every node, for it to rank.
    picky = pod("b", group="g")
    picky["spec"]["affinity"] = {
        "nodeAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {
                    "weight": 10,
                    "preference": {
                        "matchExpressions": [
                            {"key": "kubernetes.io/hostname", "operator": "In", "values": ["n1"]}
                        ]
                    },
                }
            ]
        }
    }
    r = await post(client, "filter", {"Pod": picky, "NodeNames": ["n1", "n2"]})
    assert r.json()["NodeNames"] == ["n1", "n2"]
    choices = "gang_extender_member_node_choices_total"
    assert w.metrics.registry.get_sample_value(choices, {"by": "extender"}) == 2
    assert w.metrics.registry.get_sample_value(choices, {"by": "scheduler"}) == 1


async def test_a_member_is_not_given_a_node_it_would_rather_avoid(
    world: tuple[World, httpx.AsyncClient],
) -> None:
    w, client = world
    disfavoured = node("n2")
    disfavoured["spec"]["taints"] = [{"key": "spot", "value": "", "effect": "PreferNoSchedule"}]
    w.state.apply_node(disfavoured)
    w.state.apply_pod(pod("busy", node="n2", cpu="2"))  # the fuller node: binpack's first
    w.state.apply_podgroup(podgroup("g", 2))
    for name in ("a", "b"):
        w.state.apply_pod(pod(name, group="g"))
    r = await post(client, "filter", {"Pod": pod("a", group="g"), "NodeNames": ["n1", "n2"]})
    assert r.json()["NodeNames"] == ["n1"]
    # Tolerated, the taint no longer counts against the node.
    tolerant = pod("b", group="g")
    tolerant["spec"]["tolerations"] = [{"key": "spot", "operator": "Exists"}]
    r = await post(client, "filter", {"Pod": tolerant, "NodeNames": ["n1", "n2"]})
    assert r.json()["NodeNames"] == ["n2"]


async def test_bind_of_unknown_or_recreated_pod_is_refused(
    world: tuple[World, httpx.AsyncClient],
) -> None:
    w, client = world
    r = await post(
        client, "bind", {"PodName": "gone", "PodNamespace": "default", "PodUID": "u", "Node": "n1"}
    )
    assert "not found" in r.json()["Error"]
    w.api.pods["default/new"] = pod("new", uid="uid-2")
    r = await post(
        client,
        "bind",
        {"PodName": "new", "PodNamespace": "default", "PodUID": "uid-1", "Node": "n1"},
    )
    assert "was recreated" in r.json()["Error"]
    assert w.api.bound == []


async def test_malformed_requests_get_400_with_a_message(
    world: tuple[World, httpx.AsyncClient],
) -> None:
    w, client = world
    for verb in ("filter", "prioritize", "preempt", "bind"):
        r = await client.post(f"/scheduler/{verb}", content=b"{oops")
        assert r.status_code == 400
        assert "not valid JSON" in r.json()["Error"]
    sample = w.metrics.registry.get_sample_value(
        "gang_extender_requests_total", {"verb": "bind", "code": "400"}
    )
    assert sample == 1


async def test_prioritize_scores_every_node_within_range(
    world: tuple[World, httpx.AsyncClient],
) -> None:
    _, client = world
    r = await post(
        client, "prioritize", {"Pod": pod("a"), "Nodes": {"items": [node("n1"), node("n2")]}}
    )
    scores = r.json()
    assert [s["Host"] for s in scores] == ["n1", "n2"]
    assert all(0 <= s["Score"] <= 10 for s in scores)


async def test_health_readiness_and_metrics(world: tuple[World, httpx.AsyncClient]) -> None:
    _, client = world
    assert (await client.get("/healthz")).status_code == 200
    assert (await client.get("/readyz")).status_code == 200
    metrics = (await client.get("/metrics")).text
    assert "gang_extender_gate_waiting_pods" in metrics


async def test_preemptor_not_yet_in_the_cache_still_counts_toward_the_gangs_need(
    world: tuple[World, httpx.AsyncClient],
) -> None:
    """kube-scheduler can ask before our watch delivered the preemptor itself."""
    w, client = world  # 2 nodes x 4 CPUs
    anchor = pod("anchor", node="n1", cpu="1")
    anchor["spec"]["priority"] = 5000
    w.state.apply_pod(anchor)
    w.state.apply_pod(pod("low", node="n2", cpu="2"))
    w.state.apply_podgroup(podgroup("g", 3))
    for i in range(2):
        w.state.apply_pod(pod(f"g-{i}", group="g", cpu="3"))
    preemptor = pod("g-2", group="g", cpu="3")  # 3 x 3 CPUs > the 7 not held by anchor
    preemptor["spec"]["priority"] = 1000
    request = {
        "Pod": preemptor,
        "NodeNameToMetaVictims": {
            "n2": {"Pods": [{"UID": "uid-default-low"}], "NumPDBViolations": 0}
        },
    }
    r = await post(client, "preempt", request)
    assert r.json() == {"NodeNameToMetaVictims": {}}
    smaller = pod("g-2", group="g", cpu="1")  # 3 + 3 + 1 = 7 CPUs: now the gang fits
    smaller["spec"]["priority"] = 1000
    r = await post(client, "preempt", {**request, "Pod": smaller})
    assert list(r.json()["NodeNameToMetaVictims"]) == ["n2"]


async def test_members_are_served_from_the_plan_while_the_watch_lags_a_sibling(
    world: tuple[World, httpx.AsyncClient],
) -> None:
    """The sequence of a CI failure: the third member, not delivered by our watch yet,
    makes the plan; its siblings' calls came before the watch caught up and were
    refused as 'too few pods', so the plan's other node never got its members."""
    w, client = world  # 2 nodes x 4 CPUs
    w.state.apply_pod(pod("low-1", node="n1", cpu="3"))
    w.state.apply_pod(pod("low-2", node="n2", cpu="3"))
    w.state.apply_podgroup(podgroup("g", 3))
    members = []
    for i in range(3):
        member = pod(f"g-{i}", group="g", cpu="2")
        member["spec"]["priority"] = 1000
        members.append(member)
    for member in members[:2]:
        w.state.apply_pod(member)  # g-2 is not in our cache yet
    victims = {
        "n1": {"Pods": [{"UID": "uid-default-low-1"}], "NumPDBViolations": 0},
        "n2": {"Pods": [{"UID": "uid-default-low-2"}], "NumPDBViolations": 0},
    }
    r = await post(client, "preempt", {"Pod": members[2], "NodeNameToMetaVictims": victims})
    first = set(r.json()["NodeNameToMetaVictims"])
    assert len(first) == 1
    r = await post(client, "preempt", {"Pod": members[0], "NodeNameToMetaVictims": victims})
    assert set(r.json()["NodeNameToMetaVictims"]) == {"n1", "n2"} - first


async def test_gang_members_preempting_in_a_row_evict_no_more_than_the_gang_needs(
    world: tuple[World, httpx.AsyncClient],
) -> None:
    """The sequence of a CI failure: three members preempt within 50 ms, before our
    watch reports any victim's deletion or nomination. Each deciding alone, they
    evicted a third pod on a node the gang then did not need; one plan for the
    gang evicts two pods and answers every member from it."""
    w, client = world
    w.state.apply_node(node("n3"))  # 3 nodes x 4 CPUs
    for name, at, cpu in [
        ("big-1", "n1", "3"),
        ("small-2", "n1", "500m"),
        ("big-0", "n2", "3"),
        ("big-2", "n3", "3"),
        ("small-0", "n3", "500m"),
        ("small-1", "n3", "500m"),
    ]:
        w.state.apply_pod(pod(name, node=at, cpu=cpu))
    w.state.apply_podgroup(podgroup("urgent", 3))
    members = []
    for i in range(3):
        member = pod(f"u-{i}", group="urgent", cpu="2")
        member["spec"]["priority"] = 1000
        w.state.apply_pod(member)
        members.append(member)
    every_node = {
        "n1": {"Pods": [{"UID": "uid-default-big-1"}], "NumPDBViolations": 0},
        "n2": {"Pods": [{"UID": "uid-default-big-0"}], "NumPDBViolations": 0},
        "n3": {"Pods": [{"UID": "uid-default-big-2"}], "NumPDBViolations": 0},
    }

    async def preempt(member: dict[str, Any], victims: dict[str, Any]) -> dict[str, Any]:
        r = await post(client, "preempt", {"Pod": member, "NodeNameToMetaVictims": victims})
        assert r.status_code == 200
        result: dict[str, Any] = r.json()["NodeNameToMetaVictims"]
        return result

    answers = [await preempt(m, every_node) for m in (members[2], members[0], members[1])]
    victims = [
        v["UID"] for a in answers for node_victims in a.values() for v in node_victims["Pods"]
    ]
    # Two evictions make room for three members of 2 CPUs: one 3-CPU pod on n2
    # (4 CPUs free: two members) and one 3-CPU pod on n1 or n3.
    assert len(victims) == 2 and "uid-default-big-0" in victims, answers
    assert sum(1 for a in answers if a) == 2  # each answer names one node at most
    assert all(len(a) <= 1 for a in answers)
    # While the plan lives, asking again evicts nothing new.
    for m in members:
        again = await preempt(m, every_node)
        named = {v["UID"] for nv in again.values() for v in nv["Pods"]}
        assert named <= set(victims)
    plan = w.extender.plans.snapshot()
    assert [p["evictions"] for p in plan] == [2]
    # Once the gang holds its nodes, the plan is done.
    for i, at in enumerate(["n2", "n2", "n1" if "uid-default-big-1" in victims else "n3"]):
        w.state.apply_pod({**members[i], "spec": {**members[i]["spec"], "nodeName": at}})
    assert w.extender.plans.snapshot() == []


async def test_a_member_whose_podgroup_is_unknown_yet_evicts_nothing(
    world: tuple[World, httpx.AsyncClient],
) -> None:
    """kube-scheduler may ask to preempt before our watch delivered the PodGroup."""
    w, client = world
    w.state.apply_pod(pod("low", node="n2", cpu="2"))
    preemptor = pod("early-0", group="early", cpu="3")
    preemptor["spec"]["priority"] = 1000
    request = {
        "Pod": preemptor,
        "NodeNameToMetaVictims": {
            "n2": {"Pods": [{"UID": "uid-default-low"}], "NumPDBViolations": 0}
        },
    }
    r = await post(client, "preempt", request)
    assert r.json() == {"NodeNameToMetaVictims": {}}
    plain = pod("plain", cpu="3")  # the same request from a pod in no gang is granted
    plain["spec"]["priority"] = 1000
    r = await post(client, "preempt", {**request, "Pod": plain})
    assert list(r.json()["NodeNameToMetaVictims"]) == ["n2"]


MALFORMED_PODS = [
    {"metadata": {"name": "x", "labels": ["not", "a", "map"]}},
    {"metadata": {"name": "x", "namespace": 7}},
    {"metadata": {"name": "x"}, "spec": "nope"},
    {"metadata": {"name": "x"}, "spec": {"priority": "high"}},
    {
        "metadata": {"name": "x"},
        "spec": {"containers": [{"resources": {"requests": {"cpu": "lots"}}}]},
    },
    {"metadata": {"name": "x"}, "spec": {"containers": "nope"}},
    {"metadata": {"name": "x", "labels": {POD_GROUP_LABEL: 5}}},
]


@pytest.mark.parametrize("bad_pod", MALFORMED_PODS)
async def test_malformed_pods_never_cause_a_500(
    world: tuple[World, httpx.AsyncClient], bad_pod: dict[str, Any]
) -> None:
    _, client = world
    for verb, body in (
        ("filter", {"Pod": bad_pod, "NodeNames": ["n1"]}),
        ("prioritize", {"Pod": bad_pod, "NodeNames": ["n1"]}),
        ("preempt", {"Pod": bad_pod, "NodeNameToMetaVictims": {"n1": {"Pods": []}}}),
    ):
        r = await post(client, verb, body)
        assert r.status_code in (200, 400), (verb, r.status_code, r.text)
        if r.status_code == 400:
            assert r.json()["Error"]


@pytest.mark.parametrize(
    "body",
    [
        {"Pod": pod("a"), "Nodes": {"items": ["node"]}},
        {"Pod": pod("a"), "Nodes": {"items": [{"metadata": {}}]}},
        {"Pod": pod("a"), "NodeNames": [1, 2]},
        {"Pod": pod("a"), "NodeNameToMetaVictims": {"n1": {"Pods": "x"}}},
        {"Pod": pod("a"), "NodeNameToMetaVictims": {"n1": {"Pods": [{"UID": 3}]}}},
        {"Pod": pod("a"), "NodeNameToMetaVictims": {"n1": {"NumPDBViolations": "1"}}},
        {"PodName": 1, "PodNamespace": "d", "Node": "n1"},
    ],
)
async def test_malformed_requests_are_400_not_500(
    world: tuple[World, httpx.AsyncClient], body: dict[str, Any]
) -> None:
    _, client = world
    for verb in ("filter", "prioritize", "preempt", "bind"):
        r = await post(client, verb, body)
        assert r.status_code in (200, 400), (verb, r.status_code, r.text)


def volcano_pod(name: str, task: str, **kwargs: Any) -> dict[str, Any]:
    raw = pod(name, **kwargs)
    raw["metadata"]["annotations"] = {
        VOLCANO_GROUP_ANNOTATIONS[0]: "tf",
        VOLCANO_TASK_ANNOTATION: task,
    }
    return raw


async def test_volcano_min_task_member_gates_filter_and_bind(
    world: tuple[World, httpx.AsyncClient],
) -> None:
    w, client = world
    w.state.apply_podgroup(
        {
            "metadata": {"name": "tf", "namespace": "default", "uid": "pg-tf"},
            "spec": {"minMember": 2, "minTaskMember": {"ps": 1, "worker": 1}},
        },
        "volcano",
    )
    workers = [volcano_pod(f"w{i}", "worker") for i in range(2)]
    for raw in workers:
        w.state.apply_pod(raw)
    # minMember is met, but task ps has none of its 1.
    r = await post(client, "filter", {"Pod": workers[0], "NodeNames": ["n1"]})
    message = r.json()["FailedAndUnresolvableNodes"]["n1"]
    assert "per task for group volcano:default/tf (minTaskMember: task ps: 0 of 1)" in message
    ps = volcano_pod("ps0", "ps")
    w.state.apply_pod(ps)
    r = await post(client, "filter", {"Pod": workers[0], "NodeNames": ["n1"]})
    assert r.json()["NodeNames"] == ["n1"]

    def bind(name: str) -> Any:
        args = {"PodName": name, "PodNamespace": "default", "PodUID": f"uid-default-{name}"}
        return post(client, "bind", {**args, "Node": "n1"})

    # Two workers reach minMember 2, but the gate waits for the ps task.
    waiting = [asyncio.create_task(bind("w0")), asyncio.create_task(bind("w1"))]
    await asyncio.sleep(0.05)
    assert w.api.bound == [] and not any(t.done() for t in waiting)
    answers = await asyncio.gather(bind("ps0"), *waiting)
    assert [a.json() for a in answers] == [{"Error": ""}] * 3
    assert sorted(name for name, _ in w.api.bound) == ["ps0", "w0", "w1"]


def _overtake(state: ClusterState, how: str) -> None:
    """What our watch applies while the pod read's answer is still on its way."""
    if how == "deleted":
        state.apply_pod(pod("late", group="g"))
        state.delete_pod("default", "late", "uid-default-late")
    elif how == "deleted-unseen":
        # Created and deleted while our watch was cut: only the DELETED event arrives.
        state.delete_pod("default", "late", "uid-default-late")
    else:  # a relist taken after the pod was deleted: the watch never saw it
        state.replace_pods([])


@pytest.mark.parametrize("how", ["deleted", "deleted-unseen", "relisted"])
async def test_a_pod_read_for_binding_never_outlives_its_deletion_in_the_cache(
    world: tuple[World, httpx.AsyncClient], how: str
) -> None:
    """Found by the soak (a slow API server, a watch cut): a pod our watch had not delivered
    was read for its binding; the read's answer came after the watch's DELETED event (or a
    relist without it) and brought the pod back into the cache, where it stayed for good."""
    w, client = world
    w.state.apply_podgroup(podgroup("g", 2))
    w.api.pods["default/late"] = pod("late", group="g")
    w.api.during_read = lambda: _overtake(w.state, how)
    r = await post(
        client,
        "bind",
        {"PodName": "late", "PodNamespace": "default", "PodUID": "uid-default-late", "Node": "n1"},
    )
    assert "late" not in w.state.pods and "default/late" not in w.state.pods
    assert "deleted" in r.json()["Error"] or "relisted" in r.json()["Error"]
    assert w.api.bound == []
