"""hack/local_cluster's pure parts: config, component flags, scheduler config, CLI.

No cluster: these check what `up` would run and write, as data.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from local_cluster.cli import build_parser, main
from local_cluster.components import (
    ALL_COMPONENTS,
    COMPONENT_BINARY,
    POD_SIMULATOR,
    SIMULATE_COMMAND,
    component_args,
    component_argv,
    component_ports,
    feature_gate_flags,
    parse_feature_gates,
)
from local_cluster.layout import (
    MODE_EVERY_VERB,
    REPO_ROOT,
    SCHEDULER_CONFIG_TEMPLATE,
    SCHEDULER_CONFIG_TEMPLATES,
    WEBHOOK_TEMPLATE,
    WRAPPER,
    Config,
    Layout,
    Ports,
)
from local_cluster.report import ClusterError
from local_cluster.scheduler_config import (
    DEFAULT_SCHEDULER_NAME,
    NODELIST_SCHEDULER_NAME,
    SchedulerSpec,
    default_webhook_url,
    desired_schedulers,
    render_scheduler_config,
    render_webhook,
)

ROOT = Path("/state")
CONFIG = Config(Layout(ROOT), Ports(1000), scheduler_verbosity="4")
GATES = {"GenericWorkload": True, "AnotherGate": False}


def flags(argv: list[str]) -> dict[str, str]:
    """--name=value flags as a dict (every component flag has that form)."""
    parsed = dict(arg.removeprefix("--").split("=", 1) for arg in argv)
    assert len(parsed) == len(argv), f"a flag is repeated: {argv}"
    return parsed


# ---- Config -------------------------------------------------------------------------


def test_config_from_an_empty_environment_is_the_repo_state_dir_on_the_base_ports() -> None:
    config = Config.from_env({})
    assert config.layout.root == (REPO_ROOT / ".local-cluster").resolve()
    assert config.ports == Ports(0)
    assert (config.ports.apiserver, config.ports.etcd_client) == (16443, 22379)
    assert config.scheduler_verbosity == "2"


def test_config_from_the_environment_moves_dir_ports_and_verbosity(tmp_path: Path) -> None:
    config = Config.from_env(
        {
            "LOCAL_CLUSTER_DIR": str(tmp_path / "slot-1" / ".." / "slot-2"),
            "LOCAL_CLUSTER_PORT_OFFSET": "2000",
            "LOCAL_CLUSTER_SCHEDULER_VERBOSITY": "5",
        }
    )
    assert config.layout.root == tmp_path / "slot-2"
    assert config.layout.admin_kubeconfig == tmp_path / "slot-2" / "kubeconfig"
    ports = config.ports
    assert (ports.etcd_client, ports.etcd_peer, ports.apiserver) == (24379, 24380, 18443)
    assert (ports.controller_manager, ports.scheduler, ports.nodelist_scheduler) == (
        22257,
        22259,
        22260,
    )
    assert ports.apiserver_url == "https://127.0.0.1:18443"
    assert config.scheduler_verbosity == "5"


def test_every_component_has_its_own_ports() -> None:
    ports = CONFIG.ports
    assert component_ports(ports, "etcd") == (23379, 23380)
    assert component_ports(ports, "kube-apiserver") == (17443,)
    assert component_ports(ports, "kube-controller-manager") == (21257,)
    assert component_ports(ports, "kube-scheduler") == (21259,)
    assert component_ports(ports, "kube-scheduler-nodelist") == (21260,)
    assert component_ports(ports, POD_SIMULATOR) == ()
    listening = [p for name in ALL_COMPONENTS for p in component_ports(ports, name)]
    assert len(set(listening)) == len(listening)


# ---- feature gates --------------------------------------------------------------------


def test_parse_feature_gates_reads_a_comma_list() -> None:
    assert parse_feature_gates("A=true, B=FALSE,,") == {"A": True, "B": False}
    assert parse_feature_gates("") == {}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("GenericWorkload", "expected Name=true|false, got 'GenericWorkload'"),
        ("1Gate=true", "expected Name=true|false, got '1Gate=true'"),
        ("Gate=on", "feature gate Gate: expected true or false, got 'on'"),
    ],
)
def test_parse_feature_gates_names_the_bad_item(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_feature_gates(text)


def test_feature_gate_flags_are_sorted_and_the_apiserver_serves_the_gated_api() -> None:
    assert feature_gate_flags("kube-apiserver", GATES) == [
        "--feature-gates=AnotherGate=false,GenericWorkload=true",
        "--runtime-config=scheduling.k8s.io/v1beta1=true",
    ]
    for name in ("kube-controller-manager", "kube-scheduler", "kube-scheduler-nodelist"):
        assert feature_gate_flags(name, GATES) == [
            "--feature-gates=AnotherGate=false,GenericWorkload=true"
        ]


def test_a_gate_that_is_off_serves_no_api() -> None:
    assert feature_gate_flags("kube-apiserver", {"GenericWorkload": False}) == [
        "--feature-gates=GenericWorkload=false"
    ]


@pytest.mark.parametrize("name", ["etcd", POD_SIMULATOR, "kube-proxy"])
def test_components_that_are_not_kubernetes_binaries_get_no_gates(name: str) -> None:
    assert feature_gate_flags(name, GATES) == []


def test_no_gates_no_flags() -> None:
    assert feature_gate_flags("kube-apiserver", {}) == []


# ---- component flags ------------------------------------------------------------------


def test_etcd_listens_on_the_offset_ports_and_keeps_its_data_in_the_state_dir() -> None:
    f = flags(component_args(CONFIG, "etcd", GATES))
    assert f["data-dir"] == "/state/etcd"
    assert f["listen-client-urls"] == f["advertise-client-urls"] == "http://127.0.0.1:23379"
    assert f["listen-peer-urls"] == "http://127.0.0.1:23380"
    assert f["initial-cluster"] == "local-cluster=http://127.0.0.1:23380"
    assert f["unsafe-no-fsync"] == "true"
    assert "feature-gates" not in f


def test_apiserver_flags() -> None:
    f = flags(component_args(CONFIG, "kube-apiserver", GATES))
    assert (f["bind-address"], f["secure-port"]) == ("127.0.0.1", "17443")
    assert f["etcd-servers"] == "http://127.0.0.1:23379"
    assert f["client-ca-file"] == "/state/certs/ca.crt"
    assert f["tls-cert-file"] == "/state/certs/apiserver.crt"
    assert f["service-account-signing-key-file"] == "/state/certs/sa.key"
    assert f["requestheader-allowed-names"] == "front-proxy-client"
    assert f["authorization-mode"] == "Node,RBAC"
    assert f["disable-admission-plugins"] == "TaintNodesByCondition"
    assert f["watch-cache-sizes"] == "configmaps#0"
    assert f["feature-gates"] == "AnotherGate=false,GenericWorkload=true"
    assert f["runtime-config"] == "scheduling.k8s.io/v1beta1=true"
    assert "runtime-config" not in flags(component_args(CONFIG, "kube-apiserver"))


def test_controller_manager_flags() -> None:
    f = flags(component_args(CONFIG, "kube-controller-manager", GATES))
    kubeconfig = "/state/kube-controller-manager.kubeconfig"
    assert f["kubeconfig"] == f["authentication-kubeconfig"] == kubeconfig
    assert f["secure-port"] == "21257"
    # Fake nodes stay Ready only because nothing watches their heartbeat.
    assert f["controllers"] == "*,-node-lifecycle-controller"
    assert f["cluster-signing-key-file"] == "/state/certs/ca.key"
    assert f["flex-volume-plugin-dir"] == "/state/flexvolume"
    assert f["feature-gates"] == "AnotherGate=false,GenericWorkload=true"


@pytest.mark.parametrize(
    ("name", "port"), [("kube-scheduler", "21259"), ("kube-scheduler-nodelist", "21260")]
)
def test_scheduler_flags(name: str, port: str) -> None:
    f = flags(component_args(CONFIG, name, GATES))
    assert f["config"] == f"/state/{name}-config.yaml"
    assert f["authentication-kubeconfig"] == "/state/kube-scheduler.kubeconfig"
    assert f["secure-port"] == port
    assert f["cert-dir"] == f"/state/{name}-certs"
    assert f["v"] == "4"
    assert f["feature-gates"] == "AnotherGate=false,GenericWorkload=true"


def test_component_argv_runs_the_built_binary() -> None:
    bin_dir = Path("/bin-dir")
    argv = component_argv(CONFIG, bin_dir, "kube-scheduler-nodelist", GATES)
    assert argv[0] == "/bin-dir/kube-scheduler"
    assert argv[1:] == component_args(CONFIG, "kube-scheduler-nodelist", GATES)
    for name in COMPONENT_BINARY:
        assert Path(component_argv(CONFIG, bin_dir, name)[0]).parent == bin_dir


def test_the_pod_simulator_runs_this_package_for_the_same_cluster() -> None:
    argv = component_argv(CONFIG, Path("/bin-dir"), POD_SIMULATOR, GATES)
    assert argv[1:] == [
        "-B",
        str(WRAPPER),
        SIMULATE_COMMAND,
        "--state-dir=/state",
        "--port-offset=1000",
    ]


def test_an_unknown_component_has_no_flags() -> None:
    with pytest.raises(ValueError, match="kube-proxy"):
        component_args(CONFIG, "kube-proxy")


# ---- scheduler configuration ------------------------------------------------------------


def test_desired_schedulers() -> None:
    ports = CONFIG.ports
    assert desired_schedulers(ports, True, True, scheduler=False) == []
    assert desired_schedulers(ports, False, False) == [
        SchedulerSpec("kube-scheduler", DEFAULT_SCHEDULER_NAME, False, 21259)
    ]
    assert desired_schedulers(ports, True, True) == [
        SchedulerSpec("kube-scheduler", DEFAULT_SCHEDULER_NAME, True, 21259),
        # The second scheduler always exercises the node-list mode.
        SchedulerSpec("kube-scheduler-nodelist", NODELIST_SCHEDULER_NAME, False, 21260),
    ]


def rendered(
    spec: SchedulerSpec,
    url: str = "http://127.0.0.1:9999/scheduler",
    template: Path = SCHEDULER_CONFIG_TEMPLATE,
) -> Any:
    text = render_scheduler_config(
        template.read_text(), Path("/state/kube-scheduler.kubeconfig"), spec, url
    )
    return yaml.safe_load(text)


def test_gang_only_mode_calls_the_verbs_for_members_and_preempt_for_marked_preemptors() -> None:
    doc = rendered(SchedulerSpec("kube-scheduler", DEFAULT_SCHEDULER_NAME, True, 1))
    (profile,) = doc["profiles"]
    assert {"name": "GangScheduling"} in profile["plugins"]["multiPoint"]["disabled"]
    members, preemptors = doc["extenders"]
    assert members["urlPrefix"] == preemptors["urlPrefix"] == "http://127.0.0.1:9999/scheduler"
    assert members["managedResources"] == [
        {"name": "gang-extender.dev/member", "ignoredByScheduler": True}
    ]
    assert {k: v for k, v in members.items() if k.endswith("Verb")} == {
        "filterVerb": "filter",
        "prioritizeVerb": "prioritize",
        "preemptVerb": "preempt",
        "bindVerb": "bind",
    }
    # Only pods the preemptor-mark policy marked, for preempt only.
    assert preemptors["managedResources"] == [
        {"name": "gang-extender.dev/preemptor", "ignoredByScheduler": True}
    ]
    assert {k: v for k, v in preemptors.items() if k.endswith("Verb")} == {"preemptVerb": "preempt"}
    assert members["nodeCacheCapable"] is preemptors["nodeCacheCapable"] is True
    assert members["ignorable"] is preemptors["ignorable"] is False


def test_the_webhook_url_is_the_extender_port_plus_one_and_fills_the_template() -> None:
    url = default_webhook_url("http://127.0.0.1:18888/scheduler")
    assert url == "https://127.0.0.1:18889/mutate-pods"
    docs = list(yaml.safe_load_all(render_webhook(WEBHOOK_TEMPLATE.read_text(), url)))
    assert [d["kind"] for d in docs] == [
        "MutatingWebhookConfiguration",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
        "MutatingAdmissionPolicy",
        "MutatingAdmissionPolicyBinding",
    ]
    (webhook,) = docs[0]["webhooks"]
    assert webhook["clientConfig"] == {"url": url}
    assert webhook["failurePolicy"] == "Ignore"
    assert webhook["matchConditions"][1]["expression"] == (
        "object.spec.schedulerName in ['default-scheduler', 'gang-scheduler-nodelist']"
    )
    assert docs[1]["spec"]["matchConditions"] == webhook["matchConditions"]
    assert docs[3]["spec"]["matchConditions"][-1] == webhook["matchConditions"][1]


def test_every_verb_mode_calls_the_extender_with_node_names_only() -> None:
    doc = rendered(
        SchedulerSpec("kube-scheduler", DEFAULT_SCHEDULER_NAME, True, 1),
        template=SCHEDULER_CONFIG_TEMPLATES[MODE_EVERY_VERB],
    )
    assert doc["kind"] == "KubeSchedulerConfiguration"
    assert doc["clientConnection"]["kubeconfig"] == "/state/kube-scheduler.kubeconfig"
    (profile,) = doc["profiles"]
    assert profile["schedulerName"] == DEFAULT_SCHEDULER_NAME
    # gang-extender gates native PodGroups itself, so the in-tree gang plugin is off.
    assert {"name": "GangScheduling"} in profile["plugins"]["multiPoint"]["disabled"]
    (extender,) = doc["extenders"]
    assert extender["urlPrefix"] == "http://127.0.0.1:9999/scheduler"
    assert extender["nodeCacheCapable"] is True
    verbs = {k: extender[k] for k in ("filterVerb", "prioritizeVerb", "preemptVerb", "bindVerb")}
    assert verbs == {
        "filterVerb": "filter",
        "prioritizeVerb": "prioritize",
        "preemptVerb": "preempt",
        "bindVerb": "bind",
    }
    assert extender["ignorable"] is False


def test_the_nodelist_profile_gets_its_name_and_node_lists() -> None:
    doc = rendered(SchedulerSpec("kube-scheduler-nodelist", NODELIST_SCHEDULER_NAME, False, 2))
    assert [p["schedulerName"] for p in doc["profiles"]] == [NODELIST_SCHEDULER_NAME]
    assert [e["nodeCacheCapable"] for e in doc["extenders"]] == [False, False]


def test_the_extender_url_is_quoted_for_yaml() -> None:
    url = 'http://127.0.0.1:1/a"b\\c'
    doc = rendered(SchedulerSpec("kube-scheduler", DEFAULT_SCHEDULER_NAME, True, 1), url)
    assert doc["extenders"][0]["urlPrefix"] == url


SPEC = SchedulerSpec("kube-scheduler-nodelist", NODELIST_SCHEDULER_NAME, False, 2)


def render(template: str, spec: SchedulerSpec = SPEC) -> Any:
    return yaml.safe_load(render_scheduler_config(template, Path("/kc"), spec, "http://x/s"))


def test_a_scheduler_name_placeholder_wins_over_rewriting() -> None:
    doc = render(
        "profiles:\n- schedulerName: @SCHEDULER_NAME@\n"
        "clientConnection: {kubeconfig: @KUBECONFIG@}\n"
    )
    assert doc == {
        "profiles": [{"schedulerName": NODELIST_SCHEDULER_NAME}],
        "clientConnection": {"kubeconfig": "/kc"},
    }


def test_a_template_without_extenders_renders_without_them() -> None:
    doc = render("profiles:\n- schedulerName: default-scheduler\n")
    assert doc == {"profiles": [{"schedulerName": NODELIST_SCHEDULER_NAME}]}


@pytest.mark.parametrize(
    "template",
    [
        "profiles: []\n",
        "profiles:\n- schedulerName: default-scheduler\n- schedulerName: default-scheduler\n",
    ],
)
def test_a_second_profile_needs_exactly_one_default_profile_line(template: str) -> None:
    with pytest.raises(ClusterError, match="expected exactly one"):
        render(template)
    # The default profile keeps the template's name, so it needs no such line.
    assert render(template, SchedulerSpec("kube-scheduler", DEFAULT_SCHEDULER_NAME, True, 1))


def test_unknown_placeholders_are_refused_outside_comments() -> None:
    with pytest.raises(ClusterError, match="unknown placeholder"):
        render("profiles: []\nfoo: @FOO@\n", SchedulerSpec("s", DEFAULT_SCHEDULER_NAME, True, 1))
    assert render(
        "# mentions @FOO@\nprofiles: []\n", SchedulerSpec("s", DEFAULT_SCHEDULER_NAME, True, 1)
    ) == {"profiles": []}


# ---- CLI ----------------------------------------------------------------------------------


def test_help_names_the_ports_of_this_cluster() -> None:
    text = build_parser(Ports(1000)).format_help()
    assert "etcd 23379 (peer 23380), kube-apiserver 17443," in text
    assert "kube-scheduler-nodelist 21260;" in text


def test_up_parses_its_options() -> None:
    args = build_parser(Ports()).parse_args(
        ["up", "--nodes", "0", "--feature-gates", "GenericWorkload=true", "--no-scheduler"]
    )
    assert (args.nodes, args.feature_gates, args.scheduler) == (0, {"GenericWorkload": True}, False)
    assert (args.extender_url, args.node_cache_capable, args.pod_simulator) == (
        "http://127.0.0.1:8888/scheduler",
        True,
        True,
    )


@pytest.mark.parametrize(
    "argv",
    [
        ["up", "--feature-gates", "GenericWorkload"],
        ["up", "--extender-url", "ftp://x"],
        ["up", "--node-cpu", "lots"],
        ["add-node", "Node_4"],
        ["add-node", "node-4", "--label", "no-equals-sign"],
    ],
)
def test_bad_arguments_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    assert "error: argument" in capsys.readouterr().err
