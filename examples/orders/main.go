// Command orders is a team's own worker binary: the stock worker's built-in
// payment state, plus an orders row written when a payment succeeds, and a
// confirmation email asked of the mail service (examples/confirmations)
// through the outbox — all in the same transaction as the event's ledger
// row, so exactly once. A transition handler writes a receipts row once per
// PaymentIntent that succeeds, whichever event says so first.
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
	if len(os.Args) == 1 { // a start, not --help, --version or --check-config
		if err := createTablesRetrying(os.Getenv("DATABASE_URL"), 2*time.Minute); err != nil {
			fmt.Fprintln(os.Stderr, "orders: create the tables:", err)
			os.Exit(1)
		}
	}
	os.Exit(service.Worker(handlers()))
}

// handlers is the worker's handler set. The names are what the ledger
// records; keep them while the effects stay the same.
func handlers() *effects.Registry {
	reg := payments.Effects() // the built-in payment state, handler "payments"
	reg.HandleFunc("orders.create", "stripe", "payment_intent.succeeded", createOrder)
	reg.OnTransitionFunc("orders.receipt", payments.PaymentIntent, "succeeded", recordReceipt) // once per PaymentIntent
	return reg
}

// createOrder writes the order of a succeeded PaymentIntent and enqueues
// its confirmation email. It writes through tx and out only: both commit
// with the event's ledger row or not at all, and a redelivery of the event
// never runs it again. The email is sent by another service, after COMMIT,
// never from here.
func createOrder(ctx context.Context, ev effects.Event, tx effects.Tx, out effects.Outbox) error {
	if _, err := tx.Exec(ctx, `INSERT INTO orders (payment_intent_id, event_id) VALUES ($1, $2)`, ev.Object.ID, ev.Key); err != nil {
		return err // effects.Permanent(err): DLQ now; effects.RetryAfter(d, err); effects.Skip(reason)
	}
	return out.Enqueue(ctx, ev, effects.Message{Effect: "confirmation-email", ObjectID: ev.Object.ID,
		RoutingKey: "email.confirmation", Body: []byte(`{"payment_intent":"` + ev.Object.ID + `"}`)})
}

// recordReceipt writes the receipt of a PaymentIntent that succeeded. The
// built-in payment state calls it once per PaymentIntent, in the
// transaction of the event that made it succeed: payment_intent.succeeded,
// or a captured charge.succeeded that came first. It reads the amount
// received from that state, written in the same transaction.
func recordReceipt(ctx context.Context, t effects.Transition, tx effects.Tx, out effects.Outbox) error {
	_, err := tx.Exec(ctx, `INSERT INTO receipts (payment_intent_id, event_id, amount, currency)
		SELECT id, $2, amount_received, currency FROM payment_intents WHERE id = $1`, t.Object.ID, t.Event.Key)
	return err
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
		fmt.Fprintf(os.Stderr, "orders: create the tables: %v; trying again in %s\n", err, wait)
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
			created_at        timestamptz NOT NULL DEFAULT now());
		CREATE TABLE IF NOT EXISTS receipts (
			payment_intent_id text PRIMARY KEY,
			event_id          text NOT NULL,
			amount            bigint NOT NULL,
			currency          text NOT NULL,
			created_at        timestamptz NOT NULL DEFAULT now())`)
		return err
	})
}
