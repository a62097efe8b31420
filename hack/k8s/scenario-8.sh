# shellcheck shell=bash
# Scenario 8, sourced by e2e.sh: the chart's CronJobs run on the cluster.
# The reconcile CronJob on (its Stripe key from a Secret, its API URL a
# stripe-mock on the node's gateway, built by hack/stripe-mock.sh) and the
# prune CronJob as it is by default; a Job made from each with `kubectl
# create job --from=cronjob/…` completes, and its run is recorded in the
# scenario's database (reconcile_runs finished, prune_runs finished).
s8() {
  local ns=s8 rel=ie db=ie_k8s_s8 port=12111
  backing 8
  local mock; mock=$("$ROOT/hack/stripe-mock.sh") || return 1
  start stripe-mock "$mock" -http-addr "$GATEWAY:$port" -https-addr "$GATEWAY:$((port + 1))"
  wait_for "stripe-mock on $GATEWAY:$port" 30 curl -fsS -o /dev/null -H 'Authorization: Bearer sk_test_123' "http://$GATEWAY:$port/v1/events" || return 1
  kubectl create ns $ns >/dev/null
  kubectl -n $ns create secret generic stripe-reconcile --from-literal=STRIPE_API_KEY=sk_test_123 >/dev/null
  values 8 >"$NODE_DIR/s8-values.yaml"
  cat >>"$NODE_DIR/s8-values.yaml" <<YAML
reconcile:
  enabled: true
  apiURL: http://$GATEWAY:$port
  since: 24h
  settle: 0s
  stripe: {existingSecret: stripe-reconcile}
YAML
  helm install $rel "$CHART" -n $ns -f "$NODE_DIR/s8-values.yaml" --wait --timeout 5m >/dev/null || { dump $ns; return 1; }
  local job
  for job in reconcile prune; do
    kubectl -n $ns create job "s8-$job" --from="cronjob/$rel-idempotent-events-$job" >/dev/null || return 1
    kubectl -n $ns wait --for=condition=Complete "job/s8-$job" --timeout=180s >/dev/null ||
      { kubectl -n $ns logs "job/s8-$job" --all-containers >&2; dump $ns; return 1; }
  done
  local runs prunes
  runs=$(psql -h 127.0.0.1 -U postgres -d $db -Atc "SELECT count(*), coalesce(sum(listed), 0) FROM reconcile_runs WHERE state = 'done'")
  prunes=$(psql -h 127.0.0.1 -U postgres -d $db -Atc "SELECT count(*) FROM prune_runs WHERE finished_at IS NOT NULL")
  [[ ${runs%%|*} == 1 && $prunes == 1 ]] || { log "reconcile_runs done (count|listed) $runs, prune_runs finished $prunes; want 1|… and 1"; return 1; }
  S8_DETAIL="Jobs from the reconcile and prune CronJobs completed: reconcile run listed ${runs#*|} event(s) of stripe-mock, $(kubectl -n $ns logs job/s8-reconcile -c reconcile | grep -m1 'in the ledger' | sed 's/^ *//'); prune run recorded"
  helm uninstall $rel -n $ns --wait >/dev/null 2>&1 || true
}
t=$SECONDS
if s8; then result 8 cronjobs "ok: $S8_DETAIL ($((SECONDS - t))s)"; else result 8 cronjobs "FAIL: ${S8_DETAIL:-} after $((SECONDS - t))s"; fi
stop stripe-mock
