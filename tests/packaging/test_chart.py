"""The Helm chart as rendered by the pinned helm, without a cluster.

What these tests cannot show (the API server accepts the objects, the RBAC
is enough, kube-scheduler loads the configuration) is shown by
tests/cluster/test_chart.py with the real components.
"""

from __future__ import annotations

import re
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

import app
from tests.packaging.helm import (
    CHART,
    FULL_SET,
    PROMETHEUS_API,
    REPO,
    container,
    find,
    render,
    run_helm,
    scheduler_config,
)

MANIFESTS = REPO / "deploy" / "manifests" / "gang-extender.yaml"


def versions_env() -> dict[str, str]:
    text = (REPO / "hack" / "kube" / "versions.env").read_text()
    return dict(re.findall(r"^([A-Z_]+)=(\S+)$", text, re.MULTILINE))


def flags(args: list[str]) -> dict[str, str]:
    """--name=value arguments as a mapping (the chart always uses the = form)."""
    return dict(a[2:].split("=", 1) for a in args if a.startswith("--") and "=" in a)


def test_lint_is_clean_for_default_and_full_values() -> None:
    for extra in ((), FULL_SET):
        result = run_helm("lint", "--strict", str(CHART), *extra)
        assert "0 chart(s) failed" in result.stdout, result.stdout


def test_schema_rejects_a_misspelt_key() -> None:
    result = run_helm("lint", str(CHART), "--set", "extender.opsPrt=9091", check=False)
    assert result.returncode != 0
    assert "additional properties 'opsPrt' not allowed" in result.stdout + result.stderr


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (
            "scheduler.extender.httpTimeoutSeconds=80",
            "httpTimeoutSeconds (80) must be longer than extender.maxPermitWaitingTimeSeconds (80)",
        ),
        ("extender.permitWaitingTimeSeconds=100", "exceeds extender.maxPermitWaitingTimeSeconds"),
        ("tls.certManager.enabled=true", "tls.certManager.enabled needs tls.enabled"),
        (
            "tls.enabled=true,tls.certManager.enabled=true",
            "needs tls.certManager.issuerRef.name",
        ),
    ],
)
def test_inconsistent_values_fail_with_the_reason(values: str, message: str) -> None:
    result = run_helm("template", "x", str(CHART), "--set", values, check=False)
    assert result.returncode != 0
    assert message in result.stderr


def test_every_verb_render_is_one_pod_with_scheduler_and_extender() -> None:
    """mode=every-verb: the chart without the webhook (the default is in test_chart_gang_only)."""
    docs = render("--set", "mode=every-verb", namespace="gang-system")
    kinds = sorted(d["kind"] for d in docs)
    assert kinds == sorted(
        ["ServiceAccount", "ConfigMap", "Deployment", "Service", "Role"]
        + ["ClusterRole"] * 2  # the extender's, kubectl gang's
        + ["ClusterRoleBinding"] * 3
        + ["RoleBinding"] * 2
    )
    deployment = find(docs, "Deployment")
    assert deployment["spec"]["replicas"] == 1
    pod = deployment["spec"]["template"]["spec"]
    assert [c["name"] for c in pod["containers"]] == ["kube-scheduler", "gang-extender"]
    assert pod["serviceAccountName"] == find(docs, "ServiceAccount")["metadata"]["name"]

    scheduler = container(docs, "kube-scheduler")
    assert scheduler["image"] == f"registry.k8s.io/kube-scheduler:{versions_env()['KUBE_VERSION']}"
    extender = container(docs, "gang-extender")
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert extender["image"] == f"gang-extender:{chart['appVersion']}"
    ext_flags = flags(extender["args"])
    assert extender["args"][0] == "serve"
    assert ext_flags["host"] == "127.0.0.1", "the verbs must not be reachable from outside the pod"

    config = scheduler_config(docs)
    assert [p["schedulerName"] for p in config["profiles"]] == ["gang-scheduler"]
    assert config["leaderElection"] == {
        "leaderElect": True,
        "resourceLock": "leases",
        "resourceNamespace": "gang-system",
        "resourceName": "gang-extender",
    }
    (ext,) = config["extenders"]
    assert ext["urlPrefix"] == f"http://127.0.0.1:{ext_flags['port']}{ext_flags['url-prefix']}"
    assert ext["bindVerb"] == "bind" and ext["ignorable"] is False
    assert "enableHTTPS" not in ext
    timeout = float(ext["httpTimeout"].removesuffix("s"))
    assert timeout > float(ext_flags["max-permit-waiting-time-seconds"])
    assert "clientConnection" not in config, "in the cluster kube-scheduler uses its ServiceAccount"

    service = find(docs, "Service")
    ops = next(p for p in extender["ports"] if p["name"] == "ops")
    assert ops["containerPort"] == int(ext_flags["ops-port"])
    assert service["spec"]["ports"][0]["targetPort"] == "ops"


def test_every_container_is_locked_down_and_probed() -> None:
    for extra in ((), FULL_SET):
        docs = render(*extra)
        pod = find(docs, "Deployment")["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["runAsUser"] != 0
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        for c in pod["containers"]:
            sc = c["securityContext"]
            assert sc["allowPrivilegeEscalation"] is False
            assert sc["readOnlyRootFilesystem"] is True
            assert sc["capabilities"] == {"drop": ["ALL"]}
            assert c["resources"]["requests"] and c["resources"]["limits"]
        extender = container(docs, "gang-extender")
        # Probes use the plain-HTTP operations port, so they work when the verbs use mTLS.
        assert extender["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "ops"}
        assert extender["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "ops"}


def test_full_values_wire_mutual_tls_through_one_secret() -> None:
    docs = render(*FULL_SET, *PROMETHEUS_API)
    deployment = find(docs, "Deployment")
    assert deployment["spec"]["replicas"] == 2
    config = scheduler_config(docs)
    assert [p["schedulerName"] for p in config["profiles"]] == [
        "gang-scheduler",
        "default-scheduler",
    ]
    # The default gang-only mode: both entries (members' verbs, everyone's preempt) over mTLS.
    ext, preempt = config["extenders"]
    for entry in (ext, preempt):
        assert entry["urlPrefix"].startswith("https://127.0.0.1:")
        assert entry["enableHTTPS"] is True
        assert entry["tlsConfig"] == ext["tlsConfig"]

    pod = deployment["spec"]["template"]["spec"]
    (volume,) = [v for v in pod["volumes"] if "secret" in v]
    secret = volume["secret"]["secretName"]
    certificate = find(docs, "Certificate")
    assert certificate["spec"]["secretName"] == secret
    assert {"server auth", "client auth"} <= set(certificate["spec"]["usages"])
    assert "127.0.0.1" in certificate["spec"]["ipAddresses"]
    assert certificate["spec"]["issuerRef"]["kind"] == "ClusterIssuer"

    def mounted(container_name: str) -> Path:
        (mount,) = [
            m
            for m in container(docs, container_name)["volumeMounts"]
            if m["name"] == volume["name"]
        ]
        return Path(mount["mountPath"])

    tls = ext["tlsConfig"]
    assert {Path(tls[k]).name for k in ("caFile", "certFile", "keyFile")} == {
        "ca.crt",
        "tls.crt",
        "tls.key",
    }
    assert all(Path(tls[k]).parent == mounted("kube-scheduler") for k in tls)
    ext_flags = flags(container(docs, "gang-extender")["args"])
    for flag in ("tls-cert-file", "tls-key-file", "tls-client-ca-file"):
        assert Path(ext_flags[flag]).parent == mounted("gang-extender")
    assert find(docs, "PodDisruptionBudget")["spec"]["minAvailable"] == 1
    monitor = find(docs, "ServiceMonitor")
    assert (
        monitor["spec"]["endpoints"][0]["port"]
        == find(docs, "Service", "-metrics")["spec"]["ports"][0]["name"]
    )


def test_service_monitor_only_where_the_prometheus_operator_is() -> None:
    docs = render("--set", "metrics.serviceMonitor.enabled=true")
    assert "ServiceMonitor" not in {d["kind"] for d in docs}


def test_two_releases_share_no_cluster_object_or_lease() -> None:
    def names(release: str) -> tuple[set[str], str]:
        docs = render(release=release, namespace="shared")
        objects = {
            f"{d['kind']}/{d['metadata'].get('namespace', '')}/{d['metadata']['name']}"
            for d in docs
        }
        return objects, scheduler_config(docs)["leaderElection"]["resourceName"]

    a, lease_a = names("team-a")
    b, lease_b = names("team-b")
    assert not a & b
    assert lease_a != lease_b


def test_extender_role_is_narrow() -> None:
    docs = render()
    rules: list[dict[str, Any]] = find(docs, "ClusterRole", "-extender")["rules"]
    for rule in rules:
        assert "*" not in rule["verbs"] and "*" not in rule["resources"]
        assert "secrets" not in rule["resources"]
        assert not {"delete", "deletecollection", "escalate", "bind"} & set(rule["verbs"])


def test_kubectl_gang_role_reads_and_proxies_to_the_ops_service_only() -> None:
    docs = render(release="team-a", namespace="gang-system")
    role = find(docs, "ClusterRole", "-kubectl-gang")
    assert role["metadata"]["name"] == "team-a-gang-extender-kubectl-gang"
    assert "rbac.authorization.k8s.io/aggregate-to-view" not in role["metadata"]["labels"]
    rules: list[dict[str, Any]] = role["rules"]
    for rule in rules:
        assert set(rule["verbs"]) <= {"get", "list", "watch"}, rule
        assert "secrets" not in rule["resources"] and "*" not in rule["resources"]
    (proxy,) = [r for r in rules if "services/proxy" in r["resources"]]
    service = find(docs, "Service", "-metrics")
    name = service["metadata"]["name"]
    assert proxy["verbs"] == ["get"]
    assert proxy["resourceNames"] == [name, f"{name}:metrics", f"http:{name}:metrics"]
    assert [p["name"] for p in service["spec"]["ports"]] == ["metrics"]
    # app/kubectl/live.py finds the Service by this label.
    assert service["metadata"]["labels"]["app.kubernetes.io/component"] == "gang-extender-ops"
    read = {(g, r) for rule in rules for g in rule["apiGroups"] for r in rule["resources"]}
    assert {
        ("scheduling.x-k8s.io", "podgroups"),
        ("scheduling.volcano.sh", "podgroups"),
        ("scheduling.k8s.io", "podgroups"),
        ("scheduling.volcano.sh", "queues"),
        ("", "pods"),
        ("", "events"),
        ("", "nodes"),
    } <= read

    aggregated = render("--set", "kubectlGang.aggregateToView=true")
    labels = find(aggregated, "ClusterRole", "-kubectl-gang")["metadata"]["labels"]
    assert labels["rbac.authorization.k8s.io/aggregate-to-view"] == "true"
    assert not [
        d
        for d in render("--set", "kubectlGang.createRole=false")
        if "kubectl" in d["metadata"]["name"]
    ]


def test_chart_crd_is_the_one_in_deploy() -> None:
    crds = sorted(p.name for p in (CHART / "crds").iterdir())
    assert crds == sorted(p.name for p in (REPO / "deploy" / "crds").iterdir())
    for name in crds:
        assert (CHART / "crds" / name).read_bytes() == (
            REPO / "deploy" / "crds" / name
        ).read_bytes(), (
            f"charts/gang-extender/crds/{name} differs from deploy/crds/{name}: copy it over"
        )


def test_versions_agree() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert chart["appVersion"] == project["version"] == app.__version__
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert values["scheduler"]["image"]["tag"] == versions_env()["KUBE_VERSION"], (
        "charts/gang-extender/values.yaml scheduler.image.tag must follow KUBE_VERSION in "
        "hack/kube/versions.env (the version the tests run)"
    )


def test_plain_manifests_are_the_rendered_chart(tmp_path: Path) -> None:
    fresh = tmp_path / "gang-extender.yaml"
    subprocess.run(
        ["make", "-s", "--no-print-directory", "manifests", f"MANIFESTS={fresh}"],
        cwd=REPO,
        check=True,
        capture_output=True,
    )
    assert MANIFESTS.read_text() == fresh.read_text(), (
        "deploy/manifests/gang-extender.yaml is stale: run `make manifests`"
    )
    docs = [d for d in yaml.safe_load_all(fresh.read_text()) if d]
    assert docs[0] == {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": "gang-extender"},
    }
    assert {d["kind"] for d in docs} >= {"CustomResourceDefinition", "Deployment", "ClusterRole"}
    elsewhere = {
        f"{d['kind']}/{d['metadata']['name']}"
        for d in docs[1:]
        if d["metadata"].get("namespace", "gang-extender") != "gang-extender"
    }
    # Only the binding that lets kube-scheduler read the authentication ConfigMap.
    assert elsewhere == {"RoleBinding/gang-extender-authentication-reader"}
