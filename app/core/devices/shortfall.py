"""Whether a gang's devices exist in the cluster at all, before any member is placed. Pure.

A node's allocatable offers it the whole of every pool published for it, so a
pool published for many nodes (nodeSelector, allNodes) shows on each; packing
alone could then place a gang on devices that exist once. This check holds a
gang's members to the cluster's devices counted once each
(app/core/devices/distinct.py: offered by some schedulable node, less what
placed pods' claims take and what admitted gangs were promised), and says what
is short in the words a user reads: "gang ml/train needs 12 devices of class
gpu.example.com, 8 free in the cluster".

It is a necessary condition, never a sufficient one: what it lets through is
packed node by node as before. A demand no node can meet (a missing class,
template or claim) holds the gang, named here too.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence

from app.core.contention import Gang, Holder
from app.core.devices.book import DeviceBook
from app.core.packing import Demand
from app.core.resources import DEVICE_PREFIX, MISSING_PREFIX


def least_need(demands: Sequence[Demand], need: int, resource: str) -> int:
    """The least any `need` of `demands` ask of `resource` together (the smallest asks)."""
    asks = sorted(d.requests.get(resource, 0) for d in demands)
    return sum(asks[: max(0, need)])


def device_shortfall(
    key: str, demands: Sequence[Demand], need: int, free: Mapping[str, int]
) -> str | None:
    """Why `need` of the gang's `demands` cannot get their devices in the cluster now.

    None when they may (or the gang asks for no device). `free`: the cluster's
    free devices, each counted once (DistinctDevices.free).
    """
    resources = sorted({r for d in demands for r in d.requests if r.startswith(DEVICE_PREFIX)})
    if not resources:
        return None
    missing = [r[len(MISSING_PREFIX) :] for r in resources if r.startswith(MISSING_PREFIX)]
    if missing:
        shown = "; ".join(missing[:3]) + (
            f" (and {len(missing) - 3} more)" if len(missing) > 3 else ""
        )
        return f"gang {key} is held: its members cannot be given devices: {shown}"
    short: list[tuple[bool, str, int, int]] = []
    for resource in resources:
        wanted = least_need(demands, need, resource) // 1000
        have = free.get(resource, 0) // 1000
        if wanted > have:
            device_class, _sep, digest = resource[len(DEVICE_PREFIX) :].partition("/")
            short.append((digest != "", device_class, wanted, have))
    if not short:
        return None
    # The class's own count first: it reads best; selector counts when only they are short.
    short.sort()
    selected, device_class, wanted, have = short[0]
    text = f"gang {key} needs {wanted} devices of class {device_class}, {have} free in the cluster"
    if selected:
        text += " (devices passing its requests' selectors)"
    for selected, device_class, wanted, have in short[1:2]:
        which = " passing its requests' selectors" if selected else ""
        text += f"; {wanted} devices of class {device_class}{which} needed, {have} free"
    return text


def gang_device_shortfall(
    gang: Gang, book: DeviceBook, holders: Callable[[], Iterable[Holder]]
) -> str | None:
    """device_shortfall for a gang in line, against the devices free in the cluster.

    `book`: the cluster's devices (nothing is checked while no DRA watch runs).
    Devices promised to admitted gangs of lower priority count as free: this gang
    may take them by precedence (app/core/contention.py). Nothing is counted for a
    gang that asks for no device.
    """
    if not book.watching or not any(
        r.startswith(DEVICE_PREFIX) for d in gang.demands for r in d.requests
    ):
        return None
    promised = [
        requests
        for holder in holders()
        if holder.key != gang.key and holder.priority >= gang.priority
        for requests in holder.remaining.values()
    ]
    return device_shortfall(gang.key, gang.demands, gang.need, book.distinct.free(promised))


class ShortfallMemo:
    """gang_device_shortfall per gang, kept while nothing it weighs moved.

    kube-scheduler retries every pending member on cluster events, and each
    retry asks first whether the gang's devices exist (before the arbiter's
    cheap recall of its last answer). The answer is reused while the device
    book's version (slices, classes, claims, nodes, pods with claims), the
    devices placed pods take, the gang's own change stamp (its members, its
    PodGroup), the arbiter's revision (the claims that promise devices) and
    the gang itself are as they were.
    """

    __slots__ = ("_kept", "computed")

    def __init__(self) -> None:
        # Gang key -> (what it weighed, the answer).
        self._kept: dict[str, tuple[tuple[object, ...], str | None]] = {}
        self.computed = 0  # how many times it was worked out (tests)

    def of(
        self,
        gang: Gang,
        book: DeviceBook,
        holders: Callable[[], Iterable[Holder]],
        stamps: tuple[int, int],
    ) -> str | None:
        """gang_device_shortfall(gang, book, holders); `stamps`: the gang's change stamp
        and the arbiter's revision."""
        if not book.watching:
            return None
        placed = book.distinct.placed()
        # The gang as the shortfall reads it (a member the watch has not delivered yet
        # may be in its demands: the stamp alone would miss it).
        key = (
            book.version,
            tuple(sorted(placed.items())),
            *stamps,
            gang.priority,
            gang.need,
            gang.demands,
        )
        kept = self._kept.get(gang.key)
        if kept is not None and kept[0] == key:
            return kept[1]
        self.computed += 1
        short = gang_device_shortfall(gang, book, holders)
        if len(self._kept) >= 10_000:  # gangs come and go: start again past it
            self._kept.clear()
        self._kept[gang.key] = (key, short)
        return short
