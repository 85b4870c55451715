"""What the extender's verbs are built from, grouped: what every verb reads, and optional peers."""

from __future__ import annotations

from dataclasses import dataclass, field

from app.base.metrics import Metrics
from app.core.admission import Admission, WaitPolicy
from app.core.observer import GangObserver, NullObserver
from app.core.state import ClusterState
from app.runtime.arbiter import Arbiter
from app.runtime.preemption.plans import PreemptionPlans
from app.runtime.wakeup import SiblingWaker


@dataclass(frozen=True, slots=True)
class VerbCore:
    """The cluster as seen, the gang rules, the metrics, and how long members may wait."""

    state: ClusterState
    admission: Admission
    metrics: Metrics
    wait: WaitPolicy


@dataclass(frozen=True, slots=True)
class VerbLinks:
    """Optional peers; without them the verbs neither wake, report, arbitrate nor plan ahead."""

    # Brings members parked in kube-scheduler's unschedulable queue back.
    waker: SiblingWaker | None = None
    observer: GangObserver = field(default_factory=NullObserver)
    # None: members are admitted one by one (Arbiter.applies says which gangs it places).
    arbiter: Arbiter | None = None
    # What the preempt verb answers, and every victim it handed out; None: a
    # plan book of the extender's own, protecting gang members.
    plans: PreemptionPlans | None = None
