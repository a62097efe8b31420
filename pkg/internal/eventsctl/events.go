package eventsctl

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idempotent-events/idempotent-events/pkg/internal/broker"
	"github.com/idempotent-events/idempotent-events/pkg/internal/dlq"
)

const eventsUsage = `usage:
  eventsctl events show -id EVENT_ID [-dlq=false] [-json]
      where is this event, and what happened to it: the ledger row (when, by
      which handler set, how), its payment state, the deliveries that reused
      its id, its outbox messages, backfills, the archive, the DLQ and the
      DLQ tools' audit trail
  eventsctl events object -id OBJECT_ID [-json]
      a PaymentIntent's or Charge's state and every event that described it,
      in the order of their created times, with how each was taken

DATABASE_URL (or -database-url) is required; AMQP_URL (or -amqp-url) for the
DLQ scan.
`

func eventsCmd(ctx context.Context, args []string, env Env, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, eventsUsage)
		return 2
	}
	switch args[0] {
	case "show":
		return eventsShow(ctx, args[1:], env, stdout, stderr)
	case "object":
		return eventsObject(ctx, args[1:], env, stdout, stderr)
	case "-h", "--help", "help":
		fmt.Fprint(stdout, eventsUsage)
		return 0
	}
	fmt.Fprintf(stderr, "eventsctl events: unknown command %q\n\n%s", args[0], eventsUsage)
	return 2
}

// EventReport is what eventsctl events show found of one event.
type EventReport struct {
	// Key is the ledger key the id resolved to ("" when not in the ledger).
	Key       string        `json:"key,omitempty"`
	Ledger    *LedgerRow    `json:"ledger,omitempty"`
	Payment   []PaymentRow  `json:"payment_state,omitempty"`
	Conflicts []ConflictRow `json:"conflicts,omitempty"`
	Outbox    []OutboxRow   `json:"outbox,omitempty"`
	Backfills []BackfillRow `json:"backfills,omitempty"`
	Archived  *int          `json:"archived_bytes,omitempty"`
	DLQ       *dlq.Listing  `json:"dlq,omitempty"`
	DLQError  string        `json:"dlq_error,omitempty"`
	Audit     []DLQAuditRow `json:"dlq_audit,omitempty"`
	Unknown   []string      `json:"not_looked_at,omitempty"`
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

type eventsFlags struct {
	id, dbURL, amqpURL string
	scanDLQ, asJSON    bool
	scanLimit          int
}

func (f *eventsFlags) parse(name string, args []string, env Env, stderr io.Writer, withDLQ bool) int {
	fs := flag.NewFlagSet("eventsctl events "+name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&f.id, "id", "", "the id (required)")
	fs.StringVar(&f.dbURL, "database-url", env("DATABASE_URL"), "PostgreSQL URL of the ledger ($DATABASE_URL)")
	fs.BoolVar(&f.asJSON, "json", false, "print the report as JSON")
	if withDLQ {
		fs.StringVar(&f.amqpURL, "amqp-url", orDefault(env("AMQP_URL"), "amqp://guest:guest@127.0.0.1:5672/"), "RabbitMQ URL, for the DLQ scan ($AMQP_URL)")
		fs.BoolVar(&f.scanDLQ, "dlq", true, "scan events.dlq for the event (every message read is returned)")
		fs.IntVar(&f.scanLimit, "scan-limit", dlq.DefaultScanLimit, "DLQ messages read at most")
	}
	if err := fs.Parse(args); err != nil {
		return flagStatus(err)
	}
	var problems []string
	if f.id == "" {
		problems = append(problems, "-id is required")
	}
	if f.dbURL == "" {
		problems = append(problems, "DATABASE_URL (or -database-url) is required")
	} else if err := checkDatabaseURL(f.dbURL); err != nil {
		problems = append(problems, err.Error())
	}
	if withDLQ && f.scanDLQ {
		if err := checkAMQPURL(f.amqpURL); err != nil {
			problems = append(problems, err.Error())
		}
	}
	if fs.NArg() > 0 {
		problems = append(problems, fmt.Sprintf("unexpected argument %q", fs.Arg(0)))
	}
	if len(problems) > 0 {
		fmt.Fprintf(stderr, "eventsctl events %s: %s\n", name, strings.Join(problems, "; "))
		return 2
	}
	return -1
}

func eventsShow(ctx context.Context, args []string, env Env, stdout, stderr io.Writer) int {
	var f eventsFlags
	if code := f.parse("show", args, env, stderr, true); code >= 0 {
		return code
	}
	db, err := pgxpool.New(ctx, f.dbURL)
	if err != nil {
		fmt.Fprintf(stderr, "eventsctl events show: %v\n", err)
		return 2
	}
	defer db.Close()
	rep, err := findEvent(ctx, db, f.id)
	if err != nil {
		fmt.Fprintf(stderr, "eventsctl events show: %v\n", err)
		return 1
	}
	if f.scanDLQ {
		c := dlq.New(dlq.Options{Dialer: broker.Dialer{URL: f.amqpURL, Name: "eventsctl events"}, ScanLimit: f.scanLimit})
		key := rep.Key
		if key == "" {
			key = f.id
		}
		l, err := c.List(ctx, dlq.Filter{EventID: key}, 10)
		if err != nil {
			rep.DLQError = err.Error()
		} else {
			rep.DLQ = &l
		}
	} else {
		rep.Unknown = append(rep.Unknown, "events.dlq (-dlq=false)")
	}
	rep.Unknown = append(rep.Unknown, "events.main, the retry tiers and deliveries in flight (their messages are not scanned)")
	if f.asJSON {
		printJSON(stdout, rep)
	} else {
		printEvent(stdout, f.id, rep)
	}
	if rep.Ledger == nil && (rep.DLQ == nil || rep.DLQ.Matched == 0) {
		return 1
	}
	return 0
}

// findEvent reads what the ledger's tables know of the event id: the
// ledger key is the id for Stripe and <source>:<id> for other sources.
func findEvent(ctx context.Context, db *pgxpool.Pool, id string) (EventReport, error) {
	var rep EventReport
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

// at is a time to the millisecond: the steps of an event are often less
// than a second apart.
func at(t time.Time) string { return t.UTC().Format("2006-01-02T15:04:05.000Z") }

func printEvent(w io.Writer, id string, r EventReport) {
	if l := r.Ledger; l != nil {
		fmt.Fprintf(w, "event %s: %s, %s\n", r.Key, l.Source, l.Type)
		line := "  ledger: committed " + at(l.ProcessedAt)
		if l.ReceivedAt != nil {
			line += fmt.Sprintf(" (received %s, %s before)", at(*l.ReceivedAt), l.ProcessedAt.Sub(*l.ReceivedAt).Round(time.Millisecond))
		}
		line += fmt.Sprintf(", attempt %d, outcome %s", l.Attempt, l.Outcome)
		fmt.Fprintln(w, line)
		if l.Generation != nil {
			release := "release " + l.Release
			if strings.HasPrefix(l.Release, "set:") {
				release = "no WORKER_RELEASE"
			}
			fmt.Fprintf(w, "  handler set: generation %d (%s), set %s: %s\n", *l.Generation, release, l.SetID, strings.Join(l.Handlers, ", "))
		} else {
			fmt.Fprintln(w, "  handler set: not recorded (committed before handler sets were, or by a tool)")
		}
		if l.LastSeenAt != nil {
			fmt.Fprintf(w, "  last duplicate seen by a worker: %s\n", at(*l.LastSeenAt))
		}
	} else {
		fmt.Fprintf(w, "event %s: not in the ledger (not committed yet, or pruned after LEDGER_RETENTION, or never received)\n", id)
	}
	for _, p := range r.Payment {
		from := ""
		if p.From != "" {
			from = " from " + p.From
		}
		refresh := ""
		if p.NeedsRefresh {
			refresh = ", marked needs_refresh"
		}
		fmt.Fprintf(w, "  payment state: %s %s: %s (%s%s, event created %s); the object is %s now%s\n",
			p.ObjectType, p.ObjectID, p.Outcome, p.Status, from, at(p.Created), p.Now, refresh)
	}
	for _, c := range r.Conflicts {
		fmt.Fprintf(w, "  conflict: a delivery with other content under this id, recorded %s (sha256 %s…)\n", at(c.RecordedAt), c.Digest[:min(12, len(c.Digest))])
	}
	for _, o := range r.Outbox {
		state := "waiting to be published"
		switch {
		case o.PublishedAt != nil:
			state = "published " + at(*o.PublishedAt)
		case o.ParkedAt != nil:
			state = fmt.Sprintf("PARKED %s after %d attempts: %s (eventsctl outbox retry -id %d)", at(*o.ParkedAt), o.Attempts, o.LastError, o.ID)
		case o.Attempts > 0:
			state = fmt.Sprintf("%d failed attempts so far: %s", o.Attempts, o.LastError)
		}
		fmt.Fprintf(w, "  outbox #%d: %s -> %s, %s\n", o.ID, o.Effect, o.RoutingKey, state)
	}
	for _, b := range r.Backfills {
		state := "queued"
		if b.FinishedAt != nil {
			state = b.Outcome + " " + at(*b.FinishedAt)
		}
		if b.LastError != "" {
			state += ": " + firstLine(b.LastError)
		}
		fmt.Fprintf(w, "  backfill %d: handler %s %s\n", b.Backfill, b.Handler, state)
	}
	if r.Archived != nil {
		fmt.Fprintf(w, "  archive: body kept (%d bytes)\n", *r.Archived)
	}
	switch {
	case r.DLQError != "":
		fmt.Fprintf(w, "  DLQ: not scanned: %s\n", r.DLQError)
	case r.DLQ != nil && r.DLQ.Matched > 0:
		for _, m := range r.DLQ.Messages {
			fmt.Fprintf(w, "  DLQ: IN events.dlq as %s, reason %s, dead-lettered %s: %s (eventsctl dlq show %s)\n",
				m.ID, m.Reason, at(m.DeadLetteredAt), firstLine(m.LastError), m.ID)
		}
	case r.DLQ != nil:
		scope := "all"
		if !r.DLQ.Complete {
			scope = "the first"
		}
		fmt.Fprintf(w, "  DLQ: not in events.dlq (%s %d of %d messages scanned)\n", scope, r.DLQ.Scanned, r.DLQ.Depth)
	}
	for _, a := range r.Audit {
		fmt.Fprintf(w, "  DLQ audit: %s %s by %s at %s (%s)\n", a.Action, a.Outcome, a.Operator, at(a.At), a.Reason)
	}
	for _, u := range r.Unknown {
		fmt.Fprintf(w, "  not looked at: %s\n", u)
	}
}

// ObjectReport is a payment object's state and its events.
type ObjectReport struct {
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

func eventsObject(ctx context.Context, args []string, env Env, stdout, stderr io.Writer) int {
	var f eventsFlags
	if code := f.parse("object", args, env, stderr, false); code >= 0 {
		return code
	}
	db, err := pgxpool.New(ctx, f.dbURL)
	if err != nil {
		fmt.Fprintf(stderr, "eventsctl events object: %v\n", err)
		return 2
	}
	defer db.Close()
	o := ObjectReport{ID: f.id}
	err = db.QueryRow(ctx, `
SELECT 'payment_intent', status, status_event_id, status_created, needs_refresh,
       format('amount %s, received %s, refunded %s %s', amount, amount_received, amount_refunded, currency)
FROM payment_intents WHERE id = $1
UNION ALL
SELECT 'charge', status, status_event_id, status_created, needs_refresh,
       format('amount %s, captured %s, refunded %s %s, payment_intent %s', amount, amount_captured, amount_refunded, currency, payment_intent_id)
FROM charges WHERE id = $1`, f.id).Scan(&o.Type, &o.Status, &o.StatusEvent, &o.StatusAt, &o.NeedsRefresh, &o.Amounts)
	if errors.Is(err, pgx.ErrNoRows) {
		fmt.Fprintf(stdout, "object %s: no payment state (no event about it committed, or not a PaymentIntent or Charge)\n", f.id)
		return 1
	}
	if err != nil {
		fmt.Fprintf(stderr, "eventsctl events object: read the payment state: %v\n", err)
		return 1
	}
	rows, err := db.Query(ctx, `SELECT event_id, object_type, object_id, status, from_status, outcome, event_created
		FROM payment_events WHERE object_id = $1 ORDER BY event_created, recorded_at`, f.id)
	if err != nil {
		fmt.Fprintf(stderr, "eventsctl events object: read payment_events: %v\n", err)
		return 1
	}
	for rows.Next() {
		var id string
		var p PaymentRow
		if err := rows.Scan(&id, &p.ObjectType, &p.ObjectID, &p.Status, &p.From, &p.Outcome, &p.Created); err != nil {
			fmt.Fprintf(stderr, "eventsctl events object: read payment_events: %v\n", err)
			return 1
		}
		o.Events, o.EventIDs = append(o.Events, p), append(o.EventIDs, id)
	}
	if err := rows.Err(); err != nil {
		fmt.Fprintf(stderr, "eventsctl events object: read payment_events: %v\n", err)
		return 1
	}
	if f.asJSON {
		printJSON(stdout, o)
		return 0
	}
	refresh := ""
	if o.NeedsRefresh {
		refresh = "; marked needs_refresh: its events contradict each other, eventsctl reconcile fetches it from Stripe"
	}
	fmt.Fprintf(stdout, "%s %s: %s since %s (event %s); %s%s\n", o.Type, o.ID, o.Status, at(o.StatusAt), o.StatusEvent, o.Amounts, refresh)
	for i, p := range o.Events {
		from := ""
		if p.From != "" {
			from = " from " + p.From
		}
		fmt.Fprintf(stdout, "  %s  %-34s %-20s %s%s\n", at(p.Created), o.EventIDs[i], p.Outcome, p.Status, from)
	}
	return 0
}
