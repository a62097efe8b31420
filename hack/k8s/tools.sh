#!/usr/bin/env bash
# Build every binary the one-node cluster needs from the Go module proxy into
# $CACHE/bin (hack/k8s/lib.sh). Each is rebuilt only when its pinned module
# (go.mod + go.sum under hack/tools/), its version or the Go toolchain
# changed: a stamp file beside the binary records what it was built from.
#
#   kubernetes v1.37.2  kube-apiserver, -controller-manager, -scheduler, kubelet,
#                       kube-proxy, kubectl       hack/tools/kubernetes
#   etcd                                          hack/tools/etcd
#   helm v4.3.2                                   go install
#   coredns v1.15.0                               go install
#   dockerfile-frontend v0.34.2 (BuildKit)        hack/tools/dockerfile-frontend
#   keda v2.21.0 operator, adapter, webhooks              hack/tools/keda
#   pause, k8sload and the project's binaries     this module
set -euo pipefail
source "$(dirname "$0")/lib.sh"
mkdir -p "$BIN"
export CGO_ENABLED=0

# tool NAME STAMP_INPUT DIR LDFLAGS PACKAGE...: go build PACKAGE... in DIR into
# $BIN unless $BIN/.NAME.stamp holds the same digest.
tool() {
  local name=$1 input=$2 dir=$3 ldflags=$4; shift 4
  local digest
  digest=$( { echo "$input $ldflags $*"; go version; } | sha256sum | cut -c1-16)
  if [[ -f $BIN/.$name.stamp && $(cat "$BIN/.$name.stamp") == "$digest" ]]; then
    return
  fi
  local t=$SECONDS
  log "building $name (first time, or its pin changed; cold: minutes)"
  (cd "$dir" && go build -trimpath -ldflags "$ldflags" -o "$BIN/" "$@")
  echo "$digest" >"$BIN/.$name.stamp"
  log "built $name in $((SECONDS - t))s"
}
mod() { cat "$ROOT/hack/tools/$1/go.mod" "$ROOT/hack/tools/$1/go.sum"; }

kv=${K8S_VERSION#v}
tool kubernetes "$(mod kubernetes)" "$ROOT/hack/tools/kubernetes" \
  "-s -w -X k8s.io/component-base/version.gitVersion=$K8S_VERSION -X k8s.io/component-base/version.gitMajor=${kv%%.*} -X k8s.io/component-base/version.gitMinor=$(cut -d. -f2 <<<"$kv")" \
  k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager k8s.io/kubernetes/cmd/kube-scheduler \
  k8s.io/kubernetes/cmd/kubelet k8s.io/kubernetes/cmd/kube-proxy k8s.io/kubernetes/cmd/kubectl
tool etcd "$(mod etcd)" "$ROOT/hack/tools/etcd" "-s -w" go.etcd.io/etcd/server/v3
[[ -x $BIN/server ]] && mv "$BIN/server" "$BIN/etcd"
tool dockerfile-frontend "$(mod dockerfile-frontend)" "$ROOT/hack/tools/dockerfile-frontend" "-s -w" \
  github.com/moby/buildkit/frontend/dockerfile/cmd/dockerfile-frontend
if [[ ${IE_K8S_KEDA:-1} == 1 ]]; then
  tool keda "$(mod keda)" "$ROOT/hack/tools/keda" "-s -w" \
    github.com/kedacore/keda/v2/cmd/operator github.com/kedacore/keda/v2/cmd/adapter github.com/kedacore/keda/v2/cmd/webhooks
fi

# install NAME MODULE@VERSION: go install into $BIN, stamped by the version.
install_tool() {
  local name=$1 pkg=$2 digest
  digest=$( { echo "$pkg"; go version; } | sha256sum | cut -c1-16)
  [[ -f $BIN/.$name.stamp && $(cat "$BIN/.$name.stamp") == "$digest" ]] && return
  local t=$SECONDS
  log "building $name"
  GOBIN=$BIN go install -trimpath -ldflags '-s -w' "$pkg"
  echo "$digest" >"$BIN/.$name.stamp"
  log "built $name in $((SECONDS - t))s"
}
install_tool helm helm.sh/helm/v4/cmd/helm@v4.3.2
install_tool coredns github.com/coredns/coredns@v1.15.0

# Ours: always rebuilt (the Go cache makes that a few seconds).
(cd "$ROOT" && go build -trimpath -ldflags '-s -w' -o "$BIN/" ./hack/k8s/cmd/pause ./pkg/internal/cmd/k8sload)
