package eventsctl_test

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/idempotent-events/idempotent-events/pkg/internal/broker"
	"github.com/idempotent-events/idempotent-events/pkg/internal/config"
	"github.com/idempotent-events/idempotent-events/pkg/internal/dlq"
	"github.com/idempotent-events/idempotent-events/pkg/internal/eventsctl"
	"github.com/idempotent-events/idempotent-events/pkg/internal/pipelinetest"
)

// Every goroutine a test starts must be stopped by the time it ends.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// run runs `eventsctl args…` in-process against p's vhost and schema.
func run(t *testing.T, p *pipelinetest.Pipeline, args ...string) (int, string, string) {
	t.Helper()
	env := map[string]string{"AMQP_URL": p.AMQPURL, "DATABASE_URL": p.DBURL, "USER": "root-shell", "RETRY_DELAYS": config.Durations(p.Topo.RetryDelays).String()}
	var stdout, stderr bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	code := eventsctl.Main(ctx, args, func(k string) string { return env[k] }, strings.NewReader(""), &stdout, &stderr)
	return code, stdout.String(), stderr.String()
}

// The scenario with the CLI against a real worker: poisoned events
// in the DLQ, listed and filtered; a dry run that changes nothing; the cause
// fixed and the events replayed, each processed exactly once; a replay of a
// processed event is a duplicate; the poison discarded and audited.
func TestEventsctlDLQReplaysAfterTheFixAndAudits(t *testing.T) {
	t.Parallel()
	p := pipelinetest.New(t)
	p.StartWorker("")
	p.Block("evt_cli1", "evt_cli2")
	for _, id := range []string{"evt_cli1", "evt_cli2", "evt_cli_ok"} {
		p.PublishEvent(id)
	}
	p.Publish("", "", []byte(`{"id":"evt_cli_poison"}`))
	p.Eventually(func() bool { return p.Depth(broker.DLQ) == 3 && p.Outcomes("processed") == 1 }, "two rejected events and a poison in the DLQ")

	code, out, errOut := run(t, p, "dlq", "list")
	require.Equal(t, 0, code, errOut)
	for _, want := range []string{"evt_cli1", "evt_cli2", "evt_cli_poison", "rejected_by_database", "invalid_payload", "3 matching (3 shown); scanned 3 of 3"} {
		assert.Contains(t, out, want)
	}
	code, out, errOut = run(t, p, "dlq", "list", "-reason", "rejected_by_database", "-type", "payment_intent.*", "-json")
	require.Equal(t, 0, code, errOut)
	var l dlq.Listing
	require.NoError(t, json.Unmarshal([]byte(out), &l))
	require.Len(t, l.Messages, 2)
	ids := map[string]string{}
	for _, m := range l.Messages {
		ids[m.EventID] = m.ID
	}

	code, out, errOut = run(t, p, "dlq", "show", ids["evt_cli1"])
	require.Equal(t, 0, code, errOut)
	assert.Contains(t, out, "rejected by the test")
	assert.Contains(t, out, `"id": "evt_cli1"`)
	code, _, errOut = run(t, p, "dlq", "show", "ffffffffffffffff")
	assert.Equal(t, 1, code)
	assert.Contains(t, errOut, "not found")

	// Mutations need a selection and the audit trail.
	code, _, errOut = run(t, p, "dlq", "replay")
	assert.Equal(t, 2, code)
	assert.Contains(t, errOut, "select messages")
	code, _, _ = run(t, p, "dlq", "discard", "-all", "-database-url", "")
	assert.Equal(t, 2, code)

	code, out, errOut = run(t, p, "dlq", "replay", "-reason", "rejected_by_database", "-dry-run", "-operator", "alice")
	require.Equal(t, 0, code, errOut)
	assert.Equal(t, 2, strings.Count(out, "would replay"), out)
	assert.Contains(t, out, "dry run: 2 would be replayed")
	assert.Equal(t, 3, p.Depth(broker.DLQ), "a dry run moves nothing")

	// Fix the cause, then replay: one by id (positional), one by filter.
	p.Unblock()
	code, out, errOut = run(t, p, "dlq", "replay", ids["evt_cli1"], "-operator", "alice", "-rate", "50")
	require.Equal(t, 0, code, errOut)
	assert.Contains(t, out, "1 replayed, 0 failed")
	code, out, errOut = run(t, p, "dlq", "replay", "-event-id", "evt_cli2")
	require.Equal(t, 0, code, errOut)
	assert.Contains(t, out, "1 replayed, 0 failed")
	p.Eventually(func() bool { return p.Outcomes("processed") == 3 }, "both replayed events processed")
	for _, id := range []string{"evt_cli1", "evt_cli2", "evt_cli_ok"} {
		payments, ledger := p.Rows(id)
		assert.Equal(t, 1, payments, id)
		assert.Equal(t, 1, ledger, id)
	}
	code, _, errOut = run(t, p, "dlq", "replay", ids["evt_cli1"], "-operator", "alice")
	assert.Equal(t, 1, code, "it is no longer in the DLQ")
	assert.Contains(t, errOut, "not in events.dlq: "+ids["evt_cli1"])

	// A processed event's stale DLQ copy: its replay is a duplicate.
	stale := p.PutInDLQ("evt_cli_ok", "retries_exhausted", p.Event("evt_cli_ok"), time.Now())
	code, _, errOut = run(t, p, "dlq", "replay", "-id", stale, "-operator", "alice")
	require.Equal(t, 0, code, errOut)
	p.Eventually(func() bool { return p.Outcomes("duplicate") == 1 }, "a duplicate, never a double")
	payments, _ := p.Rows("evt_cli_ok")
	assert.Equal(t, 1, payments)

	// Discard the poison: audited with who, when, what and the outcome.
	code, out, errOut = run(t, p, "dlq", "discard", "-reason", "invalid_payload", "-operator", "bob")
	require.Equal(t, 0, code, errOut)
	assert.Contains(t, out, "1 discarded, 0 failed")
	assert.Equal(t, 0, p.Depth(broker.DLQ))
	code, out, errOut = run(t, p, "dlq", "audit", "-limit", "10")
	require.Equal(t, 0, code, errOut)
	assert.Contains(t, out, "bob")
	assert.Contains(t, out, "discarded")

	rows := p.Audit()
	require.Len(t, rows, 6)
	assert.Equal(t, []string{"would_replay", "would_replay", "replayed", "replayed", "replayed", "discarded"},
		[]string{rows[0].Outcome, rows[1].Outcome, rows[2].Outcome, rows[3].Outcome, rows[4].Outcome, rows[5].Outcome})
	assert.Equal(t, "root-shell", rows[3].Operator, "$USER when neither -operator nor $DLQ_OPERATOR is given")
	last := rows[5]
	assert.Equal(t, "bob", last.Operator)
	assert.Equal(t, "cli", last.Via)
	assert.Equal(t, "discard", last.Action)
	assert.Equal(t, "evt_cli_poison", last.EventID)
	assert.JSONEq(t, `{"id":"evt_cli_poison"}`, string(last.Payload))
	p.Invariant()
}

func TestEventsctlDLQUsage(t *testing.T) {
	var stdout, stderr bytes.Buffer
	code := eventsctl.Main(context.Background(), []string{"dlq", "-h"}, func(string) string { return "" }, nil, &stdout, &stderr)
	assert.Equal(t, 0, code)
	assert.Contains(t, stdout.String(), "eventsctl dlq replay")
	code = eventsctl.Main(context.Background(), []string{"dlq", "purge"}, func(string) string { return "" }, nil, &stdout, &stderr)
	assert.Equal(t, 2, code)
	stdout.Reset()
	eventsctl.Main(context.Background(), []string{"help"}, func(string) string { return "" }, nil, &stdout, &stderr)
	assert.Contains(t, stdout.String(), "eventsctl dlq <command>")
}
