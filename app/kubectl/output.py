"""`kubectl gang get` as a table, a wide table, JSON or YAML.

JSON and YAML are a `kind: List` of one item per gang, the same fields the
table shows (and the members), so a script reads the columns without parsing
them; `live` says whether the extender's state is in it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

import yaml

from app.kubectl.gangs import NONE, Gang
from app.kubectl.live import Live
from app.kubectl.table import age, clip, render

HEADERS = (
    "NAME",
    "SOURCE",
    "PHASE",
    "BOUND",
    "RESERVED",
    "PENDING",
    "MIN",
    "QUEUE",
    "DOMAIN",
    "AGE",
    "REASON",
)
WIDE_HEADERS = ("KEY", "TOPOLOGY", "NODES")
# The default table keeps the reason to one short line; -o wide shows it whole.
REASON_WIDTH = 100


def gang_cells(gang: Gang, now: float, *, wide: bool, live: Live) -> list[str]:
    """One row: every cell from an object or the live snapshot, `-`/`<none>` where unknown."""
    reserved = str(gang.reserved) if live.reachable else "-"
    cells = [
        gang.name,
        gang.source,
        gang.phase,
        str(gang.bound),
        reserved,
        str(gang.pending),
        str(gang.min_member) if gang.min_member is not None else NONE,
        gang.queue,
        gang.domain,
        age(gang.created, now),
        gang.reason if wide else clip(gang.reason, REASON_WIDTH),
    ]
    if wide:
        nodes = sorted({m.node for m in gang.members if m.node})
        cells[-1:-1] = [gang.key, gang.topology or NONE, ",".join(nodes) or NONE]
    return cells


def headers_for(*, wide: bool, all_namespaces: bool) -> list[str]:
    headers = list(HEADERS)
    if wide:
        headers[-1:-1] = WIDE_HEADERS
    return ["NAMESPACE", *headers] if all_namespaces else headers


def gang_table(
    gangs: Sequence[Gang],
    now: float,
    live: Live,
    *,
    wide: bool,
    all_namespaces: bool,
    colour: bool,
    header: bool = True,
) -> str:
    rows = [
        ([g.namespace] if all_namespaces else []) + gang_cells(g, now, wide=wide, live=live)
        for g in gangs
    ]
    headers = headers_for(wide=wide, all_namespaces=all_namespaces)
    return render(headers, rows, colour=colour, colour_column="PHASE", header=header)


def gang_document(gang: Gang) -> dict[str, Any]:
    """A gang as JSON: camelCase like the API, the object left out (kubectl get it)."""
    return {
        "namespace": gang.namespace,
        "name": gang.name,
        "source": gang.source,
        "key": gang.key,
        "phase": gang.phase,
        "minMember": gang.min_member,
        "bound": gang.bound,
        "reserved": gang.reserved,
        "pending": gang.pending,
        "queue": gang.queue,
        "domain": gang.domain,
        "topology": gang.topology or None,
        "roles": [{"task": t, "minMember": n} for t, n in gang.roles],
        "reason": gang.reason,
        "members": [asdict(m) for m in gang.members],
    }


def as_list(items: list[dict[str, Any]], live: Live) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "List",
        "items": items,
        "live": {"reachable": live.reachable, "via": live.via, "problem": live.problem or None},
    }


def dump(doc: dict[str, Any], form: str) -> str:
    if form == "json":
        return json.dumps(doc, indent=4)
    return yaml.safe_dump(doc, sort_keys=False).rstrip("\n")


def live_note(live: Live) -> str:
    """The line under a table that says where live state came from, or why it is missing."""
    if not live.reachable:
        return (
            f"extender unreachable ({live.via}): {live.problem}; "
            "RESERVED and the live reasons are unknown, the rest is from the API objects"
        )
    if live.problem:
        return f"live state from a standby ({live.via}): {live.problem}"
    return ""
