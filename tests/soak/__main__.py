"""`python -m tests.soak --minutes 30 --seed 1 --burners 2` (what `make soak SOAK_ARGS=...` runs).

Brings up the session's local control plane in a free test slot (as the
cluster tests do: tests/cluster/session.py), starts the extender, and plays
the soak (tests/soak/run.py) with the load and the slow API server asked
for. Prints the report; exits 1 when an invariant was broken.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import uuid
from collections.abc import Sequence

from tests.soak.relay import Delay
from tests.soak.stream import ALL_FAULTS, Fault


def _delay(text: str) -> Delay:
    low, _, high = text.partition("-")
    try:
        return Delay(int(low) / 1000, int(high or low) / 1000)
    except ValueError as error:
        raise argparse.ArgumentTypeError(
            f"{text!r}: use LOW-HIGH in milliseconds, e.g. 200-500 ({error})"
        ) from None


def _faults(text: str) -> tuple[Fault, ...]:
    if text in ("", "none"):
        return ()
    try:
        return tuple(sorted(Fault(name) for name in text.split(",")))
    except ValueError:
        choices = ", ".join(sorted(ALL_FAULTS))
        raise argparse.ArgumentTypeError(f"{text!r}: a comma-separated list of {choices}") from None


def _positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be above 0")
    return value


def _count(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of 0 or more")
    return int(text)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m tests.soak", description=__doc__)
    p.add_argument("--minutes", type=_positive, default=5.0, help="how long (default 5)")
    p.add_argument("--seed", type=_count, default=1, help="the stream's seed (default 1)")
    p.add_argument("--burners", type=_count, default=0, help="CPU-burning loops beside it")
    p.add_argument("--api-threads", type=_count, default=0, help="threads loading the API server")
    p.add_argument(
        "--slow-api",
        type=_delay,
        default=Delay(0.2, 0.5),
        help="kube-scheduler's and the extender's API answers and watch events delayed by "
        "LOW-HIGH ms (requests by a fifth of it); 0 for none (default 200-500)",
    )
    p.add_argument(
        "--hold",
        action="store_true",
        help="the extender holds waiting gangs out of kube-scheduler's queue "
        "(--hold-waiting-gangs=true: every member, not only those created while gangs "
        "wait, the default auto; the gang-only mode only)",
    )
    p.add_argument(
        "--faults",
        type=_faults,
        default=tuple(sorted(ALL_FAULTS)),
        help=f"comma-separated, or none (default every one: {', '.join(sorted(ALL_FAULTS))})",
    )
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    # Imported here: tests.cluster.session claims a test slot when imported (not for --help).
    from hack.clusterkit import (
        api_client,
        kubeconfig_of,
        local_cluster,
        wait_for_default_service_account,
    )
    from tests.cluster.kube import Kube
    from tests.cluster.session import CLUSTER_DIR, GANG_ONLY, UP_ARGS, Extender, apply_test_crds

    if args.hold and not GANG_ONLY:
        print("--hold needs the gang-only mode (its webhook gates the members)", file=sys.stderr)
        return 2
    from tests.soak.components import APISERVER_PORT, extender_behind, scheduler_behind
    from tests.soak.load import api_load, cpu_burners
    from tests.soak.relay import slow_relay
    from tests.soak.run import Soak, SoakConfig

    config = SoakConfig(seed=args.seed, seconds=args.minutes * 60, faults=args.faults)
    local_cluster("down")
    kubeconfig = kubeconfig_of(local_cluster("up", *UP_ARGS))
    apply_test_crds(kubeconfig)
    kube = Kube(api_client(kubeconfig))
    log_path = CLUSTER_DIR / "logs" / "extender-soak.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    extender = Extender(kubeconfig, log_path)
    extender.start(*(("--hold-waiting-gangs", "true") if args.hold else ()))
    namespace = f"soak-{args.seed}-{uuid.uuid4().hex[:5]}"
    kube.core.create_namespace({"metadata": {"name": namespace}})
    wait_for_default_service_account(kube.core, namespace, 30)
    slow: Delay = args.slow_api
    try:
        with contextlib.ExitStack() as stack:
            stack.enter_context(cpu_burners(args.burners, config.seconds + 600))
            if args.api_threads:
                stack.enter_context(api_load(kube, args.api_threads))
            relay = None
            if slow.high > 0:
                relay = stack.enter_context(
                    slow_relay(
                        APISERVER_PORT,
                        down=slow,
                        up=Delay(slow.low / 5, slow.high / 5),
                        seed=args.seed,
                        max_seconds=config.seconds + 1800,
                    )
                )
                stack.enter_context(scheduler_behind(relay.port))
                stack.enter_context(extender_behind(extender, relay.port))
            report = Soak(kube, extender, namespace, config, relay).run()
            # Printed before the teardown: a long run's figures must not be lost to a
            # restart that fails on a busy machine (the extender not ready in time).
            print(report.render(), flush=True)
            print(f"logs: {CLUSTER_DIR / 'logs'}", flush=True)
    finally:
        extender.stop()
        local_cluster("down")
    return 1 if report.violations else 0


if __name__ == "__main__":
    sys.exit(main())
