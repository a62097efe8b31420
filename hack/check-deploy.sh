#!/usr/bin/env bash
# Offline checks of the Kubernetes delivery: Helm chart, Dockerfile, kind
# config, Tiltfile (`make check-deploy`, part of `make test`).
#
# Needs Go (>= 1.26.8) with the Go module proxy, and Node.js + npm with the npm
# registry (step 3; CHECK_DEPLOY_SKIP_NPM=1 skips it, loudly). Everything is
# built from committed go.mod/go.sum and package-lock.json files, pinned; the
# Go tools come from the tools cache of hack/tools/build.sh (module
# hack/tools/k8s), linked into bin/ (gitignored):
#   bin/envtest/etcd, bin/envtest/kube-apiserver, bin/helm-unittest
# A tool is rebuilt only when its module files or build flags changed (a
# stamp beside it); --rebuild-tools forces it. Steps run one at a time.
#
# Checks run:
#   1. go vet + go test in hack/deploytest (see its doc.go): Helm SDK render
#      in strict mode of every charts/idempotent-events/ci/*-values.yaml scenario
#      with and without the monitoring/KEDA APIs, helm lint rules, strict
#      decode into the k8s.io/api types, property checks, values.schema.json
#      rejections, envtest server-side dry run (kube-apiserver v1.37.2,
#      FieldValidation=Strict), kind-config.yaml strict decode, Tiltfile run
#      in Starlark, BuildKit lint of the Dockerfiles, the Dockerfile's go
#      build step run as written (static binaries that start), and receiver,
#      worker and migrate --check-config with each container's environment
#      as the chart renders it (contract_test.go).
#   2. helm-unittest suites in charts/idempotent-events/tests.
#   3. kubernetes-models' OpenAPI validators (npm ci, hack/deploytest/crdcheck)
#      on the rendered scenarios: the only schema check of the CRD objects
#      (ScaledObject, TriggerAuthentication, ServiceMonitor, PrometheusRule).
# Exits non-zero on the first failing step.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
BIN="$ROOT/bin"
K8S_VERSION=v1.37.2
REBUILD=0
[[ ${1:-} == --rebuild-tools ]] && REBUILD=1

started=$SECONDS
step_start=$SECONDS
step() { printf '\n==> %s\n' "$*"; step_start=$SECONDS; }
done_step() { printf '    ok (%ds)\n' $((SECONDS - step_start)); }
fail() { printf '\ncheck-deploy: FAILED: %s\n' "$*" >&2; exit 1; }

command -v go >/dev/null || fail "go is not installed"
gover=$(go env GOVERSION)
if [[ $(printf '%s\n%s\n' "go1.26.8" "$gover" | sort -V | head -1) != go1.26.8 ]]; then
  fail "Go >= 1.26.8 needed (buildkit v0.34.2 requires it); this is $gover"
fi

step "tools from hack/tools/k8s (one pinned module; hack/tools/build.sh)"
# Built into the tools cache shared by every checkout and by make k8s-e2e
# (one build of kube-apiserver for envtest and the cluster); bin/envtest and
# bin/helm-unittest link to it, where envtest and the docs look.
[[ $REBUILD == 1 ]] && rm -f "$(hack/tools/build.sh --dir)"/.{kube,etcd,helm-unittest}.stamp
hack/tools/build.sh kube etcd helm-unittest || fail "building the tools"
TOOLS_BIN=$(hack/tools/build.sh --dir)
mkdir -p "$BIN/envtest"
ln -sfn "$TOOLS_BIN/etcd" "$BIN/envtest/etcd"
ln -sfn "$TOOLS_BIN/kube-apiserver" "$BIN/envtest/kube-apiserver"
ln -sfn "$TOOLS_BIN/helm-unittest" "$BIN/helm-unittest"
"$BIN/envtest/kube-apiserver" --version | grep -qx "Kubernetes $K8S_VERSION" || fail "kube-apiserver does not report $K8S_VERSION"
done_step

step "go vet hack/deploytest"
(cd hack/deploytest && go vet ./...) || fail "go vet hack/deploytest"
done_step

step "go test hack/deploytest (chart render/lint/decode/properties, schema, envtest dry run, kind, Tilt, Dockerfile, image build)"
log=$(mktemp)
rendered=$(mktemp -d)
trap 'rm -rf "$log" "$rendered"' EXIT
if ! (cd hack/deploytest && KUBEBUILDER_ASSETS="$BIN/envtest" DEPLOYTEST_REQUIRE_ENVTEST=1 DEPLOYTEST_RENDER_DIR="$rendered" \
  go test -count=1 -v -timeout 20m ./... >"$log" 2>&1); then
  grep -vE '^(=== (RUN|PAUSE|CONT)|\s+--- PASS)' "$log" | tail -200 >&2
  fail "go test hack/deploytest"
fi
grep -E '^--- (PASS|SKIP)' "$log" | sed 's/^/    /'
grep -E '^\s+(envtest|chart|values)_test\.go:[0-9]+: (API server|accepted|[0-9]+ keys checked)' "$log" | sed 's/^ */    /' || true
if grep -qE -- '--- SKIP' "$log"; then fail "a deploytest test was skipped"; fi
passed=$(grep -cE -- '--- PASS' "$log" || true)
failed=$(grep -cE -- '--- FAIL' "$log" || true)
printf '    %d passed, %d failed (tests and subtests)\n' "$passed" "$failed"
done_step

step "helm-unittest charts/idempotent-events"
"$BIN/helm-unittest" charts/idempotent-events || fail "helm-unittest"
done_step

step "kubernetes-models validation of the rendered scenarios (CRD kinds included)"
if [[ ${CHECK_DEPLOY_SKIP_NPM:-} == 1 ]]; then
  echo "    SKIPPED (CHECK_DEPLOY_SKIP_NPM=1): CRD objects were not schema-checked"
else
  command -v node >/dev/null && command -v npm >/dev/null ||
    fail "node and npm are needed for step 3 (or set CHECK_DEPLOY_SKIP_NPM=1)"
  (cd hack/deploytest/crdcheck && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error >/dev/null) ||
    fail "npm ci in hack/deploytest/crdcheck"
  if ! (cd hack/deploytest/crdcheck && node validate.mjs "$rendered") 2>&1 | sed 's/^/    /'; then
    fail "kubernetes-models validation"
  fi
  done_step
fi

printf '\ncheck-deploy: all checks passed in %ds\n' $((SECONDS - started))
