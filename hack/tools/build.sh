#!/usr/bin/env bash
# build.sh NAME... | all | --list | --dir: every pinned tool the suite runs,
# built from the Go module proxy into one cache shared by every checkout of the
# machine, and rebuilt only when its pin, its flags or the Go toolchain
# changed (a stamp beside each binary records what it was built from).
#
#   kube            kube-apiserver, -controller-manager, -scheduler, kubelet,
#                   kube-proxy, kubectl v1.37.2                  hack/tools/k8s
#   etcd            etcd v3.7.3                                  hack/tools/k8s
#   helm            helm v4.3.2                                  hack/tools/k8s
#   coredns         CoreDNS v1.15.0                              hack/tools/k8s
#   dockerfile-frontend  BuildKit's Dockerfile frontend v0.34.2 hack/tools/k8s
#   keda            KEDA v2.21.0 operator, metrics adapter, admission webhooks
#                                                                hack/tools/k8s
#   promtool        Prometheus v0.314.0's promtool (KEDA's)      hack/tools/k8s
#   prometheus      Prometheus v0.314.0's server (promtool's version; no
#                   web UI assets: the live alert suite uses its API)
#                                                                hack/tools/prometheus
#   alertmanager    Alertmanager v0.31.1                         hack/tools/alertmanager
#   helm-unittest   helm-unittest v1.1.2                         hack/tools/k8s
#   golangci-lint   golangci-lint v2.15.0                        hack/tools/golangci-lint
#   stripe-mock     stripe-mock v0.203.0                         hack/tools/stripe-mock
#
# Every Kubernetes-ecosystem tool comes from the one module hack/tools/k8s, so
# the packages they share (k8s.io/*, gRPC, protobuf, OpenTelemetry, the cloud
# SDKs) resolve to one version each and compile once; golangci-lint and
# stripe-mock keep modules of their own (nothing to share, and their pins
# should not move with Kubernetes'), and so do the Prometheus server and
# Alertmanager (their go.mod files say why).
#
# Builds of one tool are serialised by a lock, so a stage that needs a tool
# the background builder (hack/test.sh) is building waits for that build
# instead of starting a second one. Each call appends "NAME cached|built Ns|
# waited Ns" to $IE_TOOLS_REPORT when it is set: the stage table of
# `make test` reads it.
#
# The cache is ${IE_TOOLS_CACHE:-${XDG_CACHE_HOME:-~/.cache}/idempotent-events/tools};
# --dir prints its bin/ folder.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
CACHE=${IE_TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/idempotent-events/tools}
BIN=$CACHE/bin
export GOWORK=off GOFLAGS=-buildvcs=false CGO_ENABLED=0

K8S_VERSION=v1.37.2
kv=${K8S_VERSION#v}

# The order is the order `make test` needs them in (hack/test.sh builds them
# in the background in this order).
ALL=(stripe-mock golangci-lint promtool prometheus alertmanager kube etcd helm-unittest helm coredns dockerfile-frontend keda)

# spec NAME: sets dir, ldflags, tags, pkgs and outs (the binaries it leaves
# in $BIN).
spec() {
  dir=$ROOT/hack/tools/k8s ldflags="-s -w" tags="" outs=()
  case $1 in
  kube)
    ldflags="-s -w -X k8s.io/component-base/version.gitVersion=$K8S_VERSION -X k8s.io/component-base/version.gitMajor=${kv%%.*} -X k8s.io/component-base/version.gitMinor=$(cut -d. -f2 <<<"$kv")"
    pkgs=(k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager k8s.io/kubernetes/cmd/kube-scheduler
      k8s.io/kubernetes/cmd/kubelet k8s.io/kubernetes/cmd/kube-proxy k8s.io/kubernetes/cmd/kubectl) ;;
  etcd) pkgs=(go.etcd.io/etcd/server/v3) outs=(etcd) ;;
  helm) pkgs=(helm.sh/helm/v4/cmd/helm) ;;
  coredns) pkgs=(github.com/coredns/coredns) ;;
  dockerfile-frontend) pkgs=(github.com/moby/buildkit/frontend/dockerfile/cmd/dockerfile-frontend) ;;
  keda) pkgs=(github.com/kedacore/keda/v2/cmd/operator github.com/kedacore/keda/v2/cmd/adapter github.com/kedacore/keda/v2/cmd/webhooks) ;;
  promtool)
    ldflags="-s -w -X github.com/prometheus/common/version.Version=$(modver github.com/prometheus/prometheus)"
    pkgs=(github.com/prometheus/prometheus/cmd/promtool) ;;
  prometheus)
    # remove_all_sd: static and file service discovery only, not the
    # cloud providers' and Kubernetes' (add enable_kubernetes_sd when a
    # stage needs it): a third of the compile.
    dir=$ROOT/hack/tools/prometheus tags=remove_all_sd
    ldflags="-s -w -X github.com/prometheus/common/version.Version=$(modver github.com/prometheus/prometheus)"
    pkgs=(github.com/prometheus/prometheus/cmd/prometheus) ;;
  alertmanager)
    dir=$ROOT/hack/tools/alertmanager
    ldflags="-s -w -X github.com/prometheus/common/version.Version=$(modver github.com/prometheus/alertmanager)"
    pkgs=(github.com/prometheus/alertmanager/cmd/alertmanager) ;;
  helm-unittest) pkgs=(github.com/helm-unittest/helm-unittest/cmd/helm-unittest) ;;
  golangci-lint)
    dir=$ROOT/hack/tools/golangci-lint ldflags=""
    pkgs=(github.com/golangci/golangci-lint/v2/cmd/golangci-lint) ;;
  stripe-mock)
    dir=$ROOT/hack/tools/stripe-mock
    ldflags="-X main.version=$(modver github.com/stripe/stripe-mock)"
    pkgs=(github.com/stripe/stripe-mock) ;;
  *) echo "tools: no tool named $1 (one of: ${ALL[*]})" >&2; exit 2 ;;
  esac
  if [[ ${#outs[@]} -eq 0 ]]; then
    local p; for p in "${pkgs[@]}"; do outs+=("$(goname "$p")"); done
  fi
}

# goname PACKAGE: the name go build gives its binary (a major-version
# suffix such as /v3 is not a name).
goname() {
  local base=${1##*/}
  if [[ $base =~ ^v[0-9]+$ ]]; then base=${1%/*}; base=${base##*/}; fi
  echo "$base"
}

# modver MODULE: its version in $dir's go.mod, without the v (a line of a
# require block, or a one-line require).
modver() {
  awk -v m="$1" '$1 == "require" { $1 = ""; $0 = $0 } $1 == m { sub(/^v/, "", $2); print $2 }' "$dir/go.mod"
}

report() { if [[ -n ${IE_TOOLS_REPORT:-} ]]; then echo "$*" >>"$IE_TOOLS_REPORT"; fi; }

# current NAME DIGEST: every output is there and was built from DIGEST.
current() {
  local o
  [[ -f $BIN/.$1.stamp && $(cat "$BIN/.$1.stamp") == "$2" ]] || return 1
  for o in "${outs[@]}"; do [[ -x $BIN/$o ]] || return 1; done
}

build() {
  local name=$1 digest t0=$SECONDS
  spec "$name"
  digest=$( { cat "$dir/go.mod" "$dir/go.sum"; echo "${pkgs[*]} | $ldflags | ${outs[*]}${tags:+ | $tags}"; go env GOVERSION; } | sha256sum | cut -c1-16)
  if current "$name" "$digest"; then report "$name cached"; return; fi
  mkdir -p "$BIN"
  exec {lock}>"$BIN/.$name.lock"
  flock "$lock"
  if current "$name" "$digest"; then
    # Another process (the background builder) built it while we waited.
    report "$name waited $((SECONDS - t0))s"
    exec {lock}>&-
    return
  fi
  echo "tools: building $name from ${dir#"$ROOT"/} (pin or Go changed, or first run: minutes when cold)" >&2
  local tmp; tmp=$(mktemp -d "$BIN/.build-$name.XXXX")
  if ! (cd "$dir" && go build -trimpath -tags "$tags" -ldflags "$ldflags" -o "$tmp/" "${pkgs[@]}"); then
    rm -rf "$tmp"; exec {lock}>&-
    echo "tools: building $name failed" >&2; return 1
  fi
  local i
  for i in "${!pkgs[@]}"; do mv -f "$tmp/$(goname "${pkgs[$i]}")" "$BIN/${outs[$i]}"; done
  rm -rf "$tmp"
  echo "$digest" >"$BIN/.$name.stamp"
  report "$name built $((SECONDS - t0))s"
  echo "tools: built $name in $((SECONDS - t0))s" >&2
  exec {lock}>&-
}

case ${1:-} in
"") echo "usage: $0 NAME... | all | --list | --dir" >&2; exit 2 ;;
--dir) echo "$BIN"; exit 0 ;;
--list) printf '%s\n' "${ALL[@]}"; exit 0 ;;
all) set -- "${ALL[@]}" ;;
esac
for name in "$@"; do build "$name"; done
