"""Topology-aware gangs, the pure part: constraints, levels, domains, preemption per domain."""

from __future__ import annotations

import pytest

from app.core.contention import Contest, Gang, Holder, Ruling
from app.core.group_rules import (
    spec_from_labels,
)
from app.core.group_specs import spec_from_native, spec_from_volcano
from app.core.groups import (
    ALL_SOURCES,
    KUEUE_GROUP_LABEL,
    KUEUE_TOTAL_COUNT_ANNOTATION,
    SOURCE_KUEUE,
    GroupLabelError,
    GroupRef,
    PodGroupSpecError,
    group_ref_of_pod,
)
from app.core.packing import Bin, Demand
from app.core.preemption.cheapest_victims import Evictable
from app.core.preemption.planner import plan_in_domains
from app.core.records import pod_record_from, podgroup_record_from
from app.core.topology.domains import (
    DEFAULT_LEVELS,
    Domain,
    TopologyConstraint,
    TopologyError,
    Where,
    domain_message,
    fullest_first,
    levels_to_try,
    parse_levels,
    place,
    with_key,
)
from app.core.topology.sources import (
    KUEUE_PREFERRED,
    KUEUE_REQUIRED,
    constraint_from_annotations,
    constraint_from_native,
    constraint_from_volcano,
    constraint_of,
)
from app.runtime.preemption.unasked import NO_DOMAIN_ROOM

RACK = "example.com/rack"
BLOCK = "example.com/block"
ZONE = "topology.kubernetes.io/zone"
HOST = "kubernetes.io/hostname"
LEVELS = (HOST, RACK, BLOCK, ZONE)


def cpu(cores: float) -> dict[str, int]:
    return {"cpu": int(cores * 1000), "pods": 1000}


def world(free: dict[str, float] | None = None) -> list[Bin]:
    """2 zones x 2 blocks x 2 racks x 2 nodes of 4 CPUs (less where `free` says)."""
    bins = []
    for z in range(2):
        for b in range(2):
            for r in range(2):
                for n in range(2):
                    name = f"z{z}-b{b}-r{r}-n{n}"
                    labels = {
                        HOST: name,
                        RACK: f"z{z}b{b}r{r}",
                        BLOCK: f"z{z}b{b}",
                        ZONE: f"z{z}",
                    }
                    cores = (free or {}).get(name, 4.0)
                    bins.append(Bin(name, {"cpu": int(cores * 1000), "pods": 110_000}, labels))
    return bins


def gang(key: str, members: int, cores: float) -> Gang:
    demands = tuple(Demand(f"{key}-{i}", cpu(cores)) for i in range(members))
    return Gang(key, 0, 0.0, demands, members)


def racks_of(plan: dict[str, str], bins: list[Bin]) -> set[str]:
    labels = {b.name: b.labels for b in bins}
    return {labels[node][RACK] for node in plan.values()}


# ---- constraints from each source ------------------------------------------------


def test_native_podgroup_topology_key_is_required() -> None:
    spec = spec_from_native(
        "native:ml/train",
        {
            "schedulingPolicy": {"gang": {"minCount": 4}},
            "schedulingConstraints": {"topology": [{"key": RACK}]},
        },
    )
    assert spec.topology == TopologyConstraint(
        RACK, True, origin="PodGroup spec.schedulingConstraints.topology"
    )
    assert constraint_from_native({}) is None


def test_native_podgroup_with_two_topology_keys_is_refused_with_the_fix() -> None:
    with pytest.raises(PodGroupSpecError, match="exactly one"):
        spec_from_native(
            "native:ml/train",
            {
                "schedulingPolicy": {"gang": {"minCount": 4}},
                "schedulingConstraints": {"topology": [{"key": RACK}, {"key": ZONE}]},
            },
        )


def test_volcano_network_topology_hard_and_soft() -> None:
    hard = spec_from_volcano(
        "volcano:ml/a",
        {"minMember": 2, "networkTopology": {"mode": "hard", "highestTierAllowed": 2}},
    ).topology
    assert hard is not None and hard.required and hard.tier == 2
    soft = constraint_from_volcano({"networkTopology": {"mode": "soft"}})
    assert soft is not None and not soft.required and soft.tier == 1
    assert constraint_from_volcano({}) is None
    with pytest.raises(TopologyError, match="hard or soft"):
        constraint_from_volcano({"networkTopology": {"mode": "strict"}})
    with pytest.raises(TopologyError, match="highestTierAllowed"):
        constraint_from_volcano({"networkTopology": {"highestTierAllowed": 0}})
    named = constraint_from_volcano(
        {"networkTopology": {"mode": "hard", "highestTierName": "spine"}}
    )
    assert named is not None and named.required and named.tier_name == "spine"
    with pytest.raises(TopologyError, match="set one"):
        constraint_from_volcano(
            {"networkTopology": {"highestTierAllowed": 1, "highestTierName": "spine"}}
        )


def test_kueue_annotations_required_wins_over_preferred() -> None:
    both = {KUEUE_REQUIRED: BLOCK, KUEUE_PREFERRED: RACK}
    assert constraint_from_annotations(both, "pod") == TopologyConstraint(
        BLOCK, True, origin=f"annotation {KUEUE_REQUIRED} on the pod"
    )
    preferred = constraint_from_annotations({KUEUE_PREFERRED: RACK}, "PodGroup")
    assert preferred is not None and not preferred.required and preferred.key == RACK
    assert constraint_from_annotations({"other": "x"}, "pod") is None
    with pytest.raises(TopologyError, match="must be a node label key"):
        constraint_from_annotations({KUEUE_REQUIRED: " "}, "pod")


def test_kueue_annotations_on_an_x_k8s_podgroup_and_on_label_only_pods() -> None:
    record = podgroup_record_from(
        {
            "metadata": {
                "namespace": "ml",
                "name": "train",
                "annotations": {KUEUE_REQUIRED: RACK},
            },
            "spec": {"minMember": 4},
        }
    )
    assert record.spec is not None and record.spec.topology is not None
    assert record.spec.topology.key == RACK and record.spec.topology.required
    pod = pod_record_from(
        {
            "metadata": {
                "namespace": "ml",
                "name": "p-0",
                "labels": {
                    "pod-group.scheduling.sigs.k8s.io/name": "g",
                    "pod-group.scheduling.sigs.k8s.io/min-available": "2",
                },
                "annotations": {KUEUE_PREFERRED: RACK},
            },
            "spec": {"containers": []},
        }
    )
    assert pod.topology is not None and not pod.topology.required
    # A bad annotation on a PodGroup makes the group unusable, with the fix named.
    bad = podgroup_record_from(
        {
            "metadata": {"namespace": "ml", "name": "t", "annotations": {KUEUE_REQUIRED: ""}},
            "spec": {"minMember": 1},
        }
    )
    assert bad.spec is None and bad.error is not None and KUEUE_REQUIRED in bad.error


def test_the_group_object_wins_then_the_first_member_by_name() -> None:
    own = TopologyConstraint(ZONE, True)
    a = TopologyConstraint(RACK, False)
    b = TopologyConstraint(BLOCK, True)
    assert constraint_of(own, [("ml/b", b)]) is own
    assert constraint_of(None, [("ml/b", b), ("ml/a", a), ("ml/0", None)]) is a
    assert constraint_of(None, [], b) is b
    assert constraint_of(None, []) is None


# ---- levels ---------------------------------------------------------------------


def test_levels_parse_and_topology_key_joins_them() -> None:
    assert parse_levels(f"{HOST}, {RACK},{ZONE}") == (HOST, RACK, ZONE)
    with pytest.raises(TopologyError, match="twice"):
        parse_levels(f"{RACK},{RACK}")
    with pytest.raises(TopologyError, match="at least one"):
        parse_levels(" , ")
    assert with_key(DEFAULT_LEVELS, RACK) == (HOST, RACK, ZONE)
    assert with_key(DEFAULT_LEVELS, ZONE) == DEFAULT_LEVELS
    assert with_key(DEFAULT_LEVELS, None) == DEFAULT_LEVELS


def test_levels_tried_required_preferred_and_volcano_tiers() -> None:
    assert levels_to_try(TopologyConstraint(RACK, True), LEVELS) == ([RACK], False)
    assert levels_to_try(TopologyConstraint(RACK, False), LEVELS) == ([RACK, BLOCK, ZONE], True)
    # A preferred label outside the configured levels: it, then anywhere.
    assert levels_to_try(TopologyConstraint("x/y", False), LEVELS) == (["x/y"], True)
    # Volcano tiers count the levels above the node: tier 2 = block.
    assert levels_to_try(TopologyConstraint("", True, tier=2), LEVELS) == ([RACK, BLOCK], False)
    assert levels_to_try(TopologyConstraint("", True, tier=9), LEVELS) == (
        [RACK, BLOCK, ZONE],
        False,
    )
    assert levels_to_try(TopologyConstraint("", False, tier=1), LEVELS) == (
        [RACK, BLOCK, ZONE],
        True,
    )


# ---- domain choice ----------------------------------------------------------------


def test_required_rack_gang_is_admitted_in_one_rack() -> None:
    bins = world()
    placed = place(
        gang("ml/a", 4, 2), Where(TopologyConstraint(RACK, True), LEVELS), Contest(bins), 0, 60
    )
    assert placed.decision.verdict is Ruling.ADMIT
    assert placed.domain is not None and placed.domain.level == RACK
    assert racks_of(dict(placed.decision.plan), bins) == {placed.domain.value}


def test_the_fullest_rack_that_fits_is_chosen_leaving_empty_racks_whole() -> None:
    # Rack z1b1r0 is half full (its two nodes have 2 of 4 CPUs free): a gang of
    # 4 x 1 CPU fits there, and goes there rather than opening an empty rack.
    bins = world({"z1-b1-r0-n0": 2, "z1-b1-r0-n1": 2})
    placed = place(
        gang("ml/a", 4, 1), Where(TopologyConstraint(RACK, True), LEVELS), Contest(bins), 0, 60
    )
    assert placed.domain == Domain(RACK, "z1b1r0")
    # A larger gang (4 x 2 CPUs) does not fit there: the first empty rack by name.
    big = place(
        gang("ml/b", 4, 2), Where(TopologyConstraint(RACK, True), LEVELS), Contest(bins), 0, 60
    )
    assert big.domain == Domain(RACK, "z0b0r0")


def test_fullest_first_skips_domains_short_in_total() -> None:
    bins = world({"z0-b0-r0-n0": 0})
    groups = {"a": bins[:2], "b": bins[2:4]}
    assert fullest_first(groups, cpu(5)) == ["b"]
    assert fullest_first(groups, cpu(1)) == ["a", "b"]


def test_no_rack_holds_the_gang_so_it_is_short_with_a_message_naming_the_level() -> None:
    bins = world()
    placed = place(
        gang("ml/a", 3, 3), Where(TopologyConstraint(RACK, True), LEVELS), Contest(bins), 0, 60
    )
    assert placed.decision.verdict is Ruling.SHORT
    assert placed.no_domain and placed.domain is None
    assert placed.decision.message.startswith(
        "gang ml/a needs its 3 missing member(s) (cpu 9, pods 3) in one rack (required by "
        "topology key example.com/rack); no rack has that much free now"
    )
    # The words the extender's own preemption of a native gang reads (kube-scheduler's
    # pod-group cycle asks no preempt verb).
    assert NO_DOMAIN_ROOM in placed.decision.message


def test_preferred_rack_falls_back_to_block_then_zone_then_anywhere() -> None:
    preferred = TopologyConstraint(RACK, False)
    bins = world()
    # 3 x 3 CPUs: no rack (2 x 4 CPUs), one block.
    block = place(gang("ml/a", 3, 3), Where(preferred, LEVELS), Contest(bins), 0, 60)
    assert block.domain is not None and block.domain.level == BLOCK
    # 5 x 3 CPUs: no block (4 x 4), one zone.
    zone = place(gang("ml/b", 5, 3), Where(preferred, LEVELS), Contest(bins), 0, 60)
    assert zone.domain is not None and zone.domain.level == ZONE
    # 9 x 3 CPUs: no zone (8 x 4): anywhere.
    anywhere = place(gang("ml/c", 9, 3), Where(preferred, LEVELS), Contest(bins), 0, 60)
    assert anywhere.decision.verdict is Ruling.ADMIT and anywhere.domain is None
    # The required rack is refused where the preferred one fell back.
    assert (
        place(
            gang("ml/a", 3, 3), Where(TopologyConstraint(RACK, True), LEVELS), Contest(bins), 0, 60
        ).decision.verdict
        is Ruling.SHORT
    )


def test_placed_members_pin_the_domain_of_a_restarted_member() -> None:
    bins = world()
    required = TopologyConstraint(RACK, True)
    # Siblings run in rack z1b0r1: the restarted member goes back there, although
    # an emptier-named rack (z0b0r0) comes first otherwise.
    placed = place(
        gang("ml/a", 1, 1), Where(required, LEVELS, ["z1-b0-r1-n0"]), Contest(bins), 0, 60
    )
    assert placed.domain == Domain(RACK, "z1b0r1")
    # Siblings in two racks: no rack can hold the whole gang.
    split = place(
        gang("ml/a", 1, 1),
        Where(required, LEVELS, ["z1-b0-r1-n0", "z0-b0-r0-n0"]),
        Contest(bins),
        0,
        60,
    )
    assert split.decision.verdict is Ruling.SHORT
    assert "already placed on z0-b0-r0-n0, z1-b0-r1-n0" in split.decision.message


def test_a_claim_in_one_rack_sends_the_next_gang_to_another_or_behind_it() -> None:
    bins = world()
    required = TopologyConstraint(RACK, True)
    # Every rack but z1b1r1 is held by another gang's claim.
    holders = [
        Holder(f"ml/h{i}", 0, 0.0, {b.name: cpu(4) for b in bins[2 * i : 2 * i + 2]})
        for i in range(7)
    ]
    placed = place(gang("ml/a", 2, 4), Where(required, LEVELS), Contest(bins, holders), 0, 60)
    assert placed.domain == Domain(RACK, "z1b1r1")


def test_domain_message_says_where_the_gang_is_and_why() -> None:
    required = TopologyConstraint(RACK, True, origin="PodGroup spec.schedulingConstraints.topology")
    assert domain_message("ml/train", Domain(RACK, "r2"), required, "r1") == (
        "gang ml/train is placed in rack r2, required by topology key example.com/rack "
        "(PodGroup spec.schedulingConstraints.topology); this node is in rack r1"
    )
    assert domain_message("ml/train", Domain(RACK, "r2"), required, None).endswith(
        "this node has no label example.com/rack"
    )


# ---- preemption inside one domain -------------------------------------------------


def test_preemption_plans_in_the_domain_whose_victims_cost_least() -> None:
    # Two racks of two full nodes; rack "a" has 3 victims in the way, rack "b" 2.
    bins = [Bin(n, {"cpu": 0, "pods": 110_000}) for n in ("a0", "a1", "b0", "b1")]

    def victims(node: str, count: int) -> list[Evictable]:
        share = 4000 // count
        return [
            Evictable((f"{node}-{i}",), (f"ns/{node}-{i}",), node, {"cpu": share}, 0)
            for i in range(count)
        ]

    evictable = {"a0": victims("a0", 2), "a1": victims("a1", 1), "b0": victims("b0", 1)}
    evictable["b1"] = victims("b1", 1)
    demands = [Demand(f"m{i}", cpu(4)) for i in range(2)]
    found = plan_in_domains(
        demands, bins, evictable, None, [("a", ["a0", "a1"]), ("b", ["b0", "b1"])]
    )
    assert found is not None
    domain, result = found
    assert domain == "b"
    assert result.cost.evictions == 2
    assert {p.node for p in result.nodes} == {"b0", "b1"}
    # A domain that cannot hold the gang whatever is evicted is never chosen.
    assert plan_in_domains(demands, bins, evictable, None, [("a", ["a0"])]) is None


# ---- Kueue's plain pod groups, a group source -------------------------------------


def test_kueue_plain_pod_group_is_a_group_of_its_total_count() -> None:
    meta = {
        "labels": {KUEUE_GROUP_LABEL: "job"},
        "annotations": {KUEUE_TOTAL_COUNT_ANNOTATION: "4", KUEUE_REQUIRED: RACK},
    }
    ref = group_ref_of_pod("ml", meta, {})
    assert ref == GroupRef("ml", "job", 4, SOURCE_KUEUE)
    assert ref.key == "kueue:ml/job"
    spec = spec_from_labels(ref, lambda _key: [])
    assert (spec.key, spec.min_member, spec.source) == ("kueue:ml/job", 4, SOURCE_KUEUE)
    record = pod_record_from({"metadata": {"namespace": "ml", "name": "p", **meta}, "spec": {}})
    assert record.group == ref and record.topology is not None and record.topology.required
    # Switched off (--kueue-pod-groups=off): the pod is on its own.
    assert group_ref_of_pod("ml", meta, {}, ALL_SOURCES - {SOURCE_KUEUE}) is None


def test_kueue_pod_group_without_a_usable_total_count_is_explained() -> None:
    for given in (
        {},
        {KUEUE_TOTAL_COUNT_ANNOTATION: "0"},
        {KUEUE_TOTAL_COUNT_ANNOTATION: "x"},
    ):
        with pytest.raises(GroupLabelError, match="pod-group-total-count set to a whole number"):
            group_ref_of_pod("ml", {"labels": {KUEUE_GROUP_LABEL: "job"}, "annotations": given}, {})
