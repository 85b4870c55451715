"""bench/topology.py's pure parts: the seeded workload and the rack check of each gang."""

from __future__ import annotations

from bench.topology import GANG_LABEL, RACK, labels_of, node_names, racks_per_gang, workload


def test_the_workload_is_seeded_and_every_gang_fits_one_rack() -> None:
    gangs = workload(40, 19)
    assert gangs == workload(40, 19)
    assert gangs != workload(40, 20)
    assert all(2 <= g.size <= 8 for g in gangs)  # a rack: 2 nodes of 4 CPUs
    assert 0 < sum(g.required for g in gangs) < len(gangs)


def test_nodes_are_two_zones_of_two_blocks_of_two_racks_of_two() -> None:
    names = node_names()
    assert len(names) == 16
    assert len({labels_of(n)[RACK] for n in names}) == 8
    assert labels_of("topo-z1-b0-r1-n0") == {
        RACK: "z1b0r1",
        "example.com/block": "z1b0",
        "topology.kubernetes.io/zone": "z1",
    }


def test_a_gang_is_in_one_rack_only_if_every_placed_member_is() -> None:
    def placed(name: str, gang: str, node: str | None) -> dict[str, object]:
        return {
            "metadata": {"name": name, "labels": {GANG_LABEL: gang}},
            "spec": {"nodeName": node},
        }

    pods = [
        placed("a-0", "a", "topo-z0-b0-r0-n0"),
        placed("a-1", "a", "topo-z0-b0-r0-n1"),
        placed("b-0", "b", "topo-z0-b0-r0-n0"),
        placed("b-1", "b", "topo-z0-b0-r1-n0"),
        placed("c-0", "c", None),
    ]
    assert racks_per_gang(pods) == {"a": {"z0b0r0"}, "b": {"z0b0r0", "z0b0r1"}}
