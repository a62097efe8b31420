package effects

import (
	"context"
	"encoding/json"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Origin says how an event reached the worker.
type Origin string

// Origins.
const (
	// OriginWebhook: delivered by the provider to the receiver.
	OriginWebhook Origin = "webhook"
	// OriginReplay: replayed by an operator from the DLQ.
	OriginReplay Origin = "replay"
	// OriginReconcile: found missing in the provider's own event log and
	// fed into the pipeline by the reconciler.
	OriginReconcile Origin = "reconcile"
	// OriginBackfill: committed earlier by a handler set without this
	// handler, and run now by name (eventsctl effects backfill), the
	// event's other handlers not again.
	OriginBackfill Origin = "backfill"
)

// Object names the provider object an event is about.
type Object struct {
	// Type is the object's kind as the provider names it: payment_intent,
	// charge, refund. Empty when the event names no object.
	Type string
	// ID is the provider's id of the object (pi_…).
	ID string
}

// Event is one event as a handler sees it.
type Event struct {
	// Source is the webhook source: "stripe" for /webhooks/payment, or the
	// name of a WEBHOOK_SOURCES entry.
	Source string
	// ID is the provider's event id (evt_… for Stripe).
	ID string
	// Key is the ledger key: ID for the default source, "<source>:<ID>"
	// for the others.
	Key  string
	Type string
	// Created is when the provider created the event; zero when the
	// delivery does not say. Stripe's has one-second resolution.
	Created time.Time
	Object  Object
	// Raw is the body as it was delivered and verified.
	Raw json.RawMessage
	// Attempt is the processing attempt, 1 for the first delivery.
	Attempt int
	Origin  Origin
}

// Tx is the transaction that writes the event's ledger row: everything a
// handler writes through it commits with that row, or not at all.
// SendBatch sends several statements in one round trip (pgx's pipeline),
// still inside the transaction: each statement still sees what the ones
// before it did, locks included.
type Tx interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// Message is a message for a downstream service, to publish after COMMIT.
type Message struct {
	// Effect names the effect within the event ("confirmation-email"):
	// with the event's key it makes the message's idempotency key, so a
	// replay of the event cannot enqueue it twice.
	Effect string
	// ObjectID orders the messages of one object (the PaymentIntent's id):
	// downstream they arrive in the order they were enqueued.
	ObjectID string
	// Exchange and RoutingKey say where to publish it; Exchange is
	// "effects" (a topic exchange the relay declares) when empty.
	Exchange, RoutingKey string
	Headers              map[string]string
	Body                 []byte
}

// Outbox takes the messages of an event, in its transaction: they are
// published after COMMIT and never if the transaction rolls back.
type Outbox interface {
	Enqueue(ctx context.Context, ev Event, m Message) error
}

// ErrNoOutbox is what NoOutbox's Enqueue returns: the event is retried (and
// dead-lettered in the end) rather than its message dropped.
var ErrNoOutbox = errors.New("effects: no outbox here: the message cannot be published")

// NoOutbox is an Outbox that takes nothing: every Enqueue fails with
// ErrNoOutbox. Tests of handlers that enqueue nothing use it.
type NoOutbox struct{}

// Enqueue implements Outbox.
func (NoOutbox) Enqueue(context.Context, Event, Message) error { return ErrNoOutbox }

// Handler does an event's effect inside its transaction; see the package
// documentation for the contract and the results.
type Handler interface {
	Handle(ctx context.Context, ev Event, tx Tx, out Outbox) error
}

// HandlerFunc is a function that is a Handler.
type HandlerFunc func(ctx context.Context, ev Event, tx Tx, out Outbox) error

// Handle implements Handler.
func (f HandlerFunc) Handle(ctx context.Context, ev Event, tx Tx, out Outbox) error {
	return f(ctx, ev, tx, out)
}

// BatchHandler is a Handler that can also take every event of a batch it
// handles at once, in the order they are committed: in a few statements
// instead of a few per event. It reports which events it had nothing to do
// with (nil: none), as Handle would with Skip. An error fails the whole
// batch, which is then committed one event at a time (through Handle), so
// the error of a single event decides its fate.
type BatchHandler interface {
	Handler
	HandleBatch(ctx context.Context, evs []Event, tx Tx, out Outbox) (skipped []bool, err error)
}

// Transition is a change of state of a provider object, as decided by a
// handler that keeps the object's state (payments does for PaymentIntents
// and Charges).
type Transition struct {
	Object Object
	// From is the state before; "" when the object was not known.
	From, To string
	// Event is the event that brought the new state.
	Event Event
}

// TransitionHandler does the effect of an object transition, inside the
// transaction of the event that brought it. It runs once per transition,
// not once per event: two events that both imply the same new state make
// one transition.
type TransitionHandler interface {
	HandleTransition(ctx context.Context, t Transition, tx Tx, out Outbox) error
}

// TransitionFunc is a function that is a TransitionHandler.
type TransitionFunc func(ctx context.Context, t Transition, tx Tx, out Outbox) error

// HandleTransition implements TransitionHandler.
func (f TransitionFunc) HandleTransition(ctx context.Context, t Transition, tx Tx, out Outbox) error {
	return f(ctx, t, tx, out)
}
