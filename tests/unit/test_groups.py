import pytest

from app.groups import (
    LIGHT_MIN_AVAILABLE_LABEL,
    LIGHT_NAME_LABEL,
    POD_GROUP_LABEL,
    GroupLabelError,
    GroupRef,
    PodGroupSpecError,
    group_ref_of,
    spec_from_podgroup,
)


def test_plain_pod_has_no_group() -> None:
    assert group_ref_of("ns", {"app": "web"}) is None
    assert group_ref_of("ns", None) is None


def test_podgroup_label_points_to_crd_group() -> None:
    assert group_ref_of("ns", {POD_GROUP_LABEL: "train"}) == GroupRef("ns", "train")


def test_lightweight_labels_carry_min_available() -> None:
    ref = group_ref_of("ns", {LIGHT_NAME_LABEL: "mpi", LIGHT_MIN_AVAILABLE_LABEL: "4"})
    assert ref == GroupRef("ns", "mpi", 4)
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
