"""A gang's tree of sub-groups read from the cluster: its group object's and members' word.

Its own module, below the gate and the arbiter: the admission (gang_topology.py),
the preemption plan (preemption/plan_maker.py) and the gate's wholeness
(waiting_room.py) read the tree the same way.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from app.core.groups import GroupSpec
from app.core.state import ClusterState
from app.core.topology.subgroups import GangShape, GangTree, Member, slicing_of, tree_of

if TYPE_CHECKING:
    from app.runtime.line import Candidate


def gang_tree(
    state: ClusterState, spec: GroupSpec, pod: Candidate | None = None
) -> GangTree | None:
    """The gang's sub-groups and its members' paths (with `pod`, if the state lacks it);
    None for a flat gang. Raises TopologyError for slices the gang cannot have.

    The one reading of a gang's tree: its admission and its preemption plan share it.
    """
    members = state.members(spec.key)
    slicing = slicing_of(
        spec.slicing,
        ((p.key, p.slicing) for p in members),
        pod.slicing if pod is not None else None,
    )
    shape = GangShape(slicing, spec.sub_group_policy, spec.min_task_member, spec.sub_groups)
    if shape == GangShape():
        return None
    known = [
        Member(p.key, p.rank, p.group.task if p.group is not None else "", p.placed_node, p.labels)
        for p in members
    ]
    if pod is not None and not any(m.key == pod.key for m in known):
        known.append(Member(pod.key, pod.rank, pod.task, "", pod.labels))
    return tree_of(spec.key, shape, spec.min_member, known)
