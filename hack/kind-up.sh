#!/usr/bin/env bash
# Create the idempotent-events development cluster on kind, with everything
# the chart's HPA needs, then build, load and install the chart and send a
# signed test event twice.
#
#   hack/kind-up.sh               # cluster + registry + monitoring + image + chart + test event
#   hack/kind-up.sh --no-install  # cluster + registry + monitoring only (then: tilt up)
#
# Needs docker, kind, kubectl and helm on PATH, and network access to the
# prometheus-community chart repository and the image registries. Idempotent:
# re-running it reuses the cluster and registry and upgrades the releases.
# Tear down with hack/kind-down.sh.
set -euo pipefail

cd "$(dirname "$0")/.."

CLUSTER=idempotent-events            # kind-config.yaml: name
REG_NAME=kind-registry
REG_PORT=5001                        # ci/kind-values.yaml: image.repository localhost:5001/...
IMAGE=localhost:${REG_PORT}/idempotent-events:dev
NAMESPACE=${NAMESPACE:-idempotent-events}
RELEASE=${RELEASE:-idempotent-events}
MONITORING_NS=monitoring
VERSION=${VERSION:-$(git describe --tags --always --dirty 2>/dev/null || echo dev)}
INSTALL=1
[[ ${1:-} == --no-install ]] && INSTALL=0

step() { printf '\n==> %s\n' "$*"; }
need() { command -v "$1" >/dev/null || { echo "kind-up: $1 is not installed" >&2; exit 1; }; }
for tool in docker kind kubectl helm; do need "$tool"; done

step "local registry ${REG_NAME} on 127.0.0.1:${REG_PORT}"
if [[ $(docker inspect -f '{{.State.Running}}' "$REG_NAME" 2>/dev/null || true) != true ]]; then
  docker run -d --restart=always -p "127.0.0.1:${REG_PORT}:5000" --network bridge --name "$REG_NAME" registry:2
fi

step "kind cluster ${CLUSTER} (kind-config.yaml)"
if ! kind get clusters | grep -qx "$CLUSTER"; then
  kind create cluster --config kind-config.yaml --wait 120s
fi
kubectl config use-context "kind-${CLUSTER}" >/dev/null

step "nodes resolve localhost:${REG_PORT} to the registry"
for node in $(kind get nodes --name "$CLUSTER"); do
  docker exec "$node" mkdir -p "/etc/containerd/certs.d/localhost:${REG_PORT}"
  printf '[host."http://%s:5000"]\n' "$REG_NAME" |
    docker exec -i "$node" cp /dev/stdin "/etc/containerd/certs.d/localhost:${REG_PORT}/hosts.toml"
done
if [[ $(docker inspect -f '{{json .NetworkSettings.Networks.kind}}' "$REG_NAME") == null ]]; then
  docker network connect kind "$REG_NAME"
fi
# Tell tools such as Tilt where the registry is (KEP-1755).
kubectl apply -f - <<YAML
apiVersion: v1
kind: ConfigMap
metadata:
  name: local-registry-hosting
  namespace: kube-public
data:
  localRegistryHosting.v1: |
    host: "localhost:${REG_PORT}"
    help: "https://kind.sigs.k8s.io/docs/user/local-registry/"
YAML

step "monitoring: kube-prometheus-stack and prometheus-adapter (namespace ${MONITORING_NS})"
helm repo add prometheus-community https://prometheus-community.github.io/helm-charts --force-update >/dev/null
helm repo update prometheus-community >/dev/null
# Prometheus picks up ServiceMonitors and PrometheusRules labelled
# release=kube-prometheus-stack (ci/kind-values.yaml sets that label), and
# Grafana's sidecar loads dashboards from ConfigMaps labelled grafana_dashboard=1.
helm upgrade --install kube-prometheus-stack prometheus-community/kube-prometheus-stack \
  --namespace "$MONITORING_NS" --create-namespace --wait --timeout 10m \
  --set alertmanager.enabled=false \
  --set grafana.sidecar.dashboards.searchNamespace=ALL
# The adapter serves the worker HPA's External metric from the rule ConfigMap
# the chart renders into this namespace (worker.autoscaling.hpa.prometheusAdapter).
helm upgrade --install prometheus-adapter prometheus-community/prometheus-adapter \
  --namespace "$MONITORING_NS" \
  --set prometheus.url=http://kube-prometheus-stack-prometheus.${MONITORING_NS}.svc \
  --set prometheus.port=9090 \
  --set rules.existing="${RELEASE}-prometheus-adapter"

if [[ $INSTALL == 0 ]]; then
  step "cluster ready; run: tilt up"
  exit 0
fi

step "image ${IMAGE} (VERSION=${VERSION})"
docker build --build-arg VERSION="$VERSION" \
  --build-arg REVISION="$(git rev-parse HEAD 2>/dev/null || echo unknown)" \
  --build-arg CREATED="$(date -u +%Y-%m-%dT%H:%M:%SZ)" \
  -t "$IMAGE" .
docker push "$IMAGE"

step "helm upgrade --install ${RELEASE} (ci/kind-values.yaml)"
kubectl create namespace "$NAMESPACE" --dry-run=client -o yaml | kubectl apply -f -
helm upgrade --install "$RELEASE" charts/idempotent-events \
  --namespace "$NAMESPACE" \
  -f charts/idempotent-events/ci/kind-values.yaml \
  --set image.tag=dev \
  --wait --timeout 10m

step "send a signed test event twice to http://127.0.0.1:8080 (NodePort 30080)"
kubectl -n "$NAMESPACE" exec "deploy/${RELEASE}-receiver" -c receiver -- \
  /usr/local/bin/eventsctl send --url http://127.0.0.1:8080 --times 2
if curl -fsS -o /dev/null http://127.0.0.1:8080/health; then
  echo "receiver reachable from the host: http://127.0.0.1:8080/webhooks/payment"
fi

step "helm test: one event sent twice is processed once"
helm test "$RELEASE" --namespace "$NAMESPACE" --logs

cat <<MSG

Done. Next:
  kubectl -n ${NAMESPACE} get pods,hpa
  kubectl get --raw /apis/external.metrics.k8s.io/v1beta1/namespaces/${NAMESPACE}/rabbitmq_queue_messages_ready
  kubectl -n ${MONITORING_NS} port-forward svc/kube-prometheus-stack-grafana 3000:80
Tear down: hack/kind-down.sh
MSG
