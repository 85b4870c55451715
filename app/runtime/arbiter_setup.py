"""What the arbiter is built from besides the cluster state: its settings and its peers."""

from __future__ import annotations

from dataclasses import dataclass, field

from app.base.metrics import Metrics
from app.core.clock import Clock, monotonic
from app.core.observer import GangObserver, NullObserver
from app.core.topology.domains import DEFAULT_LEVELS
from app.runtime.queues.book import QueueBook
from app.runtime.queues.reclaimer import Reclaimer
from app.runtime.wakeup import SiblingWaker


@dataclass(frozen=True, slots=True)
class ArbiterSettings:
    """The flags that shape the arbiter's decisions (app/config.py reads them)."""

    # --gang-aging-seconds: a gang waiting this long is not overtaken any more.
    aging_seconds: float = 60.0
    # The topology levels, lowest first (app/core/topology/domains.py).
    levels: tuple[str, ...] = DEFAULT_LEVELS
    # --gang-feasibility; False: only gangs with a topology constraint are admitted as a whole.
    every_gang: bool = True
    # --hold-waiting-gangs: held members wait out of kube-scheduler's queue (app/runtime/holds.py).
    hold: bool = False
    clock: Clock = monotonic


@dataclass(frozen=True, slots=True)
class ArbiterPeers:
    """The objects the arbiter tells or asks; any may be absent (tests, benchmarks)."""

    waker: SiblingWaker | None = None
    observer: GangObserver = field(default_factory=NullObserver)
    metrics: Metrics | None = None
    # Teams' shares (app/runtime/queues/book.py): consulted only once a Queue object exists.
    queues: QueueBook | None = None
    reclaimer: Reclaimer | None = None
