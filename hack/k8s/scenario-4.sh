# shellcheck shell=bash
# Scenario 4, sourced by e2e.sh: while k8sload sends signed events (each
# delivered twice, every non-2xx retried as Stripe would) through the
# receiver's Service, `helm upgrade` moves both Deployments from image
# e2e-1 to e2e-2, then `kubectl rollout restart` restarts the receiver and
# the worker. The ledger must end with every event exactly once: the
# preStop sleep, the receiver's drain and the worker's
# terminationGracePeriod, for real.
s4() {
  local ns=s4 rel=ie
  backing 4
  values 4 >"$NODE_DIR/s4-values.yaml"
  cat >>"$NODE_DIR/s4-values.yaml" <<'YAML'
receiver: {replicaCount: 2}
worker: {replicaCount: 2}
YAML
  helm install "$rel" "$CHART" -n $ns --create-namespace -f "$NODE_DIR/s4-values.yaml" --wait --timeout 5m >/dev/null ||
    { dump $ns; return 1; }
  local url; url=$(svc_url $ns "$rel-idempotent-events-receiver")
  k8sload -url "$url" -secret "$SECRET" -database "postgres://postgres@127.0.0.1:5432/ie_k8s_s4?sslmode=disable" \
    -events "${S4_EVENTS:-6000}" -dups 1 -duration "${S4_DURATION:-150s}" -run s4 >"$NODE_DIR/s4-load.log" 2>&1 &
  local load=$! started=$SECONDS
  sleep 10
  helm upgrade "$rel" "$CHART" -n $ns -f "$NODE_DIR/s4-values.yaml" --set image.tag=e2e-2 --wait --timeout 5m >/dev/null ||
    { dump $ns; kill $load; return 1; }
  local images; images=$(kubectl -n $ns get deploy -o jsonpath='{range .items[*]}{.spec.template.spec.containers[0].image}{" "}{end}')
  [[ $images == *e2e-2*e2e-2* && $images != *e2e-1* ]] || { log "images after upgrade: $images"; kill $load; return 1; }
  kubectl -n $ns rollout restart deploy/$rel-idempotent-events-receiver deploy/$rel-idempotent-events-worker >/dev/null
  kubectl -n $ns rollout status deploy/$rel-idempotent-events-receiver --timeout=5m >/dev/null &&
    kubectl -n $ns rollout status deploy/$rel-idempotent-events-worker --timeout=5m >/dev/null || { dump $ns; kill $load; return 1; }
  # Every upgrade and restart must have happened while events were sent.
  local into=$((SECONDS - started)) window=${S4_DURATION:-150s}
  ((into < ${window%s})) || { log "rollouts done ${into}s into a ${window} load: raise S4_DURATION"; wait $load; return 1; }
  local rc=0; wait $load || rc=$?
  S4_DETAIL=$(tail -1 "$NODE_DIR/s4-load.log")
  [[ $rc -eq 0 ]] || { cat "$NODE_DIR/s4-load.log" >&2; dump $ns; return 1; }
  local reported; reported=$(kubectl -n $ns logs deploy/$rel-idempotent-events-worker 2>/dev/null | grep -o '"version":"[^"]*"' | sort -u | tr '\n' ' ')
  S4_DETAIL="upgrade e2e-1 -> e2e-2 and 2 rollout restarts under load (all done ${into}s into ${window} of sending): ${S4_DETAIL#k8sload: } ${reported:+(worker logs: $reported)}"
}
t=$SECONDS
if s4; then result 4 rollout "ok: $S4_DETAIL ($((SECONDS - t))s)"; else result 4 rollout "FAIL: ${S4_DETAIL:-} after $((SECONDS - t))s"; fi
