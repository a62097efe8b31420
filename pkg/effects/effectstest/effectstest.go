// Package effectstest tests effects handlers against a real PostgreSQL (and,
// for AssertExactlyOnce, the real RabbitMQ and Redis), the way the worker
// runs them.
//
//   - Event turns a provider's event body into the effects.Event a handler
//     gets.
//   - Handle runs a registry's handlers on one event in a transaction that
//     is rolled back when the check is done: a unit test of the handler's
//     writes, nothing left behind.
//   - AssertExactlyOnce runs the real worker twice on the fixtures: once
//     cleanly, once delivering every fixture twice at once and killing the
//     processing before COMMIT and again after COMMIT but before the ack,
//     and asserts the handler's tables end the same. A handler that writes
//     through anything but the transaction it is given fails it.
//   - AssertRollout runs a rollout from one handler set to the next as a
//     rolling deploy does (old and new workers on one queue after the new
//     release is announced) and asserts that every event sent during it is
//     committed by the new set, none by the old one after the announcement.
//
// The services are found through TEST_DATABASE_URL, TEST_AMQP_URL,
// TEST_REDIS_URL and TEST_RABBITMQ_API (RabbitMQ's management API), each
// defaulting to the local service. Each test gets its own PostgreSQL schema
// (the project's migrations applied), RabbitMQ vhost and Redis key prefix,
// all removed when it ends, so tests may run in parallel.
package effectstest

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idempotent-events/idempotent-events/pkg/effects"
	"github.com/idempotent-events/idempotent-events/pkg/internal/event"
	"github.com/idempotent-events/idempotent-events/pkg/internal/outbox"
	"github.com/idempotent-events/idempotent-events/pkg/internal/servicetest"
)

// Event returns the effects.Event the worker makes of body, a Stripe
// event as the provider sends it, delivered to the default source.
func Event(t testing.TB, body []byte) effects.Event {
	t.Helper()
	ev, err := event.Decode(body)
	require.NoError(t, err, "not an event the worker would accept")
	return effects.Event{Source: event.DefaultSource, ID: ev.ID, Key: ev.ID, Type: ev.Type, Created: ev.Created,
		Object: effects.Object{Type: ev.Object.Type, ID: ev.Object.ID}, Raw: body, Attempt: 1, Origin: effects.OriginWebhook}
}

// DB returns a pool on a schema of its own for t, with the project's
// migrations applied (and setup, when given, run on it for the handler's
// own tables). The schema is dropped when t ends.
func DB(t testing.TB, setup func(ctx context.Context, db *pgxpool.Pool) error) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), servicetest.Schema(t))
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	if setup != nil {
		require.NoError(t, setup(context.Background(), pool), "setup")
	}
	return pool
}

// Handle runs the handlers reg has for ev in a transaction on db, as the
// worker would after writing ev's ledger row (messages they enqueue go to
// the outbox table, in the same transaction), then calls check with the
// same transaction (to read what the handlers wrote) and rolls it back. It
// returns what the handlers returned; a panic is returned as an error.
func Handle(t testing.TB, db *pgxpool.Pool, reg *effects.Registry, ev effects.Event, check func(tx effects.Tx)) (err error) {
	t.Helper()
	ctx := context.Background()
	tx, err := db.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, `INSERT INTO processed_events (event_id, source, event_type, payload_sha256, attempt)
		VALUES ($1, $2, $3, $4, $5)`, ev.Key, ev.Source, ev.Type, digest(ev.Raw), max(ev.Attempt, 1))
	require.NoError(t, err, "ledger row of %s", ev.Key)
	func() {
		defer func() {
			if r := recover(); r != nil {
				err = fmt.Errorf("panic: %v", r)
			}
		}()
		_, err = reg.Apply(ctx, []effects.Event{ev}, tx, outbox.Writer{Tx: tx})
	}()
	if check != nil {
		check(pgxTx{tx})
	}
	return err
}

// pgxTx narrows a pgx.Tx to effects.Tx, as the worker does.
type pgxTx struct{ pgx.Tx }

func digest(b []byte) []byte {
	sum := sha256.Sum256(b)
	return sum[:]
}

// errCrash is what the fault hooks return: the worker takes it for its own
// death at that point.
var errCrash = errors.New("effectstest: simulated crash")

// waitFor polls cond until it holds or the timeout passes.
func waitFor(t testing.TB, timeout time.Duration, cond func() bool, msg string, args ...any) {
	t.Helper()
	require.Eventually(t, cond, timeout, 20*time.Millisecond, append([]any{msg}, args...)...)
}

// StripeEvent returns the body of a Stripe event with id and type typ
// about object (its "object" and "id" fields name it), created at created:
// a fixture for Event, Handle and AssertExactlyOnce.
func StripeEvent(t testing.TB, id, typ string, created time.Time, object map[string]any) []byte {
	t.Helper()
	b, err := json.Marshal(map[string]any{"id": id, "object": "event", "api_version": "2024-06-20", "type": typ,
		"created": created.Unix(), "livemode": false, "pending_webhooks": 1, "data": map[string]any{"object": object}})
	require.NoError(t, err)
	return b
}

// PaymentIntent is a PaymentIntent object for StripeEvent: id, status, and
// an amount of amount in usd (all received when the status is succeeded).
func PaymentIntent(id, status string, amount int64) map[string]any {
	received := int64(0)
	if status == "succeeded" {
		received = amount
	}
	return map[string]any{"id": id, "object": "payment_intent", "status": status, "amount": amount,
		"amount_received": received, "currency": "usd"}
}
