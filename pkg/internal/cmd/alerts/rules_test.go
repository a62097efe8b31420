package main

import (
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const shippedRules = "../../../../charts/idempotent-events/rules/idempotent-events.rules.yaml"

const twoAlerts = `groups:
  - name: g
    rules:
      - alert: First
        expr: |
          max(idempotent_events_queue_messages) > 0
          and on ()
          absent(idempotent_events_build_info)
        for: 5m
        labels:
          severity: warning
        annotations:
          description: see idempotent_events_worker_dead_letters_total
      - alert: Second
        expr: idempotent_events_outbox_parked > 0
        for: 90s
`

func TestParseRulesReadsNamesAndFor(t *testing.T) {
	got, err := parseRules(twoAlerts)
	require.NoError(t, err)
	assert.Equal(t, []rule{{Name: "First", For: 5 * time.Minute}, {Name: "Second", For: 90 * time.Second}}, got)

	_, err = parseRules("groups: []\n")
	require.Error(t, err)
}

func TestScaleForChangesOnlyForLines(t *testing.T) {
	got, err := scaleFor(twoAlerts, 60)
	require.NoError(t, err)
	assert.Contains(t, got, "        for: 5s\n")
	assert.Contains(t, got, "        for: 2s\n", "90s/60 rounds up")
	require.NoError(t, onlyForDiffers(twoAlerts, got))
	assert.Error(t, onlyForDiffers(twoAlerts, strings.Replace(got, "> 0", "> 1", 1)), "an expression change is caught")
}

func TestScaledFor(t *testing.T) {
	assert.Equal(t, time.Duration(0), scaledFor(0, 60))
	assert.Equal(t, time.Second, scaledFor(time.Second, 60), "never below 1s")
	assert.Equal(t, 30*time.Second, scaledFor(30*time.Minute, 60))
	assert.Equal(t, 10*time.Minute, scaledFor(10*time.Minute, 1))
	assert.Equal(t, 2*time.Second, scaledFor(61*time.Second, 60), "rounded up")
}

func TestExprMetricsReadsExpressionsOnly(t *testing.T) {
	text := "# idempotent_events_queue_* are gauges\n" + twoAlerts
	assert.ElementsMatch(t, []string{"idempotent_events_queue_messages", "idempotent_events_build_info", "idempotent_events_outbox_parked"},
		exprMetrics(text))
}

func TestBreakExprTouchesOneAlertsExpression(t *testing.T) {
	got, err := breakExpr(twoAlerts, "First")
	require.NoError(t, err)
	assert.Contains(t, got, "max(idempotent_events_broken_queue_messages) > 0")
	assert.Contains(t, got, "absent(idempotent_events_broken_build_info)", "every line of a block expression")
	assert.Contains(t, got, "expr: idempotent_events_outbox_parked > 0", "the other alert is untouched")
	assert.Contains(t, got, "see idempotent_events_worker_dead_letters_total", "the annotations are untouched")

	got, err = breakExpr(twoAlerts, "Second")
	require.NoError(t, err)
	assert.Contains(t, got, "expr: idempotent_events_broken_outbox_parked > 0")
	assert.Contains(t, got, "max(idempotent_events_queue_messages) > 0")

	_, err = breakExpr(twoAlerts, "Third")
	require.Error(t, err)
}

// The shipped file is what the live suite loads: every alert has a "for:",
// and the scaled copy differs from it in those lines only.
func TestShippedRulesScale(t *testing.T) {
	b, err := os.ReadFile(shippedRules)
	require.NoError(t, err)
	rules, err := parseRules(string(b))
	require.NoError(t, err)
	require.NotEmpty(t, rules)
	scaled, err := scaleFor(string(b), forScale)
	require.NoError(t, err)
	require.NoError(t, onlyForDiffers(string(b), scaled))
	again, err := parseRules(scaled)
	require.NoError(t, err)
	require.Len(t, again, len(rules))
	for i, r := range rules {
		assert.Equal(t, scaledFor(r.For, forScale), again[i].For, r.Name)
		_, err := breakExpr(string(b), r.Name)
		assert.NoError(t, err, "every alert can be broken: %s", r.Name)
	}
}
