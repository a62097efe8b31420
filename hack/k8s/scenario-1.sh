# shellcheck shell=bash
# Scenario 1, sourced by e2e.sh: the chart's default values, with only the
# image and the external services given (this machine's RabbitMQ, Redis and
# PostgreSQL). Every pod Ready, the migration Job complete, `helm test
# --logs` passes, and a signed event through the receiver's Service answers
# 202 then 200 duplicate.
s1() {
  local ns=s1 rel=ie
  backing 1
  values 1 >"$NODE_DIR/s1-values.yaml"
  helm install "$rel" "$CHART" -n $ns --create-namespace -f "$NODE_DIR/s1-values.yaml" --wait --timeout 5m >/dev/null ||
    { dump $ns; return 1; }
  ready $ns || { dump $ns; return 1; }
  kubectl -n $ns wait --for=condition=Complete "job/$rel-idempotent-events-migrate" --timeout=60s >/dev/null || return 1
  helm test "$rel" -n $ns --logs --timeout 3m >"$NODE_DIR/s1-helm-test.log" 2>&1 || { cat "$NODE_DIR/s1-helm-test.log" >&2; return 1; }
  local verified; verified=$(grep -m1 '^ok:' "$NODE_DIR/s1-helm-test.log" || true)
  [[ -n $verified ]] || { cat "$NODE_DIR/s1-helm-test.log" >&2; return 1; }
  # The receiver answers "200 duplicate" once the worker has committed the
  # event (Redis is written after COMMIT): send, wait for the ledger, send again.
  local url id first second
  url=$(svc_url $ns "$rel-idempotent-events-receiver") id=evt_k8s_s1_$RANDOM$RANDOM
  first=$(eventsctl send --url "$url" --secret "$SECRET" --id "$id" | cut -d' ' -f1)
  wait_for "ledger row of $id" 60 sh -c "psql -h 127.0.0.1 -U postgres -d ie_k8s_s1 -Atc \"SELECT 1 FROM processed_events WHERE event_id = '$id'\" | grep -qx 1" || return 1
  second=$(eventsctl send --url "$url" --secret "$SECRET" --id "$id" | cut -d' ' -f1)
  local answers="$first then $second"
  [[ $answers == "202 then 200" ]] || { log "answers: $answers"; return 1; }
  S1_DETAIL="$(kubectl -n $ns get pods --no-headers | grep -c Running) pods Ready, migration Job complete, helm test --logs passed ($verified), signed event through the Service: $answers"
}
t=$SECONDS
if s1; then result 1 defaults "ok: $S1_DETAIL ($((SECONDS - t))s)"; else result 1 defaults "FAIL after $((SECONDS - t))s"; fi
