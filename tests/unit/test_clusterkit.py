"""The pure parts of hack/clusterkit.py (the process and HTTP parts run in the cluster tests)."""

from __future__ import annotations

from typing import Any

import pytest

from app.core.groups import VOLCANO_API
from hack.clusterkit import (
    create_group,
    kubeconfig_of,
    parse_metrics,
    pause_pod,
    sample,
    sum_by_label,
    wait_for,
)

PAGE = """\
# HELP gang_extender_gang_admissions_total Gate outcomes per gang wave.
# TYPE gang_extender_gang_admissions_total counter
gang_extender_gang_admissions_total{result="timeout"} 2.0
gang_extender_gang_admissions_total{result="admitted"} 5.0
# HELP gang_extender_gate_waiting_pods Gang members waiting in the permit gate.
# TYPE gang_extender_gate_waiting_pods gauge
gang_extender_gate_waiting_pods 3.0
"""


def test_samples_are_found_by_name_and_exact_labels() -> None:
    samples = parse_metrics(PAGE)
    assert sample(samples, "gang_extender_gang_admissions_total", result="timeout") == 2.0
    assert sample(samples, "gang_extender_gate_waiting_pods") == 3.0
    # Absent (a counter never counted, or a label set that does not exist) reads as 0.
    assert sample(samples, "gang_extender_gang_admissions_total", result="rejected") == 0.0
    assert sample(samples, "gang_extender_gang_admissions_total") == 0.0


def test_the_kubeconfig_is_read_from_the_export_line() -> None:
    out = "control plane up\nexport KUBECONFIG=/tmp/x/admin.kubeconfig\nmore\n"
    assert kubeconfig_of(out) == "/tmp/x/admin.kubeconfig"
    with pytest.raises(RuntimeError, match="no KUBECONFIG line"):
        kubeconfig_of("nothing here\n")


def test_wait_for_returns_the_first_truthy_value_and_names_what_timed_out() -> None:
    answers = iter([0, [], "ready"])
    assert wait_for(lambda: next(answers), 5, "x", interval=0) == "ready"
    with pytest.raises(TimeoutError, match=r"waiting for the thing \(last: 0\)"):
        wait_for(lambda: 0, 0, "the thing", interval=0)


def test_a_group_object_is_created_with_its_api_coordinates() -> None:
    calls: list[tuple[Any, ...]] = []

    class Custom:
        def create_namespaced_custom_object(self, *args: Any) -> None:
            calls.append(args)

    create_group(Custom(), VOLCANO_API, "ns", "tf", {"minMember": 2})
    assert calls == [
        (
            "scheduling.volcano.sh",
            "v1beta1",
            "ns",
            "podgroups",
            {
                "apiVersion": "scheduling.volcano.sh/v1beta1",
                "kind": "PodGroup",
                "metadata": {"name": "tf"},
                "spec": {"minMember": 2},
            },
        )
    ]


def test_pause_pod_requests_what_it_is_given_and_takes_extra_spec_fields() -> None:
    pod = pause_pod(
        "p",
        cpu="250m",
        memory="64Mi",
        labels={"app": "x"},
        annotations={"a": "1"},
        spec={"schedulerName": "s", "nodeSelector": {"pool": "p"}},
    )
    assert pod["metadata"] == {"name": "p", "labels": {"app": "x"}, "annotations": {"a": "1"}}
    [container] = pod["spec"]["containers"]
    assert container["resources"] == {"requests": {"cpu": "250m", "memory": "64Mi"}}
    assert pod["spec"]["schedulerName"] == "s"
    assert pod["spec"]["nodeSelector"] == {"pool": "p"}
    assert pod["spec"]["terminationGracePeriodSeconds"] == 0
    assert "annotations" not in pause_pod("q", cpu="1", memory="1Gi")["metadata"]


def test_counters_are_summed_by_one_label_across_the_others() -> None:
    text = (
        "# TYPE scheduler_batch_attempts_total counter\n"
        'scheduler_batch_attempts_total{profile="default-scheduler",result="no_hint"} 1990\n'
        'scheduler_batch_attempts_total{profile="default-scheduler",result="hint_used"} 7\n'
        'scheduler_batch_attempts_total{profile="other",result="hint_used"} 3\n'
        "# TYPE scheduler_goroutines gauge\n"
        'scheduler_goroutines{operation="binding"} 4\n'
    )
    assert sum_by_label(parse_metrics(text), "scheduler_batch_attempts_total", "result") == {
        "no_hint": 1990.0,
        "hint_used": 10.0,
    }
    assert sum_by_label(parse_metrics(text), "scheduler_batch_cache_flushed_total", "reason") == {}
