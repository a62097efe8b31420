# shellcheck shell=bash
# Scenario 7, sourced by e2e.sh: a team's own worker (examples/orders: the
# built-in payment state plus an orders row and a confirmation email in the
# outbox, in the ledger row's transaction) runs on the stock chart by image
# override alone. Every signed payment_intent.succeeded event, delivered
# twice, ends as exactly one payments row, one orders row and one outbox
# message, published to a queue bound to the effects exchange: first by the
# relay inside the workers (the default), then, after a helm upgrade to
# outbox.relay.mode=deployment, by two relay pods of their own while the
# workers run OUTBOX_RELAY=off.
S7_DB=ie_k8s_s7
S7_MGMT="http://guest:guest@127.0.0.1:15672/api"

s7_psql() { psql -h 127.0.0.1 -U postgres -d $S7_DB -Atc "$1"; }

# s7_bind: the downstream queue a consuming service would bind (without one
# every publish comes back unroutable and the relay parks the rows).
s7_bind() {
  local vh=ie-k8s-s7
  curl -fsS -o /dev/null -X PUT -H 'content-type: application/json' -d '{"type":"topic","durable":true}' "$S7_MGMT/exchanges/$vh/effects" &&
    curl -fsS -o /dev/null -X PUT -H 'content-type: application/json' -d '{"durable":true}' "$S7_MGMT/queues/$vh/s7.emails" &&
    curl -fsS -o /dev/null -X POST -H 'content-type: application/json' -d '{"routing_key":"#"}' "$S7_MGMT/bindings/$vh/e/effects/q/s7.emails"
}

# s7_load RUN: 300 payments of run RUN, each delivered twice; then exactly
# 300 orders rows and 300 outbox rows of that run, all published.
s7_load() {
  local run=$1 url orders outbox
  url=$(svc_url s7 "ie-idempotent-events-receiver")
  k8sload -url "$url" -secret "$SECRET" -database "postgres://postgres@127.0.0.1:5432/$S7_DB?sslmode=disable" \
    -events 300 -dups 1 -duration 10s -run "$run" >"$NODE_DIR/$run-load.log" 2>&1 || { cat "$NODE_DIR/$run-load.log" >&2; return 1; }
  orders=$(s7_psql "SELECT count(*), count(DISTINCT event_id) FROM orders WHERE event_id LIKE 'evt_k8s_${run}_%'")
  outbox=$(s7_psql "SELECT count(*) FROM outbox WHERE effect = 'confirmation-email' AND event_id LIKE 'evt_k8s_${run}_%'")
  [[ $orders == "300|300" && $outbox == 300 ]] || { log "$run: orders (rows|distinct) $orders, outbox messages $outbox, want 300|300 and 300"; return 1; }
  wait_for "$run: 300 outbox messages published" 60 s7_published "$run"
}

s7_published() { [[ $(s7_psql "SELECT count(*) FROM outbox WHERE published_at IS NOT NULL AND event_id LIKE 'evt_k8s_${1}_%'") == 300 ]]; }

# s7_queued: the messages in s7.emails (the management API's figure, which
# lags by its statistics interval).
s7_queued() { curl -fsS "$S7_MGMT/queues/ie-k8s-s7/s7.emails" | grep -Eo '"messages":[0-9]+' | head -1 | cut -d: -f2; }
s7_queued_at_least() { local n; n=$(s7_queued) && ((n >= $1)); }

# s7_relayed: the sum of idempotent_events_outbox_published_total over the
# relay pods, each of which must say it is one (build_info's component).
s7_relayed() {
  local ip sum=0 n m
  for ip in $(kubectl -n s7 get pods -l app.kubernetes.io/component=relay -o jsonpath='{.items[*].status.podIP}'); do
    m=$(curl -fsS "http://$ip:9091/metrics") || return 1
    grep -q '^idempotent_events_build_info{component="relay"' <<<"$m" || { log "relay pod $ip: no build_info with component=relay"; return 1; }
    n=$(awk '$1 == "idempotent_events_outbox_published_total" {print int($2)}' <<<"$m")
    sum=$((sum + ${n:-0}))
  done
  echo $sum
}

s7() {
  local ns=s7 rel=ie env queued relayed
  backing 7
  values 7 >"$NODE_DIR/s7-values.yaml"
  wait_for "effects exchange and s7.emails queue" 30 s7_bind || return 1
  helm install $rel "$CHART" -n $ns --create-namespace -f "$NODE_DIR/s7-values.yaml" \
    --set image.repository=orders-worker --set image.tag=e2e --wait --timeout 5m >/dev/null || { dump $ns; return 1; }
  s7_load s7 || { dump $ns; return 1; }
  S7_DETAIL="image orders-worker:e2e by --set image.repository/tag only: $(tail -1 "$NODE_DIR/s7-load.log" | sed 's/^k8sload: //'); 300 orders rows, 300 confirmation-email outbox messages published by the workers' relay"

  helm upgrade $rel "$CHART" -n $ns -f "$NODE_DIR/s7-values.yaml" --set image.repository=orders-worker --set image.tag=e2e \
    --set outbox.relay.mode=deployment --set outbox.deployment.replicaCount=2 --wait --timeout 5m >/dev/null || { dump $ns; return 1; }
  kubectl -n $ns rollout status deploy/$rel-idempotent-events-worker --timeout=180s >/dev/null || { dump $ns; return 1; }
  env=$(kubectl -n $ns get deploy $rel-idempotent-events-worker -o jsonpath='{.spec.template.spec.containers[0].env[?(@.name=="OUTBOX_RELAY")].value}')
  [[ $env == off ]] || { log "workers' OUTBOX_RELAY after the upgrade: '$env', want off"; return 1; }
  s7_load s7b || { dump $ns; return 1; }
  relayed=$(s7_relayed) || { dump $ns; return 1; }
  ((relayed >= 300)) || { log "the relay pods published $relayed messages, want at least 300"; dump $ns; return 1; }
  wait_for "600 messages in s7.emails" 30 s7_queued_at_least 600 || return 1
  queued=$(s7_queued)
  S7_DETAIL+="; after helm upgrade to outbox.relay.mode=deployment (2 relay pods, workers OUTBOX_RELAY=off): $(tail -1 "$NODE_DIR/s7b-load.log" | sed 's/^k8sload: //'), 300 more published, $relayed by the relay pods; $queued messages in the bound queue"
  helm uninstall $rel -n $ns --wait >/dev/null 2>&1 || true
}
t=$SECONDS
if s7; then result 7 effects-image "ok: $S7_DETAIL ($((SECONDS - t))s)"; else result 7 effects-image "FAIL: ${S7_DETAIL:-} after $((SECONDS - t))s"; fi
