"""The soak's short version (issue 49): fixed seeds, a minute each, every fault.

Part of `make test` (in both extender modes, a few minutes each) and run
alone by `make soak-ci`. Its seeds found, and now hold fixed: a native
PodGroup whose priority differed from its members' was never scheduled by
kube-scheduler (seed 2: the soak named no class on the group); a claim stood
after its gang was deleted until some filter call came (seed 51). Once, after
a watch cut, a pod the API server no longer had stayed in the extender's
cache: not seen again since, its likely cause is fixed (a pod the bind verb
read while our watch lagged could land after the watch saw it deleted;
tests/unit/test_extender.py), and the caches are compared after every fault.
Once in CI (seed 2, every-verb), the last gangs got no PodScheduled message
in 30 s: kube-scheduler heard nothing for 45 s after an API server restart.
The relay had left its side of a connection open when the server reset its
own (a half-open connection that client-go's HTTP/2 ping ends after 45 s):
the relay now breaks both sides (tests/unit/test_soak_tools.py), and the
extender's watches end one silent for 150 s (tests/unit/test_kube_watch.py).
Seed 51 then failed one run in two, a gang created just before an API server
restart "waiting without saying why": kube-scheduler's status write was lost
to the restart, and its Event, retried, did land; the soak's own record of
the namespace's messages (tests/cluster/kube.py, SchedulingReports) had died
with the watch behind it, and the soak read its error as "no Event". It now
lists again after a break, as an informer does (tests/unit/test_soak_tools.py).
With two sessions at once on 2 CPUs, seed 51 then found the soak's own restart
of kube-scheduler starting the new process while the old one's last threads
still held its port ("bind: address already in use"): the rest of the run had
no scheduler. A component now counts as gone once its last thread is
(tests/soak/components.py).

tests/soak/ plays a seeded stream of gangs of every source (about one in
four required to keep to one rack of the soak's nodes), plain pods,
preempting gangs and pods, deletions mid-wait, node changes and faults
(extender SIGKILL, kube-scheduler and kube-apiserver restarts with etcd
compacted, watch connections cut) against the real control plane, with
kube-scheduler and the extender behind a relay that delays the API server's
answers and watch events. Every invariant it checks (never bound below
minMember, evictions exactly the oracle's minimum, every gang that fits is
placed, a gang kept to one rack never bound across two and its evictions
those of its cheapest rack, pending gangs say why, nothing held after the
gangs are gone, caches equal to a fresh list after each fault) must hold; the report lists what
broke, with the seed and the step. `make soak` runs the long version.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.cluster.kube import Kube
from tests.cluster.session import Extender
from tests.soak.components import APISERVER_PORT, extender_behind, scheduler_behind
from tests.soak.relay import Delay, SlowRelay, slow_relay
from tests.soak.run import Soak, SoakConfig

# Seed 1 found a claim left behind (run.py, clean-up), 2 a native group's priority, 51 a claim
# left after its gang was deleted; 2 and 51 inject every fault. 3, 4 and 5 found, in 30-minute
# runs, plain pods starved behind waiting members, a binding whose answer was lost rolled
# back, and a preemption kube-scheduler dropped (BENCHMARKS.md, the soak): their first minute
# is held fixed as well.
SEEDS = (1, 2, 3, 4, 5, 51)
SECONDS = 60.0


@pytest.fixture(scope="module")
def relay(extender: Extender) -> Iterator[SlowRelay]:
    with (
        slow_relay(
            APISERVER_PORT, down=Delay(0.05, 0.25), up=Delay(0.01, 0.05), seed=49, max_seconds=3600
        ) as relay,
        scheduler_behind(relay.port),
        extender_behind(extender, relay.port),
    ):
        yield relay


@pytest.mark.parametrize("seed", SEEDS)
def test_soak_keeps_every_invariant(
    kube: Kube, extender: Extender, relay: SlowRelay, namespace: str, seed: int
) -> None:
    report = Soak(kube, extender, namespace, SoakConfig(seed=seed, seconds=SECONDS), relay).run()
    print(report.render())
    assert report.violations == [], report.render()
    assert report.placed > 0, report.render()
