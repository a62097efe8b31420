package main

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idempotent-events/idempotent-events/pkg/effects"
	"github.com/idempotent-events/idempotent-events/pkg/effects/effectstest"
	"github.com/idempotent-events/idempotent-events/pkg/payments"
)

// The handler alone, in a rolled-back transaction: one order per
// succeeded PaymentIntent.
func TestASucceededPaymentMakesAnOrder(t *testing.T) {
	t.Parallel()
	db := effectstest.DB(t, setup)
	reg := payments.Effects()
	reg.HandleFunc("orders.create", "stripe", "payment_intent.succeeded", createOrder)
	ev := effectstest.Event(t, effectstest.StripeEvent(t, "evt_order_1", "payment_intent.succeeded", time.Now(),
		effectstest.PaymentIntent("pi_order_1", "succeeded", 2500)))
	require.NoError(t, effectstest.Handle(t, db, reg, ev, func(tx effects.Tx) {
		var pi string
		require.NoError(t, tx.QueryRow(context.Background(), `SELECT payment_intent_id FROM orders WHERE event_id = 'evt_order_1'`).Scan(&pi))
		require.Equal(t, "pi_order_1", pi)
	}))
}

// Under duplicates and crashes, the orders table ends as after one clean
// run.
func TestOrdersAreWrittenExactlyOnce(t *testing.T) {
	t.Parallel()
	reg := payments.Effects()
	reg.HandleFunc("orders.create", "stripe", "payment_intent.succeeded", createOrder)
	var fixtures [][]byte
	for _, id := range []string{"1", "2", "3", "4", "5"} {
		fixtures = append(fixtures, effectstest.StripeEvent(t, "evt_o_"+id, "payment_intent.succeeded", time.Now(),
			effectstest.PaymentIntent("pi_o_"+id, "succeeded", 2500)))
	}
	effectstest.AssertExactlyOnce(t, effectstest.Options{
		Effects: reg, Fixtures: fixtures, Setup: setup,
		Tables: []string{"orders", "payments", "payment_intents", "outbox"},
		Ignore: []string{"id", "created_at", "updated_at", "status_event_id", "next_attempt_at"},
	})
}

// setup creates the example's table in a test's schema, as main does.
func setup(ctx context.Context, db *pgxpool.Pool) error {
	return createTables(ctx, db.Config().ConnString())
}
