"""bench.contention's watcher (each gang's progress and the timeline bench/plots.py draws)
and the pods it creates."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from app.core.groups import POD_GROUP_LABEL
from bench import plots
from bench.contention import TIMELINE_FIELDS, GangLog, Result, _Watcher, pod_bodies


def pods(gang: str, bound: int, finished: int, size: int) -> list[dict[str, Any]]:
    """`size` members of `gang`: the first `bound` on a node, the first `finished` done."""
    return [
        {
            "metadata": {"name": f"{gang}-{i}", "labels": {POD_GROUP_LABEL: gang}},
            "spec": {"nodeName": "n1" if i < bound else None},
            "status": {"phase": "Succeeded" if i < finished else "Running"},
        }
        for i in range(size)
    ]


def test_the_timeline_counts_gangs_waiting_partly_bound_running_and_done() -> None:
    gangs = {"a": GangLog(2), "b": GangLog(3), "c": GangLog(2)}
    watcher = _Watcher(None, "ns", gangs)
    watcher.sample(10.0, pods("a", 0, 0, 2) + pods("b", 1, 0, 3) + pods("c", 2, 0, 2))
    watcher.sample(11.0, pods("a", 2, 0, 2) + pods("b", 3, 0, 3) + pods("c", 2, 2, 2))
    assert watcher.timeline == [
        # time, waiting, partial, running, done, pods bound
        (10.0, 1, 1, 1, 0, 3),
        (11.0, 0, 0, 2, 1, 7),
    ]
    assert gangs["b"].partial_seconds == 0.0 and gangs["b"].first_bound == 10.0
    assert gangs["c"].done == 11.0


def test_the_json_of_a_mode_has_what_the_contention_plot_reads(tmp_path: Path) -> None:
    """What main() writes per mode: the Result's fields, its ratio and the gate timeouts."""
    result = Result(
        gangs=3,
        pods=7,
        capacity_cpus=4,
        work_seconds=2.0,
        makespan=8.0,
        lower_bound=3.5,
        first_complete=1.0,
        longest_partial=0.5,
        timeline=[[0.0, 3, 0, 0, 0, 0], [1.0, 1, 1, 1, 0, 4], [8.0, 0, 0, 0, 3, 7]],
    )
    assert len(result.timeline[0]) == len(TIMELINE_FIELDS)
    mode = {**result.__dict__, "ratio": result.ratio, "gate_timeouts": 0.0}
    figures = {"date": "2026-11-28 10:00 UTC", "modes": {"on": mode, "off": mode}}
    drawn = plots.contention_timelines(figures, tmp_path / "contention.png")
    assert drawn.stat().st_size > 0


def test_the_pods_come_gang_after_gang_or_shuffled_the_same_way_for_a_seed() -> None:
    gangs = {"g00": GangLog(3), "g01": GangLog(2), "g02": GangLog(4)}
    names = [b["metadata"]["name"] for b in pod_bodies(gangs, 8)]
    assert names == [f"g00-{i}" for i in range(3)] + ["g01-0", "g01-1"] + [
        f"g02-{i}" for i in range(4)
    ]
    shuffled = [b["metadata"]["name"] for b in pod_bodies(gangs, 8, shuffle=1)]
    assert sorted(shuffled) == sorted(names) and shuffled != names
    assert shuffled == [b["metadata"]["name"] for b in pod_bodies(gangs, 8, shuffle=1)]
    body = pod_bodies(gangs, 8, shuffle=1)[0]
    assert body["metadata"]["annotations"]["local-cluster.dev/exit-after-seconds"] == "8"
