"""The arithmetic and rendering of bench/watchcost.py (its cluster part runs in `make bench`)."""

from __future__ import annotations

import pytest

from bench import watchcost
from bench.watchcost import Trial


def test_plan_takes_turns_so_that_drift_falls_on_both_sides() -> None:
    e = "extender"
    assert watchcost.plan(8) == ["", e, e, "", "", e, e, ""]
    assert watchcost.plan(2) == ["", e]
    assert watchcost.plan(7, ["json", "protobuf"]) == [
        "",
        "json",
        "protobuf",
        "protobuf",
        "json",
        "",
        "",
    ]


def test_summary_is_the_median_per_thousand_bindings_of_each_side() -> None:
    trials = [
        Trial("", 2000, 2.0, 0.0),  # 1.0 s per 1,000
        Trial("extender", 2000, 2.2, 0.14),  # 1.1, extender 0.07
        Trial("extender", 4000, 4.8, 0.32),  # 1.2, extender 0.08
        Trial("", 2000, 3.0, 0.0),  # 1.5
        Trial("", 2000, 2.4, 0.0),  # 1.2
        Trial("extender", 2000, 2.6, 0.18),  # 1.3, extender 0.09
    ]
    summary = watchcost.summarize(trials)
    assert summary.control_plane_without == pytest.approx(1.2)
    assert summary.control_plane_with == pytest.approx(1.2)
    assert summary.watcher_seconds == pytest.approx(0.08)
    assert summary.added == pytest.approx(0.08)
    assert summary.share == pytest.approx(0.08 / 1.2)


def test_summary_counts_the_watch_events_the_extender_adds() -> None:
    trials = [
        Trial("", 1000, 1.0, 0.0, watch_events=2000, watch_bytes=2_000_000),
        Trial("extender", 1000, 1.1, 0.07, watch_events=3000, watch_bytes=3_900_000),
    ]
    summary = watchcost.summarize(trials)
    assert summary.events_without == 2.0
    assert summary.events_with == 3.0
    assert summary.bytes_per_added_event == pytest.approx(1900)


def test_pod_watch_events_sum_every_watcher_of_pods_only() -> None:
    metrics = """# TYPE apiserver_watch_events_total counter
apiserver_watch_events_total{component="apiserver",group="",resource="pods",version="v1"} 6000
apiserver_watch_events_total{component="apiserver",group="",resource="nodes",version="v1"} 90
# TYPE apiserver_watch_events_sizes histogram
apiserver_watch_events_sizes_bucket{group="",resource="pods",version="v1",le="+Inf"} 6000
apiserver_watch_events_sizes_sum{group="",resource="pods",version="v1"} 6.5e+06
apiserver_watch_events_sizes_count{group="",resource="pods",version="v1"} 6000
apiserver_watch_events_sizes_sum{group="",resource="nodes",version="v1"} 9000
"""
    assert watchcost.pod_watch_events(metrics) == (6000.0, 6.5e6)


def test_summary_needs_both_kinds_of_trial() -> None:
    with pytest.raises(ValueError, match="both with and without the extender"):
        watchcost.summarize([Trial("", 1000, 1.0, 0.0)])
    with pytest.raises(ValueError, match="both with and without the extender"):
        watchcost.summarize([Trial("extender", 1000, 1.0, 0.1)])
    with pytest.raises(ValueError, match="both with and without the json"):
        watchcost.summarize([Trial("", 1000, 1.0, 0.0), Trial("extender", 1000, 1.0, 0.1)], "json")


def test_render_shows_every_trial_and_the_medians() -> None:
    trials = [Trial("", 1000, 1.0, 0.0), Trial("extender", 1000, 1.05, 0.07)]
    text = watchcost.render(trials, [watchcost.summarize(trials)], "python -m bench.watchcost")
    assert "| 1 | none | 1.000 | - |" in text
    assert "| 2 | extender | 1.050 | 0.070 |" in text
    assert "Added by the extender: 0.120 s, 12.0%" in text


def test_render_has_one_reading_per_watcher_each_against_the_same_trials_without() -> None:
    trials = [
        Trial("", 1000, 1.0, 0.0),
        Trial("json", 1000, 1.2, 0.05),
        Trial("protobuf", 1000, 1.1, 0.04),
    ]
    summaries = [watchcost.summarize(trials, w) for w in ("json", "protobuf")]
    assert [s.control_plane_with for s in summaries] == [pytest.approx(1.2), pytest.approx(1.1)]
    text = watchcost.render(trials, summaries, "python -m bench.watchcost --watchers json,protobuf")
    assert "Added by a bare json pod watch: 0.250 s, 25.0%" in text
    assert "Added by a bare protobuf pod watch: 0.140 s, 14.0%" in text


def test_too_few_trials_are_refused_before_any_cluster_starts(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        watchcost.main(["--trials", "1"])
    assert "--trials must be at least 2: one without a watcher" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        watchcost.main(["--trials", "2", "--watchers", "json,protobuf"])
    assert "--trials must be at least 3" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        watchcost.main(["--watchers", "json,xml"])
    assert "--watchers: xml; pick from" in capsys.readouterr().err
