"""One row per gang: who its members are, where they are, and why it waits.

Membership, minMember and the phase come from app/core, the code the
extender itself runs (records.pod_record_from, records.podgroup_record_from,
status.compute_status), so the plugin never disagrees with the extender on
which pod belongs to which gang. Reservations, denials, claims and plans
come from the live snapshot when there is one. Pure: no I/O here.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from app.core.composite import COMPOSITE_KIND
from app.core.composite_trees import CompositeBook
from app.core.groups import COMPOSITE_KEY_PREFIX, GROUP_APIS, SOURCE_NATIVE, GroupRef
from app.core.marking import LINE_GATE
from app.core.queues import DEFAULT_QUEUE
from app.core.records import (
    PodGroupRecord,
    PodRecord,
    not_found_message,
    pod_record_from,
    podgroup_record_from,
)
from app.core.status import compute_status
from app.core.topology.domains import Domain
from app.kubectl.live import Live
from app.kubectl.objects import Obj, Objects

NONE = "<none>"
# Preemption plan phases that are over (app/runtime/preemption/plan.py PlanPhase; the
# plugin reads the snapshot's JSON and may not import the runtime).
ENDED_PLANS = frozenset({"done", "expired", "cancelled"})
# Member states, as the describe output and JSON spell them.
BOUND, RESERVED, PENDING, GATED, FINISHED = "Bound", "Reserved", "Pending", "Gated", "Finished"


@dataclass(frozen=True, slots=True)
class Member:
    name: str
    state: str
    node: str
    domain: str
    task: str
    # Why it is not placed: PodScheduled=False message, scheduling gates, or "".
    reason: str


@dataclass(frozen=True, slots=True)
class Gang:
    """A gang as `kubectl gang get` lists it and `describe` opens it."""

    namespace: str
    name: str
    source: str
    key: str
    phase: str
    # None: unknown (its PodGroup is missing or unusable).
    min_member: int | None
    bound: int
    reserved: int
    pending: int
    queue: str
    domain: str
    created: float
    reason: str
    members: tuple[Member, ...] = ()
    topology: str = ""
    # Volcano minTaskMember: (task, minimum).
    roles: tuple[tuple[str, int], ...] = ()
    # The group object (None: label-only and Kueue groups, or a missing PodGroup).
    object: Obj | None = field(default=None, compare=False)

    @property
    def waiting(self) -> bool:
        return self.reason != NONE


def build_gangs(objects: Objects, live: Live) -> list[Gang]:
    """Every gang the objects show (a group object, or pods naming a group), sorted."""
    members: dict[str, list[tuple[PodRecord, Obj]]] = {}
    refs: dict[str, GroupRef] = {}
    trees = CompositeBook.of(objects.composites, objects.groups.get(SOURCE_NATIVE, ()))
    for raw in objects.pods:
        pod = pod_record_from(raw)
        pod.group = trees.rekey(pod.group)  # a leaf PodGroup's pod: its tree's gang
        if pod.group is None:
            continue
        members.setdefault(pod.group.key, []).append((pod, raw))
        refs.setdefault(pod.group.key, pod.group)
    records: dict[str, tuple[PodGroupRecord, Obj]] = {}
    for source, items in objects.groups.items():
        for raw in items:
            record = podgroup_record_from(raw, source)
            if source != SOURCE_NATIVE or trees.root_of(record.namespace, record.name) is None:
                records[record.key] = (record, raw)  # a tree's leaf is no gang of its own
    for raw in objects.composites:
        root = trees.root_record(raw)
        if root is not None:
            records[root.key] = (root, raw)
    gangs = [
        _gang(key, refs.get(key), records.get(key), members.get(key, []), objects, live)
        for key in set(members) | set(records)
    ]
    return sorted(gangs, key=lambda g: (g.namespace, g.name, g.source))


def _gang(
    key: str,
    ref: GroupRef | None,
    record: tuple[PodGroupRecord, Obj] | None,
    pods: list[tuple[PodRecord, Obj]],
    objects: Objects,
    live: Live,
) -> Gang:
    group, raw_group = record if record is not None else (None, None)
    namespace = group.namespace if group else ref.namespace if ref else ""
    name = group.name if group else ref.name if ref else ""
    source = group.source if group else ref.source if ref else ""
    spec = group.spec if group else None
    min_member = spec.min_member if spec else ref.min_available if ref else None
    topology = spec.topology if spec else None
    if topology is None:
        topology = next((p.topology for p, _ in sorted(pods, key=_by_name) if p.topology), None)
    reserved_uids = {str(w.get("uid")) for w in live.gate(key)}
    domain = _domain(key, live, topology.key if topology else "", pods, objects)
    rows = tuple(_member(p, raw, reserved_uids, topology, objects) for p, raw in pods)
    rows = tuple(sorted(rows, key=lambda m: m.name))
    bound = sum(m.state in (BOUND, FINISHED) for m in rows)
    reserved = sum(m.state == RESERVED for m in rows)
    pending = sum(m.state in (PENDING, GATED) for m in rows)
    phase = _phase(key, raw_group, min_member, [p for p, _ in pods], bool(reserved), live)
    queue = (spec.queue if spec else None) or next((p.queue for p, _ in pods if p.queue), "")
    created = group.created if group else min((p.created for p, _ in pods), default=0.0)
    gang = Gang(
        namespace=namespace,
        name=name,
        source=source,
        key=key,
        phase=phase,
        min_member=min_member,
        bound=bound,
        reserved=reserved,
        pending=pending,
        queue=queue or (DEFAULT_QUEUE if objects.queues else NONE),
        domain=domain,
        created=created,
        reason=NONE,
        members=rows,
        topology=topology.describe() if topology else "",
        roles=spec.min_task_member if spec else (),
        object=raw_group,
    )
    why = _reason(gang, group, ref, raw_group, live)
    return gang if why == NONE else _with_reason(gang, why)


def _by_name(item: tuple[PodRecord, Obj]) -> str:
    return item[0].name


def _with_reason(gang: Gang, reason: str) -> Gang:
    return replace(gang, reason=" ".join(reason.split()))


def _member(
    pod: PodRecord, raw: Obj, reserved: set[str], topology: Any, objects: Objects
) -> Member:
    gates = [g.get("name", "") for g in (raw.get("spec") or {}).get("schedulingGates") or ()]
    node, reason = pod.node_name, ""
    if pod.terminal:
        state = FINISHED if node else PENDING
    elif node:
        state = BOUND
    elif pod.uid in reserved:
        state = RESERVED
    elif gates == [LINE_GATE]:
        state, reason = GATED, "held in gang-extender's line until the gang can be admitted whole"
    elif gates:
        state, reason = GATED, f"held by scheduling gate(s) {', '.join(gates)}"
    else:
        state, reason = PENDING, pod.unschedulable_message
    level = topology.key if topology is not None and topology.key else ""
    where = objects.node_labels.get(node, {}).get(level, "") if node and level else ""
    task = pod.group.task if pod.group is not None else ""
    return Member(
        pod.name, state, node, Domain(level, where).describe() if where else "", task, reason
    )


def _domain(
    key: str, live: Live, level: str, pods: list[tuple[PodRecord, Obj]], objects: Objects
) -> str:
    """The domain the extender placed (or plans to place) the gang in, else the bound nodes'."""
    held = live.claim(key) or {}
    domain = held.get("domain") or next(
        (p.get("domain") for p in live.plans(key) if p.get("domain")), None
    )
    if isinstance(domain, dict) and domain.get("value"):
        return Domain(str(domain.get("level", "")), str(domain["value"])).describe()
    if not level:
        return NONE
    # Nodes we could not read (no right to list nodes) tell nothing.
    values = {
        objects.node_labels[p.node_name].get(level, "")
        for p, _ in pods
        if p.node_name and not p.terminal and p.node_name in objects.node_labels
    }
    if not values or values == {""}:
        return NONE
    if len(values) == 1:
        return Domain(level, values.pop()).describe()
    return "<several>"


def _phase(
    key: str,
    raw_group: Obj | None,
    min_member: int | None,
    pods: Iterable[PodRecord],
    waiting_in_gate: bool,
    live: Live,
) -> str:
    """The object's status.phase (x-k8s, Volcano), else the extender's, else from the pods."""
    written = ((raw_group or {}).get("status") or {}).get("phase")
    if isinstance(written, str) and written:
        return written
    known = live.group(key)
    if known and known.get("phase"):
        return str(known["phase"])
    if min_member is None:
        return NONE
    return compute_status(min_member, pods, waiting_in_gate).phase


def _reason(
    gang: Gang,
    group: PodGroupRecord | None,
    ref: GroupRef | None,
    raw_group: Obj | None,
    live: Live,
) -> str:
    """The one line that says why the gang waits, from the most specific source we have."""
    if group is None and ref is not None and ref.min_available is None:
        return not_found_message(ref)
    if group is not None and group.error:
        return group.error
    if gang.min_member is not None and gang.bound >= gang.min_member:
        return NONE
    if gang.phase in ("Finished", "Completed"):
        return NONE
    plans = [p for p in live.plans(gang.key) if p.get("phase") not in ENDED_PLANS]
    if plans:
        plan = plans[0]
        return (
            f"{plan.get('kind', 'preemption')} plan {plan.get('phase')}: "
            f"{plan.get('evictions', 0)} eviction(s) for {len(plan.get('slots') or ())} member(s)"
        )
    denial = live.denial(gang.key)
    if denial and denial.get("message"):
        return str(denial["message"])
    if gang.reserved:
        waited = max((float(w.get("waitingSeconds") or 0) for w in live.gate(gang.key)), default=0)
        return (
            f"{gang.reserved} member(s) reserved in the permit gate for up to {waited:.0f}s, "
            f"waiting for the rest of minMember {gang.min_member}"
        )
    said = _pending_message(gang)
    if said:
        return said
    return _condition_message(raw_group) or NONE


def _pending_message(gang: Gang) -> str:
    """What a pending member says (kube-scheduler's PodScheduled message), or a count."""
    reasons = [m.reason for m in gang.members if m.state in (PENDING, GATED) and m.reason]
    if reasons:
        return reasons[-1]
    alive = gang.bound + gang.reserved + gang.pending
    if gang.min_member is not None and alive < gang.min_member:
        return f"{alive} of minMember {gang.min_member} pods exist"
    return ""


def _condition_message(raw_group: Obj | None) -> str:
    for condition in ((raw_group or {}).get("status") or {}).get("conditions") or ():
        if isinstance(condition, dict) and condition.get("status") == "False":
            return str(condition.get("message") or condition.get("reason") or "")
    return ""


def event_subjects(gang: Gang) -> set[tuple[str, str]]:
    """(kind, name) of what the gang's Events are about: its pods and its group object
    (a CompositePodGroup for a tree's gang, whose key is its root's)."""
    about = {("Pod", m.name) for m in gang.members}
    if gang.object is None:
        return about
    if gang.key.startswith(f"{COMPOSITE_KEY_PREFIX}:"):
        about.add((COMPOSITE_KIND, gang.name))
    elif gang.source in GROUP_APIS:
        about.add((GROUP_APIS[gang.source].kind, gang.name))
    return about


def target_namespace(target: str, namespace: str) -> str:
    """The namespace `describe TARGET` looks in: the one the target names, else `namespace`."""
    ns, _, _ = target.split(":", 1)[-1].rpartition("/")
    return ns or namespace


def find(gangs: list[Gang], target: str, namespace: str) -> list[Gang]:
    """The gangs `target` names: SOURCE:NS/NAME (the group key), NS/NAME, or NAME in `namespace`."""
    if ":" in target:
        return [g for g in gangs if g.key == target]
    ns, _, name = target.rpartition("/")
    return [g for g in gangs if g.namespace == (ns or namespace) and g.name == name]
