#!/usr/bin/env bash
# e2e.sh [SCENARIO...]: the chart on a real one-node Kubernetes, built and
# started here (no kind: its node image cannot be pulled on these machines),
# then torn down. `make k8s-e2e` runs it; docs/kubernetes-e2e.md describes it.
#
#   1 defaults    the chart's default values, external services = this machine's
#   2 subcharts   the bundled RabbitMQ, Redis and PostgreSQL (stand-in images)
#   3 scale       kubectl scale to 3 consumers; KEDA scales the worker up and down
#   4 rollout     helm upgrade to a new image + rollout restarts under signed load
#   5 ci-values   every charts/idempotent-events/ci/*-values.yaml installs and is Ready
#   6 tilt        tilt ci, where Tilt can be built
#   7 effects     a team's own worker image (examples/orders) on the stock chart
#   8 cronjobs    the reconcile and prune CronJobs, a Job made from each
#   9 effects-rollout  helm upgrade from the stock image to a team's own under load:
#                 the old handler set is fenced, every later event has its orders row;
#                 then helm rollback makes the stock set current again
#
# Needs root (containerd, iptables, bridges). Uses this machine's RabbitMQ,
# Redis and PostgreSQL as a client only: each scenario gets its own database,
# vhost and namespace, dropped at the end.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
source "$HERE/lib.sh"
[[ $(id -u) -eq 0 ]] || die "needs root (containerd, iptables, a bridge)"
SCENARIOS=("$@"); [[ ${#SCENARIOS[@]} -gt 0 ]] || SCENARIOS=(1 2 3 4 5 6 7 8 9)
CHART=$ROOT/charts/idempotent-events
SECRET=whsec_k8s_e2e_only_secret
RESULTS=()
T0=$SECONDS

export PGOPTIONS=--client-min-messages=warning

teardown() {
  local rc=$?
  set +e
  if [[ ${KEEP:-0} == 1 ]]; then log "KEEP=1: cluster left running; stop it with hack/k8s/e2e.sh --down"; return; fi
  "$HERE/node-down.sh"
  "$HERE/docker.sh" stop
  for db in $(psql -h 127.0.0.1 -U postgres -Atc "SELECT datname FROM pg_database WHERE datname LIKE 'ie_k8s_%'" 2>/dev/null); do
    psql -h 127.0.0.1 -U postgres -qc "DROP DATABASE IF EXISTS $db WITH (FORCE)" 2>/dev/null
  done
  for vh in $(rabbitmqctl -q list_vhosts 2>/dev/null | grep '^ie-k8s-'); do rabbitmqctl -q delete_vhost "$vh" >/dev/null 2>&1; done
  printf '%s\n' "${RESULTS[@]}"
  log "done in $((SECONDS - T0))s (rc $rc)"
}
if [[ ${1:-} == --down ]]; then KEEP=0; SCENARIOS=(); trap teardown EXIT; exit 0; fi

# result N NAME MESSAGE: one line per scenario.
result() { RESULTS+=("scenario $1 $2: $3"); log "scenario $1 $2: $3"; }

# backing N: a fresh namespace sN, database and vhost for scenario N
# (Redis: db 9, shared).
backing() {
  local db=ie_k8s_s$1 vh=ie-k8s-s$1
  kubectl delete ns "s$1" --ignore-not-found --timeout=180s >/dev/null
  psql -h 127.0.0.1 -U postgres -qc "DROP DATABASE IF EXISTS $db WITH (FORCE)" -c "CREATE DATABASE $db"
  rabbitmqctl -q delete_vhost "$vh" >/dev/null 2>&1 || true
  rabbitmqctl -q add_vhost "$vh" >/dev/null
  rabbitmqctl -q set_permissions -p "$vh" guest '.*' '.*' '.*' >/dev/null
}

# values N: the overlay that points a release at scenario N's services.
values() {
  cat <<YAML
image: {repository: idempotent-events, tag: e2e-1}
rabbitmq: {enabled: false}
redis: {enabled: false}
postgresql: {enabled: false}
externalRabbitmq: {url: "amqp://guest:guest@$GATEWAY:5672/ie-k8s-s$1"}
externalRedis: {url: "redis://$GATEWAY:6379/9"}
externalDatabase: {url: "postgres://postgres@$GATEWAY:5432/ie_k8s_s$1?sslmode=disable"}
webhook: {secrets: $SECRET}
YAML
}

# keda_dir: KEDA's module source (its manifests and CRDs), as pinned by hack/tools/k8s.
keda_dir() { (cd "$ROOT/hack/tools/k8s" && go list -m -f '{{.Dir}}' github.com/kedacore/keda/v2); }

svc_url() { echo "http://$(kubectl -n "$1" get svc "$2" -o jsonpath='{.spec.clusterIP}'):$(kubectl -n "$1" get svc "$2" -o jsonpath='{.spec.ports[0].port}')"; }

# ready NS: every pod of NS Ready (Jobs' pods: Succeeded).
ready() {
  kubectl -n "$1" wait --for=condition=Ready pod -l 'app.kubernetes.io/component notin (migration,test)' --timeout="${2:-180s}" >/dev/null
}

dump() {
  kubectl -n "$1" get pods -o wide >&2 || true
  for p in $(kubectl -n "$1" get pods -o name 2>/dev/null); do
    echo "--- $p" >&2; kubectl -n "$1" logs "$p" --all-containers --tail=15 >&2 2>/dev/null || true
  done
}

# --- the cluster ---------------------------------------------------------
trap teardown EXIT
if [[ ${REUSE:-0} == 1 ]] && kubectl get --raw /readyz >/dev/null 2>&1; then
  # The edit loop: KEEP=1 left a cluster; run scenarios on it again.
  log "REUSE=1: scenarios on the running cluster (images as they were built)"
  (cd "$ROOT" && CGO_ENABLED=0 go build -trimpath -o "$BIN/" ./cmd/eventsctl ./pkg/internal/cmd/k8sload)
else
  "$HERE/deps.sh"
  t=$SECONDS; "$HERE/tools.sh"; log "tools ready in $((SECONDS - t))s"
  (cd "$ROOT" && CGO_ENABLED=0 go build -trimpath -o "$BIN/" ./cmd/eventsctl)
  "$HERE/node-down.sh" >/dev/null 2>&1 || true # a run that was killed
  rm -rf "$NODE_DIR"; mkdir -p "$NODE_DIR"
  "$HERE/docker.sh" start
  t=$SECONDS; "$HERE/pki.sh"; "$HERE/node-up.sh"; log "node Ready in $((SECONDS - t))s"
  t=$SECONDS; "$HERE/images.sh"; log "images built and imported in $((SECONDS - t))s"
  for port in 5672 15672 6379 5432; do
    start "socat-$port" socat "TCP-LISTEN:$port,bind=$GATEWAY,fork,reuseaddr" "TCP:127.0.0.1:$port"
  done
  kubectl apply -f "$HERE/manifests/coredns.yaml" >/dev/null
  kubectl -n kube-system rollout status deploy/coredns --timeout=120s >/dev/null || { dump kube-system; die "CoreDNS"; }
  log "cluster up in $((SECONDS - T0))s"
fi

# release N: delete scenario N's namespaces (sN, sN-*), so that the next
# scenario's pods fit the node's CPU (the databases stay until teardown).
release() {
  local nss; nss=$(kubectl get ns -o name | cut -d/ -f2 | grep -E "^s$1(-|\$)" || true)
  [[ -z $nss ]] || kubectl delete ns $nss --timeout=300s >/dev/null 2>&1 || log "namespaces of scenario $1 not gone after 300s"
}

for s in "${SCENARIOS[@]}"; do
  source "$HERE/scenario-$s.sh"
  release "$s"
done
for r in "${RESULTS[@]}"; do [[ $r == *": ok"* || $r == *": not run"* ]] || exit 1; done
