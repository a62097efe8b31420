// Command benchorders is the bench's worker for the outbox comparison: the
// stock worker's payment state plus an orders row per succeeded
// PaymentIntent, written for the whole batch in one statement, and — when
// BENCH_OUTBOX=on — a confirmation message per order through the outbox,
// relayed by the worker's own relay. The same business write with and
// without the outbox prices the outbox alone (examples/orders, written for
// reading, takes one statement per order, which the comparison would
// otherwise count as the outbox's).
package main

import (
	"context"
	"fmt"
	"os"

	"github.com/jackc/pgx/v5"

	"github.com/idempotent-events/idempotent-events/pkg/effects"
	"github.com/idempotent-events/idempotent-events/pkg/payments"
	"github.com/idempotent-events/idempotent-events/pkg/service"
)

func main() {
	if len(os.Args) == 1 {
		if err := createTable(context.Background(), os.Getenv("DATABASE_URL")); err != nil {
			fmt.Fprintln(os.Stderr, "benchorders: create the orders table:", err)
			os.Exit(1)
		}
	}
	reg := payments.Effects()
	reg.Handle("orders.create", "stripe", "payment_intent.succeeded", orders{outbox: os.Getenv("BENCH_OUTBOX") == "on"})
	os.Exit(service.Worker(reg))
}

type orders struct{ outbox bool }

// Handle implements effects.Handler (the worker's one-by-one fallback).
func (o orders) Handle(ctx context.Context, ev effects.Event, tx effects.Tx, out effects.Outbox) error {
	_, err := o.HandleBatch(ctx, []effects.Event{ev}, tx, out)
	return err
}

// HandleBatch implements effects.BatchHandler: the batch's orders in one
// statement, and a message per order when the outbox is on.
func (o orders) HandleBatch(ctx context.Context, evs []effects.Event, tx effects.Tx, out effects.Outbox) ([]bool, error) {
	intents, keys := make([]string, len(evs)), make([]string, len(evs))
	for i, ev := range evs {
		intents[i], keys[i] = ev.Object.ID, ev.Key
	}
	if _, err := tx.Exec(ctx, `INSERT INTO orders (payment_intent_id, event_id) SELECT * FROM unnest($1::text[], $2::text[])`, intents, keys); err != nil {
		return nil, err
	}
	if o.outbox {
		for _, ev := range evs {
			if err := out.Enqueue(ctx, ev, effects.Message{Effect: "confirmation-email", ObjectID: ev.Object.ID,
				RoutingKey: "email.confirmation", Body: []byte(`{"payment_intent":"` + ev.Object.ID + `"}`)}); err != nil {
				return nil, err
			}
		}
	}
	return make([]bool, len(evs)), nil
}

// createTable creates the orders table of examples/orders in the bench's
// schema (DATABASE_URL names it).
func createTable(ctx context.Context, databaseURL string) error {
	conn, err := pgx.Connect(ctx, databaseURL)
	if err != nil {
		return err
	}
	defer func() { _ = conn.Close(ctx) }()
	_, err = conn.Exec(ctx, `CREATE TABLE IF NOT EXISTS orders (
		payment_intent_id text PRIMARY KEY,
		event_id          text NOT NULL,
		created_at        timestamptz NOT NULL DEFAULT now())`)
	return err
}
