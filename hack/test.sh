#!/usr/bin/env bash
# `make test`: the whole suite, one stage after another, stopping at the first
# that fails, then a table of each stage's wall time and where its tools came
# from (printed on failure too).
#
# The pinned tools (hack/tools/build.sh: Kubernetes, etcd, KEDA, Helm,
# CoreDNS, promtool, helm-unittest, golangci-lint, stripe-mock) are built in
# the background from the start, at the lowest CPU and I/O priority, in the
# order the stages need them: on a cold machine their compilation fills the
# cores the test stages leave idle (waiting on RabbitMQ, PostgreSQL, timers,
# pods) instead of running in front of them. A stage that needs a tool the
# background has not built yet waits for that build (its lock), or builds it
# itself if the background has not reached it. IE_TOOLS_BACKGROUND=0 turns
# the background builder off.
#
#   hack/test.sh                every stage
#   hack/test.sh STAGE...       those stages only (names as in the table)
set -uo pipefail
cd "$(dirname "$0")/.."
MAKE=${MAKE:-make}

STAGES=(services deps test-go fresh-machine lint fuzz-short chaos-short check-observability check-deploy k8s-e2e)
declare -A WHAT=(
  [services]="RabbitMQ, Redis, PostgreSQL listening"
  [deps]="Debian packages: Chromium, the cluster's"
  [test-go]="go test -race ./... on the real services"
  [fresh-machine]="compose.yaml offline; make dev in a fresh Debian root"
  [lint]="gofmt, golangci-lint"
  [fuzz-short]="every fuzz target, count budgets"
  [chaos-short]="every chaos scenario, small"
  [check-observability]="alert rules, runbook, dashboards offline; live: every alert fired and resolved in a real Prometheus + Alertmanager, every panel has data"
  [check-deploy]="chart, image, envtest, helm-unittest"
  [k8s-e2e]="the chart on a real one-node cluster"
)
if [[ $# -gt 0 ]]; then
  for s in "$@"; do [[ -n ${WHAT[$s]:-} ]] || { echo "test: no stage $s (${STAGES[*]})" >&2; exit 2; }; done
  STAGES=("$@")
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/ie-test.XXXX")
BG_LOG=$work/tools-background.log
BG_PID=
T0=$SECONDS
ROWS=()

human() { local s=$1; if ((s >= 60)); then printf '%dm%02ds' $((s / 60)) $((s % 60)); else printf '%ds' "$s"; fi; }
size() { du -sh "$1" 2>/dev/null | cut -f1 || echo 0; }

gocache=$(go env GOCACHE) gomod=$(go env GOMODCACHE) tools=$(hack/tools/build.sh --dir)
CACHES="Go build cache $(size "$gocache"), module cache $(size "$gomod"), $(ls "$tools" 2>/dev/null | wc -l) tool binaries at the start"

table() {
  local rc=$1
  printf '\n%-20s %-9s %-7s %s\n' stage time result "tools (cached / built / waited for the background build)"
  printf '%s\n' "${ROWS[@]}"
  printf '%-20s %-9s\n' total "$(human $((SECONDS - T0)))"
  echo "caches: $CACHES"
  if [[ -s $work/background ]]; then
    echo "background builder: $(paste -sd, "$work/background" | sed 's/,/, /g')"
  fi
  return "$rc"
}

finish() {
  local rc=$?
  if [[ -n $BG_PID ]] && kill -0 "$BG_PID" 2>/dev/null; then
    kill -- -"$BG_PID" 2>/dev/null || kill "$BG_PID" 2>/dev/null
    wait "$BG_PID" 2>/dev/null
  fi
  table "$rc"
  rm -rf "$work"
  exit "$rc"
}
trap finish EXIT
trap 'exit 130' INT TERM

if [[ ${IE_TOOLS_BACKGROUND:-1} == 1 ]]; then
  # Its own process group, so that finish can stop the go builds under it.
  IE_TOOLS_REPORT=$work/background setsid nice -n 19 ionice -c 3 hack/tools/build.sh all >"$BG_LOG" 2>&1 &
  BG_PID=$!
fi

# The services stage may enable RabbitMQ's management plugin for the suite
# (hack/services.sh); make dev never changes a running service.
export IE_SERVICES_FOR_TESTS=1
for stage in "${STAGES[@]}"; do
  report=$work/$stage.tools
  : >"$report"
  printf '\n=== stage %s: %s\n' "$stage" "${WHAT[$stage]}"
  t=$SECONDS
  IE_TOOLS_REPORT=$report $MAKE --no-print-directory "$stage"
  rc=$?
  used=$(paste -sd, "$report" | sed 's/,/, /g')
  result=ok; ((rc == 0)) || result=FAILED
  ROWS+=("$(printf '%-20s %-9s %-7s %s' "$stage" "$(human $((SECONDS - t)))" "$result" "${used:--}")")
  if ((rc != 0)); then
    if [[ -s $BG_LOG ]] && grep -q 'failed' "$BG_LOG"; then echo "--- background tool builds:"; tail -20 "$BG_LOG"; fi
    exit "$rc"
  fi
done
