"""Where a gang may go: its topology constraint, the one domain it must fit in, and telling so.

The constraint comes from the gang's group object or its pods' Kueue
annotations (app/core/topology/sources.py); the levels are the configured
ones, then the HyperNode tiers the cluster has (app/core/state.py). A gang
made of groups (Kueue slices, Volcano roles) has a tree
(app/core/topology/tree.py), built here from its members: each sub-group
gets its own domain inside the gang's, and a member is held to its own.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import replace
from functools import partial
from typing import TYPE_CHECKING

from app.base.metrics import Metrics
from app.core.contention import Contest, Decision, Gang, Ruling, decide
from app.core.groups import GroupSpec
from app.core.observer import GangObserver
from app.core.packing import Bin, Packing
from app.core.records import PodRecord
from app.core.state import ClusterState
from app.core.topology.domains import (
    Domain,
    TopologyConstraint,
    TopologyError,
    Where,
    fits_one_domain,
    levels_to_try,
    place,
    placed_message,
)
from app.core.topology.exclusive import exclusive_room
from app.core.topology.held import HeldGroup, groups_message, held_groups
from app.core.topology.sources import constraint_of
from app.core.topology.subgroups import GangTree, Path
from app.core.topology.tree import Resolve, pack_tree, place_tree
from app.runtime.claims import Claim
from app.runtime.gang_tree import gang_tree
from app.runtime.revision import Revision

if TYPE_CHECKING:
    from app.runtime.line import Candidate

Held = dict[Path, HeldGroup]
"""Each constrained sub-group's domain, constraint and members, by path (a claim keeps it)."""

log = logging.getLogger(__name__)


class GangTopology:
    """The topology side of admitting a gang as a whole."""

    def __init__(
        self,
        state: ClusterState,
        levels: tuple[str, ...],
        revision: Revision,
        metrics: Metrics | None,
        observer: GangObserver,
    ) -> None:
        self._state = state
        self.levels = levels
        self._revision = revision
        self._metrics = metrics
        self._observer = observer
        # group key -> (version, whether its required topology fits one domain now).
        self._fits: dict[str, tuple[int, bool]] = {}

    def constraint(
        self, spec: GroupSpec, pod_topology: TopologyConstraint | None = None
    ) -> TopologyConstraint | None:
        """The gang's topology constraint: its group object's, else its pods' annotations."""
        return constraint_of(
            spec.topology,
            ((p.key, p.topology) for p in self._state.members(spec.key)),
            pod_topology,
        )

    def applies(self, spec: GroupSpec, pod: Candidate | None) -> bool:
        """Whether the gang has a topology constraint or slices: a whole-gang decision."""
        if spec.slicing is not None or spec.sub_group_policy or spec.sub_groups:
            return True
        if pod is not None and pod.slicing is not None:
            return True
        return self.constraint(spec, pod.topology if pod is not None else None) is not None

    def tree(self, spec: GroupSpec, pod: Candidate | None = None) -> GangTree | None:
        """The gang's sub-groups and its members' paths; None for a flat gang.

        Raises TopologyError for slices the gang cannot have (larger than it).
        """
        return gang_tree(self._state, spec, pod)

    def domain(
        self,
        spec: GroupSpec,
        pod_topology: TopologyConstraint | None,
        claim: Claim | None,
        pod: Candidate | None = None,
    ) -> tuple[Domain, TopologyConstraint] | None:
        """The domain the gang's members must go to now, and why; None: any node.

        While the gang holds a claim: the domain it was admitted in (the pod's
        sub-group's, for a gang made of groups). Otherwise (extra members of a
        whole gang, restarted members) a required level's domain its placed
        members share (the pod's sub-group's placed members first).
        """
        path: Path = ()
        tree = None
        if pod is not None and (
            pod.slicing is not None
            or spec.slicing is not None
            or spec.sub_group_policy
            or spec.sub_groups
            or spec.min_task_member
        ):
            tree = self.tree(spec, pod)
            path = tree.paths.get(pod.key, ()) if tree is not None else ()
        if claim is not None:
            for depth in range(len(path), 0, -1):
                held = claim.groups.get(path[:depth])
                if held is not None:
                    return held.domain, held.constraint
            if claim.domain is None or claim.constraint is None:
                return None
            return claim.domain, claim.constraint
        if tree is not None:
            for group in reversed(tree.constrained(path)):
                assert group.constraint is not None
                nodes = [node for p, node in tree.placed if p[: len(group.path)] == group.path]
                found = self._state.placed_domain(group.constraint, self.levels, nodes)
                if found is not None:
                    return found, group.constraint
        constraint = self.constraint(spec, pod_topology)
        if constraint is None or not constraint.required:
            return None
        domain = self._state.placed_domain(constraint, self.levels, self._placed_nodes(spec.key))
        return (domain, constraint) if domain is not None else None

    def decide(
        self,
        gang: Gang,
        constraint: TopologyConstraint | None,
        contest: Contest,
        now: float,
        aging_seconds: float,
        spec: GroupSpec | None = None,
        pod: Candidate | None = None,
    ) -> tuple[Decision, Domain | None, Held]:
        """decide(), in one domain when the gang has a constraint; the domain it was given,
        and each constrained sub-group's (and its constraint) for a gang made of groups
        (`spec` given: TopologyError for slices the gang cannot have)."""
        tree = self.tree(spec, pod) if spec is not None else None
        if spec is not None and spec.exclusive_size and constraint is not None:
            narrowed = self._exclusive(spec, gang, constraint, contest)
            if isinstance(narrowed, Decision):
                return narrowed, None, {}
            gang, contest = narrowed
        if tree is not None and tree.groups:
            where = self._where(gang.key, constraint) if constraint is not None else None
            placed_tree = place_tree(
                gang, where, tree, contest, now, aging_seconds, self.resolver()
            )
            held = held_groups(tree, placed_tree.groups, placed_tree.decision.plan)
            return placed_tree.decision, placed_tree.domain, held
        if constraint is None:
            return decide(gang, contest, now, aging_seconds), None, {}
        placed = place(gang, self._where(gang.key, constraint), contest, now, aging_seconds)
        return placed.decision, placed.domain, {}

    def _exclusive(
        self, spec: GroupSpec, gang: Gang, constraint: TopologyConstraint, contest: Contest
    ) -> tuple[Gang, Contest] | Decision:
        """LeaderWorkerSet exclusive-topology (app/core/topology/exclusive.py): the free nodes
        narrowed to the domains with no other LWS group of its namespace and room for the
        whole replica, and whatever of it exists placed together; or why no domain will do."""
        # LWS's anti-affinity term names no namespaces: it weighs its own namespace's pods.
        own = spec.key.split("/", 1)[0] + "/"
        barred = {
            value
            for key in self._state.group_keys()
            if key.startswith(own) and key != spec.key
            for p in self._state.placed_members(key)
            if (value := self._state.labels_of(p.placed_node).get(constraint.key)) is not None
        }
        size = spec.exclusive_size - len(self._placed_nodes(spec.key))
        inner = next((p for p in spec.sub_group_policy if p.constraint is not None), None)
        sub = None
        if inner is not None and inner.constraint is not None and size == spec.exclusive_size:
            sub = (inner.size, inner.constraint.key)  # nothing placed: cut the whole replica
        nodes, why = exclusive_room(
            spec.key, gang.demands, size, constraint.key, contest.free, barred, sub
        )
        if not nodes:
            return Decision(Ruling.SHORT, message=why)
        return replace(gang, need=len(gang.demands)), replace(contest, free=nodes, positions=None)

    def packer(
        self, spec: GroupSpec, pod: Candidate | None, members: Sequence[PodRecord]
    ) -> Callable[..., Packing] | None:
        """How the decisions behind a gang in line weigh it: a gang made of groups as a tree
        (each slice whole in one domain), else None (first fit, as any gang)."""
        declared = spec.slicing or spec.sub_group_policy or (pod is not None and pod.slicing)
        if not declared and not any(p.slicing is not None for p in members):
            return None
        try:
            tree = self.tree(spec, pod)
        except TopologyError:
            return None
        if tree is None or not any(g.constraint is not None for g in tree.groups):
            return None
        return partial(pack_tree, tree, self.resolver())

    def resolver(self) -> Resolve:
        """A sub-group's constraint as the levels to try: the configured ones and the
        HyperNode tiers the cluster has now (levels_to_try)."""
        levels = self._state.topology_levels(self.levels)
        tiers = self._state.hypernodes.tier_names
        return lambda c: levels_to_try(c, levels, tiers)

    def fits_one_domain(self, gang: Gang, constraint: TopologyConstraint, free: list[Bin]) -> bool:
        """fits_one_domain(), remembered while capacity, claims and the line stay the same."""
        known = self._fits.get(gang.key)
        version = self._revision.version
        if known is not None and known[0] == version:
            return known[1]
        if len(self._fits) > 10_000:
            self._fits.clear()
        fits = fits_one_domain(gang, self._where(gang.key, constraint), free)
        self._fits[gang.key] = (version, fits)
        return fits

    def _where(self, key: str, constraint: TopologyConstraint) -> Where:
        """The gang's constraint with the levels the cluster has and its placed members' nodes."""
        return Where(
            constraint,
            self._state.topology_levels(self.levels),
            self._placed_nodes(key),
            self._state.hypernodes.tier_names,
        )

    def announce(
        self,
        key: str,
        members: int,
        pod: str,
        where: tuple[TopologyConstraint | None, Domain | None, Held],
    ) -> None:
        """The gang claimed room for `members` in its domain (its sub-groups in theirs,
        `where`): the log, the metric and the group's event say so."""
        log.info(
            "gang claimed capacity for %d member(s)",
            members,
            extra={"podgroup": key, "verb": "filter", "pod": pod},
        )
        constraint, domain, held = where
        if held:
            self._announce_groups(key, held, pod)
        if constraint is None:
            return
        text = placed_message(key, constraint, domain)
        log.info(
            text,
            extra={
                "podgroup": key,
                "pod": pod,
                "verb": "filter",
                "domain": domain.to_json() if domain is not None else None,
            },
        )
        if self._metrics is not None:
            self._metrics.topology_placements.labels(
                domain.level if domain is not None else "anywhere"
            ).inc()
        self._observer.gang_placed(key, text)

    def _announce_groups(self, key: str, groups: Held, pod: str) -> None:
        """The gang's sub-groups were given their domains: the log and the group's event say so."""
        text = groups_message(key, groups)
        log.info(text, extra={"podgroup": key, "pod": pod, "verb": "filter"})
        self._observer.gang_placed(key, text)

    def _placed_nodes(self, key: str) -> list[str]:
        return [p.placed_node for p in self._state.placed_members(key)]
