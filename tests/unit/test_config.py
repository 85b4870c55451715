import argparse
from pathlib import Path

import pytest

from app.cli import parser
from app.config import ConfigError, Settings, advice, load


def settings(argv: list[str], env: dict[str, str] | None = None) -> Settings:
    args = parser().parse_args(["serve", *argv])
    return load(args, env or {})


def test_defaults_work_out_of_the_box() -> None:
    s = settings([])
    assert (s.port, s.url_prefix, s.permit_waiting_time_seconds) == (8888, "/scheduler", 60)
    assert s.denied_pg_expiration_seconds == 3
    assert s.kubeconfig is None


def test_a_gate_wait_below_the_schedulers_backoff_is_advised_against_not_refused() -> None:
    assert advice(settings([])) == []
    assert advice(settings(["--permit-waiting-time-seconds", "10"])) == []
    (note,) = advice(settings(["--permit-waiting-time-seconds", "6"]))
    assert note.startswith("--permit-waiting-time-seconds=6 is below kube-scheduler's")
    assert "podMaxBackoffSeconds" in note and "raise the wait" in note


def test_flags_win_over_environment() -> None:
    s = settings(["--port", "9000"], {"GANG_EXTENDER_PORT": "9100", "GANG_EXTENDER_HOST": "::"})
    assert (s.port, s.host) == (9000, "::")


def test_url_prefix_is_normalised() -> None:
    assert settings(["--url-prefix", "gang/"]).url_prefix == "/gang"
    assert settings(["--url-prefix", "/"]).url_prefix == ""


@pytest.mark.parametrize(
    ("argv", "env", "message"),
    [
        (["--port", "0"], {}, "--port='0': must be a TCP port"),
        ([], {"GANG_EXTENDER_PORT": "http"}, "GANG_EXTENDER_PORT='http'"),
        (["--permit-waiting-time-seconds", "-1"], {}, "must be a number of seconds > 0"),
        (["--log-level", "loud"], {}, "must be one of debug, info, warning, error"),
        (["--kubeconfig", "/nonexistent/kc"], {}, "does not exist"),
        (
            ["--permit-waiting-time-seconds", "120"],
            {},
            "exceeds --max-permit-waiting-time-seconds=80",
        ),
    ],
)
def test_invalid_values_are_rejected_with_the_setting_named(
    argv: list[str], env: dict[str, str], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        settings(argv, env)


def test_kubeconfig_falls_back_to_the_kubeconfig_variable() -> None:
    s = load(argparse.Namespace(), {"KUBECONFIG": "/a/kc:/b/kc"})
    assert s.kubeconfig == "/a/kc"


def test_tls_settings_must_be_complete(tmp_path: Path) -> None:
    cert, key, ca = (tmp_path / n for n in ("tls.crt", "tls.key", "ca.crt"))
    for f in (cert, key, ca):
        f.write_text("pem")
    s = settings(
        ["--tls-cert-file", str(cert), "--tls-key-file", str(key), "--tls-client-ca-file", str(ca)]
    )
    assert s.tls and s.tls_client_ca_file == str(ca)
    with pytest.raises(ConfigError, match="go together"):
        settings(["--tls-cert-file", str(cert)])
    with pytest.raises(ConfigError, match="mutual TLS is only possible over HTTPS"):
        settings(["--tls-client-ca-file", str(ca)])


def test_expecting_marked_preemptors_is_off_by_default_and_needs_the_gang_only_mode() -> None:
    assert settings([]).expect_marked_preemptors is False
    on = settings(["--webhook-port", "9443"], {"GANG_EXTENDER_EXPECT_MARKED_PREEMPTORS": "true"})
    assert on.expect_marked_preemptors is True
    with pytest.raises(ConfigError, match="--expect-marked-preemptors=true is for the gang-only"):
        settings(["--expect-marked-preemptors", "true"])


def test_holding_waiting_gangs_is_auto_by_default_and_true_needs_the_webhook_and_the_line() -> None:
    # auto holds where it can: the gang-only mode's webhook and the line.
    assert settings([]).hold_waiting_gangs == "auto"
    assert not settings([]).holds_gangs
    assert settings(["--webhook-port", "9443"]).holds_gangs
    no_line = {"GANG_EXTENDER_GANG_FEASIBILITY": "false"}
    assert not settings(["--webhook-port", "9443"], no_line).holds_gangs
    off = settings(["--webhook-port", "9443", "--hold-waiting-gangs", "false"])
    assert not off.holds_gangs
    on = settings(["--webhook-port", "9443"], {"GANG_EXTENDER_HOLD_WAITING_GANGS": "true"})
    assert on.hold_waiting_gangs == "true" and on.holds_gangs
    with pytest.raises(ConfigError):
        settings(["--hold-waiting-gangs", "yes"])
    with pytest.raises(ConfigError, match=r"needs the webhook .* set --webhook-port"):
        settings(["--hold-waiting-gangs", "true"])
    with pytest.raises(ConfigError, match="only --gang-feasibility=true keeps"):
        settings(
            ["--hold-waiting-gangs", "true", "--webhook-port", "9443"],
            {"GANG_EXTENDER_GANG_FEASIBILITY": "false"},
        )


def test_ops_port_must_differ_from_the_verbs_port() -> None:
    assert settings(["--ops-port", "9090"]).ops_port == 9090
    with pytest.raises(ConfigError, match="is the verbs' port"):
        settings(["--ops-port", "8888"])


def test_group_sources_and_leader_election_flags() -> None:
    s = settings([])
    assert (s.x_k8s_podgroups, s.volcano_podgroups, s.native_podgroups) == ("auto",) * 3
    assert s.label_groups == "on" and s.leader_election_lease is None
    s = settings(
        ["--native-podgroups", "off", "--leader-election-lease", "gang/gang-extender"],
        {"GANG_EXTENDER_LEADER_IDENTITY": "gang-extender-5f7-abcde"},
    )
    assert s.native_podgroups == "off"
    assert (s.leader_election_lease, s.leader_identity) == (
        "gang/gang-extender",
        "gang-extender-5f7-abcde",
    )
    with pytest.raises(ConfigError, match="--volcano-podgroups='yes': must be one of auto, off"):
        settings(["--volcano-podgroups", "yes"])
    with pytest.raises(ConfigError, match="NAMESPACE/NAME of kube-scheduler's leader-election"):
        settings(["--leader-election-lease", "gang-extender"])


def test_reliability_settings_have_safe_defaults_and_are_validated() -> None:
    s = settings([])
    assert (s.on_partial_bind, s.max_request_bytes, s.shutdown_grace_seconds) == (
        "delete-bound",
        64 * 1024 * 1024,
        10,
    )
    s = settings(["--on-partial-bind", "leave"], {"GANG_EXTENDER_MAX_REQUEST_BYTES": "1024"})
    assert (s.on_partial_bind, s.max_request_bytes) == ("leave", 1024)
    for argv, message in (
        (["--on-partial-bind", "keep"], "must be one of delete-bound, leave"),
        (["--max-request-bytes", "0"], "must be a whole number >= 1"),
        (["--shutdown-grace-seconds", "-3"], "must be a number of seconds > 0"),
    ):
        with pytest.raises(ConfigError, match=message):
            settings(argv)


def test_full_gc_interval_defaults_to_a_minute_takes_zero_for_off_and_refuses_negatives() -> None:
    assert settings([]).full_gc_interval_seconds == 60
    assert settings(["--full-gc-interval-seconds", "0"]).full_gc_interval_seconds == 0
    env = {"GANG_EXTENDER_FULL_GC_INTERVAL_SECONDS": "300"}
    assert settings([], env).full_gc_interval_seconds == 300
    with pytest.raises(ConfigError, match="must be a number of seconds >= 0"):
        settings(["--full-gc-interval-seconds", "-1"])


def test_gang_feasibility_is_on_by_default_and_switches_off_by_flag_or_env() -> None:
    assert settings([]).gang_feasibility is True
    assert settings([]).gang_aging_seconds == 60
    assert settings(["--gang-feasibility", "false"]).gang_feasibility is False
    assert settings([], {"GANG_EXTENDER_GANG_FEASIBILITY": "off"}).gang_feasibility is False
    assert settings(["--gang-aging-seconds", "15"]).gang_aging_seconds == 15
    with pytest.raises(ConfigError, match="--gang-feasibility='maybe': must be true or false"):
        settings(["--gang-feasibility", "maybe"])
    with pytest.raises(ConfigError, match="GANG_EXTENDER_GANG_AGING_SECONDS"):
        settings([], {"GANG_EXTENDER_GANG_AGING_SECONDS": "0"})


def test_api_requests_in_flight_default_to_32_and_must_be_positive() -> None:
    assert settings([]).api_max_in_flight == 32
    assert settings(["--api-max-in-flight", "128"]).api_max_in_flight == 128
    assert settings([], {"GANG_EXTENDER_API_MAX_IN_FLIGHT": "8"}).api_max_in_flight == 8
    with pytest.raises(ConfigError, match="--api-max-in-flight='0': must be a whole number >= 1"):
        settings(["--api-max-in-flight", "0"])
