# shellcheck shell=bash
# Shared by the hack/k8s scripts: where things live, logging, and starting and
# stopping the node's daemons by PID file. Sourced, never run.
#
# Layout (nothing outside these paths is written, except what the kubelet,
# kube-proxy and CNI insist on; see node-down.sh):
#   $BIN            the tools cache of hack/tools/build.sh (binaries built from
#                   the module proxy, reused across runs and checkouts), and
#                   this checkout's pause, k8sload and eventsctl
#   $CACHE/docker   the private dockerd's data root (base images, build cache)
#   $NODE_DIR       one run's cluster state (pki, etcd, kubelet, containerd), wiped per run
#   /run/ie-k8s     sockets and containerd state
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
CACHE=${IE_K8S_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/idempotent-events/k8s}
BIN=$("$ROOT/hack/tools/build.sh" --dir)
NODE_DIR=${IE_K8S_NODE_DIR:-$CACHE/node}
RUN_DIR=/run/ie-k8s
BRIDGE=iek8s0
POD_CIDR=10.244.0.0/24
GATEWAY=10.244.0.1
SERVICE_CIDR=10.96.0.0/16
DNS_IP=10.96.0.10
K8S_VERSION=v1.37.2
export DOCKER_HOST=unix://$RUN_DIR/docker.sock
export KUBECONFIG=$NODE_DIR/pki/admin.kubeconfig
export PATH=$BIN:/usr/sbin:/usr/bin:/sbin:/bin:$PATH
CTR=(ctr --address "$RUN_DIR/containerd/containerd.sock" -n k8s.io)

log() { printf '%s k8s-e2e: %s\n' "$(date +%T)" "$*" >&2; }
die() { log "FAIL: $*"; exit 1; }

node_ip() { ip -4 -o route get 1.1.1.1 2>/dev/null | sed -n 's/.* src \([0-9.]*\).*/\1/p'; }

# start NAME CMD...: run CMD in the background unless NAME's PID is alive.
start() {
  local n=$1; shift
  mkdir -p "$NODE_DIR/run" "$NODE_DIR/log"
  if [[ -f $NODE_DIR/run/$n.pid ]] && kill -0 "$(cat "$NODE_DIR/run/$n.pid")" 2>/dev/null; then return; fi
  setsid nohup "$@" >"$NODE_DIR/log/$n.log" 2>&1 </dev/null &
  echo $! >"$NODE_DIR/run/$n.pid"
}

# stop NAME: SIGTERM the PID in NAME's file, SIGKILL after 10 s.
stop() {
  local f=$NODE_DIR/run/$1.pid p
  [[ -f $f ]] || return 0
  p=$(cat "$f")
  if kill -0 "$p" 2>/dev/null; then
    kill "$p" 2>/dev/null
    for _ in $(seq 1 40); do kill -0 "$p" 2>/dev/null || break; sleep 0.25; done
    kill -0 "$p" 2>/dev/null && kill -9 "$p" 2>/dev/null
  fi
  rm -f "$f"
}

# wait_for WHAT SECONDS CMD...: poll CMD every 0.5 s.
wait_for() {
  local what=$1 s=$2; shift 2
  for ((i = 0; i < s * 2; i++)); do
    "$@" >/dev/null 2>&1 && return 0
    sleep 0.5
  done
  log "$what: not ready after ${s}s"
  return 1
}
