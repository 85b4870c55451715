"""The chart's gang-only mode (mode=gang-only), rendered by the pinned helm.

tests/cluster/test_chart_gang_only.py shows the API server accepts it and the
real kube-scheduler loads its configuration.
"""

from __future__ import annotations

from typing import Any

import pytest

from app.core.lws import LWS_NAME_LABEL
from app.core.marking import (
    SYSTEM_NAMESPACES,
    member_expression,
    preemptor_expression,
    preemptor_mutation,
    refusal_message,
)
from app.core.resources import MEMBER_RESOURCE, PREEMPTOR_RESOURCE
from tests.packaging.helm import CHART, container, find, render, run_helm, scheduler_config
from tests.packaging.test_chart import flags

GANG_ONLY = ("--set", "mode=gang-only")
CERT_MANAGER = (
    "--set",
    "mode=gang-only,webhook.certManager.enabled=true,webhook.certManager.issuerRef.name=ca",
)


def test_two_extender_entries_one_binder_members_and_marked_preemptors_only() -> None:
    docs = render(*GANG_ONLY, namespace="gang-system")
    config = scheduler_config(docs)
    members, preemptors = config["extenders"]
    assert members["managedResources"] == [{"name": MEMBER_RESOURCE, "ignoredByScheduler": True}]
    # Gang members have their own preempt verb: they carry no preemptor mark.
    assert {k for k in members if k.endswith("Verb")} == {
        "filterVerb",
        "prioritizeVerb",
        "preemptVerb",
        "bindVerb",
    }
    assert {k for k in preemptors if k.endswith("Verb")} == {"preemptVerb"}
    assert preemptors["managedResources"] == [
        {"name": PREEMPTOR_RESOURCE, "ignoredByScheduler": True}
    ]
    assert members["urlPrefix"] == preemptors["urlPrefix"]
    (profile,) = config["profiles"]
    (fit,) = profile["pluginConfig"]
    assert fit["args"]["scoringStrategy"]["type"] == "MostAllocated"
    assert flags(container(docs, "gang-extender")["args"])["expect-marked-preemptors"] == "true"


def test_the_api_server_marks_preemptors_with_a_policy_not_the_webhook() -> None:
    docs = render(*GANG_ONLY, release="r", namespace="gang-system")
    (member_hook,) = find(docs, "MutatingWebhookConfiguration")["webhooks"]
    policy = find(docs, "MutatingAdmissionPolicy")
    assert policy["metadata"]["name"] == "r-gang-extender-preemptor-mark"
    spec = policy["spec"]
    assert spec["failurePolicy"] == "Ignore"
    assert spec["matchConstraints"]["resourceRules"][0]["operations"] == ["CREATE"]
    # Every namespace: nothing is sent anywhere, and a system pod's preemption counts too.
    assert "namespaceSelector" not in spec["matchConstraints"]
    assert spec["matchConditions"] == [
        {"name": "may-preempt", "expression": preemptor_expression()},
        {"name": "not-a-gang-member", "expression": f"!({member_expression()['isMember']})"},
        {
            "name": "unscheduled",
            "expression": "!has(object.spec.nodeName) || object.spec.nodeName == ''",
        },
        member_hook["matchConditions"][1],
    ]
    assert spec["mutations"] == [
        {
            "patchType": "ApplyConfiguration",
            "applyConfiguration": {"expression": preemptor_mutation()},
        }
    ]
    binding = find(docs, "MutatingAdmissionPolicyBinding")
    assert binding["spec"] == {"policyName": "r-gang-extender-preemptor-mark"}


def test_without_marked_preemptors_the_preempt_entry_serves_every_pod() -> None:
    docs = render("--set", "mode=gang-only,markPreemptors=false", namespace="gang-system")
    members, everyone = scheduler_config(docs)["extenders"]
    assert {k for k in members if k.endswith("Verb")} == {
        "filterVerb",
        "prioritizeVerb",
        "bindVerb",
    }
    assert {k for k in everyone if k.endswith("Verb")} == {"preemptVerb"}
    assert "managedResources" not in everyone
    assert not [d for d in docs if d["kind"].startswith("MutatingAdmissionPolicy")]
    assert "expect-marked-preemptors" not in flags(container(docs, "gang-extender")["args"])


def test_holding_waiting_gangs_is_auto_by_default_and_a_gang_only_flag() -> None:
    default = flags(container(render(*GANG_ONLY), "gang-extender")["args"])
    assert default["hold-waiting-gangs"] == "auto"
    for value in ("true", "false"):
        held = render("--set", f"mode=gang-only,holdWaitingGangs={value}", namespace="gang-system")
        assert flags(container(held, "gang-extender")["args"])["hold-waiting-gangs"] == value
    refused = run_helm(
        "template", "x", str(CHART), "--set", "holdWaitingGangs=sometimes", check=False
    )
    assert refused.returncode != 0 and "holdWaitingGangs" in refused.stderr
    # Every verb serves no webhook: nothing would give members the gate.
    every = render("--set", "mode=every-verb,holdWaitingGangs=true", namespace="gang-system")
    assert "hold-waiting-gangs" not in flags(container(every, "gang-extender")["args"])


def test_the_old_webhook_mark_preemptors_value_is_refused_by_the_schema() -> None:
    result = run_helm(
        "template", "x", str(CHART), "--set", "webhook.markPreemptors=true", check=False
    )
    assert result.returncode != 0
    assert "markPreemptors" in result.stderr


def test_the_webhook_reaches_the_extender_through_its_service_and_makes_its_own_certs() -> None:
    docs = render(*GANG_ONLY, release="r", namespace="gang-system")
    extender = container(docs, "gang-extender")
    ext_flags = flags(extender["args"])
    assert ext_flags["webhook-port"] == "9443" and ext_flags["webhook-host"] == "0.0.0.0"
    assert ext_flags["webhook-configuration"] == "r-gang-extender"
    assert ext_flags["webhook-cert-secret"] == "gang-system/r-gang-extender-webhook-cert"
    assert ext_flags["webhook-scheduler-names"] == "gang-scheduler"
    assert "r-gang-extender-webhook.gang-system.svc" in ext_flags["webhook-hosts"].split(",")
    service = find(docs, "Service", "-webhook")
    assert service["spec"]["ports"] == [
        {"name": "webhook", "port": 443, "targetPort": "webhook", "protocol": "TCP"}
    ]
    assert {"name": "webhook", "containerPort": 9443} in extender["ports"]
    # The root filesystem is read-only: the self-made certificate's files go to /tmp.
    assert {"name": "tmp", "mountPath": "/tmp"} in extender["volumeMounts"]

    configuration = find(docs, "MutatingWebhookConfiguration")
    (webhook,) = configuration["webhooks"]
    assert webhook["clientConfig"]["service"] == {
        "name": "r-gang-extender-webhook",
        "namespace": "gang-system",
        "path": "/mutate-pods",
        "port": 443,
    }
    assert webhook["failurePolicy"] == "Ignore"
    assert webhook["sideEffects"] == "None"
    excluded = webhook["namespaceSelector"]["matchExpressions"][0]
    assert excluded["operator"] == "NotIn"
    assert set(excluded["values"]) == SYSTEM_NAMESPACES
    expressions = member_expression()
    assert webhook["matchConditions"] == [
        {"name": "gang-member", "expression": expressions["isMember"]},
        {"name": "our-schedulers", "expression": "object.spec.schedulerName in ['gang-scheduler']"},
    ]
    policy = find(docs, "ValidatingAdmissionPolicy")["spec"]
    assert policy["matchConditions"] == webhook["matchConditions"]
    assert policy["validations"] == [
        {"expression": expressions["valid"], "message": refusal_message(), "reason": "Forbidden"}
    ]
    binding = find(docs, "ValidatingAdmissionPolicyBinding")["spec"]
    assert binding == {"policyName": "r-gang-extender-member-mark", "validationActions": ["Deny"]}


def test_self_made_certs_need_only_their_own_secret_and_configuration() -> None:
    docs = render(*GANG_ONLY, release="r", namespace="ns")
    rules: list[dict[str, Any]] = find(docs, "ClusterRole", "-extender")["rules"]
    webhook_rules = [r for r in rules if "mutatingwebhookconfigurations" in r["resources"]]
    assert webhook_rules == [
        {
            "apiGroups": ["admissionregistration.k8s.io"],
            "resources": ["mutatingwebhookconfigurations"],
            "resourceNames": ["r-gang-extender"],
            "verbs": ["get", "update"],
        }
    ]
    role = find(docs, "Role", "-webhook-cert")
    assert role["rules"][1]["resourceNames"] == ["r-gang-extender-webhook-cert"]
    assert "list" not in role["rules"][0]["verbs"] + role["rules"][1]["verbs"]


def test_cert_manager_issues_the_webhook_certificate_and_injects_the_ca() -> None:
    docs = render(*CERT_MANAGER, release="r", namespace="ns")
    certificate = find(docs, "Certificate", "-webhook")
    assert certificate["spec"]["secretName"] == "r-gang-extender-webhook-cert"
    assert "r-gang-extender-webhook.ns.svc" in certificate["spec"]["dnsNames"]
    configuration = find(docs, "MutatingWebhookConfiguration")
    assert configuration["metadata"]["annotations"] == {
        "cert-manager.io/inject-ca-from": "ns/r-gang-extender-webhook"
    }
    ext_flags = flags(container(docs, "gang-extender")["args"])
    assert ext_flags["webhook-cert-file"].endswith("/tls.crt")
    assert "webhook-configuration" not in ext_flags
    rules = find(docs, "ClusterRole", "-extender")["rules"]
    assert not any("mutatingwebhookconfigurations" in r["resources"] for r in rules)


def test_serving_the_default_scheduler_marks_its_pods_too() -> None:
    docs = render("--set", "mode=gang-only,serveDefaultScheduler=true")
    (webhook,) = find(docs, "MutatingWebhookConfiguration")["webhooks"]
    assert webhook["matchConditions"][1]["expression"] == (
        "object.spec.schedulerName in ['gang-scheduler', 'default-scheduler']"
    )
    assert flags(container(docs, "gang-extender")["args"])["webhook-scheduler-names"] == (
        "gang-scheduler,default-scheduler"
    )


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ("mode=gang-only,webhook.certManager.enabled=true", "needs webhook.certManager.issuerRef"),
        ("mode=gang-only,webhook.existingSecret=mine", "needs webhook.caBundle"),
        ("mode=gang-only,webhook.port=9090", "webhook.port must differ"),
        ("mode=some-verbs", "mode"),
    ],
)
def test_inconsistent_gang_only_values_fail_with_the_reason(values: str, message: str) -> None:
    result = run_helm("template", "x", str(CHART), "--set", values, check=False)
    assert result.returncode != 0
    assert message in result.stderr


def test_gang_only_is_the_default() -> None:
    docs = render()
    assert sorted(d["kind"] for d in docs) == sorted(
        ["ServiceAccount", "ConfigMap", "Deployment", "MutatingWebhookConfiguration"]
        + ["ClusterRole"] * 2  # the extender's, kubectl gang's
        + ["ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"]
        + ["MutatingAdmissionPolicy", "MutatingAdmissionPolicyBinding"]
        + ["Service"] * 2  # operations, webhook
        + ["Role"] * 2  # leader election, the webhook's certificate Secret
        + ["RoleBinding"] * 3
        + ["ClusterRoleBinding"] * 3
    )
    members, preemptors = scheduler_config(docs)["extenders"]
    assert "managedResources" in members and "managedResources" in preemptors


def test_every_verb_has_no_webhook() -> None:
    docs = render("--set", "mode=every-verb")
    assert not {
        "MutatingWebhookConfiguration",
        "ValidatingAdmissionPolicy",
        "MutatingAdmissionPolicy",
    } & {d["kind"] for d in docs}
    (extender,) = scheduler_config(docs)["extenders"]
    assert "managedResources" not in extender


def test_lws_gangs_on_makes_lws_pods_members_in_the_webhook_and_its_policies() -> None:
    """groupSources.lws on: the flag, and LWS's name label in every isMember expression."""
    docs = render("--set", "mode=gang-only,extender.groupSources.lws=on")
    assert "--lws-gangs=on" in container(docs, "gang-extender")["args"]
    is_member = member_expression(member_labels=(LWS_NAME_LABEL,))["isMember"]
    webhook = find(docs, "MutatingWebhookConfiguration")["webhooks"][0]
    assert webhook["matchConditions"][0] == {"name": "gang-member", "expression": is_member}
    policy = find(docs, "ValidatingAdmissionPolicy")["spec"]
    assert policy["matchConditions"][0] == webhook["matchConditions"][0]
    off = render(*GANG_ONLY)
    assert "--lws-gangs=off" in container(off, "gang-extender")["args"]
    assert LWS_NAME_LABEL not in str(find(off, "MutatingWebhookConfiguration"))
