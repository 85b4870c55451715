"""The arithmetic of bench/deepline.py: line order, gang starts, the order check, the ratios."""

from __future__ import annotations

from app.core.marking import LINE_GATE
from bench import deepline, e2e
from bench.deepline import ModeResult, OutOfOrder, SmallRun


def small(rate: float, all_bound: float | None = 2.0) -> SmallRun:
    return SmallRun("x", 200, 200, rate, 1.0, all_bound)


def test_line_order_is_creation_time_then_name() -> None:
    created = {
        "big0002": "2026-11-28T19:00:01Z",
        "big0001": "2026-11-28T19:00:01Z",
        "big0000": "2026-11-28T19:00:02Z",
    }
    assert deepline.line_order(created) == ["big0001", "big0002", "big0000"]


def test_a_gang_starts_when_its_last_member_is_bound() -> None:
    members = {"a": ["a-0", "a-1"], "b": ["b-0", "b-1"], "c": []}
    bound_at = {"a-0": 1.0, "a-1": 3.0, "b-0": 2.0}
    assert deepline.gang_starts(bound_at, members) == {"a": 3.0}


def test_gangs_started_in_line_order_are_not_reported() -> None:
    line = ["g0", "g1", "g2", "g3", "g4"]
    # Within a round the order does not count; across rounds the line does.
    assert deepline.check_order(line, [{"g1", "g0"}, {"g2"}, {"g3", "g4"}]) == []


def test_a_gang_started_ahead_of_its_turn_is_reported_with_the_ones_it_skipped() -> None:
    line = ["g0", "g1", "g2", "g3", "g4"]
    found = deepline.check_order(line, [{"g0", "g3"}, {"g1"}, set()])
    assert found == [OutOfOrder(round=1, gang="g3", position=3, skipped=("g1",))]
    # The skipped gang starting later is in order then: it is first of those still waiting.
    assert deepline.check_order(line, [{"g2"}, {"g0", "g1"}]) == [
        OutOfOrder(round=1, gang="g2", position=2, skipped=("g0",))
    ]


def test_ratios_use_the_medians_of_the_rounds_and_say_whether_targets_are_met() -> None:
    ours = ModeResult("c", "ours", 200, 1000)
    ours.without = [small(100.0), small(90.0), small(120.0)]
    ours.behind = [small(85.0), small(80.0), small(95.0)]
    ours.drain_rounds = [["g0", "g1"], ["g2"]]
    ours.out_of_order = [OutOfOrder(2, "g2", 1, ("g9",))]
    in_tree = ModeResult("d", "in-tree", 200, 1000)
    in_tree.without = [small(100.0)]
    in_tree.behind = [small(10.0, None)]
    assert deepline.median_rate(ours.without) == 100.0
    assert deepline.median_rate([]) == 0.0
    assert deepline.median_all_bound(in_tree.behind) is None
    assert deepline.ratio(1.0, 0.0) is None
    rows = deepline.target_rows([ours, in_tree])
    assert rows == [
        "| (c) small gangs' pods/s behind the line / with none | 0.85 | >= 0.8 | yes |",
        "| (d) small gangs' pods/s behind the line / with none | 0.10 | >= 0.8 | **no** |",
        "| (c)/(d) small gangs' pods/s behind the line, gang-extender / in-tree | 8.50 "
        "| >= 1.0 | yes |",
        "| (c) big gangs started out of line order in the drain | 1 of 3 | 0 | **no** |",
    ]


def test_the_section_shows_each_scheduler_and_the_out_of_order_starts() -> None:
    ours = ModeResult("c", "gang-extender, every verb", 200, 1000, running=50, waiting=950)
    ours.without, ours.behind = [small(100.0)], [small(90.0)]
    ours.out_of_order = [OutOfOrder(1, "big0060", 3, ("big0051",))]
    ours.in_line, ours.aged = 950, 940
    section = deepline.render_markdown(
        {
            "date": "today",
            "label": "test",
            "command": "defaults",
            "duration": 10.0,
            "commit": "abc",
            "machine": "m",
            "load": "1 1 1",
            "kube_version": "v1",
            "aging_seconds": 5.0,
            "small_gangs": 100,
            "rounds": 1,
            "modes": [ours],
        }
    )
    assert section.startswith(deepline.MD_BEGIN) and section.endswith(deepline.MD_END + "\n")
    assert "| (c) gang-extender, every verb | 100.0 (100.0) | 90.0 (90.0) |" in section
    assert "| 50 / 0 / 950 (950 in line, 940 aged) |" in section
    assert "big0060 started from place 3 in line, ahead of it still waiting: big0051" in section


def test_the_held_mode_is_case_q_with_its_members_gated_as_the_webhook_leaves_them() -> None:
    held = deepline.case_of(deepline.HELD)
    assert held.key == "k" and held.gang_only and held.gangs == e2e.CASES["q"].gangs
    bodies = [e2e.pod_body("p-0", x_group="p", marked=True)]
    gated = deepline.as_webhook_leaves(held, bodies)
    assert gated[0]["spec"]["schedulingGates"] == [{"name": LINE_GATE}]
    plain = deepline.as_webhook_leaves(e2e.CASES["q"], [e2e.pod_body("p-1", x_group="p")])
    assert "schedulingGates" not in plain[0]["spec"]
