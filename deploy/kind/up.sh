#!/usr/bin/env bash
# gang-extender on kind, for users with Docker:
#
#   deploy/kind/up.sh          create the cluster, build and load the image,
#                              install the chart, apply the examples
#   deploy/kind/up.sh down     delete the cluster
#
# Needs docker, kind and kubectl; helm is taken from PATH, else built by
# hack/build-helm (needs Go). Settings (environment):
#   KIND_CLUSTER_NAME  cluster name                    (default gang-extender)
#   KIND_NODE_IMAGE    kind node image                 (default kindest/node:<KUBE_VERSION>
#                      from hack/kube/versions.env; kube-scheduler in the chart gets the
#                      same tag, since it must not be newer than the API server)
#   IMAGE              extender image to build and load (default gang-extender:kind)
#
# The chart serves the scheduler profile `gang-scheduler` next to kind's own
# default scheduler; the examples get `schedulerName: gang-scheduler` from
# deploy/kind/examples (a kustomization over deploy/examples).
#
# This script cannot run on the development machine (no Docker engine there);
# `make test` checks it with `bash -n` and shellcheck
# (tests/packaging/test_scripts.py).
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
# shellcheck source=../../hack/kube/versions.env
source "$repo/hack/kube/versions.env"

cluster=${KIND_CLUSTER_NAME:-gang-extender}
node_image=${KIND_NODE_IMAGE:-kindest/node:$KUBE_VERSION}
image=${IMAGE:-gang-extender:kind}
context="kind-$cluster"
namespace=gang-extender

need() {
  command -v "$1" >/dev/null 2>&1 || { echo "up.sh: $1 is required ($2)" >&2; exit 1; }
}
need docker "https://docs.docker.com/get-docker/"
need kind "https://kind.sigs.k8s.io/docs/user/quick-start/#installation"

if [ "${1:-}" = "down" ]; then
  kind delete cluster --name "$cluster"
  exit 0
fi
if [ $# -gt 0 ]; then
  echo "usage: $0 [down]" >&2
  exit 2
fi

need kubectl "https://kubernetes.io/docs/tasks/tools/"
if command -v helm >/dev/null 2>&1; then
  helm=helm
else
  need go "to build helm with hack/build-helm, or install helm: https://helm.sh/docs/intro/install/"
  helm="$("$repo/hack/build-helm")/helm"
fi

if kind get clusters 2>/dev/null | grep -qx "$cluster"; then
  echo "up.sh: kind cluster $cluster exists; reusing it" >&2
else
  kind create cluster --name "$cluster" --image "$node_image" \
    --config "$repo/deploy/kind/kind-config.yaml" --wait 120s
fi

docker build -t "$image" "$repo"
kind load docker-image "$image" --name "$cluster"

# Installs the PodGroup CRD (the chart's crds/) on first install.
"$helm" upgrade --install gang-extender "$repo/charts/gang-extender" \
  --kube-context "$context" --namespace "$namespace" --create-namespace \
  --set extender.image.repository="${image%:*}" \
  --set extender.image.tag="${image##*:}" \
  --set extender.image.pullPolicy=Never \
  --set scheduler.image.tag="${node_image##*:}" \
  --wait --timeout 5m

kubectl --context "$context" kustomize --load-restrictor LoadRestrictionsNone \
  "$repo/deploy/kind/examples" | kubectl --context "$context" apply -f -

cat <<EOF

gang-extender runs in namespace $namespace of kind cluster $cluster (context $context).
The examples are in namespace gang-demo:
  kubectl --context $context -n gang-demo get pods -o wide      # nginx: 2 of minMember 3, Pending
  kubectl --context $context -n gang-demo scale deployment nginx --replicas=3
  kubectl --context $context -n gang-demo get podgroups
Logs:   kubectl --context $context -n $namespace logs deploy/gang-extender -c gang-extender
Delete: $0 down
EOF
