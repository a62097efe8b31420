// Command orders is a team's own worker binary: the stock worker's built-in
// payment state, plus an orders row written when a payment succeeds, and a
// confirmation email asked of the mail service (examples/confirmations)
// through the outbox — all in the same transaction as the event's ledger
// row, so exactly once.
//
// Build it in place of cmd/worker (examples/orders/Dockerfile builds the
// image: the stock binaries with this worker) and run the chart with that
// image; nothing else changes.
package main

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idempotent-events/idempotent-events/pkg/effects"
	"github.com/idempotent-events/idempotent-events/pkg/payments"
	"github.com/idempotent-events/idempotent-events/pkg/service"
)

func main() {
	if len(os.Args) == 1 { // a start, not --help or --check-config
		if err := createTablesRetrying(os.Getenv("DATABASE_URL"), 2*time.Minute); err != nil {
			fmt.Fprintln(os.Stderr, "orders: create the orders table:", err)
			os.Exit(1)
		}
	}
	reg := payments.Effects() // keep the built-in payment state
	reg.HandleFunc("orders.create", "stripe", "payment_intent.succeeded", createOrder)
	os.Exit(service.Worker(reg))
}

// createOrder writes the order of a succeeded PaymentIntent and enqueues
// its confirmation email. It writes through tx and out only: both commit
// with the event's ledger row or not at all, and a redelivery of the event
// never runs it again. The email is sent by another service, after COMMIT,
// never from here.
func createOrder(ctx context.Context, ev effects.Event, tx effects.Tx, out effects.Outbox) error {
	if _, err := tx.Exec(ctx, `INSERT INTO orders (payment_intent_id, event_id) VALUES ($1, $2)`, ev.Object.ID, ev.Key); err != nil {
		return err
	}
	return out.Enqueue(ctx, ev, effects.Message{
		Effect: "confirmation-email", ObjectID: ev.Object.ID, RoutingKey: "email.confirmation",
		Body: []byte(`{"payment_intent":"` + ev.Object.ID + `"}`),
	})
}

// createTablesRetrying runs createTables until it succeeds or for as long
// as patience: a database that is restarting, or a connection cut while
// the worker starts, is waited for, as the stock worker waits for its
// dependencies, instead of ending the process.
func createTablesRetrying(databaseURL string, patience time.Duration) error {
	deadline := time.Now().Add(patience)
	for wait := 100 * time.Millisecond; ; wait = min(2*wait, 5*time.Second) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err := createTables(ctx, databaseURL)
		cancel()
		if err == nil || time.Now().Add(wait).After(deadline) {
			return err
		}
		fmt.Fprintf(os.Stderr, "orders: create the orders table: %v; trying again in %s\n", err, wait)
		time.Sleep(wait)
	}
}

// createTables is the service's own migration, run at start so that the
// stock chart runs the example unchanged (a real service has migrations of
// its own). The advisory lock keeps replicas that start together from
// racing on CREATE TABLE.
func createTables(ctx context.Context, databaseURL string) error {
	if databaseURL == "" {
		databaseURL = "postgres://postgres@127.0.0.1:5432/idempotent_events?sslmode=disable"
	}
	conn, err := pgx.Connect(ctx, databaseURL)
	if err != nil {
		return err
	}
	defer func() { _ = conn.Close(ctx) }()
	return pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtext('examples/orders'))`); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS orders (
			payment_intent_id text PRIMARY KEY,
			event_id          text NOT NULL,
			created_at        timestamptz NOT NULL DEFAULT now())`)
		return err
	})
}
