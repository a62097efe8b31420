# shellcheck shell=bash
# Scenario 9, sourced by e2e.sh: effects that survive a deploy. The stock
# chart runs under signed load; `helm upgrade` then moves the workers to a
# team's own image (examples/orders: the stock payment state plus an orders
# row per succeeded payment) with a surge, so old and new pods consume
# events.main together. The migration hook announces the new release: from
# its COMMIT on, the old pods' handler set is not current and they commit
# nothing. Every event accepted after the announcement must have exactly
# one orders row, no event of the old set may be committed after it, the
# ledger must end with every event once (k8sload) and nothing in the DLQ.
# Then `eventsctl effects backfill` runs orders.create, in the new pods, over
# the events the stock set committed (the archive is on): every succeeded
# payment ends with exactly one orders row, and a second run queues nothing.
# Then `helm rollback`: the old release is announced again, the stock set is
# current, and the events sent after it are committed by it.
S9_DB=ie_k8s_s9
s9_psql() { psql -h 127.0.0.1 -U postgres -d $S9_DB -Atc "$1"; }

# s9_current SET_NAME_PATTERN: the newest generation runs a handler set
# whose handlers match (orders.create or not).
s9_newest() { s9_psql "SELECT release || '|' || coalesce(set_id, '') FROM handler_generations ORDER BY generation DESC LIMIT 1"; }

s9() {
  local ns=s9 rel=ie w=ie-idempotent-events-worker url load started
  backing 9
  values 9 >"$NODE_DIR/s9-values.yaml"
  cat >>"$NODE_DIR/s9-values.yaml" <<'YAML'
worker:
  replicaCount: 2
  config:
    eventArchive: true
YAML
  helm install $rel "$CHART" -n $ns --create-namespace -f "$NODE_DIR/s9-values.yaml" --wait --timeout 5m >/dev/null ||
    { dump $ns; return 1; }
  url=$(svc_url $ns "$rel-idempotent-events-receiver")
  k8sload -url "$url" -secret "$SECRET" -database "postgres://postgres@127.0.0.1:5432/$S9_DB?sslmode=disable" \
    -events "${S9_EVENTS:-3000}" -dups 1 -duration "${S9_DURATION:-90s}" -run s9 >"$NODE_DIR/s9-load.log" 2>&1 &
  load=$! started=$SECONDS
  sleep 10
  helm upgrade $rel "$CHART" -n $ns -f "$NODE_DIR/s9-values.yaml" --set image.repository=orders-worker --set image.tag=e2e \
    --wait --timeout 5m >/dev/null || { dump $ns; kill $load; return 1; }
  kubectl -n $ns rollout status deploy/$w --timeout=5m >/dev/null || { dump $ns; kill $load; return 1; }
  local into=$((SECONDS - started)) window=${S9_DURATION:-90s}
  ((into < ${window%s})) || { log "upgrade done ${into}s into a ${window} load: raise S9_DURATION"; wait $load; return 1; }
  local rc=0; wait $load || rc=$?
  [[ $rc -eq 0 ]] || { cat "$NODE_DIR/s9-load.log" >&2; dump $ns; return 1; }
  S9_DETAIL="stock -> orders-worker under load: $(tail -1 "$NODE_DIR/s9-load.log" | sed 's/^k8sload: //')"

  local gens announced after missing late dlq
  gens=$(s9_psql "SELECT string_agg(generation || ':' || release || ':' || coalesce(handlers::text, 'announced'), ' ' ORDER BY generation) FROM handler_generations")
  [[ $(s9_psql "SELECT count(*) FROM handler_generations WHERE release = 'ie-2' AND handlers @> '[{\"name\": \"orders.create\"}]'") == 1 ]] ||
    { log "no generation of release ie-2 runs orders.create: $gens"; return 1; }
  announced=$(s9_psql "SELECT announced_at FROM handler_generations WHERE release = 'ie-2'")
  after=$(s9_psql "SELECT count(*) FROM processed_events WHERE received_at > '$announced' AND event_type = 'payment_intent.succeeded'")
  missing=$(s9_psql "SELECT count(*) FROM processed_events p WHERE p.received_at > '$announced' AND p.event_type = 'payment_intent.succeeded'
    AND (SELECT count(*) FROM orders o WHERE o.event_id = p.event_id) <> 1")
  late=$(s9_psql "SELECT count(*) FROM processed_events p JOIN handler_generations g USING (generation)
    WHERE NOT g.handlers @> '[{\"name\": \"orders.create\"}]' AND p.processed_at > '$announced'")
  ((after > 0)) || { log "no event was accepted after the announcement ($announced): the load ended too early"; return 1; }
  [[ $missing == 0 && $late == 0 ]] ||
    { log "accepted after the announcement: $after, without exactly one orders row: $missing; committed by the stock set after it: $late"; dump $ns; return 1; }
  dlq=$(rabbitmqctl -q list_queues -p ie-k8s-s9 name messages | awk '$1 == "events.dlq" {print $2}')
  [[ ${dlq:-0} == 0 ]] || { log "events.dlq holds $dlq messages"; return 1; }
  S9_DETAIL+="; $after events accepted after the new release was announced, each with one orders row; 0 committed by the stock set after it; DLQ empty"

  # The backfill: orders.create over the events the stock set committed
  # before the upgrade (their bodies archived: worker.config.eventArchive),
  # run by the orders-worker pods; then every succeeded payment of the
  # ledger has exactly one orders row. A second run queues nothing.
  local db="postgres://postgres@127.0.0.1:5432/$S9_DB?sslmode=disable" stockrows queued
  stockrows=$(s9_psql "SELECT count(*) FROM processed_events p JOIN handler_generations g USING (generation)
    WHERE NOT g.handlers @> '[{\"name\": \"orders.create\"}]' AND p.event_type = 'payment_intent.succeeded'")
  ((stockrows > 0)) || { log "the stock set committed no payment_intent.succeeded before the upgrade: nothing to backfill"; return 1; }
  "$BIN/eventsctl" effects backfill -handler orders.create -since 2h -rate 500 -progress 5s -database-url "$db" >"$NODE_DIR/s9-backfill.log" 2>&1 ||
    { cat "$NODE_DIR/s9-backfill.log" >&2; dump $ns; return 1; }
  queued=$(sed -n 's/^backfill [0-9]*: \([0-9]*\) events queued.*/\1/p' "$NODE_DIR/s9-backfill.log")
  missing=$(s9_psql "SELECT count(*) FROM processed_events p WHERE p.event_type = 'payment_intent.succeeded'
    AND (SELECT count(*) FROM orders o WHERE o.event_id = p.event_id) <> 1")
  [[ $missing == 0 && $queued == "$stockrows" ]] ||
    { cat "$NODE_DIR/s9-backfill.log" >&2; log "backfill: $stockrows committed by the stock set, $queued queued; succeeded payments without exactly one orders row: $missing"; return 1; }
  "$BIN/eventsctl" effects backfill -handler orders.create -since 2h -database-url "$db" >"$NODE_DIR/s9-backfill2.log" 2>&1 &&
    grep -q '^backfill [0-9]*: 0 events queued' "$NODE_DIR/s9-backfill2.log" ||
    { cat "$NODE_DIR/s9-backfill2.log" >&2; log "backfill run twice queued again"; return 1; }
  S9_DETAIL+="; eventsctl effects backfill: the $stockrows succeeded payments the stock set committed got their orders row from the orders-worker pods ($(tail -1 "$NODE_DIR/s9-backfill.log" | sed 's/^backfill [0-9]* //')); every succeeded payment has exactly one; a second run queued nothing"

  # The rollback: revision 1's hook announces ie-1 again; the stock set is current.
  helm rollback $rel 1 -n $ns --wait --timeout 5m >/dev/null || { dump $ns; return 1; }
  kubectl -n $ns rollout status deploy/$w --timeout=5m >/dev/null || { dump $ns; return 1; }
  [[ $(s9_newest) == ie-1\|?* ]] || { log "after the rollback the newest generation is $(s9_newest), want release ie-1 with its set"; return 1; }
  k8sload -url "$url" -secret "$SECRET" -database "postgres://postgres@127.0.0.1:5432/$S9_DB?sslmode=disable" \
    -events 300 -dups 1 -duration 10s -run s9r >"$NODE_DIR/s9r-load.log" 2>&1 || { cat "$NODE_DIR/s9r-load.log" >&2; dump $ns; return 1; }
  local stock orders
  stock=$(s9_psql "SELECT count(*) FROM processed_events p JOIN handler_generations g USING (generation)
    WHERE p.event_id LIKE 'evt_k8s_s9r_%' AND g.release = 'ie-1' AND g.generation = (SELECT max(generation) FROM handler_generations)")
  orders=$(s9_psql "SELECT count(*) FROM orders WHERE event_id LIKE 'evt_k8s_s9r_%'")
  [[ $stock == 300 && $orders == 0 ]] || { log "after the rollback: $stock of 300 events committed by the rolled-back stock set, $orders orders rows (want 300, 0)"; return 1; }
  S9_DETAIL+="; helm rollback: ie-1 announced again as the newest generation, $(tail -1 "$NODE_DIR/s9r-load.log" | sed 's/^k8sload: //'), all 300 committed by the stock set, no orders rows"
  helm uninstall $rel -n $ns --wait >/dev/null 2>&1 || true
}
t=$SECONDS
if s9; then result 9 effects-rollout "ok: $S9_DETAIL ($((SECONDS - t))s)"; else result 9 effects-rollout "FAIL: ${S9_DETAIL:-} after $((SECONDS - t))s"; fi
