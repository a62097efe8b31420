#!/usr/bin/env bash
# Every binary the one-node cluster needs, in $BIN (hack/k8s/lib.sh): the
# pinned tools from hack/tools/build.sh (one module, hack/tools/k8s, so they
# share their compiled packages, and one cache with `make check-deploy`,
# which builds the same kube-apiserver for envtest), each rebuilt only when
# its pin or the Go toolchain changed:
#
#   kube      kube-apiserver, -controller-manager, -scheduler, kubelet,
#             kube-proxy, kubectl v1.37.2
#   etcd, helm v4.3.2, coredns v1.15.0, dockerfile-frontend v0.34.2 (BuildKit)
#   keda      v2.21.0 operator, metrics adapter, admission webhooks
#             (scenario 3; IE_K8S_KEDA=0 leaves it out)
#
# and, always rebuilt (the Go cache makes that seconds), pause and k8sload
# from this module.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
tools=(kube etcd helm coredns dockerfile-frontend)
[[ ${IE_K8S_KEDA:-1} == 1 ]] && tools+=(keda)
"$ROOT/hack/tools/build.sh" "${tools[@]}"
(cd "$ROOT" && CGO_ENABLED=0 go build -trimpath -ldflags '-s -w' -o "$BIN/" ./hack/k8s/cmd/pause ./pkg/internal/cmd/k8sload)
