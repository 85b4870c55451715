"""One group per domain, with room for members still to come (LeaderWorkerSet). Pure.

LeaderWorkerSet's `exclusive-topology` (app/core/lws.py) puts one replica per
domain of a node label: its pod webhook gives the leader a required pod
affinity to its own group's pods and a required pod anti-affinity to every
other group's (label `leaderworkerset.sigs.k8s.io/group-key`), which
kube-scheduler enforces; and its controller creates the workers only once
the leader has a node, with a nodeSelector on the leader's domain. So the
leader is placed alone, and where it goes decides the replica's domain:

- a domain holding a placed member of another group of its namespace is
  barred (kube-scheduler would refuse the leader there: the anti-affinity,
  whose term names no namespaces, so it weighs the pod's own);
- the domain must have room for the whole replica, the members not created
  yet counted like the ones there are (the workers usually share the
  leader's shape), else the leader would start in a domain its workers can
  never join.

`exclusive_room()` narrows the free nodes to the domains that pass both, or
says why none does.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import replace

from app.core.packing import Bin, Demand, pack
from app.core.topology.domains import by_domain, short_level


def exclusive_room(
    key: str,
    demands: Sequence[Demand],
    size: int,
    level: str,
    free: Sequence[Bin],
    barred: Collection[str],
    sub: tuple[int, str] | None = None,
) -> tuple[list[Bin], str]:
    """The nodes of the domains of `level` that hold no other group and fit `size` members.

    `demands`: the group's members not placed yet (at least one); the rest of
    `size` is counted as copies of the first. `barred`: the domains holding a
    placed member of another group. `sub`: LWS's subgroup-exclusive-topology
    (sub-group size, level): the members, cut into sub-groups, must each find
    a domain of that level of their own inside. Returns the nodes (empty:
    none) and, when empty, the message saying why.
    """
    expected = list(demands)
    for i in range(len(expected), size):
        expected.append(replace(demands[0], key=f"{key}#to-come-{i}"))
    nodes: list[Bin] = []
    taken = too_small = 0
    for value, bins in by_domain(free, level).items():
        if value in barred:
            taken += 1
        elif pack(expected, bins).fits if sub is None else _sub_groups_fit(expected, bins, *sub):
            nodes.extend(bins)
        else:
            too_small += 1
    if nodes:
        return nodes, ""
    name = short_level(level)
    inside = f", each sub-group of {sub[0]} in a {short_level(sub[1])} of its own" if sub else ""
    return [], (
        f"gang {key} needs one {name} ({level}) of its own with room for all its {size} "
        f"member(s){inside}, those not created yet counted like the first: {taken} {name}(s) "
        f"hold another group, {too_small} lack the room; it stays pending, nothing is reserved"
    )


def _sub_groups_fit(expected: list[Demand], bins: Sequence[Bin], size: int, level: str) -> bool:
    """Can the members, in sub-groups of `size` (LWS's getSubGroupIndex: the leader the extra
    one of the first when size divides the workers), each go whole into a domain of `level`
    of its own (subgroup-exclusive-topology: one sub-group per domain)?"""
    cuts = [size + 1] if (len(expected) - 1) % size == 0 else []
    start = sum(cuts)
    cuts += [size] * ((len(expected) - start + size - 1) // size)
    domains = list(by_domain(bins, level).values())
    first = 0
    for cut in cuts:
        group = expected[first : first + cut]
        first += cut
        found = next((d for d in domains if pack(group, d).fits), None)
        if found is None:
            return False
        domains.remove(found)
    return True
