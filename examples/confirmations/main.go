// Command confirmations is a downstream service of a team's own: it takes
// the confirmation emails examples/orders enqueues (routing key
// email.confirmation on the outbox's "effects" exchange) and "sends" each
// exactly once — here, a row of sent_emails — with the consumer kit: the
// row and the message's ledger row commit together, the ack follows COMMIT,
// and a redelivered message is acked without a second email.
//
// Environment: AMQP_URL, DATABASE_URL (defaults: the local services, as the
// other binaries), CONFIRMATIONS_QUEUE (default confirmation-emails).
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idempotent-events/idempotent-events/pkg/consumer"
	"github.com/idempotent-events/idempotent-events/pkg/effects"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "confirmations:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context) error {
	db, err := pgxpool.New(ctx, env("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/idempotent_events?sslmode=disable"))
	if err != nil {
		return err
	}
	defer db.Close()
	// The tables are created at start; a database that is restarting, or
	// a connection cut meanwhile, is waited for rather than fatal.
	var c *consumer.Consumer
	for wait := 100 * time.Millisecond; ; wait = min(2*wait, 5*time.Second) {
		if _, err = db.Exec(ctx, createTable); err == nil {
			c, err = consumer.New(ctx, consumer.Options{
				Name: "confirmations", AMQPURL: env("AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/"),
				Queue: env("CONFIRMATIONS_QUEUE", "confirmation-emails"), RoutingKeys: []string{"email.confirmation"},
				DB: db, BatchHandler: sendEmails,
			})
		}
		if err == nil {
			break
		}
		fmt.Fprintf(os.Stderr, "confirmations: start: %v; trying again in %s\n", err, wait)
		select {
		case <-ctx.Done():
			return err
		case <-time.After(wait):
		}
	}
	return c.Run(ctx)
}

// sendEmails records the batch's emails in its transaction, one statement
// for them all.
func sendEmails(ctx context.Context, msgs []consumer.Message, tx effects.Tx) error {
	ids, intents, events := make([]string, len(msgs)), make([]string, len(msgs)), make([]string, len(msgs))
	for i, m := range msgs {
		ids[i], intents[i], events[i] = m.ID, m.ObjectID, m.EventID
	}
	_, err := tx.Exec(ctx, `INSERT INTO sent_emails (message_id, payment_intent_id, event_id)
		SELECT message_id, payment_intent_id, event_id
		FROM unnest($1::text[], $2::text[], $3::text[]) WITH ORDINALITY AS m(message_id, payment_intent_id, event_id, n) ORDER BY n`,
		ids, intents, events)
	return err
}

// createTable is the service's own table (a real one has migrations).
// sent_at is the statement's clock: received_at -> sent_at measures the
// path from the webhook to the downstream effect. message_id is not
// unique on purpose: the kit's ledger alone keeps each email to one row,
// and the chaos suite counts the rows to prove it.
const createTable = `CREATE TABLE IF NOT EXISTS sent_emails (
	id                bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
	message_id        text NOT NULL,
	payment_intent_id text NOT NULL,
	event_id          text NOT NULL,
	sent_at           timestamptz NOT NULL DEFAULT clock_timestamp())`

func env(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}
