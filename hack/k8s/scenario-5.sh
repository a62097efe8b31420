# shellcheck shell=bash
# Scenario 5, sourced by e2e.sh: every charts/idempotent-events/ci/*-values.yaml
# installs and becomes Ready. Each is installed as it is, with the e2e
# overlay on top (the image built here and this machine's services, since
# the example hosts and registries of those files do not exist here), plus
# the Secrets the file names as existingSecret. The CRDs the files use are
# the real ones, from the module proxy: prometheus-operator's ServiceMonitor
# and PrometheusRule, KEDA's ScaledObject and TriggerAuthentication.
crds() {
  local po keda
  po=$(cd "$ROOT/hack/tools/k8s" && go mod download -json github.com/prometheus-operator/prometheus-operator@v0.85.0 | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')
  keda=$(keda_dir)
  kubectl apply --server-side -f "$po/example/prometheus-operator-crd/monitoring.coreos.com_servicemonitors.yaml" \
    -f "$po/example/prometheus-operator-crd/monitoring.coreos.com_prometheusrules.yaml" \
    -f "$keda/config/crd/bases/keda.sh_scaledobjects.yaml" -f "$keda/config/crd/bases/keda.sh_triggerauthentications.yaml" >/dev/null
  kubectl wait --for=condition=Established crd --all --timeout=60s >/dev/null
}

s5_one() { # FILE
  local f=$1 name; name=$(basename "$f" -values.yaml)
  local ns=s5-$name rel=ie
  # Its own database and vhost: the files differ in queue type, and
  # RabbitMQ refuses to redeclare a queue with other arguments.
  local db=ie_k8s_s5_${name//-/_} vh=ie-k8s-s5-$name
  rabbitmqctl -q delete_vhost "$vh" >/dev/null 2>&1 || true
  rabbitmqctl -q add_vhost "$vh" >/dev/null
  rabbitmqctl -q set_permissions -p "$vh" guest '.*' '.*' '.*' >/dev/null
  kubectl delete ns $ns --ignore-not-found --timeout=180s >/dev/null
  kubectl create ns $ns >/dev/null
  psql -h 127.0.0.1 -U postgres -qc "DROP DATABASE IF EXISTS $db WITH (FORCE)" -c "CREATE DATABASE $db"
  kubectl -n $ns create secret generic payments-rabbitmq --from-literal=uri="amqp://guest:guest@$GATEWAY:5672/$vh" >/dev/null
  kubectl -n $ns create secret generic payments-postgres \
    --from-literal=DATABASE_URL="postgres://postgres@$GATEWAY:5432/$db?sslmode=disable" >/dev/null
  kubectl -n $ns create secret generic stripe-webhook --from-literal=signing-secrets="$SECRET" >/dev/null
  kubectl -n $ns create secret generic github-webhook --from-literal=secret=github-e2e-secret >/dev/null
  # Namespaces the files name for other parts of a cluster: the ingress
  # controller's (NetworkPolicy) and the monitoring stack's (the
  # prometheus-adapter rules and the Grafana dashboard ConfigMaps).
  for other in ingress-nginx monitoring; do
    kubectl create ns $other --dry-run=client -o yaml | kubectl apply -f - >/dev/null
  done
  values 5 | sed -e "s#/ie_k8s_s5?#/$db?#" -e "s#5672/ie-k8s-s5\"#5672/$vh\"#" >"$NODE_DIR/s5-$name-overlay.yaml"
  cat >>"$NODE_DIR/s5-$name-overlay.yaml" <<YAML
image: {repository: idempotent-events, tag: e2e-1, pullPolicy: IfNotPresent, digest: ""}
YAML
  if ! helm install $rel "$CHART" -n $ns -f "$f" -f "$NODE_DIR/s5-$name-overlay.yaml" --wait --timeout 4m >"$NODE_DIR/s5-$name.log" 2>&1; then
    cat "$NODE_DIR/s5-$name.log" >&2; dump $ns; return 1
  fi
  ready $ns || { dump $ns; return 1; }
  local kinds; kinds=$(helm get manifest $rel -n $ns | sed -n 's/^kind: //p' | sort | uniq -c | awk '{printf "%s%s ", $2, ($1>1?"x"$1:"")}')
  echo "$name [$kinds]"
}

s5() {
  backing 5
  crds
  local f line ok=0 failed=()
  S5_DETAIL=""
  for f in "$CHART"/ci/*-values.yaml; do
    if line=$(s5_one "$f"); then ok=$((ok + 1)); log "  s5 ${line}"; S5_DETAIL+="${line%% *} "; else failed+=("$(basename "$f")"); fi
    helm uninstall ie -n "s5-$(basename "$f" -values.yaml)" --wait --timeout 2m >/dev/null 2>&1 || true
  done
  S5_DETAIL="$ok of $(ls "$CHART"/ci/*-values.yaml | wc -l) ci values files installed and Ready: $S5_DETAIL"
  [[ ${#failed[@]} -eq 0 ]] || { S5_DETAIL+="; failed: ${failed[*]}"; return 1; }
}
t=$SECONDS
if s5; then result 5 ci-values "ok: $S5_DETAIL ($((SECONDS - t))s)"; else result 5 ci-values "FAIL: $S5_DETAIL after $((SECONDS - t))s"; fi
