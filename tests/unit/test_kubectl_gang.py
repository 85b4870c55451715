"""kubectl gang's rows: membership, counts, phase, queue, domain and reason from recorded objects.

The objects are the JSON the API server returns (tests/unit/builders.py),
the live state a /debug/gangs document as app/ops/debug.py writes it.
"""

from __future__ import annotations

from typing import Any

from app.core.groups import (
    KUEUE_GROUP_LABEL,
    KUEUE_TOTAL_COUNT_ANNOTATION,
    VOLCANO_API,
    VOLCANO_GROUP_ANNOTATIONS,
    VOLCANO_TASK_ANNOTATION,
)
from app.core.marking import LINE_GATE
from app.core.queues import QUEUE_ANNOTATION
from app.kubectl.gangs import (
    BOUND,
    GATED,
    NONE,
    PENDING,
    RESERVED,
    Gang,
    build_gangs,
    event_subjects,
    find,
    target_namespace,
)
from app.kubectl.live import Live
from app.kubectl.objects import Objects
from tests.unit.builders import pod, podgroup
from tests.unit.test_composite import cpg_object
from tests.unit.test_composite_trees import leaf

NOW = 1_800_000_000.0
UNREACHABLE = Live(
    None, "service gang-extender/gang-extender-metrics:metrics", "connection refused"
)
RACK = "example.com/rack"


def objects(pods: list[dict[str, Any]], **groups: list[dict[str, Any]]) -> Objects:
    nodes = {"n1": {RACK: "r1"}, "n2": {RACK: "r1"}, "n3": {RACK: "r2"}}
    return Objects(pods, {"x-k8s": [], "volcano": [], "native": [], **groups}, nodes, [], now=NOW)


def unschedulable(raw: dict[str, Any], message: str) -> dict[str, Any]:
    raw["status"]["conditions"] = [
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message}
    ]
    return raw


def only(gangs: list[Gang]) -> Gang:
    assert len(gangs) == 1, gangs
    return gangs[0]


def test_a_waiting_x_k8s_gang_counts_members_and_says_why_from_the_pod() -> None:
    group = podgroup("train", 3, namespace="ml")
    group["metadata"]["creationTimestamp"] = "2027-01-15T08:00:00Z"
    group["status"] = {"phase": "Pending"}
    pods = [
        pod("t-0", namespace="ml", group="train", node="n1", phase="Running"),
        unschedulable(
            pod("t-1", namespace="ml", group="train"),
            "cannot find enough sibling pods, current pods number: 2, minMember of group: 3",
        ),
    ]
    gang = only(build_gangs(objects(pods, **{"x-k8s": [group]}), UNREACHABLE))
    assert (gang.namespace, gang.name, gang.source, gang.key) == (
        "ml",
        "train",
        "x-k8s",
        "ml/train",
    )
    assert (gang.phase, gang.min_member, gang.bound, gang.reserved, gang.pending) == (
        "Pending",
        3,
        1,
        0,
        1,
    )
    assert gang.reason.startswith("cannot find enough sibling pods, current pods number: 2")
    assert gang.queue == NONE  # no Queue objects: queues do not apply
    assert gang.created > 0
    assert [(m.name, m.state, m.node) for m in gang.members] == [
        ("t-0", BOUND, "n1"),
        ("t-1", PENDING, ""),
    ]


def test_a_running_gang_has_no_reason_and_its_domain_comes_from_the_nodes() -> None:
    pods = [pod(f"r-{i}", light=("ring", "2"), node=f"n{i + 1}", phase="Running") for i in range(2)]
    for raw in pods:
        raw["metadata"]["annotations"] = {
            "kueue.x-k8s.io/podset-required-topology": RACK,
        }
    gang = only(build_gangs(objects(pods), UNREACHABLE))
    assert gang.source == "labels" and gang.key == "default/ring"
    assert gang.phase == "Running"  # no object, no live state: computed from the pods
    assert gang.reason == NONE and not gang.waiting
    assert gang.domain == "rack r1"
    assert [m.domain for m in gang.members] == ["rack r1", "rack r1"]


def test_live_reservations_and_denials_are_shown_when_the_extender_answers() -> None:
    pods = [pod(f"p-{i}", group="g") for i in range(3)]
    live = Live(
        {
            "groups": [{"key": "default/g", "phase": "PreScheduling"}],
            "gate": {"default/g": [{"pod": "default/p-0", "uid": "uid-default-p-0", "node": "n1"}]},
            "denied": [],
            "leader": True,
        },
        "service x",
    )
    gang = only(build_gangs(objects(pods, **{"x-k8s": [podgroup("g", 3)]}), live))
    assert (gang.bound, gang.reserved, gang.pending) == (0, 1, 2)
    assert gang.phase == "PreScheduling"  # the object has no status yet: the extender's
    assert gang.reason.startswith("1 member(s) reserved in the permit gate")
    assert gang.members[0].state == RESERVED

    denied = Live(
        {"denied": [{"group": "default/g", "message": "gang default/g timed out after 6s"}]}, "x"
    )
    gang = only(build_gangs(objects(pods, **{"x-k8s": [podgroup("g", 3)]}), denied))
    assert gang.reason == "gang default/g timed out after 6s"


def test_a_live_preemption_plan_is_the_reason_and_its_domain_the_gangs() -> None:
    pods = [pod(f"u-{i}", group="urgent") for i in range(2)]
    plan = {
        "group": "default/urgent",
        "kind": "preemption",
        "phase": "evicting",
        "evictions": 2,
        "slots": [{"node": "n3", "victims": ["default/low-0"], "member": ""}] * 2,
        "domain": {"level": RACK, "value": "r2"},
    }
    live = Live({"preemptionPlans": [plan]}, "x")
    gang = only(build_gangs(objects(pods, **{"x-k8s": [podgroup("urgent", 2)]}), live))
    assert gang.reason == "preemption plan evicting: 2 eviction(s) for 2 member(s)"
    assert gang.domain == "rack r2"
    done = Live({"preemptionPlans": [plan | {"phase": "done"}]}, "x")
    gang = only(build_gangs(objects(pods, **{"x-k8s": [podgroup("urgent", 2)]}), done))
    assert not gang.reason.startswith("preemption")


def test_volcano_roles_queue_and_a_missing_podgroup() -> None:
    group = {
        "apiVersion": VOLCANO_API.api_version,
        "kind": "PodGroup",
        "metadata": {"name": "tf", "namespace": "ml", "uid": "v1"},
        "spec": {"minMember": 2, "minTaskMember": {"ps": 1, "worker": 1}, "queue": "team-a"},
        "status": {"phase": "Inqueue"},
    }
    pods = []
    for name, task in (("tf-ps-0", "ps"), ("tf-worker-0", "worker")):
        raw = pod(name, namespace="ml")
        raw["metadata"]["annotations"] = {
            VOLCANO_GROUP_ANNOTATIONS[0]: "tf",
            VOLCANO_TASK_ANNOTATION: task,
        }
        pods.append(raw)
    stray = pod("lost-0", namespace="ml", group="nowhere")
    gangs = build_gangs(objects([*pods, stray], volcano=[group]), UNREACHABLE)
    lost, tf = gangs
    assert tf.key == "volcano:ml/tf" and tf.phase == "Inqueue" and tf.queue == "team-a"
    assert tf.roles == (("ps", 1), ("worker", 1))
    assert [m.task for m in tf.members] == ["ps", "worker"]
    assert lost.min_member is None and lost.phase == NONE
    assert lost.reason.startswith("PodGroup ml/nowhere not found")


def test_kueue_group_gated_members_and_a_queue_named_on_the_pods() -> None:
    pods = []
    for i in range(2):
        raw = pod(f"k-{i}")
        raw["metadata"]["labels"][KUEUE_GROUP_LABEL] = "kg"
        raw["metadata"]["annotations"] = {
            KUEUE_TOTAL_COUNT_ANNOTATION: "2",
            QUEUE_ANNOTATION: "team-b",
        }
        raw["spec"]["schedulingGates"] = [{"name": "kueue.x-k8s.io/admission"}]
        pods.append(raw)
    found = objects(pods)
    found.queues = [{"metadata": {"name": "team-b"}, "spec": {"weight": 1}}]
    gang = only(build_gangs(found, UNREACHABLE))
    assert (gang.source, gang.key, gang.min_member) == ("kueue", "kueue:default/kg", 2)
    assert gang.queue == "team-b" and gang.pending == 2
    assert {m.state for m in gang.members} == {GATED}
    assert gang.reason == "held by scheduling gate(s) kueue.x-k8s.io/admission"


def test_native_podgroup_without_pods_and_the_default_queue() -> None:
    native = {
        "metadata": {"name": "svc", "namespace": "default", "uid": "n1"},
        "spec": {"schedulingPolicy": {"gang": {"minCount": 4}}},
    }
    found = objects([], native=[native])
    found.queues = [{"metadata": {"name": "default"}, "spec": {"weight": 1}}]
    gang = only(build_gangs(found, UNREACHABLE))
    assert (gang.key, gang.min_member, gang.phase) == ("native:default/svc", 4, "Pending")
    assert gang.reason == "0 of minMember 4 pods exist"
    assert gang.queue == "default"  # Queue objects exist, the gang names none


def test_find_by_namespace_name_key_or_name() -> None:
    gangs = build_gangs(
        objects(
            [],
            **{"x-k8s": [podgroup("a", 1, namespace="ml")]},
            native=[
                {
                    "metadata": {"name": "a", "namespace": "ml"},
                    "spec": {"schedulingPolicy": {"gang": {"minCount": 2}}},
                }
            ],
        ),
        UNREACHABLE,
    )
    # Sorted by namespace, name, source.
    assert [g.key for g in find(gangs, "ml/a", "default")] == ["native:ml/a", "ml/a"]
    assert [g.key for g in find(gangs, "native:ml/a", "default")] == ["native:ml/a"]
    assert [g.key for g in find(gangs, "a", "ml")] == ["native:ml/a", "ml/a"]
    assert find(gangs, "a", "default") == []
    assert target_namespace("native:ml/a", "default") == "ml"
    assert target_namespace("ml/a", "default") == "ml"
    assert target_namespace("a", "team") == "team"


def test_nodes_the_user_may_not_read_leave_the_domain_unknown() -> None:
    found = objects([pod("x-0", group="x", node="n1", phase="Running")], **{"x-k8s": []})
    found.node_labels = {}
    raw = podgroup("x", 1)
    raw["metadata"]["annotations"] = {"kueue.x-k8s.io/podset-required-topology": RACK}
    found.groups["x-k8s"] = [raw]
    gang = only(build_gangs(found, UNREACHABLE))
    assert gang.domain == NONE
    assert gang.topology.startswith(f"required by topology key {RACK}")


def test_members_in_two_domains_are_shown_as_several() -> None:
    pods = [pod(f"s-{i}", group="s", node=n, phase="Running") for i, n in enumerate(("n1", "n3"))]
    raw = podgroup("s", 2)
    raw["metadata"]["annotations"] = {"kueue.x-k8s.io/podset-preferred-topology": RACK}
    gang = only(build_gangs(objects(pods, **{"x-k8s": [raw]}), UNREACHABLE))
    assert gang.domain == "<several>"
    assert [m.domain for m in gang.members] == ["rack r1", "rack r2"]


def test_a_gang_held_in_the_line_says_so_and_its_members_count() -> None:
    group = podgroup("wait", 2, namespace="ml")
    pods = []
    for i in range(2):
        raw = pod(f"w-{i}", namespace="ml", group="wait")
        raw["spec"]["schedulingGates"] = [{"name": LINE_GATE}]
        pods.append(raw)
    gang = only(build_gangs(objects(pods, **{"x-k8s": [group]}), UNREACHABLE))
    assert gang.pending == 2 and {m.state for m in gang.members} == {GATED}
    assert gang.reason == "held in gang-extender's line until the gang can be admitted whole"


def test_a_composite_podgroup_tree_is_one_gang_keyed_by_its_root() -> None:
    leaves = [leaf("job-a"), leaf("job-b")]
    for raw in leaves:
        raw["metadata"]["namespace"] = "default"
    root = cpg_object("job", min_groups=2, key=RACK)
    root["metadata"]["namespace"] = "default"
    members = []
    for name in ("job-a", "job-b"):
        for i in range(3):
            raw = pod(f"{name}-{i}", node="n1" if name == "job-a" else "")
            raw["spec"]["schedulingGroup"] = {"podGroupName": name}
            members.append(raw)
    found = objects(members, native=leaves)
    found.composites = [root]
    gang = only(build_gangs(found, UNREACHABLE))  # the leaves are no gangs of their own
    assert (gang.key, gang.min_member, gang.bound, gang.pending) == (
        "composite:default/job",
        6,
        3,
        3,
    )
    assert gang.object is root
    # describe shows the Events on the root CompositePodGroup, not on a PodGroup of its name.
    assert ("CompositePodGroup", "job") in event_subjects(gang)
    assert ("PodGroup", "job") not in event_subjects(gang)
    assert ("Pod", "job-b-2") in event_subjects(gang)
