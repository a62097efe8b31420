package eventsctl_test

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotent-events/idempotent-events/pkg/internal/broker"
	"github.com/idempotent-events/idempotent-events/pkg/internal/eventsctl"
	"github.com/idempotent-events/idempotent-events/pkg/internal/pipelinetest"
)

// "Where is event X, and what happened to it?" in one command, against a
// real worker: a committed event shows its ledger row, handler set and
// payment state; a dead-lettered one is found in events.dlq with its
// reason; an unknown one says so and exits 1. events object lists a
// PaymentIntent's events and how each was taken.
func TestEventsShowAndObject(t *testing.T) {
	t.Parallel()
	p := pipelinetest.New(t)
	p.StartWorker("")
	p.Block("evt_where_dlq")
	p.PublishEvent("evt_where_ok")
	p.PublishEvent("evt_where_dlq")
	p.Eventually(func() bool { return p.Depth(broker.DLQ) == 1 && p.Outcomes("processed") == 1 }, "one committed, one in the DLQ")

	code, out, errOut := run(t, p, "events", "show", "-id", "evt_where_ok")
	require.Equal(t, 0, code, errOut)
	for _, want := range []string{
		"event evt_where_ok: stripe, payment_intent.succeeded",
		"ledger: committed ", "attempt 1, outcome applied",
		"handler set: generation 1 (no WORKER_RELEASE), set ", ": payments",
		"payment state: payment_intent pi_where_ok: applied (succeeded", "the object is succeeded now",
		"DLQ: not in events.dlq (all 1 of 1 messages scanned)",
		"not looked at: events.main, the retry tiers",
	} {
		assert.Contains(t, out, want)
	}

	code, out, errOut = run(t, p, "events", "show", "-id", "evt_where_dlq")
	require.Equal(t, 0, code, errOut)
	assert.Contains(t, out, "event evt_where_dlq: not in the ledger")
	assert.Contains(t, out, "DLQ: IN events.dlq as ")
	assert.Contains(t, out, "reason rejected_by_database")
	assert.Equal(t, 1, p.Depth(broker.DLQ), "the scan returns what it read")

	code, out, errOut = run(t, p, "events", "show", "-id", "evt_where_nobody", "-json")
	assert.Equal(t, 1, code, errOut)
	var rep eventsctl.EventReport
	require.NoError(t, json.Unmarshal([]byte(out), &rep))
	assert.Nil(t, rep.Ledger)
	require.NotNil(t, rep.DLQ)
	assert.Zero(t, rep.DLQ.Matched)

	code, out, errOut = run(t, p, "events", "object", "-id", "pi_where_ok")
	require.Equal(t, 0, code, errOut)
	assert.Contains(t, out, "payment_intent pi_where_ok: succeeded since")
	assert.Contains(t, out, "evt_where_ok")
	assert.Contains(t, out, "applied")
	code, out, _ = run(t, p, "events", "object", "-id", "pi_nobody")
	assert.Equal(t, 1, code)
	assert.Contains(t, out, "no payment state")

	code, _, errOut = run(t, p, "events", "show")
	assert.Equal(t, 2, code)
	assert.Contains(t, errOut, "-id is required")
}
