"""Where the API server is and who we are to it: the official client's Configuration, loaded.

The kubernetes package does here what it does best: reading a kubeconfig
(exec plugins, token files, `proxy-url`, the environment's proxy) or the
in-cluster ServiceAccount, whose refresh hook rereads the token as it
rotates. Every call to the API server itself goes through app/kube/http.py,
which asks the Configuration for the credentials on each request.
"""

from __future__ import annotations

import os
from typing import Any

from kubernetes import client as k8s
from kubernetes import config as k8s_config


class KubeConfigError(RuntimeError):
    """No way to reach the API server; the message says what to set."""


def kube_configuration(kubeconfig: str | None) -> k8s.Configuration:
    """The Configuration of `kubeconfig`, or of the in-cluster ServiceAccount when there is none."""
    configuration = k8s.Configuration()
    try:
        if kubeconfig:
            k8s_config.load_kube_config(  # type: ignore[no-untyped-call]
                config_file=kubeconfig, client_configuration=configuration
            )
        elif os.environ.get("KUBERNETES_SERVICE_HOST"):
            k8s_config.load_incluster_config(  # type: ignore[no-untyped-call]
                client_configuration=configuration
            )
        else:
            raise KubeConfigError(
                "no kubeconfig given and not running in a cluster: pass --kubeconfig PATH "
                "(or set GANG_EXTENDER_KUBECONFIG / KUBECONFIG)"
            )
    except k8s_config.ConfigException as err:
        raise KubeConfigError(f"cannot load Kubernetes client configuration: {err}") from None
    return configuration


def read_and_release(response: Any) -> bytes:
    """Read an official client's raw (_preload_content=False) response whole, then release it.

    For bench/e2e.py, which drives the cluster with the official client:
    releasing a connection with the body unread would hand the next request
    on it the leftover bytes (urllib3 then fails with BadStatusLine).
    """
    try:
        data: bytes = response.data
        return data
    finally:
        response.release_conn()
