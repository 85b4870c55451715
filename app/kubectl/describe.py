"""`kubectl gang describe`: one gang in full, laid out like `kubectl describe`.

Sections: the gang (source, key, phase, counts, queue, topology, why it
waits), its roles (Volcano minTaskMember; sub-groups get their own section
here once a source declares them), every member and where it is, the live
preemption plan, where the live state came from, and the recent Events of
the group object and its pods.
"""

from __future__ import annotations

from typing import Any

from app.core.groups import GROUP_APIS
from app.core.timestamps import parse_rfc3339
from app.kubectl.gangs import BOUND, FINISHED, NONE, RESERVED, Gang
from app.kubectl.live import Live
from app.kubectl.objects import Obj, event_time
from app.kubectl.table import age, paint, phase_colour, render

# The Events shown: the newest, as kubectl describe shows a pod's recent ones.
RECENT_EVENTS = 20
INDENT = "  "
# Values start in one column, as in kubectl describe.
LABEL_WIDTH = 13


def describe(gang: Gang, live: Live, events: list[Obj], now: float, colour: bool) -> str:
    api = GROUP_APIS.get(gang.source)
    kind = f"{api.kind} {api.api_version}" if api else "no object (pod labels)"
    minimum = str(gang.min_member) if gang.min_member is not None else NONE
    fields = [
        ("Name", gang.name),
        ("Namespace", gang.namespace),
        ("Source", f"{gang.source} ({kind})"),
        ("Key", gang.key),
        ("Phase", paint(gang.phase, phase_colour(gang.phase), colour)),
        ("MinMember", minimum),
        (
            "Members",
            f"{gang.bound} bound, "
            + (f"{gang.reserved} reserved, " if live.reachable else "reserved unknown, ")
            + f"{gang.pending} pending",
        ),
        ("Queue", gang.queue),
        ("Topology", gang.topology or NONE),
        ("Domain", gang.domain),
        ("Age", age(gang.created, now)),
        ("Waiting", gang.reason),
    ]
    out = [_field(k, v) for k, v in fields]
    out += _roles(gang)
    # No source declares sub-groups yet; a source that does lists them here.
    out += [_field("Sub-groups", NONE)]
    out += _members(gang, colour)
    out += _plans(gang, live)
    out += _live(live)
    out += _events(events, now)
    return "\n".join(out)


def _field(label: str, value: str) -> str:
    return f"{label + ':':<{LABEL_WIDTH}}{value}"


def _indent(text: str) -> list[str]:
    return [INDENT + line for line in text.splitlines()]


def _roles(gang: Gang) -> list[str]:
    """Volcano minTaskMember: each task's minimum and how many of its pods are placed."""
    if not gang.roles:
        return [_field("Roles", NONE)]
    rows = []
    for task, minimum in gang.roles:
        mine = [m for m in gang.members if m.task == task]
        placed = sum(m.state in (BOUND, RESERVED, FINISHED) for m in mine)
        rows.append([task, str(minimum), str(len(mine)), str(placed)])
    return ["Roles:", *_indent(render(["TASK", "MIN", "MEMBERS", "PLACED"], rows))]


def _members(gang: Gang, colour: bool) -> list[str]:
    if not gang.members:
        return [_field("Member Pods", NONE)]
    rows = [
        [m.name, m.state, m.node or NONE, m.domain or NONE, m.task or NONE, m.reason or NONE]
        for m in gang.members
    ]
    headers = ["POD", "STATE", "NODE", "DOMAIN", "TASK", "REASON"]
    table = render(headers, rows, colour=colour, colour_column="STATE")
    return ["Member Pods:", *_indent(table)]


def _plans(gang: Gang, live: Live) -> list[str]:
    plans = live.plans(gang.key)
    if not live.reachable:
        return [_field("Preemption", "unknown (extender unreachable)")]
    if not plans:
        return [_field("Preemption", NONE)]
    out = ["Preemption:"]
    for plan in plans:
        out.append(
            f"{INDENT}{plan.get('kind', 'preemption')} plan, phase {plan.get('phase')}, "
            f"{plan.get('evictions', 0)} eviction(s), deadline in "
            f"{_seconds(plan.get('deadlineSeconds'))}, made {_seconds(plan.get('ageSeconds'))} ago"
        )
        if plan.get("reason"):
            out.append(f"{INDENT}reason: {plan['reason']}")
        rows = [
            [str(s.get("node")), ", ".join(s.get("victims") or ()) or NONE, _slot_member(s)]
            for s in plan.get("slots") or ()
        ]
        if rows:
            out += _indent(render(["NODE", "VICTIMS", "MEMBER"], rows))
    return out


def _slot_member(slot: dict[str, Any]) -> str:
    return str(slot.get("member") or "(open)")


def _seconds(value: Any) -> str:
    return f"{float(value):.0f}s" if isinstance(value, int | float) else "?"


def _live(live: Live) -> list[str]:
    if not live.reachable:
        return [_field("Live State", f"unreachable via {live.via}: {live.problem}")]
    note = f" ({live.problem})" if live.problem else ""
    return [_field("Live State", f"from {live.via}{note}")]


def _events(events: list[Obj], now: float) -> list[str]:
    if not events:
        return [_field("Events", NONE)]
    rows = []
    for event in events[-RECENT_EVENTS:]:
        source = event.get("source") or {}
        by = source.get("component") or event.get("reportingComponent") or NONE
        when = parse_rfc3339(event_time(event))
        count = int(event.get("count") or 1)
        shown = age(when, now) if when else "<unknown>"
        if count > 1:
            shown = f"{shown} (x{count})"
        involved = event.get("involvedObject") or {}
        rows.append(
            [
                str(event.get("type") or ""),
                str(event.get("reason") or ""),
                shown,
                f"{involved.get('kind', '')}/{involved.get('name', '')}",
                str(by),
                " ".join(str(event.get("message") or "").split()),
            ]
        )
    headers = ["TYPE", "REASON", "AGE", "OBJECT", "FROM", "MESSAGE"]
    return ["Events:", *_indent(render(headers, rows))]
