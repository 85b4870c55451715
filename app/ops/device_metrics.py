"""The device metrics, computed from the cluster state when Prometheus scrapes.

`gang_extender_devices{device_class, state}`: per DeviceClass, the devices the
schedulable nodes offer (allocatable), those free, and those waiting gangs hold
(held_waiting: members waiting in the permit gate, what the line promised
to admitted gangs' members not placed yet, and what allocated claims hold for
the members of gangs waiting in line); counted at scrape time, so
they cost nothing between scrapes. `gang_extender_device_selectors_by_class`:
CEL selectors our engine cannot evaluate, whose requests are counted by class.
Device classes are few and named by the cluster's administrators: a bounded label.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import NamedTuple

from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from app.core.contention import Holder
from app.core.devices.report import device_counts
from app.core.state import ClusterState


class Family(NamedTuple):
    """A gauge family this collector yields: what the reference page lists (docs/reference)."""

    name: str
    help: str
    labels: tuple[str, ...]


DEVICES = Family(
    "gang_extender_devices",
    "DRA devices per DeviceClass: offered by schedulable nodes (allocatable), free, "
    "and held by waiting gangs (held_waiting): by members waiting in the permit gate, "
    "promised to admitted gangs' members not placed yet, and by allocated claims of "
    "members of gangs waiting in line.",
    ("device_class", "state"),
)
SELECTORS_BY_CLASS = Family(
    "gang_extender_device_selectors_by_class",
    "CEL device selectors the extender cannot evaluate: their requests are counted "
    "by device class alone (the log names each).",
    (),
)
FAMILIES = (DEVICES, SELECTORS_BY_CLASS)
STATES = ("allocatable", "free", "held_waiting")


class DeviceCollector(Collector):
    def __init__(
        self,
        state: ClusterState,
        holders: Callable[[], Iterable[Holder]] = list,
        waiting: Callable[[], Iterable[str]] = list,
    ) -> None:
        """`holders`: the gangs the line admitted (Arbiter.holders): the devices promised
        to their members not placed yet are held by waiting gangs too; `waiting`: the
        group keys of the gangs in line (their members' allocated claims hold devices)."""
        self._state = state
        self._holders = holders
        self._waiting = waiting

    def collect(self) -> Iterator[Metric]:
        devices = GaugeMetricFamily(DEVICES.name, DEVICES.help, labels=list(DEVICES.labels))
        promised = [r for h in self._holders() for r in h.remaining.values()]
        counts = device_counts(self._state, promised, self._waiting())
        for device_class, row in counts.items():
            for state in STATES:
                devices.add_metric([device_class, state], row[state])
        yield devices
        yield GaugeMetricFamily(
            SELECTORS_BY_CLASS.name,
            SELECTORS_BY_CLASS.help,
            value=len(self._state.devices.model.fallbacks),
        )
