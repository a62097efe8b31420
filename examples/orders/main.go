// Command orders is a team's own worker binary: the stock worker's built-in
// payment state, plus an orders row written when a payment succeeds, in the
// same transaction as the event's ledger row, so exactly once.
//
// Build it in place of cmd/worker (examples/orders/Dockerfile builds the
// image: the stock binaries with this worker) and run the chart with that
// image; nothing else changes.
package main

import (
	"context"
	"os"

	"github.com/idempotent-events/idempotent-events/pkg/effects"
	"github.com/idempotent-events/idempotent-events/pkg/payments"
	"github.com/idempotent-events/idempotent-events/pkg/service"
)

func main() {
	reg := payments.Effects() // keep the built-in payment state
	reg.HandleFunc("stripe", "payment_intent.succeeded", createOrder)
	os.Exit(service.Worker(reg))
}

// createOrder writes the order of a succeeded PaymentIntent. It writes
// through tx only: its row commits with the event's ledger row or not at
// all, and a redelivery of the event never runs it again.
func createOrder(ctx context.Context, ev effects.Event, tx effects.Tx, _ effects.Outbox) error {
	if _, err := tx.Exec(ctx, createTable); err != nil {
		return err
	}
	_, err := tx.Exec(ctx, `INSERT INTO orders (payment_intent_id, event_id) VALUES ($1, $2)`, ev.Object.ID, ev.Key)
	return err
}

// createTable is the orders table. A real service creates it with its own
// migrations; the example creates it on first use so that the stock chart
// runs it unchanged.
const createTable = `CREATE TABLE IF NOT EXISTS orders (
	payment_intent_id text PRIMARY KEY,
	event_id          text NOT NULL,
	created_at        timestamptz NOT NULL DEFAULT now())`
