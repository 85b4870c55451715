"""Stand-ins shared by the unit tests: a clock the test moves, and the API calls the verbs make.

Plain classes, imported by the tests that need them (tests import no other
test module and no conftest). The cluster tests cover the real API.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from app.base.metrics import Metrics
from app.core.admission import Admission, WaitPolicy
from app.core.scoring import ScoringPolicy
from app.core.state import ClusterState
from app.runtime.arbiter import Arbiter
from app.runtime.arbiter_setup import ArbiterPeers, ArbiterSettings
from app.runtime.gate import PermitGate
from app.web.extender import GangExtender
from app.web.verb_context import VerbCore, VerbLinks


class Clock:
    """A clock that stands still until the test sets `now`."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class RecordingBinder:
    """Stands in for the API server's pods/binding; cluster tests cover the real one.

    `fail` maps a pod name to the error its binding raises; `hold`, when
    set, keeps every binding waiting until the test sets the event.
    """

    def __init__(self) -> None:
        self.bound: list[tuple[str, str]] = []
        self.fail: dict[str, Exception] = {}
        self.hold: asyncio.Event | None = None

    async def bind(self, namespace: str, name: str, uid: str, node: str) -> None:
        if self.hold is not None:
            await self.hold.wait()
        if name in self.fail:
            raise self.fail[name]
        self.bound.append((name, node))


class FakePodApi(RecordingBinder):
    """Bindings as RecordingBinder, and pod reads answered from `pods` (namespace/name keys)."""

    def __init__(self, pods: dict[str, dict[str, Any]] | None = None) -> None:
        super().__init__()
        self.pods = pods or {}
        # Runs while a read's answer is on its way (a watch event overtaking it, say).
        self.during_read: Callable[[], None] | None = None

    async def read_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        raw = self.pods.get(f"{namespace}/{name}")
        if self.during_read is not None:
            self.during_read()
        return raw


def gauge(metrics: Metrics, name: str, labels: dict[str, str] | None = None) -> float:
    """A sample of the extender's registry; 0 when it was never set."""
    value = metrics.registry.get_sample_value(name, labels or {})
    return value or 0.0


class ExtenderOnState:
    """The real extender, arbiter and gate over an in-memory ClusterState, for verb tests.

    levels: --topology-levels; every_gang: --gang-feasibility; pick_member_node:
    --member-node-choice=extender.
    """

    def __init__(
        self,
        state: ClusterState,
        levels: tuple[str, ...],
        *,
        every_gang: bool,
        pick_member_node: bool = False,
    ) -> None:
        self.metrics = Metrics()
        admission = Admission(3)
        api = FakePodApi()
        gate = PermitGate(state, admission, api, self.metrics)
        self.arbiter = Arbiter(
            state,
            admission,
            gate,
            lambda spec: 30.0,
            ArbiterPeers(metrics=self.metrics),
            ArbiterSettings(levels=levels, every_gang=every_gang),
        )
        self.extender = GangExtender(
            VerbCore(state, admission, self.metrics, WaitPolicy(60, 80)),
            gate,
            api,
            VerbLinks(arbiter=self.arbiter),
            ScoringPolicy(pick_member_node=pick_member_node),
        )


async def eventually(check: Callable[[], object], seconds: float = 10.0) -> None:
    """Until `check()` is true, yielding to the loop; fails after `seconds`.

    For work the code under test does on timers and tasks: a fixed sleep before an
    assertion is a race on a busy machine (the loop may run the sleep's wake-up
    before a timer due earlier has done its work).
    """
    deadline = time.monotonic() + seconds
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"never happened within {seconds} s: {check}")
        await asyncio.sleep(0.01)
