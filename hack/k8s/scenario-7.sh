# shellcheck shell=bash
# Scenario 7, sourced by e2e.sh: a team's own worker (examples/orders: the
# built-in payment state plus an orders row and a confirmation email in the
# outbox, in the ledger row's transaction) runs on the stock chart by image
# override alone. Every signed payment_intent.succeeded event, delivered
# twice, ends as exactly one payments row, one orders row and one outbox
# message.
s7() {
  local ns=s7 rel=ie
  backing 7
  values 7 >"$NODE_DIR/s7-values.yaml"
  helm install $rel "$CHART" -n $ns --create-namespace -f "$NODE_DIR/s7-values.yaml" \
    --set image.repository=orders-worker --set image.tag=e2e --wait --timeout 5m >/dev/null || { dump $ns; return 1; }
  local url; url=$(svc_url $ns "$rel-idempotent-events-receiver")
  k8sload -url "$url" -secret "$SECRET" -database "postgres://postgres@127.0.0.1:5432/ie_k8s_s7?sslmode=disable" \
    -events 300 -dups 1 -duration 10s -run s7 >"$NODE_DIR/s7-load.log" 2>&1 || { cat "$NODE_DIR/s7-load.log" >&2; dump $ns; return 1; }
  local orders outbox
  orders=$(psql -h 127.0.0.1 -U postgres -d ie_k8s_s7 -Atc "SELECT count(*), count(DISTINCT event_id) FROM orders WHERE event_id LIKE 'evt_k8s_s7_%'")
  outbox=$(psql -h 127.0.0.1 -U postgres -d ie_k8s_s7 -Atc "SELECT count(*) FROM outbox WHERE effect = 'confirmation-email'")
  [[ $orders == "300|300" && $outbox == 300 ]] || { log "orders (rows|distinct) $orders, outbox messages $outbox, want 300|300 and 300"; return 1; }
  S7_DETAIL="image orders-worker:e2e by --set image.repository/tag only: $(tail -1 "$NODE_DIR/s7-load.log" | sed 's/^k8sload: //'); 300 orders rows, 300 confirmation-email outbox messages"
  helm uninstall $rel -n $ns --wait >/dev/null 2>&1 || true
}
t=$SECONDS
if s7; then result 7 effects-image "ok: $S7_DETAIL ($((SECONDS - t))s)"; else result 7 effects-image "FAIL: ${S7_DETAIL:-} after $((SECONDS - t))s"; fi
