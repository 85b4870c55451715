"""The soak's seeded stream of steps: what happens to the cluster, in order. Pure: no I/O.

The same seed gives the same steps, so a failing seed is replayed exactly
(the faults and the timing around them differ; the steps do not). Each step
is one thing a user, an operator or a fault does: create a gang (any source,
any size, low priority), a plain pod, a high-priority gang or pod that has
to preempt, delete a gang (often one still waiting), add, cordon or remove
a node, or inject a fault.

Topology: every node is in a rack (RACK_LABEL; `rack_of` the k-th node
created, racks of 2 and 3 nodes in turn), and about one gang in four (of
GANG and PREEMPT_GANG steps) must be placed in one rack (`Step.rack`: Kueue's
required-topology annotation on its pods, which every source reads; a native
PodGroup's own spec.schedulingConstraints.topology). That
choice is drawn from a Random of its own, so the other steps of a seed are
what they were before topology came into the stream.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from enum import StrEnum


class Action(StrEnum):
    GANG = "gang"
    PLAIN = "plain"
    PREEMPT_GANG = "preempt-gang"  # a high-priority gang that must evict to fit
    PREEMPT_POD = "preempt-pod"  # a high-priority plain pod
    DELETE_GANG = "delete-gang"
    ADD_NODE = "add-node"
    CORDON = "cordon"  # cordon a node, or uncordon a cordoned one
    REMOVE_NODE = "remove-node"
    FAULT = "fault"


class Source(StrEnum):
    XK8S = "x-k8s"
    LABELS = "labels"
    VOLCANO = "volcano"
    NATIVE = "native"
    KUEUE = "kueue"


class Fault(StrEnum):
    EXTENDER_KILL = "extender-kill"  # SIGKILL, started again
    SCHEDULER_RESTART = "scheduler-restart"  # kube-scheduler SIGKILL, started again
    APISERVER_RESTART = "apiserver-restart"  # SIGKILL, etcd compacted meanwhile: watches get 410
    WATCH_CUT = "watch-cut"  # the slow relay drops every connection (watches resume)


ALL_FAULTS = frozenset(Fault)
# The fault steps that need the slow relay in front of the clients.
RELAY_FAULTS = frozenset({Fault.WATCH_CUT})

LOW_PRIORITIES = (0, 100)
HIGH_PRIORITY = 10_000
NODE_CPUS = (4000, 6000, 8000)
MEMBER_CPUS = (500, 1000, 1500, 2000, 2500)
# The node label of the soak's racks, and the share of gangs required to keep to one rack.
RACK_LABEL = "soak.example.com/rack"
RACK_SHARE = 0.25

# How often each action comes, out of the total weight.
_WEIGHTS: dict[Action, int] = {
    Action.GANG: 30,
    Action.PLAIN: 12,
    Action.PREEMPT_GANG: 10,
    Action.PREEMPT_POD: 4,
    Action.DELETE_GANG: 20,
    Action.ADD_NODE: 4,
    Action.CORDON: 4,
    Action.REMOVE_NODE: 4,
    Action.FAULT: 6,
}


@dataclass(frozen=True, slots=True)
class Step:
    index: int
    action: Action
    name: str = ""
    members: int = 0
    min_member: int = 0
    cpu: int = 0  # millicpu per member
    priority: int = 0
    source: Source = Source.XK8S
    fault: Fault | None = None
    # For DELETE_GANG, CORDON and REMOVE_NODE: which of the live ones, as a fraction
    # (the runner picks index int(pick * len(live))), so the stream needs no cluster state.
    pick: float = 0.0
    # For GANG and PREEMPT_GANG: every member in one rack (a required topology level).
    rack: bool = False

    def describe(self) -> str:
        if self.action is Action.FAULT:
            return f"step {self.index}: fault {self.fault}"
        if self.action in (Action.GANG, Action.PREEMPT_GANG):
            return (
                f"step {self.index}: {self.action} {self.name} ({self.source}, "
                f"{self.min_member}/{self.members} x {self.cpu}m, priority {self.priority}"
                f"{', one rack' if self.rack else ''})"
            )
        if self.action in (Action.PLAIN, Action.PREEMPT_POD):
            return f"step {self.index}: {self.action} {self.name} ({self.cpu}m, {self.priority})"
        if self.action is Action.ADD_NODE:
            return f"step {self.index}: add node {self.name} ({self.cpu}m)"
        return f"step {self.index}: {self.action} (pick {self.pick:.2f})"


def steps(seed: int, faults: Sequence[Fault] = tuple(ALL_FAULTS)) -> Iterator[Step]:
    """The endless stream of seed `seed`; only the `faults` given are injected."""
    rng = random.Random(seed)
    # Its own Random: the topology choice leaves the other draws (and steps) as they were.
    topology = random.Random(f"topology-{seed}")
    actions = [a for a in _WEIGHTS if a is not Action.FAULT or faults]
    weights = [_WEIGHTS[a] for a in actions]
    fault_kinds = sorted(faults)
    index = 0
    while True:
        index += 1
        action = rng.choices(actions, weights)[0]
        name = f"s{seed}-{index}"
        if action in (Action.GANG, Action.PREEMPT_GANG):
            members = rng.randint(2, 4)
            high = action is Action.PREEMPT_GANG
            source = Source.XK8S if high else rng.choice(list(Source))
            # Only x-k8s and Volcano PodGroups say minMember below the pod count here;
            # a preempting gang wants every member (its evictions are checked for all).
            partial = not high and source in (Source.XK8S, Source.VOLCANO) and rng.random() < 0.3
            yield Step(
                index,
                action,
                name=f"{'hi' if high else 'g'}{name}",
                members=members,
                min_member=members - 1 if partial else members,
                cpu=rng.choice(MEMBER_CPUS),
                priority=HIGH_PRIORITY if high else rng.choice(LOW_PRIORITIES),
                source=source,
                rack=topology.random() < RACK_SHARE,
            )
        elif action in (Action.PLAIN, Action.PREEMPT_POD):
            high = action is Action.PREEMPT_POD
            yield Step(
                index,
                action,
                name=f"{'hp' if high else 'p'}{name}",
                members=1,
                min_member=1,
                cpu=rng.choice(MEMBER_CPUS),
                priority=HIGH_PRIORITY if high else rng.choice(LOW_PRIORITIES),
            )
        elif action is Action.ADD_NODE:
            yield Step(index, action, name=f"n{name}", cpu=rng.choice(NODE_CPUS))
        elif action is Action.FAULT:
            yield Step(index, action, fault=rng.choice(fault_kinds))
        else:
            yield Step(index, action, pick=rng.random())


def rack_of(k: int) -> str:
    """The rack of the k-th node the soak creates (from 0): racks of 2 and 3 nodes in turn.

    The soak's first four nodes make two racks; the nodes the stream adds
    fill the second one, then the next ones.
    """
    return f"rack-{(2 * k + 1) // 5}"
