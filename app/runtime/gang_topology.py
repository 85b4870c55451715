"""Where a gang may go: its topology constraint, the one domain it must fit in, and telling so.

The constraint comes from the gang's group object or its pods' Kueue
annotations (app/core/topology/sources.py); the levels are the configured
ones, then the HyperNode tiers the cluster has (app/core/state.py).
"""

from __future__ import annotations

import logging

from app.base.metrics import Metrics
from app.core.contention import Contest, Decision, Gang, decide
from app.core.groups import GroupSpec
from app.core.observer import GangObserver
from app.core.packing import Bin
from app.core.state import ClusterState
from app.core.topology.domains import (
    Domain,
    TopologyConstraint,
    Where,
    fits_one_domain,
    place,
    placed_message,
)
from app.core.topology.sources import constraint_of
from app.runtime.claims import Claim
from app.runtime.revision import Revision

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

    def domain(
        self, spec: GroupSpec, pod_topology: TopologyConstraint | None, claim: Claim | None
    ) -> tuple[Domain, TopologyConstraint] | None:
        """The domain the gang's members must go to now, and why; None: any node.

        While the gang holds a claim: the domain it was admitted in. Otherwise
        (extra members of a whole gang, restarted members) a required level's
        domain its placed members share.
        """
        if claim is not None:
            if claim.domain is None or claim.constraint is None:
                return None
            return claim.domain, claim.constraint
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
    ) -> tuple[Decision, Domain | None]:
        """decide(), in one domain when the gang has a constraint; the domain it was given."""
        if constraint is None:
            return decide(gang, contest, now, aging_seconds), None
        placed = place(gang, self._where(gang.key, constraint), contest, now, aging_seconds)
        return placed.decision, placed.domain

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
        self, key: str, constraint: TopologyConstraint, domain: Domain | None, pod: str
    ) -> None:
        """The gang was admitted in `domain`: the log, the metric and the group's event say so."""
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

    def _placed_nodes(self, key: str) -> list[str]:
        return [p.placed_node for p in self._state.placed_members(key)]
