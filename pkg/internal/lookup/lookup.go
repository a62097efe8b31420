// Package lookup answers "where is event X, and what happened to it?" and
// "what happened to object Y?" from every place an event leaves a trace in
// the ledger's database: its ledger row and handler set, the payment
// state, conflicting deliveries, the outbox, backfills, the archive and the
// DLQ tools' audit trail. Where it waits in the broker (events.dlq, a
// retry tier) is the dlq package's to find (Client.Locate), in the types
// here. eventsctl events and the admin API and page print the same report.
package lookup

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Event is what the ledger's tables, and the queues, know of one event.
type Event struct {
	// Key is the ledger key the id resolved to ("" when not in the ledger).
	Key       string        `json:"key,omitempty"`
	Ledger    *LedgerRow    `json:"ledger,omitempty"`
	Payment   []PaymentRow  `json:"payment_state,omitempty"`
	Conflicts []ConflictRow `json:"conflicts,omitempty"`
	Outbox    []OutboxRow   `json:"outbox,omitempty"`
	Backfills []BackfillRow `json:"backfills,omitempty"`
	Archived  *int          `json:"archived_bytes,omitempty"`
	// Queues is where it waits in the broker (events.dlq, a retry tier),
	// filled by the caller (dlq.Client.Locate); QueuesError says why not.
	Queues      *Queues       `json:"queues,omitempty"`
	QueuesError string        `json:"queues_error,omitempty"`
	Audit       []DLQAuditRow `json:"dlq_audit,omitempty"`
	Unknown     []string      `json:"not_looked_at,omitempty"`
}

// LedgerRow is an event's processed_events row and the handler set that
// committed it.
type LedgerRow struct {
	Source      string     `json:"source"`
	Type        string     `json:"type"`
	ReceivedAt  *time.Time `json:"received_at,omitempty"`
	ProcessedAt time.Time  `json:"processed_at"`
	LastSeenAt  *time.Time `json:"last_seen_at,omitempty"`
	Attempt     int        `json:"attempt"`
	Outcome     string     `json:"outcome"`
	Generation  *int64     `json:"generation,omitempty"`
	Release     string     `json:"release,omitempty"`
	SetID       string     `json:"set_id,omitempty"`
	Handlers    []string   `json:"handlers,omitempty"`
}

// PaymentRow is how the payment state took the event.
type PaymentRow struct {
	ObjectType string    `json:"object_type"`
	ObjectID   string    `json:"object_id"`
	Status     string    `json:"status"`
	From       string    `json:"from,omitempty"`
	Outcome    string    `json:"outcome"`
	Created    time.Time `json:"event_created"`
	// Now is the object's status today.
	Now          string `json:"object_status_now,omitempty"`
	NeedsRefresh bool   `json:"object_needs_refresh,omitempty"`
}

// ConflictRow is a delivery that reused the event's id with other content.
type ConflictRow struct {
	RecordedAt time.Time `json:"recorded_at"`
	Digest     string    `json:"received_sha256"`
}

// OutboxRow is a message a handler enqueued with the event.
type OutboxRow struct {
	ID          int64      `json:"id"`
	Effect      string     `json:"effect"`
	RoutingKey  string     `json:"routing_key"`
	CreatedAt   time.Time  `json:"created_at"`
	PublishedAt *time.Time `json:"published_at,omitempty"`
	ParkedAt    *time.Time `json:"parked_at,omitempty"`
	Attempts    int        `json:"attempts"`
	LastError   string     `json:"last_error,omitempty"`
}

// BackfillRow is a backfill of a handler over the event.
type BackfillRow struct {
	Backfill   int64      `json:"backfill"`
	Handler    string     `json:"handler"`
	Outcome    string     `json:"outcome,omitempty"`
	FinishedAt *time.Time `json:"finished_at,omitempty"`
	Attempts   int        `json:"attempts"`
	LastError  string     `json:"last_error,omitempty"`
}

// DLQAuditRow is a replay or discard of the event from the DLQ.
type DLQAuditRow struct {
	At       time.Time `json:"at"`
	Operator string    `json:"operator"`
	Action   string    `json:"action"`
	Outcome  string    `json:"outcome"`
	Reason   string    `json:"reason,omitempty"`
}

// Queues is where an event's messages wait in the broker.
type Queues struct {
	Hits    []QueueHit `json:"hits"`
	Scanned []Scan     `json:"scanned"`
}

// QueueHit is one message of the event in a queue.
type QueueHit struct {
	Queue     string    `json:"queue"`
	ID        string    `json:"id"`
	Reason    string    `json:"reason,omitempty"`
	Attempts  int       `json:"attempts"`
	LastError string    `json:"last_error,omitempty"`
	At        time.Time `json:"dead_lettered_at,omitzero"`
	FailedAt  time.Time `json:"last_failed_at,omitzero"`
}

// Scan is how much of a queue was read.
type Scan struct {
	Queue    string `json:"queue"`
	Read     int    `json:"read"`
	Depth    int    `json:"depth"`
	Complete bool   `json:"complete"`
	// Missing: the queue does not exist in the vhost.
	Missing bool `json:"missing,omitempty"`
}

// Locator finds an event's messages in queues; *dlq.Client is one.
type Locator interface {
	Locate(ctx context.Context, key string, queues []string) (Queues, error)
}

// Unscanned is where an event may be that no lookup looks.
const Unscanned = "events.main, events.replay and deliveries in flight (their messages are not scanned)"

// Locate looks for the event's messages in queues with loc: by its ledger
// key, or by id when it is not in the ledger. A failure is kept in
// QueuesError, beside what was scanned before it.
func (e *Event) Locate(ctx context.Context, loc Locator, id string, queues []string) {
	key := e.Key
	if key == "" {
		key = id
	}
	q, err := loc.Locate(ctx, key, queues)
	e.Queues = &q
	if err != nil {
		e.QueuesError = err.Error()
	}
	e.Unknown = append(e.Unknown, Unscanned)
}

// Found reports whether the event is anywhere: committed, or waiting in a
// queue that was scanned.
func (e Event) Found() bool { return e.Ledger != nil || (e.Queues != nil && len(e.Queues.Hits) > 0) }

// FindEvent reads what the ledger's tables know of the event id: the
// ledger key is the id for Stripe and <source>:<id> for other sources.
func FindEvent(ctx context.Context, db *pgxpool.Pool, id string) (Event, error) {
	var rep Event
	var l LedgerRow
	var handlers []string
	err := db.QueryRow(ctx, `
SELECT p.event_id, p.source, p.event_type, p.received_at, p.processed_at, p.last_seen_at, p.attempt, p.outcome,
       p.generation, coalesce(g.release, ''), coalesce(g.set_id, ''),
       coalesce((SELECT array_agg(h->>'name' ORDER BY h->>'name') FROM jsonb_array_elements(g.handlers) h), '{}')
FROM processed_events p LEFT JOIN handler_generations g USING (generation)
WHERE p.event_id = $1 OR p.event_id LIKE '%:' || $1
ORDER BY p.event_id = $1 DESC LIMIT 1`, id).Scan(&rep.Key, &l.Source, &l.Type, &l.ReceivedAt, &l.ProcessedAt, &l.LastSeenAt,
		&l.Attempt, &l.Outcome, &l.Generation, &l.Release, &l.SetID, &handlers)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
	case err != nil:
		return rep, fmt.Errorf("read the ledger: %w", err)
	default:
		l.Handlers = handlers
		rep.Ledger = &l
	}
	key := rep.Key
	if key == "" {
		key = id
	}
	queries := []struct {
		what string
		sql  string
		scan func(pgx.Rows) error
	}{
		{"payment_events", `SELECT e.object_type, e.object_id, e.status, e.from_status, e.outcome, e.event_created,
				coalesce(pi.status, ch.status, ''), coalesce(pi.needs_refresh, ch.needs_refresh, false)
			FROM payment_events e
			LEFT JOIN payment_intents pi ON e.object_type = 'payment_intent' AND pi.id = e.object_id
			LEFT JOIN charges ch ON e.object_type = 'charge' AND ch.id = e.object_id
			WHERE e.event_id = $1`, func(rows pgx.Rows) error {
			var p PaymentRow
			if err := rows.Scan(&p.ObjectType, &p.ObjectID, &p.Status, &p.From, &p.Outcome, &p.Created, &p.Now, &p.NeedsRefresh); err != nil {
				return err
			}
			rep.Payment = append(rep.Payment, p)
			return nil
		}},
		{"event_conflicts", `SELECT recorded_at, encode(received_sha256, 'hex') FROM event_conflicts WHERE event_id = $1 ORDER BY recorded_at`,
			func(rows pgx.Rows) error {
				var c ConflictRow
				if err := rows.Scan(&c.RecordedAt, &c.Digest); err != nil {
					return err
				}
				rep.Conflicts = append(rep.Conflicts, c)
				return nil
			}},
		{"outbox", `SELECT id, effect, routing_key, created_at, published_at, parked_at, attempts, last_error FROM outbox WHERE event_id = $1 ORDER BY id`,
			func(rows pgx.Rows) error {
				var o OutboxRow
				if err := rows.Scan(&o.ID, &o.Effect, &o.RoutingKey, &o.CreatedAt, &o.PublishedAt, &o.ParkedAt, &o.Attempts, &o.LastError); err != nil {
					return err
				}
				rep.Outbox = append(rep.Outbox, o)
				return nil
			}},
		{"backfill_items", `SELECT backfill_id, handler, coalesce(outcome, ''), finished_at, attempts, coalesce(last_error, '') FROM backfill_items WHERE event_id = $1 ORDER BY id`,
			func(rows pgx.Rows) error {
				var b BackfillRow
				if err := rows.Scan(&b.Backfill, &b.Handler, &b.Outcome, &b.FinishedAt, &b.Attempts, &b.LastError); err != nil {
					return err
				}
				rep.Backfills = append(rep.Backfills, b)
				return nil
			}},
		{"event_archive", `SELECT octet_length(body) FROM event_archive WHERE event_id = $1`, func(rows pgx.Rows) error {
			var n int
			if err := rows.Scan(&n); err != nil {
				return err
			}
			rep.Archived = &n
			return nil
		}},
		{"dlq_audit", `SELECT at, operator, action, outcome, reason FROM dlq_audit WHERE event_id = $1 OR event_id = $2 ORDER BY at`, func(rows pgx.Rows) error {
			var a DLQAuditRow
			if err := rows.Scan(&a.At, &a.Operator, &a.Action, &a.Outcome, &a.Reason); err != nil {
				return err
			}
			rep.Audit = append(rep.Audit, a)
			return nil
		}},
	}
	for _, q := range queries {
		args := []any{key}
		if strings.Contains(q.sql, "$2") {
			args = append(args, id)
		}
		rows, err := db.Query(ctx, q.sql, args...)
		if err != nil {
			return rep, fmt.Errorf("read %s: %w", q.what, err)
		}
		for rows.Next() {
			if err := q.scan(rows); err != nil {
				rows.Close()
				return rep, fmt.Errorf("read %s: %w", q.what, err)
			}
		}
		if err := rows.Err(); err != nil {
			return rep, fmt.Errorf("read %s: %w", q.what, err)
		}
	}
	return rep, nil
}

// Object is a payment object's state and its events.
type Object struct {
	Type         string       `json:"type"`
	ID           string       `json:"id"`
	Status       string       `json:"status"`
	StatusEvent  string       `json:"status_event_id"`
	StatusAt     time.Time    `json:"status_created"`
	NeedsRefresh bool         `json:"needs_refresh"`
	Amounts      string       `json:"amounts"`
	Events       []PaymentRow `json:"events"`
	EventIDs     []string     `json:"event_ids"`
}

// ErrNoObject says an object has no payment state.
var ErrNoObject = errors.New("no payment state")

// FindObject reads a PaymentIntent's or Charge's state and every event that
// described it, by created time.
func FindObject(ctx context.Context, db *pgxpool.Pool, id string) (Object, error) {
	o := Object{ID: id}
	err := db.QueryRow(ctx, `
SELECT 'payment_intent', status, status_event_id, status_created, needs_refresh,
       format('amount %s, received %s, refunded %s %s', amount, amount_received, amount_refunded, currency)
FROM payment_intents WHERE id = $1
UNION ALL
SELECT 'charge', status, status_event_id, status_created, needs_refresh,
       format('amount %s, captured %s, refunded %s %s, payment_intent %s', amount, amount_captured, amount_refunded, currency, payment_intent_id)
FROM charges WHERE id = $1`, id).Scan(&o.Type, &o.Status, &o.StatusEvent, &o.StatusAt, &o.NeedsRefresh, &o.Amounts)
	if errors.Is(err, pgx.ErrNoRows) {
		return o, fmt.Errorf("object %s: %w (no event about it committed, or not a PaymentIntent or Charge)", id, ErrNoObject)
	}
	if err != nil {
		return o, fmt.Errorf("read the payment state of %s: %w", id, err)
	}
	rows, err := db.Query(ctx, `SELECT event_id, object_type, object_id, status, from_status, outcome, event_created
		FROM payment_events WHERE object_id = $1 ORDER BY event_created, recorded_at`, id)
	if err != nil {
		return o, fmt.Errorf("read the events of %s: %w", id, err)
	}
	defer rows.Close()
	for rows.Next() {
		var eid string
		var p PaymentRow
		if err := rows.Scan(&eid, &p.ObjectType, &p.ObjectID, &p.Status, &p.From, &p.Outcome, &p.Created); err != nil {
			return o, fmt.Errorf("read the events of %s: %w", id, err)
		}
		o.Events, o.EventIDs = append(o.Events, p), append(o.EventIDs, eid)
	}
	if err := rows.Err(); err != nil {
		return o, fmt.Errorf("read the events of %s: %w", id, err)
	}
	return o, nil
}
