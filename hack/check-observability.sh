#!/usr/bin/env bash
# Checks of the operator-facing observability artifacts, offline (1-5) and live (6):
#   charts/idempotent-events/rules/idempotent-events.rules.yaml  (alert rules)
#   hack/rules-test/*.yaml                                       (their unit tests)
#   charts/idempotent-events/dashboards/*.json                   (Grafana dashboards)
#   docs/runbook.md                                              (one section per alert)
#
# 1. promtool from the pinned tools module hack/tools/k8s, built into the
#    shared tools cache by hack/tools/build.sh when missing or stale
#    (a cold build takes about 4-6 minutes and 1.8 GB of module cache).
# 2. promtool check rules, then promtool test rules.
# 3. Every alert has a severity label, summary/description/runbook_url
#    annotations, a runbook section matching its runbook_url anchor, and at
#    least one firing and one non-firing unit test.
# 4. Builds hack/dashboardcheck and runs it: JSON structure, datasource
#    variable, queries, metric names against hack/dashboardcheck/metrics.txt
#    (dashboards and the rule file), strict grafana-foundation-sdk decoding.
# 5. The dashboard queries parse as PromQL (extracted by dashboardcheck as
#    recording rules, then promtool check rules).
# 6. Live (pkg/internal/cmd/alerts): a real Prometheus and Alertmanager
#    (hack/tools/prometheus, built by hack/tools/build.sh) watch the real
#    binaries of this tree on the machine's services; every alert of the
#    rule file is induced, fires to a webhook and resolves (a table with
#    the times), and every dashboard panel's query returns data. Then the
#    negative control: the same suite with one alert's expression broken
#    must fail on that alert. IE_LIVE_ALERTS=0 skips both (reported as a
#    failure, never as a pass).
#
# Exits non-zero if any check fails; every check runs either way.
set -uo pipefail

cd "$(dirname "$0")/.."
ROOT=$PWD
BIN=${BIN:-$ROOT/bin}
GO=${GO:-go}
export GOWORK=off GOFLAGS="${GOFLAGS:-} -buildvcs=false"

RULES=charts/idempotent-events/rules/idempotent-events.rules.yaml
RUNBOOK=docs/runbook.md
shopt -s nullglob
TESTS=(hack/rules-test/*.yaml)
DASHBOARDS=(charts/idempotent-events/dashboards/*.json)
shopt -u nullglob

passed=0
failed=0
step() { printf '\n==> %s\n' "$*"; }
ok() { printf 'ok: %s\n' "$*"; passed=$((passed + 1)); }
fail() { printf 'FAIL: %s\n' "$*"; failed=$((failed + 1)); }

mkdir -p "$BIN"

# --- 1. promtool ------------------------------------------------------------
step "promtool (hack/tools/k8s, built by hack/tools/build.sh)"
have_promtool=false
PROMTOOL=$(hack/tools/build.sh --dir)/promtool
if hack/tools/build.sh promtool; then
	echo "$("$PROMTOOL" --version 2>&1 | head -1)"
	have_promtool=true
else
	fail "building promtool"
fi

# --- 2. promtool check rules / test rules -----------------------------------
step "promtool check rules $RULES"
if $have_promtool; then
	if "$PROMTOOL" check rules "$RULES"; then
		ok "promtool check rules"
	else
		fail "promtool check rules"
	fi
else
	fail "promtool check rules: no promtool"
fi

step "promtool test rules (${#TESTS[@]} files)"
if ((${#TESTS[@]} == 0)); then
	fail "no rule unit tests in hack/rules-test"
elif $have_promtool; then
	# Count what is tested, so the log says more than SUCCESS.
	groups=$(cat "${TESTS[@]}" | grep -Ec '^  - name:')
	cases=$(cat "${TESTS[@]}" | grep -Ec '^ +- eval_time:')
	if "$PROMTOOL" test rules "${TESTS[@]}"; then
		ok "promtool test rules: $groups tests, $cases alert evaluations"
	else
		fail "promtool test rules"
	fi
else
	fail "promtool test rules: no promtool"
fi

# --- 3. alert metadata, runbook sections, test coverage ---------------------
step "alert metadata, runbook sections and test coverage"
# GitHub's heading anchors: lower case, punctuation dropped, spaces to dashes.
anchors=$(sed -n 's/^#\{1,6\} \{1,\}//p' "$RUNBOOK" 2>/dev/null |
	tr '[:upper:]' '[:lower:]' | sed 's/[^a-z0-9 _-]//g; s/ /-/g')
# Per alert: name, whether it has each required field, its runbook anchor.
alerts=$(awk '
	function flush() {
		if (name != "") print name, sev, sum, desc, (anchor == "" ? "-" : anchor)
	}
	/^ *- alert: / { flush(); name = $3; sev = sum = desc = 0; anchor = "" ; next }
	/^ *severity: /    { sev = 1 }
	/^ *summary: /     { sum = 1 }
	/^ *description: / { desc = 1 }
	/^ *runbook_url: / { n = split($2, parts, "#"); anchor = (n == 2 && parts[1] ~ /docs\/runbook\.md$/) ? parts[2] : "" }
	END { flush() }
' "$RULES")
# Per alert in the tests: F when a case expects it firing, Q when quiet.
covered=$(awk '
	/alertname: / { name = $NF }
	/exp_alerts: *\[\]/ { print name, "Q"; next }
	/exp_alerts: *$/ { print name, "F" }
' "${TESTS[@]}" | sort -u)
n_alerts=0
meta_ok=true
while read -r name sev sum desc anchor; do
	[[ -z $name ]] && continue
	n_alerts=$((n_alerts + 1))
	problems=()
	[[ $sev == 1 ]] || problems+=("no severity label")
	[[ $sum == 1 ]] || problems+=("no summary annotation")
	[[ $desc == 1 ]] || problems+=("no description annotation")
	if [[ $anchor == - ]]; then
		problems+=("runbook_url does not point to docs/runbook.md#<anchor>")
	elif ! grep -qxF -- "$anchor" <<<"$anchors"; then
		problems+=("$RUNBOOK has no section with anchor #$anchor")
	fi
	grep -qxF "$name F" <<<"$covered" || problems+=("no unit test where it fires")
	grep -qxF "$name Q" <<<"$covered" || problems+=("no unit test where it stays quiet")
	if ((${#problems[@]})); then
		meta_ok=false
		printf '  %s: %s\n' "$name" "$(IFS=';'; echo "${problems[*]}")"
	fi
done <<<"$alerts"
if ((n_alerts == 0)); then
	fail "no alerts found in $RULES"
elif $meta_ok; then
	ok "$n_alerts alerts: severity, summary, description, runbook section, firing and quiet tests"
else
	fail "alert metadata / runbook / test coverage"
fi

# --- 4. dashboards ----------------------------------------------------------
step "dashboards (${#DASHBOARDS[@]} files) and metric names"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
queries=$tmp/dashboard-queries.rules.yaml
if ((${#DASHBOARDS[@]} == 0)); then
	fail "no dashboards in charts/idempotent-events/dashboards"
elif (cd hack/dashboardcheck && $GO build -o "$BIN/dashboardcheck" .); then
	if "$BIN/dashboardcheck" -metrics hack/dashboardcheck/metrics.txt -names "$RULES" \
		-promql-out "$queries" "${DASHBOARDS[@]}"; then
		ok "dashboards and metric names"
	else
		fail "dashboards and metric names"
	fi
else
	fail "building hack/dashboardcheck"
fi

step "dashboard queries parse as PromQL (promtool check rules on the extracted exprs)"
if [[ ! -s $queries ]]; then
	fail "no dashboard queries were extracted"
elif $have_promtool; then
	if "$PROMTOOL" check rules "$queries"; then
		ok "dashboard PromQL parses"
	else
		fail "dashboard PromQL"
	fi
else
	fail "dashboard PromQL: no promtool"
fi

# --- 6. live alerts and panels ---------------------------------------------
step "live: every alert induced, fired to Alertmanager and resolved; every panel's query has data (pkg/internal/cmd/alerts)"
if [[ ${IE_LIVE_ALERTS:-1} != 1 ]]; then
	fail "live alerts: skipped (IE_LIVE_ALERTS=${IE_LIVE_ALERTS})"
elif ! hack/tools/build.sh prometheus alertmanager; then
	fail "building prometheus and alertmanager"
elif ! $GO build -o "$BIN/alerts-suite" ./pkg/internal/cmd/alerts; then
	fail "building pkg/internal/cmd/alerts"
else
	TOOLS=$(hack/tools/build.sh --dir)
	# The binaries of this tree are built once, for both runs. The negative
	# control (about a minute) runs beside the suite, on a stack of its own.
	"$BIN/alerts-suite" -bin "$tmp/ie-bin" -build-only >/dev/null &&
		{ "$BIN/alerts-suite" -tools "$TOOLS" -bin "$tmp/ie-bin" -break IdempotentEventsDLQNotEmpty >"$tmp/negative.log" 2>&1 &
		  negative=$!; }
	if "$BIN/alerts-suite" -tools "$TOOLS" -bin "$tmp/ie-bin"; then
		ok "live alerts and panels"
	else
		fail "live alerts and panels"
	fi
	step "live, negative control: IdempotentEventsDLQNotEmpty's expression broken must fail the suite"
	rc=none
	if [[ -n ${negative:-} ]]; then
		wait "$negative"
		rc=$?
		cat "$tmp/negative.log"
	fi
	if [[ $rc == 1 ]] && grep -Eq '^IdempotentEventsDLQNotEmpty.* FAILED \(no firing notification' "$tmp/negative.log"; then
		ok "negative control: the broken alert failed the suite (exit 1)"
	else
		fail "negative control: exit $rc, and the broken alert was not reported FAILED"
	fi
fi

echo
echo "observability: $passed passed, $failed failed"
((failed == 0))
