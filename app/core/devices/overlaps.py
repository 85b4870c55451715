"""Which selector sets of one DeviceClass overlap, to be counted together (Hall's condition).

Two requests of a class whose selectors both pass some device could each count
that device as free. app/core/devices/counting.py therefore offers, per group of
overlapping selector sets, the devices that pass any set of the group, and
every request of a set in the group asks its count of that too. A node's
devices can be shared out among requests exactly when, for every set of
requests, what they ask fits in the devices any of them may take (Hall's
theorem); requests without selectors may take any device of the class, which
the class's own count checks; sets that overlap with no other need no group.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Mapping

from app.core.devices.records import ClassRecord, Device

# Overlapping selector sets of one class counted together: every subset of a group of
# this many (2^n - n - 1 resources) is; a larger group is split (docs/dra.md, Limits).
MAX_GROUP = 6

Signature = tuple[str, tuple[str, ...]]
Groups = dict[str, list[tuple[tuple[str, ...], ...]]]


def find_groups(
    signatures: Iterable[Signature],
    classes: Mapping[str, ClassRecord],
    devices: Iterable[Device],
    passes: Callable[[Device, tuple[str, ...]], bool],
) -> Groups:
    """Class -> every subset of two or more of each connected group of overlapping sets.

    `devices`: one of each kind of published device (alike devices pass alike);
    `passes`: whether a device passes all of the selectors given.
    """
    by_class: dict[str, list[tuple[str, ...]]] = {}
    for device_class, selectors in signatures:
        if device_class in classes:
            by_class.setdefault(device_class, []).append(selectors)
    if not any(len(sets) > 1 for sets in by_class.values()):
        return {}
    kinds = list(devices)
    out: Groups = {}
    for device_class, sets in by_class.items():
        if len(sets) < 2:
            continue
        own = classes[device_class].selectors
        passing = {
            selectors: {d.content for d in kinds if passes(d, (*own, *selectors))}
            for selectors in sets
        }
        groups: list[tuple[tuple[str, ...], ...]] = []
        for component in _components(sorted(sets), passing):
            for start in range(0, len(component), MAX_GROUP):
                part = component[start : start + MAX_GROUP]
                for size in range(2, len(part) + 1):
                    groups.extend(itertools.combinations(part, size))
        if groups:
            out[device_class] = groups
    return out


def _components(
    sets: list[tuple[str, ...]], passing: Mapping[tuple[str, ...], set[bytes]]
) -> list[list[tuple[str, ...]]]:
    """The selector sets in groups connected by overlaps (some device passes both)."""
    left = list(sets)
    out: list[list[tuple[str, ...]]] = []
    while left:
        component = [left.pop(0)]
        reach = set(passing[component[0]])
        grew = True
        while grew:
            grew = False
            for selectors in list(left):
                if passing[selectors] & reach:
                    left.remove(selectors)
                    component.append(selectors)
                    reach |= passing[selectors]
                    grew = True
        if len(component) > 1:
            out.append(component)
    return out
