// Package reconcile compares a provider's own record of events with the
// ledger and feeds the events that never arrived into the pipeline.
//
// At-least-once delivery still misses events: an endpoint down longer than
// the provider's retry window, a wrong secret for a day, a deploy that
// answered 4xx. Stripe keeps 30 days of events behind GET /v1/events; a run
// lists one window of them and, for each event the ledger does not hold,
// publishes it to the exchange the receiver publishes to, marked
// x-ie-origin: reconcile. Dedupe, ordering and effects are then the same
// as a webhook's, and a late webhook of the same event is a duplicate (its
// content digest is event.AnyDigest: the API renders an event at the API
// version of its creation, an endpoint at its own).
//
// A run has two phases, both checkpointed in Postgres so that a run killed
// anywhere is resumed by the next one for its source:
//
//   - listing: the window is paged newest first (Stripe's order); per page
//     the events the ledger lacks are kept in reconcile_missing, and the
//     page's last id becomes the cursor, in one transaction;
//   - injecting: the kept events are published oldest first, each checked
//     against the ledger again just before (a webhook may have come in the
//     meantime: "arrived"), and marked injected after the broker confirmed
//     it.
//
// Listing first and injecting after gives oldest-first injection at the
// cost of one pass over the window: Stripe's ending_before walks oldest
// first only from a known event, which a window's first run does not have.
// An event published but not yet marked when a run dies is published again
// on resume unless the ledger has it by then; the worker's dedupe makes the
// copy a duplicate, so its effect is still once.
//
// One run per source at a time: a session-level advisory lock, held for
// the whole run, and a unique index on the source's unfinished run.
package reconcile

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"
	"go.uber.org/zap"

	"github.com/idempotent-events/idempotent-events/pkg/effects"
	"github.com/idempotent-events/idempotent-events/pkg/internal/broker"
	"github.com/idempotent-events/idempotent-events/pkg/internal/event"
	"github.com/idempotent-events/idempotent-events/pkg/internal/options"
	"github.com/idempotent-events/idempotent-events/pkg/internal/retention"
	"github.com/idempotent-events/idempotent-events/pkg/payments"
)

// PageSize is the events per listing page: Stripe's largest.
const PageSize = 100

// MaxWindow is how far back Stripe keeps events.
const MaxWindow = 30 * 24 * time.Hour

// ProviderEvent is one event of the provider's log: its id, type, creation
// time and JSON as the API returned it.
type ProviderEvent struct {
	ID, Type string
	Created  time.Time
	Raw      []byte
}

// PageQuery asks for one page of a window's listing.
type PageQuery struct {
	// From and To bound the events' creation times, both included.
	From, To time.Time
	// After is the id of the last event of the previous page.
	After string
	// Types, when set, lists only events of these types (at most 20).
	Types []string
	// UndeliveredOnly lists only events not yet delivered to every
	// endpoint (Stripe's delivery_success=false).
	UndeliveredOnly bool
	// Limit is the page size, PageSize when 0.
	Limit int
}

func (q PageQuery) limit() int {
	if q.Limit <= 0 {
		return PageSize
	}
	return q.Limit
}

// Page is one page of a listing, newest first.
type Page struct {
	Events  []ProviderEvent
	HasMore bool
}

// EventLog is a provider's record of events; *StripeLog is Stripe's.
type EventLog interface {
	Page(ctx context.Context, q PageQuery) (Page, error)
}

// ObjectFetcher fetches an object's current JSON from the provider; an
// EventLog that is one also refreshes the objects the payment effect
// marked needs_refresh.
type ObjectFetcher interface {
	Object(ctx context.Context, kind, id string) ([]byte, error)
}

// Publisher confirms a publish before it returns nil.
type Publisher interface {
	Publish(ctx context.Context, exchange, key string, msg amqp.Publishing) error
}

// Options configures a run.
type Options struct {
	// Source is the webhook source the events belong to ("stripe" for
	// /webhooks/payment): it qualifies their ledger keys.
	Source    string
	Log       EventLog
	DB        *pgxpool.Pool
	Publisher Publisher
	// Since is how far back the window starts; Settle how far back it
	// ends, so that events still being delivered are left to their
	// webhooks.
	Since, Settle   time.Duration
	Types           []string
	UndeliveredOnly bool
	// DryRun lists and compares, and injects and records nothing.
	DryRun         bool
	PublishTimeout time.Duration
	Logger         *zap.Logger
	Now            func() time.Time
	// AfterPage, when set, runs after each page is kept and after each
	// batch is injected; an error from it ends the run as a crash would
	// (tests kill runs with it).
	AfterPage func(r Report) error
}

func (o *Options) validate() error {
	p := options.Check("reconcile")
	p.Need(o.Log != nil, "Log", "is required")
	p.Need(o.DB != nil, "DB", "is required")
	p.Need(o.DryRun || o.Publisher != nil, "Publisher", "is required unless DryRun")
	o.checkSettings(p)
	return p.Err()
}

// CheckSettings reports the settings Run would refuse, leaving out the
// parts that connect (Log, DB, Publisher): what `eventsctl reconcile
// -check-config` can know without calling Stripe, PostgreSQL or RabbitMQ.
func (o Options) CheckSettings() error {
	p := options.Check("reconcile")
	o.checkSettings(p)
	return p.Err()
}

func (o *Options) checkSettings(p *options.Problems) {
	p.Need(o.Source != "", "Source", "is required")
	p.Need(o.Since > 0 && o.Since <= MaxWindow, "Since", "must be more than 0 and at most 720h (Stripe keeps 30 days of events)")
	p.Need(o.Settle >= 0 && o.Settle < o.Since, "Settle", "must be at least 0 and less than Since")
	p.Need(len(o.Types) <= 20, "Types", "may name at most 20 event types")
	p.Need(o.DryRun || o.PublishTimeout > 0, "PublishTimeout", "must be positive")
}

// Report says what a run did; a resumed run's counts include what it did
// before it was interrupted.
type Report struct {
	RunID   int64     `json:"run_id,omitempty"`
	Source  string    `json:"source"`
	Resumed bool      `json:"resumed"`
	DryRun  bool      `json:"dry_run"`
	From    time.Time `json:"window_start"`
	To      time.Time `json:"window_end"`
	Pages   int       `json:"pages"`
	Listed  int       `json:"listed"`
	Present int       `json:"present"`
	Missing int       `json:"missing"`
	// Injected were published; Arrived came by webhook between listing
	// and injection; Invalid were refused by the event decoder and not
	// injected (see reconcile_missing.detail).
	Injected int `json:"injected"`
	Arrived  int `json:"arrived"`
	Invalid  int `json:"invalid"`
	// Refreshed are the objects marked needs_refresh that were fetched and
	// fed in as payments.RefreshType events; RefreshFailed could not be
	// fetched (a key without read access to PaymentIntents and Charges).
	Refreshed     int `json:"refreshed"`
	RefreshFailed int `json:"refresh_failed"`
	// MissingIDs are the missing events' ids (dry runs only).
	MissingIDs []string `json:"missing_ids,omitempty"`
}

// ErrLocked means another run holds the source's lock.
var ErrLocked = errors.New("another reconcile run for this source is in progress")

// Run reconciles one window, or resumes the source's unfinished run.
func Run(ctx context.Context, o Options) (Report, error) {
	if err := o.validate(); err != nil {
		return Report{}, err
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Logger == nil {
		o.Logger = zap.NewNop()
	}
	release, err := lockSource(ctx, o.DB, o.Source)
	if err != nil {
		return Report{}, err
	}
	defer release()

	keep, pruned, err := retention.LedgerRetention(ctx, o.DB)
	if err != nil {
		return Report{}, fmt.Errorf("reconcile: read the ledger's retention: %w", err)
	}
	if pruned && o.Since > keep-time.Hour {
		return Report{}, fmt.Errorf("reconcile: the window of %s reaches past the ledger's retention of %s less an hour "+
			"(the latest eventsctl prune): an event whose ledger row was pruned would be processed again; use a shorter -since", o.Since, keep)
	}
	r := &run{o: o}
	if o.DryRun {
		return r.dryRun(ctx)
	}
	if err := r.open(ctx); err != nil {
		return r.rep, err
	}
	if r.state == "listing" {
		if err := r.list(ctx); err != nil {
			return r.rep, err
		}
	}
	if err := r.inject(ctx); err != nil {
		return r.rep, err
	}
	if f, ok := o.Log.(ObjectFetcher); ok {
		if err := r.refresh(ctx, f); err != nil {
			return r.rep, err
		}
	}
	return r.rep, nil
}

func lockName(source string) string { return "idempotent-events:reconcile:" + source }

type run struct {
	o      Options
	rep    Report
	state  string
	cursor string
}

// open resumes the source's unfinished run or starts one.
func (r *run) open(ctx context.Context) error {
	o := r.o
	r.rep = Report{Source: o.Source}
	err := o.DB.QueryRow(ctx, `SELECT id, window_start, window_end, types, state, cursor, pages, listed, present, missing, injected, arrived, invalid
		FROM reconcile_runs WHERE source = $1 AND state <> 'done'`, o.Source).Scan(
		&r.rep.RunID, &r.rep.From, &r.rep.To, &r.o.Types, &r.state, &r.cursor, &r.rep.Pages, &r.rep.Listed, &r.rep.Present,
		&r.rep.Missing, &r.rep.Injected, &r.rep.Arrived, &r.rep.Invalid)
	switch {
	case err == nil:
		r.rep.Resumed = true
		o.Logger.Info("resuming an unfinished reconcile run", zap.Int64("run", r.rep.RunID), zap.String("state", r.state),
			zap.Time("window_start", r.rep.From), zap.Time("window_end", r.rep.To))
		return nil
	case !errors.Is(err, pgx.ErrNoRows):
		return fmt.Errorf("reconcile: look for an unfinished run: %w", err)
	}
	now := o.Now().UTC().Truncate(time.Second)
	r.rep.From, r.rep.To, r.state = now.Add(-o.Since), now.Add(-o.Settle), "listing"
	types := o.Types
	if types == nil {
		types = []string{}
	}
	if err := o.DB.QueryRow(ctx, `INSERT INTO reconcile_runs (source, window_start, window_end, types) VALUES ($1, $2, $3, $4) RETURNING id`,
		o.Source, r.rep.From, r.rep.To, types).Scan(&r.rep.RunID); err != nil {
		return fmt.Errorf("reconcile: start a run: %w", err)
	}
	return nil
}

func (r *run) query() PageQuery {
	return PageQuery{From: r.rep.From, To: r.rep.To, After: r.cursor, Types: r.o.Types, UndeliveredOnly: r.o.UndeliveredOnly}
}

// list pages the window and keeps the missing events with the cursor.
func (r *run) list(ctx context.Context) error {
	for {
		page, err := r.o.Log.Page(ctx, r.query())
		if err != nil {
			return err
		}
		missing, err := r.missing(ctx, page.Events)
		if err != nil {
			return err
		}
		done := !page.HasMore || len(page.Events) == 0
		if err := r.keep(ctx, page, missing, done); err != nil {
			return err
		}
		if err := r.after(); err != nil {
			return err
		}
		if done {
			return nil
		}
	}
}

// keep records a page: its missing events, the cursor and the counts, in
// one transaction.
func (r *run) keep(ctx context.Context, page Page, missing []ProviderEvent, done bool) error {
	next := r.rep
	next.Pages++
	next.Listed += len(page.Events)
	next.Missing += len(missing)
	next.Present += len(page.Events) - len(missing)
	cursor, state := r.cursor, "listing"
	if n := len(page.Events); n > 0 {
		cursor = page.Events[n-1].ID
	}
	if done {
		state = "injecting"
	}
	err := pgx.BeginFunc(ctx, r.o.DB, func(tx pgx.Tx) error {
		b := &pgx.Batch{}
		seq := int64(r.rep.Listed)
		for _, e := range page.Events {
			seq++
			if !contains(missing, e.ID) {
				continue
			}
			b.Queue(`INSERT INTO reconcile_missing (run_id, event_id, event_type, created, seq, body) VALUES ($1, $2, $3, $4, $5, $6)
				ON CONFLICT DO NOTHING`, r.rep.RunID, e.ID, e.Type, e.Created, seq, e.Raw)
		}
		b.Queue(`UPDATE reconcile_runs SET cursor = $2, state = $3, pages = $4, listed = $5, present = $6, missing = $7, updated_at = now()
			WHERE id = $1`, r.rep.RunID, cursor, state, next.Pages, next.Listed, next.Present, next.Missing)
		return tx.SendBatch(ctx, b).Close()
	})
	if err != nil {
		return fmt.Errorf("reconcile: keep page %d: %w", next.Pages, err)
	}
	r.rep, r.cursor, r.state = next, cursor, state
	return nil
}

func contains(evs []ProviderEvent, id string) bool {
	for _, e := range evs {
		if e.ID == id {
			return true
		}
	}
	return false
}

// missing returns the events the ledger does not hold.
func (r *run) missing(ctx context.Context, evs []ProviderEvent) ([]ProviderEvent, error) {
	if len(evs) == 0 {
		return nil, nil
	}
	keys := make([]string, len(evs))
	for i, e := range evs {
		keys[i] = event.Key(r.o.Source, e.ID)
	}
	present, err := inLedger(ctx, r.o.DB, keys)
	if err != nil {
		return nil, err
	}
	var out []ProviderEvent
	for i, e := range evs {
		if !present[keys[i]] {
			out = append(out, e)
		}
	}
	return out, nil
}

// inject publishes the kept events oldest first, in batches of a page.
func (r *run) inject(ctx context.Context) error {
	for {
		batch, err := r.pending(ctx)
		if err != nil {
			return err
		}
		if len(batch) == 0 {
			_, err := r.o.DB.Exec(ctx, `UPDATE reconcile_runs SET state = 'done', finished_at = now(), updated_at = now() WHERE id = $1`, r.rep.RunID)
			if err != nil {
				return fmt.Errorf("reconcile: finish run %d: %w", r.rep.RunID, err)
			}
			r.state = "done"
			return nil
		}
		still, err := r.missing(ctx, batch)
		if err != nil {
			return err
		}
		settled := make(map[string][2]string, len(batch)) // id -> outcome, detail
		for _, e := range batch {
			settled[e.ID] = [2]string{"arrived", ""}
		}
		for _, e := range still {
			msg, err := r.message(e)
			if err != nil {
				settled[e.ID] = [2]string{"invalid", err.Error()}
				r.o.Logger.Warn("missing event not injected: the event decoder refuses it", zap.String("event_id", e.ID), zap.Error(err))
				continue
			}
			pctx, cancel := context.WithTimeout(ctx, r.o.PublishTimeout)
			err = r.o.Publisher.Publish(pctx, broker.Exchange, broker.RoutingKey, msg)
			cancel()
			if err != nil {
				// What was published stays unmarked and is checked again on
				// the next run: nothing is lost, at worst a duplicate.
				return fmt.Errorf("reconcile: publish %s: %w", e.ID, err)
			}
			settled[e.ID] = [2]string{"injected", ""}
		}
		if err := r.settle(ctx, settled); err != nil {
			return err
		}
		if err := r.after(); err != nil {
			return err
		}
	}
}

// pending returns the next kept events not yet settled, oldest first.
func (r *run) pending(ctx context.Context) ([]ProviderEvent, error) {
	rows, err := r.o.DB.Query(ctx, `SELECT event_id, event_type, created, body FROM reconcile_missing
		WHERE run_id = $1 AND outcome IS NULL ORDER BY created, seq DESC LIMIT $2`, r.rep.RunID, PageSize)
	if err != nil {
		return nil, fmt.Errorf("reconcile: read kept events: %w", err)
	}
	var out []ProviderEvent
	var e ProviderEvent
	_, err = pgx.ForEachRow(rows, []any{&e.ID, &e.Type, &e.Created, &e.Raw}, func() error {
		out = append(out, ProviderEvent{ID: e.ID, Type: e.Type, Created: e.Created, Raw: append([]byte(nil), e.Raw...)})
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("reconcile: read kept events: %w", err)
	}
	return out, nil
}

// settle marks a batch's outcomes and adds them to the run's counts.
func (r *run) settle(ctx context.Context, settled map[string][2]string) error {
	next := r.rep
	err := pgx.BeginFunc(ctx, r.o.DB, func(tx pgx.Tx) error {
		b := &pgx.Batch{}
		for id, s := range settled {
			switch s[0] {
			case "injected":
				next.Injected++
			case "arrived":
				next.Arrived++
			case "invalid":
				next.Invalid++
			}
			b.Queue(`UPDATE reconcile_missing SET outcome = $3, detail = $4, settled_at = now() WHERE run_id = $1 AND event_id = $2`,
				r.rep.RunID, id, s[0], s[1])
		}
		b.Queue(`UPDATE reconcile_runs SET injected = $2, arrived = $3, invalid = $4, updated_at = now() WHERE id = $1`,
			r.rep.RunID, next.Injected, next.Arrived, next.Invalid)
		return tx.SendBatch(ctx, b).Close()
	})
	if err != nil {
		return fmt.Errorf("reconcile: record injected events: %w", err)
	}
	r.rep = next
	return nil
}

// message is the pipeline message of a missing event: what the receiver
// would have published, marked as the reconciler's.
func (r *run) message(e ProviderEvent) (amqp.Publishing, error) {
	ev, err := event.Decode(e.Raw)
	if err != nil {
		return amqp.Publishing{}, err
	}
	if ev.ID != e.ID {
		return amqp.Publishing{}, fmt.Errorf("the listing says %s, the body %s", e.ID, ev.ID)
	}
	now := r.o.Now()
	return amqp.Publishing{
		ContentType:  "application/json",
		DeliveryMode: amqp.Persistent,
		MessageId:    event.Key(r.o.Source, ev.ID),
		Type:         ev.Type,
		Timestamp:    now,
		Body:         e.Raw,
		Headers: amqp.Table{
			broker.HeaderSource:     r.o.Source,
			broker.HeaderDigest:     event.AnyDigestHex,
			broker.HeaderReceivedAt: now.UnixMilli(),
			broker.HeaderOrigin:     string(effects.OriginReconcile),
		},
	}, nil
}

// refreshLimit bounds the objects one run refreshes; the rest wait for the
// next run.
const refreshLimit = 1000

// refresh fetches the objects marked needs_refresh and publishes each as a
// payments.RefreshType event: the worker applies it as the object's latest
// state in the usual transaction, so transition handlers run as for any
// change. It is not checkpointed: a refresh published twice applies the
// same state twice, which changes nothing the second time.
func (r *run) refresh(ctx context.Context, f ObjectFetcher) error {
	rows, err := r.o.DB.Query(ctx, `SELECT 'payment_intent', id FROM payment_intents WHERE needs_refresh
		UNION ALL SELECT 'charge', id FROM charges WHERE needs_refresh LIMIT $1`, refreshLimit)
	if err != nil {
		return fmt.Errorf("reconcile: find objects to refresh: %w", err)
	}
	type object struct{ kind, id string }
	var objs []object
	var o object
	if _, err := pgx.ForEachRow(rows, []any{&o.kind, &o.id}, func() error { objs = append(objs, o); return nil }); err != nil {
		return fmt.Errorf("reconcile: find objects to refresh: %w", err)
	}
	for _, o := range objs {
		at := r.o.Now().UTC()
		body, err := f.Object(ctx, o.kind, o.id)
		if err != nil {
			if ctx.Err() != nil {
				return err
			}
			r.rep.RefreshFailed++
			r.o.Logger.Warn("object marked needs_refresh not fetched", zap.String("object", o.kind+" "+o.id), zap.Error(err))
			continue
		}
		msg, err := r.refreshMessage(o.kind, o.id, at, body)
		if err != nil {
			r.rep.RefreshFailed++
			r.o.Logger.Warn("fetched object not usable", zap.String("object", o.kind+" "+o.id), zap.Error(err))
			continue
		}
		pctx, cancel := context.WithTimeout(ctx, r.o.PublishTimeout)
		err = r.o.Publisher.Publish(pctx, broker.Exchange, broker.RoutingKey, msg)
		cancel()
		if err != nil {
			return fmt.Errorf("reconcile: publish the refresh of %s %s: %w", o.kind, o.id, err)
		}
		r.rep.Refreshed++
	}
	return nil
}

// refreshMessage wraps a fetched object in an event of type
// payments.RefreshType, created at the time of the fetch.
func (r *run) refreshMessage(kind, id string, at time.Time, object []byte) (amqp.Publishing, error) {
	var head struct {
		Object string `json:"object"`
		ID     string `json:"id"`
	}
	if err := json.Unmarshal(object, &head); err != nil {
		return amqp.Publishing{}, err
	}
	if head.Object != kind || head.ID != id {
		return amqp.Publishing{}, fmt.Errorf("asked for %s %s, got %s %s", kind, id, head.Object, head.ID)
	}
	body, err := json.Marshal(map[string]any{
		"id": fmt.Sprintf("refresh_%s_%d", id, at.UnixNano()), "object": "event", "type": payments.RefreshType,
		"created": at.Unix(), "data": map[string]json.RawMessage{"object": object},
	})
	if err != nil {
		return amqp.Publishing{}, err
	}
	return r.message(ProviderEvent{ID: fmt.Sprintf("refresh_%s_%d", id, at.UnixNano()), Type: payments.RefreshType, Created: at, Raw: body})
}

func (r *run) after() error {
	if r.o.AfterPage == nil {
		return nil
	}
	return r.o.AfterPage(r.rep)
}

// dryRun lists the window and reports what is missing, writing nothing.
func (r *run) dryRun(ctx context.Context) (Report, error) {
	now := r.o.Now().UTC().Truncate(time.Second)
	r.rep = Report{Source: r.o.Source, DryRun: true, From: now.Add(-r.o.Since), To: now.Add(-r.o.Settle)}
	for {
		page, err := r.o.Log.Page(ctx, r.query())
		if err != nil {
			return r.rep, err
		}
		missing, err := r.missing(ctx, page.Events)
		if err != nil {
			return r.rep, err
		}
		r.rep.Pages++
		r.rep.Listed += len(page.Events)
		r.rep.Missing += len(missing)
		r.rep.Present += len(page.Events) - len(missing)
		for _, e := range missing {
			r.rep.MissingIDs = append(r.rep.MissingIDs, e.ID)
		}
		if !page.HasMore || len(page.Events) == 0 {
			return r.rep, nil
		}
		r.cursor = page.Events[len(page.Events)-1].ID
	}
}
