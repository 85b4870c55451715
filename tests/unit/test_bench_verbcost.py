"""The arithmetic and rendering of bench/verbcost.py (its cluster part runs in `make bench`)."""

from __future__ import annotations

import orjson
import pytest

from bench import verbcost
from bench.verbcost import NOOP, OURS, Trial


def test_plan_takes_turns_in_one_order_then_the_reverse() -> None:
    assert verbcost.plan(["a", "b", "c"], 2) == ["a", "b", "c", "c", "b", "a"]
    assert verbcost.plan(["a", "b"], 3) == ["a", "b", "b", "a", "a", "b"]


@pytest.mark.parametrize(
    ("nodes", "names"),
    [
        (60, 60),  # under 100 nodes: every node
        (150, 100),  # 49% would be 73: at least 100
        (500, 230),  # 46%
        (2000, 680),  # 34%
        (5000, 500),  # 10%: issue 20's size
        (10000, 500),  # the 5% floor
    ],
)
def test_names_are_what_kube_scheduler_sends_at_that_many_nodes(nodes: int, names: int) -> None:
    assert verbcost.names_sent(nodes) == names


def test_figures_are_medians_per_call_for_each_extender_and_verb() -> None:
    def trial(label: str, verb: str, calls: int, client: float, extender: float) -> Trial:
        return Trial(label, verb, calls, client, extender, 2 * client, client / 1000, client / 100)

    trials = [
        trial(OURS, "filter", 1000, 0.10, 0.05),  # 100 µs client, 50 extender
        trial(NOOP, "filter", 1000, 0.12, 0.09),
        trial(NOOP, "filter", 2000, 0.26, 0.20),  # 130, 100
        trial(OURS, "filter", 2000, 0.24, 0.12),  # 120, 60
        trial(OURS, "filter", 1000, 0.11, 0.07),  # 110, 70
        trial(NOOP, "filter", 1000, 0.14, 0.11),  # 140, 110
        trial(OURS, "prioritize", 1000, 0.08, 0.04),
    ]
    rows = verbcost.summarize(trials)
    assert [(r.label, r.verb) for r in rows] == [
        (OURS, "filter"),
        (NOOP, "filter"),
        (OURS, "prioritize"),
    ]
    ours, noop, prioritize = rows
    assert (ours.client_us, ours.extender_us, ours.wall_us) == pytest.approx((110, 60, 220))
    assert (noop.client_us, noop.extender_us) == pytest.approx((130, 100))
    assert ours.p50_us == pytest.approx(110)  # medians of the trials' own p50s: 100, 120, 110
    assert prioritize.client_us == pytest.approx(80)
    # The no-op's k-th trial against gang-extender's k-th: client 120/100, 130/120, 140/110.
    assert ours.to_ours is None and prioritize.to_ours is None
    assert noop.to_ours is not None
    assert noop.to_ours[0] == pytest.approx(120 / 100)
    assert noop.to_ours[1] == pytest.approx(100 / 60)  # 90/50, 100/60, 110/70


def test_render_gives_each_row_its_ratios_to_gang_extender_for_the_same_verb() -> None:
    rows = [
        verbcost.Figures(OURS, "filter", 100.0, 50.0, 200.0, 180.0, 900.0),
        verbcost.Figures(NOOP, "filter", 120.0, 100.0, 260.0, 230.0, 1500.0, (1.2, 2.0, 1.3)),
    ]
    text = verbcost.render(rows, "python -m bench.verbcost")
    assert "| filter | gang-extender | 100.0 | 50.0 | 200.0 | 180 / 900 | - |" in text
    assert (
        "| filter | no-op Go extender | 120.0 | 100.0 | 260.0 | 230 / 1500 | 1.20, 2.00, 1.30 |"
        in text
    )


def test_the_floors_answer_the_least_a_verb_can_do() -> None:
    from bench.verbfloor import answer

    body = orjson.dumps({"Pod": {"metadata": {"name": "p"}}, "NodeNames": ["n-1", "n-2"]})
    status, filtered = answer(b"/scheduler/filter", body)
    assert status == 200
    assert orjson.loads(filtered) == {
        "NodeNames": ["n-1", "n-2"],
        "FailedNodes": {},
        "FailedAndUnresolvableNodes": {},
    }
    # Every node scores 0, which gang-extender's answer says by naming none.
    status, scores = answer(b"/scheduler/prioritize", body)
    assert (status, orjson.loads(scores)) == (200, [])
    assert answer(b"/healthz", b"")[0] == 200
    assert answer(b"/scheduler/bind", body)[0] == 404
