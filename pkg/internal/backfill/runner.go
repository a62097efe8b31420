package backfill

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/idempotent-events/idempotent-events/pkg/effects"
	"github.com/idempotent-events/idempotent-events/pkg/internal/options"
	"github.com/idempotent-events/idempotent-events/pkg/internal/store"
)

// Item outcomes (backfill_items.outcome).
const (
	OutcomeApplied = "applied"
	OutcomeSkipped = "skipped"
	OutcomeFailed  = "failed"
)

// Ledger runs the Runner's fenced transactions; *store.Store is the real one.
type Ledger interface {
	InFence(ctx context.Context, mine store.Fence, fn func(tx store.Tx) error) error
}

// RunnerOptions configure a Runner.
type RunnerOptions struct {
	DB     *pgxpool.Pool
	Ledger Ledger
	// Effects are the worker's handlers: the Runner takes the backfills of
	// its event handlers.
	Effects *effects.Registry
	// Outbox gives a handler's transaction its outbox, as the worker's.
	Outbox func(tx effects.Tx) effects.Outbox
	// Fence is the worker's registration (the zero Fence before it
	// registered): a backfill runs only in a transaction fenced by it.
	Fence func() store.Fence
	// Poll is how often the Runner looks for backfills when it has none.
	Poll time.Duration
	// MaxAttempts is how many times an item is tried before it is
	// recorded failed.
	MaxAttempts int
	Logger      *zap.Logger
	Metrics     *Metrics
}

// Runner runs the backfills of the worker's handlers.
type Runner struct {
	o     RunnerOptions
	names []string
}

// Metrics are the Runner's.
type Metrics struct {
	items *prometheus.CounterVec
}

// NewMetrics registers the Runner's metrics on reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{items: prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "idempotent_events_backfill_items_total",
		Help: "Backfill items this worker ran, by handler and outcome: applied, skipped (the handler returned Skip), failed (Permanent, a panic, or its attempts used up), retried (an error; tried again later).",
	}, []string{"handler", "outcome"})}
	reg.MustRegister(m.items)
	return m
}

// NewRunner returns a Runner, or nil when the worker has no event handler
// (nothing it could backfill).
func NewRunner(o RunnerOptions) (*Runner, error) {
	p := options.Check("backfill")
	p.Need(o.DB != nil, "DB", "is required")
	p.Need(o.Ledger != nil, "Ledger", "is required")
	p.Need(o.Effects != nil, "Effects", "is required")
	p.Need(o.Fence != nil, "Fence", "is required")
	if err := p.Err(); err != nil {
		return nil, err
	}
	if o.Outbox == nil {
		o.Outbox = func(effects.Tx) effects.Outbox { return effects.NoOutbox{} }
	}
	if o.Poll <= 0 {
		o.Poll = 5 * time.Second
	}
	if o.MaxAttempts <= 0 {
		o.MaxAttempts = 5
	}
	if o.Logger == nil {
		o.Logger = zap.NewNop()
	}
	if o.Metrics == nil {
		o.Metrics = NewMetrics(prometheus.NewRegistry())
	}
	r := &Runner{o: o}
	for _, h := range o.Effects.Set().Handlers {
		if h.ObjectType == "" {
			r.names = append(r.names, h.Name)
		}
	}
	if len(r.names) == 0 {
		return nil, nil
	}
	return r, nil
}

// Run runs backfills until ctx is done: while one of the worker's handlers
// has an open backfill, it runs its items at the backfill's rate;
// otherwise it looks again every Poll. Database errors and a fenced worker
// are waited out.
func (r *Runner) Run(ctx context.Context) {
	for ctx.Err() == nil {
		wait, err := r.Step(ctx)
		if err != nil && ctx.Err() == nil {
			if errors.Is(err, store.ErrFenced) {
				r.o.Logger.Debug("backfill waits: the handler set is not current", zap.Error(err))
			} else {
				r.o.Logger.Warn("backfill", zap.Error(err))
			}
			wait = r.o.Poll
		}
		select {
		case <-ctx.Done():
		case <-time.After(wait):
		}
	}
}

// Step runs at most one item of an open backfill of the worker's handlers
// and says how long to wait before the next Step.
func (r *Runner) Step(ctx context.Context) (wait time.Duration, err error) {
	mine := r.o.Fence()
	if mine.SetID == "" {
		return r.o.Poll, nil
	}
	// The oldest open backfill of ours whose next slot is due takes it:
	// next_at moves by one event's share of the rate, so every worker
	// together stays within it.
	var id int64
	var handler string
	var secs float64
	err = r.o.DB.QueryRow(ctx, `
WITH o AS (
  SELECT id, next_at FROM backfills WHERE finished_at IS NULL AND handler = ANY($1) ORDER BY next_at, id LIMIT 1
), slot AS (
  UPDATE backfills b SET next_at = greatest(b.next_at, clock_timestamp()) + interval '1 second' / b.rate
  FROM o WHERE b.id = o.id AND b.next_at <= clock_timestamp() -- the row's, re-read after its lock: two workers never share a slot
  RETURNING b.id, b.handler
)
SELECT o.id, coalesce(slot.handler, ''), greatest(extract(epoch FROM o.next_at - clock_timestamp()), 0)::float8
FROM o LEFT JOIN slot ON slot.id = o.id`, r.names).Scan(&id, &handler, &secs)
	if errors.Is(err, pgx.ErrNoRows) {
		return r.o.Poll, nil
	}
	if err != nil {
		return 0, fmt.Errorf("take a backfill slot: %w", err)
	}
	if handler == "" { // its next slot is not due yet
		return min(time.Duration(secs*float64(time.Second)), r.o.Poll), nil
	}
	return 0, r.runOne(ctx, mine, id, handler)
}

// item is one backfill_items row with its event.
type item struct {
	id       int64
	attempts int
	ev       effects.Event
	archived bool
}

// runOne runs the next pending item of backfill id, if any, in a fenced
// transaction that also marks it done; when none is pending it records the
// backfill finished.
func (r *Runner) runOne(ctx context.Context, mine store.Fence, id int64, name string) error {
	h, _, ok := r.o.Effects.Named(name)
	if !ok {
		return fmt.Errorf("backfill %d: handler %q is not registered here", id, name)
	}
	var it item
	var found bool
	var out effects.Outbox
	var outcome string
	err := r.o.Ledger.InFence(ctx, mine, func(tx store.Tx) error {
		var err error
		if it, found, err = claim(ctx, tx, id); err != nil || !found {
			return err
		}
		if !it.archived {
			outcome = OutcomeFailed
			_, err = tx.Exec(ctx, `UPDATE backfill_items SET attempts = attempts + 1, outcome = $2, finished_at = now(), last_error = $3 WHERE id = $1`,
				it.id, outcome, "the event's body is no longer in event_archive (pruned)")
			return err
		}
		out = r.o.Outbox(tx)
		err = run(ctx, h, it.ev, tx, out)
		var skip *effects.SkipError
		switch {
		case errors.As(err, &skip):
			outcome = OutcomeSkipped
		case err != nil:
			return &handlerError{err: err}
		default:
			outcome = OutcomeApplied
		}
		if f, ok := out.(interface{ Flush(context.Context) error }); ok {
			if err := f.Flush(ctx); err != nil {
				return &handlerError{err: err}
			}
		}
		_, err = tx.Exec(ctx, `UPDATE backfill_items SET attempts = attempts + 1, outcome = $2, finished_at = now(), last_error = NULL WHERE id = $1`, it.id, outcome)
		return err
	})
	var herr *handlerError
	switch {
	case errors.As(err, &herr):
		return r.failed(ctx, id, name, it, herr.err)
	case err != nil:
		return fmt.Errorf("backfill %d (%s): %w", id, name, err)
	case !found:
		_, err := r.o.DB.Exec(ctx, `UPDATE backfills SET finished_at = now() WHERE id = $1 AND finished_at IS NULL
			AND NOT EXISTS (SELECT 1 FROM backfill_items WHERE backfill_id = $1 AND finished_at IS NULL)`, id)
		if err != nil {
			return fmt.Errorf("backfill %d: record it finished: %w", id, err)
		}
		return nil
	}
	if c, ok := out.(interface{ Committed() }); ok {
		c.Committed()
	}
	r.o.Metrics.items.WithLabelValues(name, outcome).Inc()
	return nil
}

// claim locks the next pending item of backfill id that no other worker
// holds, with its archived event.
func claim(ctx context.Context, tx store.Tx, id int64) (it item, found bool, err error) {
	var src, pid, typ, objType, objID *string
	var created *time.Time
	var body []byte
	err = tx.QueryRow(ctx, `
SELECT i.id, i.attempts, i.event_id, a.source, a.provider_id, a.event_type, a.created, a.object_type, a.object_id, a.body
FROM backfill_items i LEFT JOIN event_archive a ON a.event_id = i.event_id
WHERE i.backfill_id = $1 AND i.finished_at IS NULL AND (i.retry_at IS NULL OR i.retry_at <= now())
ORDER BY i.id LIMIT 1
FOR UPDATE OF i SKIP LOCKED`, id).Scan(&it.id, &it.attempts, &it.ev.Key, &src, &pid, &typ, &created, &objType, &objID, &body)
	if errors.Is(err, pgx.ErrNoRows) {
		return item{}, false, nil
	}
	if err != nil {
		return item{}, false, fmt.Errorf("claim an item of backfill %d: %w", id, err)
	}
	if body != nil {
		it.archived = true
		it.ev.Source, it.ev.ID, it.ev.Type = *src, *pid, *typ
		it.ev.Object = effects.Object{Type: *objType, ID: *objID}
		if created != nil {
			it.ev.Created = *created
		}
		it.ev.Raw, it.ev.Attempt, it.ev.Origin = body, it.attempts+1, effects.OriginBackfill
	}
	return it, true, nil
}

// handlerError is the handler's own failure (its transaction rolled back).
type handlerError struct{ err error }

func (e *handlerError) Error() string { return e.err.Error() }

// run runs h over ev; a panic is a permanent failure.
func run(ctx context.Context, h effects.Handler, ev effects.Event, tx effects.Tx, out effects.Outbox) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = effects.Permanent(fmt.Errorf("panic: %v\n%s", p, debug.Stack()))
		}
	}()
	return h.Handle(ctx, ev, tx, out)
}

// failed records a failed try of it: failed for good when the handler said
// Permanent (or panicked) or its attempts are used up, tried again after
// a backoff (2, 4, 8… seconds, at most a minute) otherwise. A worker that has since run it (its attempt
// committed) is not overwritten.
func (r *Runner) failed(ctx context.Context, id int64, name string, it item, cause error) error {
	var perm *effects.PermanentError
	final := errors.As(cause, &perm) || it.attempts+1 >= r.o.MaxAttempts
	outcome := "retried"
	var done *string
	if final {
		outcome = OutcomeFailed
		done = &outcome
	}
	_, err := r.o.DB.Exec(ctx, `UPDATE backfill_items SET attempts = attempts + 1, last_error = $2,
		outcome = $3, finished_at = CASE WHEN $3::text IS NULL THEN NULL ELSE now() END,
		retry_at = now() + least(power(2, attempts + 1), 60) * interval '1 second'
		WHERE id = $1 AND finished_at IS NULL`, it.id, cause.Error(), done)
	if err != nil {
		return fmt.Errorf("backfill %d: record the failure of %s: %w", id, it.ev.Key, err)
	}
	r.o.Metrics.items.WithLabelValues(name, outcome).Inc()
	r.o.Logger.Warn("backfill item failed", zap.Int64("backfill", id), zap.String("handler", name), zap.String("event_id", it.ev.Key),
		zap.Int("attempt", it.attempts+1), zap.Bool("final", final), zap.Error(cause))
	return nil
}
