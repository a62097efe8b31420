package eventsctl_test

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotent-events/idempotent-events/pkg/effects"
	"github.com/idempotent-events/idempotent-events/pkg/internal/broker"
	"github.com/idempotent-events/idempotent-events/pkg/internal/config"
	"github.com/idempotent-events/idempotent-events/pkg/internal/eventsctl"
	"github.com/idempotent-events/idempotent-events/pkg/internal/lookup"
	"github.com/idempotent-events/idempotent-events/pkg/internal/outbox"
	"github.com/idempotent-events/idempotent-events/pkg/internal/pipelinetest"
	"github.com/idempotent-events/idempotent-events/pkg/internal/servicetest"
	"github.com/idempotent-events/idempotent-events/pkg/payments"
)

// "Where is event X, and what happened to it?" in one command, against a
// real worker, an event in each state: committed with an outbox message
// published and one parked; dead-lettered; replayed after the fix (the
// audit trail says so); unknown (exit 1). events object lists a
// PaymentIntent's events and how each was taken.
func TestEventsShowAndObject(t *testing.T) {
	t.Parallel()
	p := pipelinetest.New(t)
	// The event's handler enqueues two messages: one to a bound queue
	// (published), one to a routing key nothing binds (returned, parked
	// after one attempt).
	fx := payments.Effects()
	fx.HandleFunc("test.notify", "stripe", "payment_intent.succeeded", func(ctx context.Context, ev effects.Event, _ effects.Tx, out effects.Outbox) error {
		if ev.Key != "evt_where_ok" {
			return nil
		}
		for _, key := range []string{"test.bound", "test.nowhere"} {
			if err := out.Enqueue(ctx, ev, effects.Message{Effect: key, ObjectID: ev.Object.ID + "/" + key, RoutingKey: key, Body: []byte("{}")}); err != nil {
				return err
			}
		}
		return nil
	})
	p.Effects = fx
	p.Tune = func(c *config.Worker) { c.OutboxMaxAttempts = 1 }
	bindQueue(t, p.AMQPURL, "test.bound")
	p.StartWorker("")
	p.Block("evt_where_dlq")
	p.PublishEvent("evt_where_ok")
	p.PublishEvent("evt_where_dlq")
	p.Eventually(func() bool { return p.Depth(broker.DLQ) == 1 && p.Outcomes("processed") == 1 }, "one committed, one in the DLQ")
	p.Eventually(func() bool {
		var n int
		require.NoError(t, p.DB.QueryRow(context.Background(), `SELECT count(*) FROM outbox WHERE published_at IS NOT NULL OR parked_at IS NOT NULL`).Scan(&n))
		return n == 2
	}, "one message published, one parked")

	code, out, errOut := run(t, p, "events", "show", "-id", "evt_where_ok")
	require.Equal(t, 0, code, errOut)
	for _, want := range []string{
		"event evt_where_ok: stripe, payment_intent.succeeded",
		"ledger: committed ", "attempt 1, outcome applied",
		"handler set: generation 1 (no WORKER_RELEASE), set ", ": payments, test.notify",
		"payment state: payment_intent pi_where_ok: applied (succeeded", "the object is succeeded now",
		"test.bound -> test.bound, published ",
		"test.nowhere -> test.nowhere, PARKED ", "eventsctl outbox retry -id ",
		"queues: not in events.dlq nor a retry tier",
		"not looked at: events.main",
	} {
		assert.Contains(t, out, want)
	}

	code, out, errOut = run(t, p, "events", "show", "-id", "evt_where_dlq")
	require.Equal(t, 0, code, errOut)
	assert.Contains(t, out, "event evt_where_dlq: not in the ledger")
	assert.Contains(t, out, "DLQ: IN events.dlq as ")
	assert.Contains(t, out, "reason rejected_by_database, attempts 1")
	assert.Equal(t, 1, p.Depth(broker.DLQ), "the scan returns what it read")

	// Fixed and replayed: now committed, and the audit trail says how.
	p.Unblock()
	code, _, errOut = run(t, p, "dlq", "replay", "-event-id", "evt_where_dlq", "-operator", "alice")
	require.Equal(t, 0, code, errOut)
	p.Eventually(func() bool { return p.Outcomes("processed") == 2 }, "the replayed event processed")
	code, out, errOut = run(t, p, "events", "show", "-id", "evt_where_dlq")
	require.Equal(t, 0, code, errOut)
	assert.Contains(t, out, "ledger: committed ")
	assert.Contains(t, out, "DLQ audit: replay replayed by alice")
	assert.Contains(t, out, "queues: not in events.dlq nor a retry tier")

	code, out, errOut = run(t, p, "events", "show", "-id", "evt_where_nobody", "-json")
	assert.Equal(t, 1, code, errOut)
	var rep lookup.Event
	require.NoError(t, json.Unmarshal([]byte(out), &rep))
	assert.Nil(t, rep.Ledger)
	require.NotNil(t, rep.Queues)
	assert.Empty(t, rep.Queues.Hits)
	assert.Len(t, rep.Queues.Scanned, 2, "events.dlq and the one retry tier of RETRY_DELAYS")

	code, out, errOut = run(t, p, "events", "object", "-id", "pi_where_ok")
	require.Equal(t, 0, code, errOut)
	assert.Contains(t, out, "payment_intent pi_where_ok: succeeded since")
	assert.Contains(t, out, "evt_where_ok")
	code, out, _ = run(t, p, "events", "object", "-id", "pi_nobody")
	assert.Equal(t, 1, code)
	assert.Contains(t, out, "no payment state")

	code, _, errOut = run(t, p, "events", "show")
	assert.Equal(t, 2, code)
	assert.Contains(t, errOut, "-id is required")
}

// An event waiting in a retry tier is found there, with its attempt and
// error, and stays there (its delay is not reset by the scan).
func TestEventsShowFindsAnEventInARetryTier(t *testing.T) {
	t.Parallel()
	amqpURL := servicetest.VHost(t)
	topo := broker.Topology{QueueType: broker.QueueClassic, RetryDelays: []time.Duration{time.Second, 10 * time.Minute}, DeliveryLimit: 100}
	b := servicetest.NewBroker(t, amqpURL, topo)
	conn, err := amqp.Dial(amqpURL)
	require.NoError(t, err)
	defer func() { _ = conn.Close() }()
	ch, err := conn.Channel()
	require.NoError(t, err)
	require.NoError(t, ch.PublishWithContext(context.Background(), "", broker.RetryQueue(10*time.Minute), false, false, amqp.Publishing{
		MessageId: "evt_retrying", Body: []byte(`{"id":"evt_retrying","type":"payment_intent.succeeded"}`),
		Headers: amqp.Table{broker.HeaderAttempt: int32(2), broker.HeaderLastError: "stock service busy"},
	}))
	env := map[string]string{"AMQP_URL": amqpURL, "DATABASE_URL": servicetest.Schema(t), "RETRY_DELAYS": "1s,10m"}
	code, out, errOut := runEnv(t, env, "events", "show", "-id", "evt_retrying")
	require.Equal(t, 0, code, errOut+out)
	assert.Contains(t, out, "not in the ledger")
	assert.Contains(t, out, "retrying: IN events.retry.10m after attempt 2")
	assert.Contains(t, out, "stock service busy")
	assert.Equal(t, 1, b.Depth(broker.RetryQueue(10*time.Minute)))
}

// bindQueue declares queue q bound to routing key q on the outbox's
// exchange, so the relay's messages with that key are routable.
func bindQueue(t *testing.T, amqpURL, q string) {
	t.Helper()
	conn, err := amqp.Dial(amqpURL)
	require.NoError(t, err)
	defer func() { _ = conn.Close() }()
	ch, err := conn.Channel()
	require.NoError(t, err)
	require.NoError(t, ch.ExchangeDeclare(outbox.Exchange, "topic", true, false, false, false, nil))
	_, err = ch.QueueDeclare(q, true, false, false, false, nil)
	require.NoError(t, err)
	require.NoError(t, ch.QueueBind(q, q, outbox.Exchange, false, nil))
}

// runEnv runs `eventsctl args…` in-process with env.
func runEnv(t *testing.T, env map[string]string, args ...string) (int, string, string) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	code := eventsctl.Main(ctx, args, func(k string) string { return env[k] }, strings.NewReader(""), &stdout, &stderr)
	return code, stdout.String(), stderr.String()
}
