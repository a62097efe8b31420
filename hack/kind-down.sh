#!/usr/bin/env bash
# Delete the kind cluster and the local registry that hack/kind-up.sh made.
#   hack/kind-down.sh             # cluster and registry
#   hack/kind-down.sh --keep-registry
set -euo pipefail

CLUSTER=idempotent-events
REG_NAME=kind-registry

if kind get clusters 2>/dev/null | grep -qx "$CLUSTER"; then
  kind delete cluster --name "$CLUSTER"
else
  echo "kind-down: no cluster ${CLUSTER}"
fi
if [[ ${1:-} != --keep-registry ]] && docker inspect "$REG_NAME" >/dev/null 2>&1; then
  docker rm -f "$REG_NAME" >/dev/null
  echo "kind-down: removed registry container ${REG_NAME}"
fi
