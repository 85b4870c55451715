"""bench/deepline.py's scenario, tiny, on the test cluster: its code works and its outcomes hold.

The full run (200 nodes, 1,000 big gangs, 100 small ones, the in-tree plugin
beside gang-extender) is `make bench-deepline`; here its Scenario runs with
the session's extender (every verb, short aging) and a kube-scheduler of its
own on 8 nodes of 8 CPUs: 2 big gangs of 4 x 6 CPUs run, 18 wait and age, the
small gangs run in the 2-CPU remainders with and without the line, and as
running big gangs end the waiting ones start in line order. No timing is
asserted; what the API server shows is.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from bench import deepline, e2e
from tests.cluster.bench_runner import bench_runner
from tests.cluster.kube import Kube
from tests.cluster.racks import node_pool
from tests.cluster.session import Extender

NODES = 8
POOL = {"pool": "deepline"}


@pytest.fixture
def deepline_pool(kube: Kube, extender: Extender) -> Iterator[list[str]]:
    """NODES nodes of 8 CPUs labelled pool=deepline, and the extender with short aging."""
    shape = (NODES, str(deepline.NODE_SHAPE["cpu"]), "32Gi")
    with node_pool(kube, extender, "deepline", shape, "--gang-aging-seconds", "2"):
        yield [f"deepline-{i}" for i in range(NODES)]


def test_small_gangs_run_beside_the_line_and_big_gangs_start_in_line_order(
    kubeconfig: str, extender: Extender, deepline_pool: list[str]
) -> None:
    runner = bench_runner(kubeconfig, "bench-deepline", extender)
    sizes = deepline.Sizes(
        big_gangs=20,
        small_gangs=5,
        rounds=1,
        drain_rounds=2,
        drain_gangs=1,
        aging_seconds=2,
        small_timeout=40,
        line_timeout=60,
        drain_timeout=40,
    )
    scenario = deepline.Scenario(
        runner, e2e.CASES["c"], sizes, NODES, node_selector=POOL, log=print, prefix="smoke"
    )
    result = scenario.run()

    for run in (*result.without, *result.behind):
        assert run.bound == run.pods == 10, run
        assert run.all_bound_seconds is not None and run.pods_per_second > 0
        assert run.big_started == 0  # no room for a big gang while the small ones run
    # One 6-CPU member per node: NODES / 4 big gangs run whole, none partly, the rest wait.
    assert (result.running, result.partial, result.waiting) == (2, 0, 18), result
    assert result.in_line == 18 and result.aged is not None and result.aged > 0, result
    assert [len(r) for r in result.drain_rounds] == [1, 1], result.drain_rounds
    assert result.out_of_order == [], result.out_of_order
    assert not result.notes, result.notes
    dump = runner.cluster.work_dir / "smoke-c-debug-gangs.json"
    assert deepline._line_of(json.loads(dump.read_text()))  # the evidence was kept
    section = deepline.render_markdown(
        {
            "date": "today",
            "label": "smoke",
            "command": "pytest",
            "duration": 1.0,
            "commit": "x",
            "machine": "test",
            "load": "-",
            "kube_version": "-",
            "aging_seconds": 2,
            "small_gangs": 5,
            "rounds": 1,
            "modes": [result],
        }
    )
    assert "| (c) big gangs started out of line order in the drain | 0 of 2 | 0 | yes |" in section
