"""Faults and bad input, on the real control plane (docs/reliability.md).

Each test injects one fault into the running system (the extender killed or
stopped, kube-apiserver or kube-scheduler killed, a binding refused by an
admission policy, thousands of malformed requests) and asserts on what the
API server shows: where pods are bound, their events, and the extender's
own /debug and /metrics. Tests that kill a shared component restart it
before they return (`hack/local-cluster up` with the session's arguments),
so the tests after them find a healthy cluster.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import http.client
import json
import os
import random
import re
import signal
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from app.core.groups import XK8S_API
from hack.clusterkit import (
    local_cluster,
    start_extender,
    wait_for,
    wait_for_default_service_account,
)
from tests.cluster.chart_pod import free_port
from tests.cluster.kube import Kube
from tests.cluster.session import CLUSTER_DIR, EXTENDER_PORT, PORT_OFFSET, UP_ARGS, Extender
from tests.fuzz import fuzz_request

ETCD_URL = f"http://127.0.0.1:{22379 + PORT_OFFSET}"


# ---- helpers ---------------------------------------------------------------------------


# The bindings of one admission are separate API calls made at once, so a
# list can land between them; a wave completes in milliseconds. A partial
# state that outlives this is a gang left partly bound.
WAVE_SECONDS = 2.0


@contextmanager
def no_partial_gang(kube: Kube, namespace: str, min_member: int) -> Iterator[list[str]]:
    """Watch the namespace the whole time: bound pods must be 0 or >= min_member.

    Polls every 0.2 s on its own thread; yields the list of violations seen
    (the test asserts it is empty at the end): partial states that lasted
    longer than WAVE_SECONDS, or that were still there at the end.
    """
    seen: list[str] = []
    stop = threading.Event()

    def poll() -> None:
        since: float | None = None
        bound: dict[str, str] = {}
        while not stop.is_set():
            try:
                bound = kube.bound(namespace)
            except Exception:  # the API server may be down in a fault test
                bound = {}
            if 0 < len(bound) < min_member:
                since = since if since is not None else time.monotonic()
                if time.monotonic() - since > WAVE_SECONDS:
                    seen.append(f"{time.strftime('%T')}: {sorted(bound)} bound")
            else:
                since = None
            stop.wait(0.2)
        # The last poll may have landed inside a binding wave: judge the end on a fresh look.
        with contextlib.suppress(Exception):
            bound = kube.bound(namespace)
        if 0 < len(bound) < min_member:
            seen.append(f"at the end: {sorted(bound)} bound")

    thread = threading.Thread(target=poll, daemon=True)
    thread.start()
    try:
        yield seen
    finally:
        stop.set()
        thread.join(5)


def debug(extender: Extender, what: str = "gangs") -> Any:
    with urllib.request.urlopen(f"{extender.url}/debug/{what}", timeout=10) as response:
        return json.loads(response.read())


def waiting_in_gate(extender: Extender, group_key: str) -> list[dict[str, Any]]:
    return list(debug(extender)["gate"].get(group_key, []))


def gang_with_an_unfit_member(kube: Kube, namespace: str, timeout: int) -> None:
    """g-0 and g-1 fit and wait in the gate; g-2 is never placed, so the gang never opens.

    g-2 names a scheduler that does not run: a member that fits no node would
    be caught by --gang-feasibility before anything is reserved.
    """
    kube.create_podgroup(namespace, "g", 3, timeout=timeout)
    kube.create_pod(namespace, "g-0", group="g")
    kube.create_pod(namespace, "g-1", group="g")
    kube.create_pod(namespace, "g-2", group="g", scheduler="no-such-scheduler")


def make_the_gang_fit(kube: Kube, namespace: str) -> None:
    kube.core.delete_namespaced_pod("g-2", namespace, grace_period_seconds=0)
    wait_for(lambda: "g-2" not in {p.metadata.name for p in kube.pods(namespace)}, 30, "g-2 gone")
    kube.create_pod(namespace, "g-2", group="g")


def pid_of(component: str) -> int:
    return int((CLUSTER_DIR / "pids" / f"{component}.pid").read_text().strip())


def restart_cluster() -> None:
    """`up` with the session's arguments restarts whatever died, keeps the rest."""
    local_cluster("up", *UP_ARGS)


def etcd(path: str, body: dict[str, Any]) -> dict[str, Any]:
    """etcd's JSON gateway (the local etcd listens on plain HTTP)."""
    request = urllib.request.Request(
        f"{ETCD_URL}{path}", data=json.dumps(body).encode(), method="POST"
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        result: dict[str, Any] = json.loads(response.read())
        return result


def compact_etcd() -> int:
    """Compact etcd at its current revision: every older resourceVersion is gone."""
    # A write first: a watcher whose resourceVersion is the newest revision
    # (bookmarks keep it there) would otherwise still be allowed to resume.
    key = base64.b64encode(b"/gang-extender-tests/compaction").decode()
    value = base64.b64encode(str(time.time()).encode()).decode()
    revision = int(etcd("/v3/kv/put", {"key": key, "value": value})["header"]["revision"])
    etcd("/v3/kv/compaction", {"revision": revision, "physical": True})
    return revision


def fresh_caches(kube: Kube) -> dict[str, Any]:
    """What /debug/caches must equal: a fresh list from the API server."""
    pods = kube.core.list_pod_for_all_namespaces().items
    groups = kube.custom.list_cluster_custom_object(
        XK8S_API.group, XK8S_API.version, XK8S_API.plural
    )
    return {
        "pods": {
            f"{p.metadata.namespace}/{p.metadata.name}": {
                "uid": p.metadata.uid,
                "resourceVersion": p.metadata.resource_version,
                "nodeName": p.spec.node_name or "",
                "phase": p.status.phase or "Pending",
            }
            for p in pods
        },
        "nodes": sorted(n.metadata.name for n in kube.core.list_node().items),
        "podgroups": {
            f"{g['metadata']['namespace']}/{g['metadata']['name']}": g["metadata"]["uid"]
            for g in groups["items"]
        },
    }


def cache_diff(extender: Extender, kube: Kube) -> str:
    """'' when the extender's caches equal a fresh list, else what differs."""
    return diff_caches(debug(extender, "caches"), fresh_caches(kube))


def diff_caches(cached: dict[str, Any], fresh: dict[str, Any]) -> str:
    """'' when /debug/caches' document equals a fresh list's, else the first differences."""
    problems = []
    for kind in ("pods", "podgroups"):
        for key in sorted(set(cached[kind]) | set(fresh[kind])):
            if cached[kind].get(key) != fresh[kind].get(key):
                problems.append(
                    f"{kind} {key}: cache {cached[kind].get(key)} api {fresh[kind].get(key)}"
                )
    if cached["nodes"] != fresh["nodes"]:
        problems.append(f"nodes: cache {cached['nodes']} api {fresh['nodes']}")
    return "; ".join(problems[:10])


# ---- 1. extender SIGKILL while members wait in the gate -------------------------------


def test_extender_killed_while_members_wait_then_the_gang_completes_whole(
    kube: Kube, namespace: str, extender: Extender
) -> None:
    gang_with_an_unfit_member(kube, namespace, timeout=40)
    key = f"{namespace}/g"
    wait_for(lambda: len(waiting_in_gate(extender, key)) == 2, 60, "g-0 and g-1 in the gate")
    with no_partial_gang(kube, namespace, 3) as partial:
        extender.kill()
        # kube-scheduler's bind calls fail (connection reset) and the pods are requeued.
        for pod in ("g-0", "g-1"):
            wait_for(
                functools.partial(kube.event_on, namespace, pod, "FailedScheduling", "bind"),
                60,
                f"a failed binding reported on {pod}",
            )
        assert kube.bound(namespace) == {}
        extender.start(*extender.extra_args)
        make_the_gang_fit(kube, namespace)
        bound = wait_for(
            lambda: len(kube.bound(namespace)) == 3 and kube.bound(namespace),
            120,
            "the whole gang bound after the extender restarted",
        )
    assert set(bound) == {"g-0", "g-1", "g-2"}
    assert partial == [], f"part of the gang was bound: {partial}"


# ---- 4. SIGTERM with members waiting ----------------------------------------------------


def test_sigterm_answers_every_waiter_and_exits_within_the_grace_period(
    kube: Kube, namespace: str, extender: Extender
) -> None:
    gang_with_an_unfit_member(kube, namespace, timeout=40)
    key = f"{namespace}/g"
    wait_for(lambda: len(waiting_in_gate(extender, key)) == 2, 60, "g-0 and g-1 in the gate")
    process = extender.process
    assert process is not None
    with no_partial_gang(kube, namespace, 3) as partial:
        started = time.monotonic()
        process.send_signal(signal.SIGTERM)
        code = process.wait(30)
        elapsed = time.monotonic() - started
        extender.process = None
        try:
            # Each waiter was answered with the shutdown error: kube-scheduler
            # reports it on the pod and requeues the pod.
            for pod in ("g-0", "g-1"):
                wait_for(
                    functools.partial(
                        kube.event_on, namespace, pod, "gang-extender is shutting down"
                    ),
                    30,
                    f"the shutdown error reported on {pod}",
                )
        finally:
            extender.start(*extender.extra_args)
    # uvicorn re-raises the SIGTERM it handled once it is done: -15 is a clean exit too.
    assert code in (0, -signal.SIGTERM), f"exit code {code}"
    # --shutdown-grace-seconds defaults to 10: waiters answered at once, then exit.
    assert elapsed < 10, f"took {elapsed:.1f}s to exit"
    assert "shutting down: verbs refused, gate waiters released" in extender.log()
    assert kube.bound(namespace) == {}
    assert partial == []


# ---- 3. a binding refused after the gate opened ----------------------------------------


def refuse_binding(kube: Kube, namespace: str, pod: str) -> str:
    """A ValidatingAdmissionPolicy that denies pods/binding of one pod; returns its name."""
    name = f"refuse-{namespace}"[:60]
    api: Any = k8s.AdmissionregistrationV1Api(kube.client)
    api.create_validating_admission_policy(
        {
            "metadata": {"name": name},
            "spec": {
                "failurePolicy": "Fail",
                "matchConstraints": {
                    "namespaceSelector": {
                        "matchLabels": {"kubernetes.io/metadata.name": namespace}
                    },
                    "resourceRules": [
                        {
                            "apiGroups": [""],
                            "apiVersions": ["v1"],
                            "operations": ["CREATE"],
                            "resources": ["pods/binding"],
                        }
                    ],
                },
                "validations": [
                    {
                        "expression": f"object.metadata.name != '{pod}'",
                        "message": f"binding of {pod} refused by the test's admission policy",
                    }
                ],
            },
        }
    )
    api.create_validating_admission_policy_binding(
        {"metadata": {"name": name}, "spec": {"policyName": name, "validationActions": ["Deny"]}}
    )
    return name


def allow_binding(kube: Kube, name: str) -> None:
    api: Any = k8s.AdmissionregistrationV1Api(kube.client)
    for delete in (
        api.delete_validating_admission_policy_binding,
        api.delete_validating_admission_policy,
    ):
        try:
            delete(name)
        except ApiException as err:
            if err.status != 404:
                raise


def create_statefulset(kube: Kube, namespace: str, name: str, replicas: int) -> None:
    template = kube.pod_body(name, group=name, labels={"app": name})
    del template["metadata"]["name"]
    kube.apps.create_namespaced_stateful_set(
        namespace,
        {
            "metadata": {"name": name},
            "spec": {
                "replicas": replicas,
                "serviceName": name,
                "podManagementPolicy": "Parallel",
                "selector": {"matchLabels": {"app": name}},
                "template": template,
            },
        },
    )


def test_a_refused_binding_deletes_what_the_admission_bound_and_the_gang_retries_whole(
    kube: Kube, namespace: str, extender: Extender
) -> None:
    policy = refuse_binding(kube, namespace, "web-2")
    try:
        _refused_binding_rolls_back(kube, namespace, extender, policy)
    finally:
        kube.apps.delete_namespaced_stateful_set("web", namespace)


def _refused_binding_rolls_back(
    kube: Kube, namespace: str, extender: Extender, policy: str
) -> None:
    try:
        time.sleep(2)  # the API server's policy cache picks the policy up
        kube.create_podgroup(namespace, "web", 3)
        create_statefulset(kube, namespace, "web", 3)

        def rolled_back() -> list[str]:
            return [e for e in kube.events(namespace, "web") if e.startswith("GangBindRolledBack")]

        events = wait_for(rolled_back, 90, "a GangBindRolledBack event on the PodGroup")
        assert "refused by the test's admission policy" in events[0]
        assert "are deleted for their controllers to recreate them" in events[0]
        # The pods this admission bound were deleted: none of them stays bound
        # with the gang short of minMember.
        bound_uids = {
            p.metadata.uid
            for p in kube.pods(namespace)
            if p.spec.node_name and p.metadata.deletion_timestamp is None
        }
        wait_for(
            lambda: (
                not (
                    bound_uids & {p.metadata.uid for p in kube.pods(namespace) if p.spec.node_name}
                )
                or len(kube.bound(namespace)) == 3
            ),
            30,
            "the partly bound members deleted",
        )
        assert any(
            "GangBindRolledBack" in e for p in ("web-0", "web-1") for e in kube.events(namespace, p)
        ), "the deleted pods carry the reason"
        assert extender.sample("gang_extender_gang_admissions_total", result="rolled-back") >= 1
    finally:
        allow_binding(kube, policy)
    # With the policy gone, the recreated gang is bound whole.
    bound = wait_for(
        lambda: len(kube.bound(namespace)) == 3 and kube.bound(namespace),
        120,
        "the StatefulSet's gang bound whole once bindings are allowed",
    )
    assert set(bound) == {"web-0", "web-1", "web-2"}


def test_with_leave_a_refused_binding_keeps_the_bound_members_and_says_so(
    kube: Kube, namespace: str, extender: Extender
) -> None:
    extender.restart("--on-partial-bind", "leave")
    policy = refuse_binding(kube, namespace, "web-2")
    try:
        time.sleep(2)  # the API server's policy cache picks the policy up
        kube.create_podgroup(namespace, "web", 3)
        create_statefulset(kube, namespace, "web", 3)
        events = wait_for(
            lambda: [e for e in kube.events(namespace, "web") if e.startswith("GangPartlyBound")],
            90,
            "a GangPartlyBound event on the PodGroup",
        )
        assert "because --on-partial-bind=leave" in events[0]
        kept = {p.metadata.name: p.metadata.uid for p in kube.pods(namespace) if p.spec.node_name}
        assert set(kept) == {"web-0", "web-1"}
        allow_binding(kube, policy)
        # The refused member joins the members that stayed, which are the same pods.
        wait_for(lambda: len(kube.bound(namespace)) == 3, 120, "web-2 bound beside them")
        now = {p.metadata.name: p.metadata.uid for p in kube.pods(namespace)}
        assert all(now[name] == uid for name, uid in kept.items()), "a kept member was replaced"
    finally:
        allow_binding(kube, policy)
        kube.apps.delete_namespaced_stateful_set("web", namespace)
        extender.restart()


# ---- 6. kube-scheduler restarted while members wait ------------------------------------


def test_scheduler_restart_while_members_wait_binds_nothing_until_the_gang_is_whole(
    kube: Kube, namespace: str, extender: Extender
) -> None:
    gang_with_an_unfit_member(kube, namespace, timeout=8)
    key = f"{namespace}/g"
    wait_for(lambda: len(waiting_in_gate(extender, key)) == 2, 60, "g-0 and g-1 in the gate")
    timeouts = extender.sample("gang_extender_gang_admissions_total", result="timeout")
    with no_partial_gang(kube, namespace, 3) as partial:
        os.kill(pid_of("kube-scheduler"), signal.SIGKILL)
        restart_cluster()
        # The new scheduler places the pods again; each pod is held once (the
        # forgotten waiter is superseded or released at its timeout).
        deadline = time.monotonic() + 8 + 5
        while time.monotonic() < deadline:
            held = [w["pod"] for w in waiting_in_gate(extender, key)]
            assert len(held) == len(set(held)), f"a pod held twice: {held}"
            time.sleep(0.3)
        wait_for(
            lambda: (
                extender.sample("gang_extender_gang_admissions_total", result="timeout") > timeouts
            ),
            30,
            "the waiters released at their timeout",
        )
        assert kube.bound(namespace) == {}
        make_the_gang_fit(kube, namespace)
        wait_for(lambda: len(kube.bound(namespace)) == 3, 90, "the whole gang bound")
    assert partial == []


# ---- 2. kube-apiserver killed and restarted; every watch answered 410 ------------------


def test_apiserver_restart_and_compaction_leave_caches_equal_to_a_fresh_list(
    kube: Kube, namespace: str, extender: Extender
) -> None:
    for i in range(3):
        kube.create_pod(namespace, f"before-{i}")
    wait_for(lambda: len(kube.bound(namespace)) == 3, 60, "the plain pods bound")
    wait_for(lambda: cache_diff(extender, kube) == "", 30, "caches in sync before the fault")
    restarts = {
        kind: extender.sample("gang_extender_watch_restarts_total", kind=kind)
        for kind in ("pods", "nodes", "podgroups")
    }
    apiserver = pid_of("kube-apiserver")
    argv = Path(f"/proc/{apiserver}/cmdline").read_bytes().split(b"\0")[:-1]
    try:
        os.kill(apiserver, signal.SIGKILL)
        wait_for(lambda: not Path(f"/proc/{apiserver}").exists(), 30, "kube-apiserver gone")
        # While it is down, etcd forgets every revision the extender's watches hold.
        compact_etcd()
        with (CLUSTER_DIR / "logs" / "kube-apiserver.log").open("ab") as log:
            process = subprocess.Popen(
                [a.decode() for a in argv],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        (CLUSTER_DIR / "pids" / "kube-apiserver.pid").write_text(f"{process.pid}\n")
        wait_for(lambda: _api_ready(kube), 90, "kube-apiserver ready again")
    finally:
        restart_cluster()  # a no-op when the restart above worked
    # Changes after the restart reach the caches through the new watches.
    kube.core.delete_namespaced_pod("before-0", namespace, grace_period_seconds=0)
    kube.create_pod(namespace, "after-0")
    kube.create_podgroup(namespace, "late", 2)
    for i in range(2):
        kube.create_pod(namespace, f"late-{i}", group="late")
    wait_for(lambda: len(kube.bound(namespace)) == 5, 120, "the new gang and pod bound")
    diff = wait_for(
        lambda: cache_diff(extender, kube) == "" or None, 60, "caches equal to a fresh list"
    )
    assert diff
    for kind, before in restarts.items():
        assert extender.sample("gang_extender_watch_restarts_total", kind=kind) > before, kind
    for kind in ("pods", "nodes", "podgroups"):
        assert f"{kind} watch expired (410 Gone); listing again" in extender.log(), kind


def _api_ready(kube: Kube) -> bool:
    try:
        kube.core.list_namespace(limit=1)
        return True
    except Exception:
        return False


# ---- bad input against the live extender ----------------------------------------------


def test_live_extender_survives_thousands_of_malformed_requests(
    kube: Kube, extender: Extender
) -> None:
    errors_before = sum(
        value
        for (name, labels), value in extender.metrics().items()
        if name == "gang_extender_requests_total" and dict(labels)["code"].startswith("5")
    )
    connection = http.client.HTTPConnection("127.0.0.1", EXTENDER_PORT, timeout=10)
    statuses: dict[int, int] = {}
    nodes = kube.node_names()
    started = time.monotonic()
    for seed in range(3000):
        request = fuzz_request(random.Random(seed), nodes)
        try:
            connection.request(request.method, request.path, body=request.body)
            response = connection.getresponse()
            body = response.read()
        except (http.client.HTTPException, OSError) as err:
            raise AssertionError(f"seed {seed} ({request.what}): no answer: {err}") from None
        statuses[response.status] = statuses.get(response.status, 0) + 1
        assert response.status < 500, (
            f"seed {seed} ({request.what}): {response.status} {body[:300]!r}"
        )
        if response.getheader("connection") == "close":
            connection.close()
            connection = http.client.HTTPConnection("127.0.0.1", EXTENDER_PORT, timeout=10)
    connection.close()
    elapsed = time.monotonic() - started
    # A body declared larger than --max-request-bytes is refused before it is read.
    huge = http.client.HTTPConnection("127.0.0.1", EXTENDER_PORT, timeout=10)
    huge.putrequest("POST", "/scheduler/filter")
    huge.putheader("Content-Length", str(200 * 1024 * 1024))
    huge.endheaders()
    huge.send(b"{" * 1024)
    response = huge.getresponse()
    assert response.status == 413, response.status
    assert "--max-request-bytes" in json.loads(response.read())["Error"]
    huge.close()
    assert extender.process is not None and extender.process.poll() is None, "extender died"
    with urllib.request.urlopen(f"{extender.url}/healthz", timeout=5) as alive:
        assert alive.status == 200
    errors_after = sum(
        value
        for (name, labels), value in extender.metrics().items()
        if name == "gang_extender_requests_total" and dict(labels)["code"].startswith("5")
    )
    assert errors_after == errors_before, "the extender answered 5xx"
    assert statuses.get(400, 0) > 1000 and statuses.get(200, 0) > 100, statuses
    assert elapsed < 120, f"3000 requests took {elapsed:.0f}s"


def test_a_podgroup_with_absurd_values_gets_an_event_and_its_pods_the_reason(
    kube: Kube, namespace: str
) -> None:
    # The CRD's quantity pattern accepts this; the extender must not (a
    # billion-digit integer), and must say so.
    kube.create_podgroup(namespace, "absurd", 2, min_resources={"cpu": "1e999999999"})
    for i in range(2):
        kube.create_pod(namespace, f"absurd-{i}", group="absurd")
    wrong = "spec.minResources: invalid quantity '1e999999999': larger than 1e30"
    events = wait_for(
        lambda: [e for e in kube.events(namespace, "absurd") if e.startswith("InvalidPodGroup")],
        60,
        "an InvalidPodGroup event on the PodGroup",
    )
    assert wrong in events[0] and "its pods are turned away" in events[0]
    wait_for(
        functools.partial(kube.event_on, namespace, "absurd-0", "FailedScheduling", wrong),
        60,
        "the reason on the pod",
    )
    assert kube.bound(namespace) == {}


# ---- secrets never logged ------------------------------------------------------------


def test_no_token_key_or_authorization_header_in_the_logs(
    kube: Kube, kubeconfig: str, extender: Extender, tmp_path: Path
) -> None:
    """The session extender runs at --log-level debug and has been through every fault above."""
    config = yaml.safe_load(Path(kubeconfig).read_text())
    secrets: list[str] = []
    for user in config["users"]:
        fields = user["user"]
        if fields.get("token"):
            secrets.append(fields["token"])
        for name in ("client-key-data", "client-certificate-data"):
            if fields.get(name):
                pem = base64.b64decode(fields[name]).decode()
                # Any line of the key body, not only the whole PEM.
                secrets.extend(line for line in pem.splitlines() if len(line) > 40)
        for name in ("client-key", "client-certificate"):
            if fields.get(name):
                pem = Path(fields[name]).read_text()
                secrets.extend(line for line in pem.splitlines() if len(line) > 40)
    # A run with a bearer token: the chart's ServiceAccount token flow, at debug level.
    token = _service_account_token(kube)
    secrets.append(token)
    token_config = _token_kubeconfig(config, token, tmp_path)
    token_log = tmp_path / "token-run.log"
    token_run = Extender(str(token_config), token_log)
    port = free_port()
    token_run.url = f"http://127.0.0.1:{port}"
    try:
        _run_briefly(token_run, port)
    finally:
        k8s.RbacAuthorizationV1Api(kube.client).delete_cluster_role_binding(LOG_TEST_BINDING)
    assert secrets
    for log in (extender.log_path, token_log):
        text = log.read_text(errors="replace")
        assert text, f"{log} is empty"
        for secret in secrets:
            assert secret not in text, f"{log} contains a credential"
        assert "PRIVATE KEY" not in text
        assert not re.search(r"authorization['\"]?\s*[:=]", text, re.IGNORECASE), log
        assert "Bearer " not in text


LOG_TEST_BINDING = "gang-extender-log-test"


def _service_account_token(kube: Kube) -> str:
    """A token of kube-system's `default` ServiceAccount, bound to cluster-admin."""
    try:
        rbac: Any = k8s.RbacAuthorizationV1Api(kube.client)
        rbac.create_cluster_role_binding(
            {
                "metadata": {"name": LOG_TEST_BINDING},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "ClusterRole",
                    "name": "cluster-admin",
                },
                "subjects": [
                    {"kind": "ServiceAccount", "name": "default", "namespace": "kube-system"}
                ],
            }
        )
    except ApiException as err:
        if err.status != 409:
            raise
    wait_for_default_service_account(kube.core, "kube-system", 30)
    request = kube.core.create_namespaced_service_account_token(
        "default", "kube-system", {"spec": {"expirationSeconds": 600}}
    )
    return str(request.status.token)


def _token_kubeconfig(config: dict[str, Any], token: str, into: Path) -> Path:
    cluster = config["clusters"][0]
    path = into / "token.kubeconfig"
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [cluster],
                "users": [{"name": "sa", "user": {"token": token}}],
                "contexts": [{"name": "sa", "context": {"cluster": cluster["name"], "user": "sa"}}],
                "current-context": "sa",
            }
        )
    )
    return path


def _run_briefly(handle: Extender, port: int) -> None:
    """Start an extender on `port`, let it list and watch, and stop it."""
    handle.process = start_extender(
        handle.kubeconfig, port, handle.log_path, ("--log-level", "debug"), timeout=60
    )
    try:
        # A binding for a pod that does not exist: one more authenticated API call.
        request = urllib.request.Request(
            f"{handle.url}/scheduler/bind",
            data=json.dumps(
                {"PodName": "absent", "PodNamespace": "default", "PodUID": "", "Node": "node-1"}
            ).encode(),
            method="POST",
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            assert "not found" in json.loads(response.read())["Error"]
    finally:
        handle.stop()
