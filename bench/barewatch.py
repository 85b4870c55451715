#!/usr/bin/env python3
"""A pod watch that reads every event and keeps nothing: bench.watchcost's stand-in watcher.

`python -m bench.barewatch KUBECONFIG json|protobuf` watches every pod from
now on in that encoding and discards the bytes, so that bench.watchcost can
tell what one more pod watcher costs the API server apart from what our
extender does with the events, and whether a protobuf watch (the encoding
kube-scheduler and the controller manager use, which the API server encodes
once for all of them) would cost it less than the JSON one we read. It
prints one line once the API server has accepted the watch.
"""

from __future__ import annotations

import sys
from typing import Any

from kubernetes import client as k8s

from hack.clusterkit import api_client

ACCEPT = {
    "json": "application/json",
    "protobuf": "application/vnd.kubernetes.protobuf;stream=watch",
}


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[1] not in ACCEPT:
        print(f"usage: python -m bench.barewatch KUBECONFIG {'|'.join(ACCEPT)}", file=sys.stderr)
        return 2
    kubeconfig, encoding = argv
    client = api_client(kubeconfig)
    configuration = client.configuration
    core: Any = k8s.CoreV1Api(client)
    listed = core.list_pod_for_all_namespaces(limit=1)
    # From the current resourceVersion: no initial ADDED event for every pod.
    # The bench cluster's kubeconfig authenticates by client certificate, which
    # the client's pool carries (as bench/e2e.py's /metrics reads rely on).
    url = (
        f"{configuration.host}/api/v1/pods?watch=true&allowWatchBookmarks=true"
        f"&resourceVersion={listed.metadata.resource_version}"
    )
    response = client.rest_client.pool_manager.request(
        "GET", url, headers={"Accept": ACCEPT[encoding]}, preload_content=False, timeout=None
    )
    if response.status != 200:
        print(f"watch refused: HTTP {response.status}", file=sys.stderr)
        return 1
    print(f"watching pods, {response.headers.get('content-type')}", flush=True)
    for _chunk in response.stream(64 * 1024):
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
