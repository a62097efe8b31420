# shellcheck shell=bash
# Scenario 2, sourced by e2e.sh: ci/default-values.yaml with the bundled
# RabbitMQ, Redis and PostgreSQL subcharts on, run on the stand-in images
# built by images.sh from hack/k8s/images/ (Debian's RabbitMQ 3.10, Redis
# 7.0 and PostgreSQL 15 under the official images' names; see
# hack/k8s/images/README.md). Only the image and the webhook secret are
# given. Every pod Ready, the install-time migration Job complete, `helm
# test --logs` passes, and a signed event through the receiver's Service
# answers 202 then 200 duplicate.

# s2_ledger NS REL ID: the bundled PostgreSQL's ledger has ID.
s2_ledger() {
  kubectl -n "$1" exec "statefulset/$2-postgresql" -c postgresql -- \
    sh -c 'psql -U "$POSTGRES_USER" -d "$POSTGRES_DB" -Atc "SELECT 1 FROM processed_events WHERE event_id = '"'$3'"'"' |
    grep -qx 1
}

s2() {
  local ns=s2 rel=ie
  cat >"$NODE_DIR/s2-values.yaml" <<YAML
image: {repository: idempotent-events, tag: e2e-1}
webhook: {secrets: $SECRET}
YAML
  helm install "$rel" "$CHART" -n $ns --create-namespace -f "$CHART/ci/default-values.yaml" -f "$NODE_DIR/s2-values.yaml" \
    --wait --timeout 6m >/dev/null || { dump $ns; return 1; }
  ready $ns || { dump $ns; return 1; }
  # With postgresql.enabled the first install's migration is a plain Job
  # (not a hook): the database only exists once the release is applied.
  kubectl -n $ns wait --for=condition=Complete "job/$rel-idempotent-events-migrate-install" --timeout=120s >/dev/null ||
    { dump $ns; return 1; }
  helm test "$rel" -n $ns --logs --timeout 3m >"$NODE_DIR/s2-helm-test.log" 2>&1 || { cat "$NODE_DIR/s2-helm-test.log" >&2; dump $ns; return 1; }
  local verified; verified=$(grep -m1 '^ok:' "$NODE_DIR/s2-helm-test.log" || true)
  [[ -n $verified ]] || { cat "$NODE_DIR/s2-helm-test.log" >&2; return 1; }
  # 202, then (once the worker has committed it: read the ledger in the
  # bundled PostgreSQL) 200 duplicate.
  local url id first second answers
  url=$(svc_url $ns "$rel-idempotent-events-receiver") id=evt_k8s_s2_$RANDOM$RANDOM
  first=$(eventsctl send --url "$url" --secret "$SECRET" --id "$id" | cut -d' ' -f1)
  wait_for "ledger row of $id" 60 s2_ledger "$ns" "$rel" "$id" || { dump $ns; return 1; }
  second=$(eventsctl send --url "$url" --secret "$SECRET" --id "$id" | cut -d' ' -f1)
  answers="$first then $second"
  [[ $answers == "202 then 200" ]] || { log "answers: $answers"; return 1; }
  # What actually ran under the official images' names.
  local pg rmq redis
  pg=$(kubectl -n $ns exec "statefulset/$rel-postgresql" -c postgresql -- \
    sh -c 'psql -U "$POSTGRES_USER" -d "$POSTGRES_DB" -Atc "SHOW server_version"' 2>/dev/null | cut -d' ' -f1)
  rmq=$(kubectl -n $ns exec "statefulset/$rel-rabbitmq" -c rabbitmq -- rabbitmqctl -q version 2>/dev/null | tail -1)
  redis=$(kubectl -n $ns exec "deploy/$rel-redis" -c redis -- redis-server --version 2>/dev/null | sed -n 's/.* v=\([^ ]*\).*/\1/p')
  [[ -n $pg && -n $rmq && -n $redis ]] || { log "versions: postgres '$pg' rabbitmq '$rmq' redis '$redis'"; return 1; }
  S2_DETAIL="$(kubectl -n $ns get pods --no-headers | grep -c Running) pods Ready (stand-ins: PostgreSQL $pg as postgres:17.6-bookworm, RabbitMQ $rmq as rabbitmq:4.1.4-management, Redis $redis as redis:7.4.5-alpine), migration Job complete, helm test --logs passed ($verified), signed event through the Service: $answers"
}
t=$SECONDS
if s2; then result 2 subcharts "ok: $S2_DETAIL ($((SECONDS - t))s)"; else result 2 subcharts "FAIL after $((SECONDS - t))s"; fi
