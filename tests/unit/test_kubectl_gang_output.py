"""kubectl gang's output and command line: columns, ages, colour, json/yaml, describe, errors."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from app.kubectl.args import UsageError, parse
from app.kubectl.describe import describe
from app.kubectl.gangs import build_gangs
from app.kubectl.live import Live
from app.kubectl.main import View, main, watch_rows
from app.kubectl.objects import Objects
from app.kubectl.output import HEADERS, as_list, dump, gang_document, gang_table, live_note
from app.kubectl.queues import bars, parse_formatted, queue_rows, queue_table
from app.kubectl.table import human_age, render
from tests.unit.builders import pod, podgroup
from tests.unit.test_kubectl_gang import UNREACHABLE, objects, unschedulable

LIVE = Live(
    {
        "groups": [],
        "gate": {"ml/b": [{"pod": "ml/b-0", "uid": "uid-ml-b-0", "node": "n2"}]},
        "leader": True,
        "contention": {
            "queues": [
                {
                    "queue": "team-a",
                    "weight": 1,
                    "state": "Open",
                    "reclaimable": True,
                    "deserved": "cpu 6, memory 12Gi",
                    "allocated": "cpu 3, memory 3Gi",
                    "pendingGangs": 1,
                }
            ]
        },
    },
    "service gang-extender/gang-extender-metrics:metrics",
)


def two_gangs() -> Objects:
    a = podgroup("a", 2, namespace="ml")
    a["metadata"]["creationTimestamp"] = "2027-01-15T07:59:00Z"
    b = podgroup("b", 2, namespace="ml")
    b["metadata"]["creationTimestamp"] = "2027-01-15T07:00:00Z"
    b["spec"]["queue"] = "team-a"  # x-k8s has no spec.queue: ignored, annotation below counts
    b["metadata"]["annotations"] = {"scheduling.volcano.sh/queue-name": "team-a"}
    pods = [
        pod("a-0", namespace="ml", group="a", node="n1", phase="Running"),
        pod("a-1", namespace="ml", group="a", node="n2", phase="Running"),
        pod("b-0", namespace="ml", group="b"),
        unschedulable(
            pod("b-1", namespace="ml", group="b"), "0/3 nodes are available: " + "x" * 200
        ),
    ]
    found = objects(pods, **{"x-k8s": [a, b]})
    found.now = 1_800_000_000.0
    return found


@pytest.mark.parametrize(
    ("seconds", "shown"),
    [
        (5, "5s"),
        (119, "119s"),
        (125, "2m5s"),
        (600, "10m"),
        (3 * 3600 + 60, "3h1m"),
        (50 * 3600, "2d2h"),
        (30 * 86400, "30d"),
        (3 * 365 * 86400, "3y"),
    ],
)
def test_ages_read_like_kubectls(seconds: float, shown: str) -> None:
    assert human_age(seconds) == shown


def test_columns_are_aligned_and_coloured_only_when_asked() -> None:
    plain = render(
        ["NAME", "PHASE", "REASON"], [["a", "Running", "x"], ["long-name", "Failed", "y"]]
    )
    assert plain.splitlines() == [
        "NAME        PHASE     REASON",
        "a           Running   x",
        "long-name   Failed    y",
    ]
    coloured = render(
        ["NAME", "PHASE", "REASON"], [["a", "Running", "x"]], colour=True, colour_column="PHASE"
    )
    assert coloured.splitlines()[1] == "a      \033[32mRunning\033[0m   x"
    assert coloured.splitlines()[0] == "NAME   PHASE     REASON"  # the header is plain


def test_get_table_shows_every_column_and_clips_the_reason() -> None:
    found = two_gangs()
    gangs = build_gangs(found, LIVE)
    text = gang_table(gangs, found.now, LIVE, wide=False, all_namespaces=True, colour=False)
    header, a, b = text.splitlines()
    assert header.split() == ["NAMESPACE", *HEADERS]  # the columns: tests/cluster checks them
    assert a.split() == [
        *("ml", "a", "x-k8s", "Running", "2", "0", "0", "2", "<none>", "<none>", "60s", "<none>")
    ]
    assert b.split()[:9] == ["ml", "b", "x-k8s", "PreScheduling", "0", "1", "1", "2", "team-a"]
    assert b.endswith(
        "   1 member(s) reserved in the permit gate for up to 0s, waiting for the "
        "rest of minMember 2"
    )
    offline = gang_table(
        build_gangs(found, UNREACHABLE),
        found.now,
        UNREACHABLE,
        wide=False,
        all_namespaces=False,
        colour=False,
    )
    reason = offline.splitlines()[2].split("   ")[-1]
    assert reason.startswith("0/3 nodes are available: xxx") and reason.endswith("...")
    assert len(reason) == 100


def test_wide_output_adds_key_topology_and_nodes_and_the_whole_reason() -> None:
    found = two_gangs()
    gangs = build_gangs(found, UNREACHABLE)
    text = gang_table(gangs, found.now, UNREACHABLE, wide=True, all_namespaces=False, colour=False)
    header, a, b = text.splitlines()
    assert header.split()[-4:] == ["KEY", "TOPOLOGY", "NODES", "REASON"]
    assert "ml/a" in a.split() and "n1,n2" in a.split()
    assert b.endswith("x" * 200)


def test_unreachable_extender_shows_dashes_and_says_so() -> None:
    found = two_gangs()
    gangs = build_gangs(found, UNREACHABLE)
    text = gang_table(gangs, found.now, UNREACHABLE, wide=False, all_namespaces=False, colour=False)
    b = text.splitlines()[2].split()
    assert b[:6] == ["b", "x-k8s", "Pending", "0", "-", "2"]
    note = live_note(UNREACHABLE)
    assert note.startswith("extender unreachable (service gang-extender/")
    assert "connection refused" in note and "from the API objects" in note
    assert live_note(Live({"leader": False}, "svc", "only standby replicas answered")).startswith(
        "live state from a standby"
    )


def test_json_and_yaml_are_a_list_with_the_columns_and_members() -> None:
    found = two_gangs()
    gangs = build_gangs(found, LIVE)
    doc = as_list([gang_document(g) for g in gangs], LIVE)
    parsed = json.loads(dump(doc, "json"))
    assert parsed == yaml.safe_load(dump(doc, "yaml"))
    assert parsed["kind"] == "List" and parsed["live"]["reachable"] is True
    b = parsed["items"][1]
    assert (b["key"], b["bound"], b["reserved"], b["pending"], b["minMember"]) == (
        "ml/b",
        0,
        1,
        1,
        2,
    )
    assert [m["state"] for m in b["members"]] == ["Reserved", "Pending"]


def test_describe_shows_members_roles_plans_and_events() -> None:
    found = two_gangs()
    (_, b) = build_gangs(found, LIVE)
    events = [
        {
            "type": "Normal",
            "reason": "GangWaiting",
            "message": "1 of minMember 2 members placed",
            "lastTimestamp": "2027-01-15T07:59:00Z",
            "count": 3,
            "source": {"component": "gang-extender"},
            "involvedObject": {"kind": "PodGroup", "name": "b"},
        }
    ]
    text = describe(b, LIVE, events, found.now, colour=False)
    lines = text.splitlines()
    assert "Name:        b" in lines and "Key:         ml/b" in lines
    assert "Members:     0 bound, 1 reserved, 1 pending" in lines
    assert "Roles:       <none>" in lines and "Sub-groups:  <none>" in lines
    assert any(line.split()[:3] == ["b-0", "Reserved", "<none>"] for line in lines)
    assert "Preemption:  <none>" in lines
    assert any("GangWaiting" in line and "(x3)" in line and "PodGroup/b" in line for line in lines)
    assert lines[-2].split()[:2] == ["TYPE", "REASON"]
    offline = describe(b, UNREACHABLE, [], found.now, colour=False)
    assert "Preemption:  unknown (extender unreachable)" in offline
    assert "reserved unknown" in offline and "Events:      <none>" in offline


def test_queues_table_and_bars() -> None:
    found = two_gangs()
    found.queues = [
        {
            "metadata": {"name": "team-a"},
            "spec": {"weight": 1, "reclaimable": True},
            "status": {"state": "Open"},
        },
    ]
    gangs = build_gangs(found, LIVE)
    rows = queue_rows(found.queues, gangs, LIVE)
    assert [r.name for r in rows] == ["default", "team-a"]
    text = queue_table(rows)
    assert text.splitlines()[2].split() == [
        "team-a",
        "1",
        "Open",
        "true",
        "cpu",
        "6,",
        "memory",
        "12Gi",
        "cpu",
        "3,",
        "memory",
        "3Gi",
        "1",
        "0",
    ]
    drawn = bars(rows).splitlines()
    assert drawn[1].split()[:2] == ["team-a", "cpu"] and "#" * 15 + "-" * 15 in drawn[1]
    assert drawn[1].endswith("3 of 6")
    assert parse_formatted("cpu 500m, memory 1Gi") == {"cpu": 500, "memory": 1024**3 * 1000}
    offline = queue_rows(found.queues, gangs, UNREACHABLE)
    assert offline[1].cells()[4] == "-"  # deserved: only the leader knows


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["describe"], "describe needs a gang"),
        (["describe", "a/b/c"], "malformed gang 'a/b/c'"),
        (["describe", "volcano:b"], "malformed gang"),
        (["get", "x"], "get takes no name"),
        (["get", "-o", "table"], "unknown output format 'table'"),
        (["describe", "ns/x", "-w"], "--watch works with get and queues"),
        (["lists"], "invalid choice: 'lists'"),
        (["get", "--extender-url", "file:///etc/passwd"], "must be an http(s) URL"),
    ],
)
def test_bad_arguments_are_one_line_and_exit_2(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(UsageError) as raised:
        parse(argv)
    assert message in str(raised.value)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ") and message in err


def test_a_missing_kubeconfig_is_one_line_and_exit_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["get", "--kubeconfig", str(tmp_path / "none")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: cannot load a kubeconfig from ") and err.count("\n") == 1


def test_an_api_server_that_is_not_there_is_one_line_and_exit_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "kubeconfig"
    config.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": "http://127.0.0.1:9"}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )
    assert main(["get", "--kubeconfig", str(config), "--request-timeout", "2"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: cannot reach the API server at http://127.0.0.1:9")
    assert err.count("\n") == 1


def test_watch_keys_ignore_the_age_but_not_a_change() -> None:
    options = parse(["get", "-w"])
    found = two_gangs()
    before = View(found, UNREACHABLE, build_gangs(found, UNREACHABLE))
    later = View(replace(found, now=found.now + 600), UNREACHABLE, before.gangs)
    (a1, b1), (a2, b2) = watch_rows(before, options, False), watch_rows(later, options, False)
    assert (a1[0], b1[0]) == (a2[0], b2[0]) and a1[1] != a2[1]  # only AGE moved on
    found.pods[0]["spec"]["nodeName"] = None
    changed = View(found, UNREACHABLE, build_gangs(found, UNREACHABLE))
    assert watch_rows(changed, options, False)[0][0] != a1[0]
