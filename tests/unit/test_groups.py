from typing import Any

import pytest

from app.core.group_rules import (
    describe_task_shortfall,
    task_shortfall,
)
from app.core.group_specs import spec_from_native, spec_from_podgroup, spec_from_volcano
from app.core.groups import (
    ALL_SOURCES,
    LIGHT_MIN_AVAILABLE_LABEL,
    LIGHT_NAME_LABEL,
    POD_GROUP_LABEL,
    SOURCE_LABELS,
    SOURCE_NATIVE,
    SOURCE_VOLCANO,
    SOURCE_XK8S,
    GroupLabelError,
    GroupRef,
    GroupSpec,
    PodGroupSpecError,
    group_ref_of,
    group_ref_of_pod,
)
from app.core.groups import (
    VOLCANO_TASK_ANNOTATION as VOLCANO_TASK,
)


def test_plain_pod_has_no_group() -> None:
    assert group_ref_of("ns", {"app": "web"}) is None
    assert group_ref_of("ns", None) is None


def test_podgroup_label_points_to_crd_group() -> None:
    assert group_ref_of("ns", {POD_GROUP_LABEL: "train"}) == GroupRef("ns", "train")


def test_lightweight_labels_carry_min_available() -> None:
    ref = group_ref_of("ns", {LIGHT_NAME_LABEL: "mpi", LIGHT_MIN_AVAILABLE_LABEL: "4"})
    assert ref == GroupRef("ns", "mpi", 4, SOURCE_LABELS)
    assert ref is not None and ref.key == "ns/mpi"


def test_crd_label_wins_over_lightweight_labels() -> None:
    labels = {POD_GROUP_LABEL: "a", LIGHT_NAME_LABEL: "b", LIGHT_MIN_AVAILABLE_LABEL: "2"}
    assert group_ref_of("ns", labels) == GroupRef("ns", "a")


@pytest.mark.parametrize(
    ("labels", "hint"),
    [
        ({POD_GROUP_LABEL: ""}, "is empty"),
        ({LIGHT_NAME_LABEL: "mpi"}, "needs pod-group.scheduling.sigs.k8s.io/min-available"),
        ({LIGHT_NAME_LABEL: "mpi", LIGHT_MIN_AVAILABLE_LABEL: "many"}, "whole number >= 1"),
        ({LIGHT_NAME_LABEL: "mpi", LIGHT_MIN_AVAILABLE_LABEL: "0"}, "whole number >= 1"),
    ],
)
def test_unusable_labels_explain_the_fix(labels: dict[str, str], hint: str) -> None:
    with pytest.raises(GroupLabelError, match=hint):
        group_ref_of("ns", labels)


def test_podgroup_spec_is_read_and_validated() -> None:
    spec = spec_from_podgroup(
        "ns/pg",
        {"minMember": 3, "minResources": {"cpu": "6"}, "scheduleTimeoutSeconds": 20},
    )
    assert (spec.min_member, spec.min_resources, spec.schedule_timeout_seconds) == (
        3,
        {"cpu": 6000},
        20,
    )
    with pytest.raises(
        PodGroupSpecError, match="minMember must be an integer between 1 and 2147483647, got 0"
    ):
        spec_from_podgroup("ns/pg", {"minMember": 0})
    with pytest.raises(PodGroupSpecError, match="minResources"):
        spec_from_podgroup("ns/pg", {"minMember": 1, "minResources": {"cpu": "lots"}})


# ---- every source ends in one GroupSpec --------------------------------------------------


def pod_ref(
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    spec: dict[str, Any] | None = None,
    sources: frozenset[str] = ALL_SOURCES,
) -> GroupRef | None:
    meta = {"labels": labels or {}, "annotations": annotations or {}}
    return group_ref_of_pod("ns", meta, spec or {}, sources)


def test_each_source_names_its_group_and_key() -> None:
    volcano = pod_ref(annotations={"scheduling.k8s.io/group-name": "tf", VOLCANO_TASK: "ps"})
    assert volcano == GroupRef("ns", "tf", source=SOURCE_VOLCANO, task="ps")
    assert volcano.key == "volcano:ns/tf"
    assert pod_ref(annotations={"scheduling.volcano.sh/group-name": "tf"}) == GroupRef(
        "ns", "tf", source=SOURCE_VOLCANO
    )
    native = pod_ref(spec={"schedulingGroup": {"podGroupName": "inf"}})
    assert native == GroupRef("ns", "inf", source=SOURCE_NATIVE)
    assert native.key == "native:ns/inf"
    assert pod_ref({POD_GROUP_LABEL: "pi"}) == GroupRef("ns", "pi", source=SOURCE_XK8S)


def test_x_k8s_label_wins_then_native_then_volcano_then_labels() -> None:
    everything = {
        "labels": {POD_GROUP_LABEL: "a", LIGHT_NAME_LABEL: "d", LIGHT_MIN_AVAILABLE_LABEL: "2"},
        "annotations": {"scheduling.k8s.io/group-name": "c"},
    }
    spec = {"schedulingGroup": {"podGroupName": "b"}}
    order = [SOURCE_XK8S, SOURCE_NATIVE, SOURCE_VOLCANO, SOURCE_LABELS]
    for i, expected in enumerate(order):
        ref = group_ref_of_pod("ns", everything, spec, frozenset(order[i:]))
        assert ref is not None and ref.source == expected


def test_a_switched_off_source_leaves_its_pods_to_schedule_alone() -> None:
    native = {"schedulingGroup": {"podGroupName": "inf"}}
    assert pod_ref(spec=native, sources=frozenset({SOURCE_XK8S, SOURCE_LABELS})) is None
    volcano = {"scheduling.k8s.io/group-name": "tf"}
    assert pod_ref(annotations=volcano, sources=frozenset({SOURCE_NATIVE})) is None


def test_empty_volcano_annotation_explains_the_fix() -> None:
    hint = r"annotation scheduling\.k8s\.io/group-name is empty"
    with pytest.raises(GroupLabelError, match=hint):
        pod_ref(annotations={"scheduling.k8s.io/group-name": ""})


def test_schedule_timeout_zero_or_absent_means_the_default() -> None:
    # mpi-operator and the training-operator write 0 when the job sets no timeout.
    assert spec_from_podgroup("ns/pi", {"minMember": 3, "scheduleTimeoutSeconds": 0}) == (
        GroupSpec("ns/pi", 3)
    )
    assert spec_from_podgroup("ns/pi", {"minMember": 3}).schedule_timeout_seconds is None
    with pytest.raises(
        PodGroupSpecError, match="scheduleTimeoutSeconds must be an integer between 0 and"
    ):
        spec_from_podgroup("ns/pi", {"minMember": 3, "scheduleTimeoutSeconds": -1})


def test_volcano_spec_reads_tasks_queue_and_priority() -> None:
    spec = spec_from_volcano(
        "volcano:ns/tf",
        {
            "minMember": 3,
            "minResources": {"cpu": "2"},
            "minTaskMember": {"worker": 2, "ps": 1, "chief": 0},
            "queue": "research",
            "priorityClassName": "high",
        },
    )
    assert spec == GroupSpec(
        "volcano:ns/tf",
        3,
        {"cpu": 2000},
        source=SOURCE_VOLCANO,
        min_task_member=(("ps", 1), ("worker", 2)),
        queue="research",
        priority_class_name="high",
    )
    assert spec_from_volcano("volcano:ns/tf", {"minMember": 0}).min_member == 1
    with pytest.raises(PodGroupSpecError, match=r"minTaskMember\[ps\]"):
        spec_from_volcano("volcano:ns/tf", {"minMember": 1, "minTaskMember": {"ps": "one"}})


def test_native_spec_reads_the_gang_policy() -> None:
    gang = {"schedulingPolicy": {"gang": {"minCount": 4}}, "priorityClassName": "p"}
    assert spec_from_native("native:ns/inf", gang) == GroupSpec(
        "native:ns/inf", 4, source=SOURCE_NATIVE, priority_class_name="p"
    )
    # The basic policy is no gang: every pod on its own.
    basic: dict[str, Any] = {"schedulingPolicy": {"basic": {}}}
    assert spec_from_native("native:ns/inf", basic).min_member == 1
    with pytest.raises(PodGroupSpecError, match="minCount"):
        spec_from_native("native:ns/inf", {"schedulingPolicy": {"gang": {}}})


def test_task_shortfall_names_every_task_below_its_minimum() -> None:
    spec = GroupSpec("k", 3, min_task_member=(("ps", 1), ("worker", 2)))
    assert task_shortfall(spec, ["worker", "worker", "worker"]) == [("ps", 0, 1)]
    assert task_shortfall(spec, ["ps", "worker"]) == [("worker", 1, 2)]
    assert task_shortfall(spec, ["ps", "worker", "worker"]) == []
    assert task_shortfall(GroupSpec("k", 3), []) == []
    message = describe_task_shortfall(spec, [("ps", 0, 1)])
    assert "task ps: 0 of 1" in message and "volcano.sh/task-spec" in message
