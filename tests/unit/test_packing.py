from app.packing import (
    Bin,
    Demand,
    Placement,
    Requirement,
    Taint,
    Toleration,
    pack,
    placement_of,
    taints_of,
)


def cpu(cores: float, pods: int = 1) -> dict[str, int]:
    return {"cpu": int(cores * 1000), "pods": pods * 1000}


def nodes(*cores: float, pods: int = 110) -> list[Bin]:
    return [Bin(f"n{i}", cpu(c, pods)) for i, c in enumerate(cores)]


def test_first_fit_decreasing_places_large_members_first() -> None:
    # In arrival order, first fit would put 1+1 on n0 and then find no room
    # for either 3; largest first fits all four.
    demands = [Demand("a", cpu(1)), Demand("b", cpu(1)), Demand("c", cpu(3)), Demand("d", cpu(3))]
    result = pack(demands, nodes(4, 4))
    assert result.fits
    assert result.plan == {"c": "n0", "d": "n1", "a": "n0", "b": "n1"}


def test_does_not_fit_names_the_aggregate_shortfall() -> None:
    demands = [Demand(f"m{i}", cpu(2)) for i in range(4)]
    result = pack(demands, nodes(4, 2))
    assert not result.fits
    assert len(result.plan) == 3
    assert result.shortfall == {"cpu": 2000}
    message = result.describe("ns/g", demands)
    assert "gang ns/g needs 4 more member(s)" in message
    assert "only 3 fit" in message and "short by cpu 2" in message


def test_fragmentation_is_reported_when_the_total_would_suffice() -> None:
    # 3 free CPUs in total, but no node has 2.
    result = pack([Demand("m0", cpu(2))], nodes(1, 1, 1))
    assert not result.fits
    assert result.shortfall == {"cpu": 1000}


def test_need_stops_once_min_member_is_reached() -> None:
    demands = [Demand(f"m{i}", cpu(2)) for i in range(5)]
    result = pack(demands, nodes(4), need=2)
    assert result.fits and len(result.plan) == 2
    assert pack(demands, nodes(4), need=3).fits is False


def test_pods_per_node_counts() -> None:
    demands = [Demand(f"m{i}", cpu(0.1)) for i in range(3)]
    assert not pack(demands, nodes(8, pods=2)).fits
    assert pack(demands, nodes(8, 8, pods=2)).fits


def test_input_bins_are_not_modified() -> None:
    bins = nodes(4)
    pack([Demand("m", cpu(3))], bins)
    assert bins[0].free == cpu(4, 110)


def test_node_selector_affinity_and_taints_decide_the_node() -> None:
    gpu = Bin("gpu", cpu(8), {"accel": "gpu", "zone": "a"}, (Taint("gpu", "", "NoSchedule"),))
    plain = Bin("plain", cpu(8), {"zone": "b"})
    selector = Placement(node_selector=(("accel", "gpu"),))
    assert not pack([Demand("m", cpu(1), selector)], [gpu, plain]).fits
    tolerating = Placement((("accel", "gpu"),), (), (Toleration("gpu", "Exists", "", ""),))
    assert pack([Demand("m", cpu(1), tolerating)], [gpu, plain]).plan == {"m": "gpu"}
    zone_b = Placement(terms=((Requirement("zone", "In", ("b",)),),))
    assert pack([Demand("m", cpu(1), zone_b)], [gpu, plain]).plan == {"m": "plain"}
    nowhere = Placement(node_selector=(("accel", "tpu"),))
    result = pack([Demand("m", cpu(1), nowhere)], [gpu, plain])
    assert not result.fits and result.no_node == ("m",)
    assert "match no schedulable node" in result.describe("ns/g", [Demand("m", cpu(1))])
    # An untainted pod does not go to the tainted node.
    assert pack([Demand("m", cpu(1))], [gpu]).fits is False
    # PreferNoSchedule does not keep pods away.
    soft = Bin("soft", cpu(8), {}, (Taint("x", "", "PreferNoSchedule"),))
    assert pack([Demand("m", cpu(1))], [soft]).fits


def test_affinity_operators() -> None:
    labels = {"zone": "a", "gen": "5"}

    def allows(*reqs: Requirement) -> bool:
        return Placement(terms=(reqs,)).allows("n1", labels, ())

    assert allows(Requirement("zone", "In", ("a", "b")))
    assert not allows(Requirement("zone", "NotIn", ("a",)))
    assert allows(Requirement("rack", "DoesNotExist", ()))
    assert allows(Requirement("gen", "Gt", ("4",)))
    assert not allows(Requirement("gen", "Lt", ("4",)))
    assert allows(Requirement("metadata.name", "In", ("n1",), field=True))
    assert not allows(Requirement("zone", "Exists", ()), Requirement("rack", "Exists", ()))
    # Terms are ORed.
    either = Placement(
        terms=((Requirement("rack", "Exists", ()),), (Requirement("zone", "In", ("a",)),))
    )
    assert either.allows("n1", labels, ())


def test_placement_and_taints_parsed_from_the_api_objects() -> None:
    spec = {
        "nodeSelector": {"pool": "batch"},
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}
                    ]
                }
            }
        },
        "tolerations": [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}],
    }
    placement = placement_of(spec)
    assert placement is not None
    taints = taints_of({"taints": [{"key": "gpu", "effect": "NoSchedule"}]})
    assert placement.allows("n", {"pool": "batch", "zone": "a"}, taints)
    assert not placement.allows("n", {"pool": "batch", "zone": "b"}, taints)
    assert placement_of({"containers": []}) is None
