# shellcheck shell=bash
# Scenario 3, sourced by e2e.sh: `kubectl scale` of the worker to 3 gives
# three consumers on events.main; then the chart's KEDA mode (KEDA v2.21.0
# built from the module proxy, deployed with its own manifests) scales the
# worker up on a backlog and back down once it drains. The backlog is made
# real: a session holds an exclusive lock on processed_events, so the
# workers cannot commit while signed events arrive; the lock is released
# once KEDA has scaled up. k8sload then checks the ledger (0 lost, 0 doubled).
keda_up() {
  local keda; keda=$(keda_dir)
  # KEDA's manifests as released, with the images built here (no pull).
  kubectl kustomize "$keda/config/default" | sed 's/imagePullPolicy: Always/imagePullPolicy: IfNotPresent/' |
    kubectl apply --server-side --force-conflicts -f - >/dev/null
  # keda-operator, keda-metrics-apiserver, keda-admission.
  kubectl -n keda wait --for=condition=Available deploy --all --timeout=180s >/dev/null || { dump keda; return 1; }
  kubectl wait --for=condition=Available apiservice/v1beta1.external.metrics.k8s.io --timeout=180s >/dev/null || { dump keda; return 1; }
}

keda_down() {
  local keda; keda=$(keda_dir)
  kubectl kustomize "$keda/config/default" | kubectl delete --ignore-not-found --wait=false -f - >/dev/null 2>&1 || true
}

# replicas NS DEPLOY WANT SECONDS: wait until WANT replicas are ready; print how long it took.
replicas() {
  local t=$SECONDS r
  while ((SECONDS - t < $4)); do
    r=$(kubectl -n "$1" get deploy "$2" -o jsonpath='{.status.readyReplicas}/{.spec.replicas}')
    [[ $r == "$3/$3" ]] && { echo $((SECONDS - t)); return 0; }
    sleep 2
  done
  log "$2 at $r, wanted $3/$3"; return 1
}

consumers() { rabbitmqctl -q list_queues -p "$1" name consumers | awk '$1 == "events.main" {print $2}'; }

s3() {
  local ns=s3 rel=ie w=ie-idempotent-events-worker
  backing 3
  values 3 >"$NODE_DIR/s3-values.yaml"
  helm install $rel "$CHART" -n $ns --create-namespace -f "$NODE_DIR/s3-values.yaml" --wait --timeout 5m >/dev/null || { dump $ns; return 1; }
  kubectl -n $ns scale deploy/$w --replicas=3 >/dev/null
  local took; took=$(replicas $ns $w 3 120) || { dump $ns; return 1; }
  local c=0
  for _ in $(seq 1 30); do c=$(consumers ie-k8s-s3); [[ $c == 3 ]] && break; sleep 1; done
  [[ $c == 3 ]] || { log "events.main has $c consumers, want 3"; return 1; }
  S3_DETAIL="kubectl scale 1->3: Ready in ${took}s, events.main has 3 consumers"

  keda_up || return 1
  helm upgrade $rel "$CHART" -n $ns -f "$NODE_DIR/s3-values.yaml" --wait --timeout 5m \
    --set worker.autoscaling.enabled=true --set worker.autoscaling.mode=keda \
    --set worker.autoscaling.minReplicas=1 --set worker.autoscaling.maxReplicas=4 \
    --set worker.autoscaling.targetMessagesPerReplica=100 \
    --set worker.autoscaling.keda.pollingInterval=2 --set worker.autoscaling.keda.cooldownPeriod=5 \
    --set worker.autoscaling.behavior.scaleDown.stabilizationWindowSeconds=0 >/dev/null || { dump $ns; return 1; }
  kubectl -n $ns wait --for=condition=Ready scaledobject/$w --timeout=120s >/dev/null || { kubectl -n $ns describe scaledobject >&2; dump keda; return 1; }
  took=$(replicas $ns $w 1 180) || { kubectl -n $ns describe hpa >&2; return 1; }
  # Hold the workers' commits, then make a backlog.
  psql -h 127.0.0.1 -U postgres -d ie_k8s_s3 -qc "BEGIN; LOCK TABLE processed_events IN ACCESS EXCLUSIVE MODE; SELECT pg_sleep(600)" >/dev/null 2>&1 &
  local lock=$!
  sleep 1
  local url; url=$(svc_url $ns "$rel-idempotent-events-receiver")
  k8sload -url "$url" -secret "$SECRET" -database "postgres://postgres@127.0.0.1:5432/ie_k8s_s3?sslmode=disable" \
    -events 1500 -dups 0 -duration 10s -settle 5m -run s3 >"$NODE_DIR/s3-load.log" 2>&1 &
  local load=$!
  local up; up=$(replicas $ns $w 4 240) || { kill $lock $load; kubectl -n $ns describe hpa >&2; dump keda; return 1; }
  local ready; ready=$(rabbitmqctl -q list_queues -p ie-k8s-s3 name messages_ready | awk '$1 == "events.main" {print $2}')
  psql -h 127.0.0.1 -U postgres -d ie_k8s_s3 -qAtc "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE query LIKE '%pg_sleep(600)%' AND pid <> pg_backend_pid()" >/dev/null
  wait $lock 2>/dev/null || true
  local rc=0; wait $load || rc=$?
  [[ $rc -eq 0 ]] || { cat "$NODE_DIR/s3-load.log" >&2; return 1; }
  local down; down=$(replicas $ns $w 1 300) || { kubectl -n $ns describe hpa >&2; return 1; }
  S3_DETAIL+="; KEDA: a backlog (ledger locked; $ready messages ready) -> 4 workers in ${up}s; lock released, every event in the ledger -> back to 1 worker ${down}s later; $(tail -1 "$NODE_DIR/s3-load.log" | sed 's/^k8sload: //')"
}
t=$SECONDS
if [[ ! -x $BIN/operator ]]; then
  result 3 scale "FAIL: KEDA was not built (IE_K8S_KEDA=0)"
else
  if s3; then result 3 scale "ok: $S3_DETAIL ($((SECONDS - t))s)"; else result 3 scale "FAIL after $((SECONDS - t))s${S3_DETAIL:+ (passed before it: $S3_DETAIL)}"; fi
  helm uninstall ie -n s3 --wait >/dev/null 2>&1 || true
  keda_down
fi
