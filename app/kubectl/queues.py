"""`kubectl gang queues`: each queue's weight, deserved share, what it holds, who waits.

Weight, state, reclaimable and capability are the Queue object's; the
deserved share and what the extender counts as allocated are the leader's
(`contention.queues` of /debug/gangs, recomputed at every filter call);
without the extender, allocated is the Queue's `status.allocated` (written by
the leader every 2 s) and deserved is unknown. Waiting and running gangs are
counted from the gangs `get` shows. A bar per resource draws allocated
against deserved.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from app.core.queues import DEFAULT_QUEUE
from app.core.resources import (
    QuantityError,
    Resources,
    format_amount,
    format_resources,
    parse_quantity,
    parse_resource_list,
)
from app.kubectl.gangs import NONE, Gang
from app.kubectl.live import Live
from app.kubectl.objects import Obj
from app.kubectl.table import render

BAR_WIDTH = 30
HEADERS = ("NAME", "WEIGHT", "STATE", "RECLAIMABLE", "DESERVED", "ALLOCATED", "WAITING", "RUNNING")


@dataclass(frozen=True, slots=True)
class QueueRow:
    name: str
    weight: str
    state: str
    reclaimable: str
    # None: unknown (no live state).
    deserved: Resources | None
    allocated: Resources | None
    waiting: int
    running: int
    capability: str

    def cells(self) -> list[str]:
        return [
            self.name,
            self.weight,
            self.state,
            self.reclaimable,
            _shown(self.deserved),
            _shown(self.allocated),
            str(self.waiting),
            str(self.running),
        ]

    def document(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "weight": self.weight,
            "state": self.state,
            "reclaimable": self.reclaimable,
            "capability": self.capability or None,
            "deserved": _shown(self.deserved) if self.deserved is not None else None,
            "allocated": _shown(self.allocated) if self.allocated is not None else None,
            "waitingGangs": self.waiting,
            "runningGangs": self.running,
        }


def _shown(resources: Resources | None) -> str:
    if resources is None:
        return "-"
    return format_resources(resources) or NONE


def parse_formatted(text: Any) -> Resources | None:
    """The inverse of app/core/resources.format_resources ("cpu 2, memory 1Gi")."""
    if not isinstance(text, str):
        return None
    found: Resources = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, _, amount = part.rpartition(" ")
        try:
            found[name] = parse_quantity(amount)
        except QuantityError:
            return None
    return found


def queue_rows(queues: Sequence[Obj], gangs: Sequence[Gang], live: Live) -> list[QueueRow]:
    """One row per Queue object (and per queue the extender or a gang names without one)."""
    shares = {str(q.get("queue")): q for q in live.queues()}
    objects = {str((q.get("metadata") or {}).get("name")): q for q in queues}
    names = set(objects) | set(shares) | {g.queue for g in gangs if g.queue != NONE}
    return [_row(n, objects.get(n), shares.get(n), gangs, live) for n in sorted(names)]


def _row(
    name: str, obj: Obj | None, share: Mapping[str, Any] | None, gangs: Sequence[Gang], live: Live
) -> QueueRow:
    spec = (obj or {}).get("spec") or {}
    status = (obj or {}).get("status") or {}
    mine = [g for g in gangs if g.queue == name]
    allocated: Resources | None = None
    if share is not None:
        allocated = parse_formatted(share.get("allocated"))
    elif isinstance(status.get("allocated"), dict):
        try:
            allocated = parse_resource_list(status["allocated"])
        except QuantityError:
            allocated = None
    if obj is None and share is None:
        weight = "1" if name == DEFAULT_QUEUE else NONE  # implicit default, or a missing queue
    else:
        weight = str(spec.get("weight") if obj is not None else (share or {}).get("weight", "-"))
    reclaimable = spec.get("reclaimable", (share or {}).get("reclaimable"))
    return QueueRow(
        name=name,
        weight=weight,
        state=str(status.get("state") or (share or {}).get("state") or NONE),
        reclaimable=NONE if reclaimable is None else str(bool(reclaimable)).lower(),
        deserved=parse_formatted(share.get("deserved")) if share is not None else None,
        allocated=allocated,
        waiting=sum(g.waiting for g in mine),
        running=sum(not g.waiting for g in mine),
        capability=_capability(spec),
    )


def _capability(spec: Mapping[str, Any]) -> str:
    try:
        return format_resources(parse_resource_list(spec.get("capability") or {}))
    except QuantityError:
        return str(spec.get("capability"))


def bars(rows: Sequence[QueueRow]) -> str:
    """Allocated against deserved, per queue and resource: `cpu [#####-----] 2 / 4`."""
    lines = []
    for row in rows:
        if not row.deserved:
            continue
        for resource, deserved in sorted(row.deserved.items()):
            held = (row.allocated or {}).get(resource, 0)
            filled = min(BAR_WIDTH, round(BAR_WIDTH * held / deserved)) if deserved else 0
            bar = "#" * filled + "-" * (BAR_WIDTH - filled)
            over = "+" if deserved and held > deserved else " "
            lines.append(
                [
                    row.name,
                    resource,
                    f"[{bar}]{over}",
                    f"{format_amount(resource, held)} of {format_amount(resource, deserved)}",
                ]
            )
    if not lines:
        return ""
    return render(["QUEUE", "RESOURCE", "ALLOCATED / DESERVED", ""], lines)


def queue_table(rows: Sequence[QueueRow], *, header: bool = True) -> str:
    return render(HEADERS, [r.cells() for r in rows], header=header)
