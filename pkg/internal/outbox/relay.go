package outbox

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"
	"go.uber.org/zap"

	"github.com/idempotent-events/idempotent-events/pkg/internal/backoff"
	"github.com/idempotent-events/idempotent-events/pkg/internal/broker"
	"github.com/idempotent-events/idempotent-events/pkg/internal/options"
	"github.com/idempotent-events/idempotent-events/pkg/internal/tlsconfig"
)

// Message headers of a published outbox message, beside MessageId (the
// idempotency key).
const (
	HeaderObjectID = "x-ie-object-id"
	HeaderSeq      = "x-ie-seq"
	HeaderEventID  = "x-ie-event-id"
	HeaderEffect   = "x-ie-effect"
)

// Options configures a Relay.
type Options struct {
	// Pool is where the outbox table is.
	Pool *pgxpool.Pool
	// DatabaseURL is where LISTEN wakes the relay early (a connection of
	// its own); empty leaves only the polling.
	DatabaseURL string
	// DatabaseTLS is the TLS of that connection (DATABASE_TLS_*), the
	// same as Pool's; nil: none of ours.
	DatabaseTLS *tlsconfig.Client
	// Dialer reaches RabbitMQ; the relay reconnects through it.
	Dialer broker.Dialer
	// BatchSize is how many rows one round claims at most.
	BatchSize int
	// PollInterval is how long the relay waits for work when it found none.
	PollInterval time.Duration
	// PublishTimeout bounds waiting for one confirm.
	PublishTimeout time.Duration
	// MaxAttempts is how many failed publishes park a row.
	MaxAttempts int
	// MaxBackoff caps the wait before a failed row is tried again.
	MaxBackoff time.Duration
	// Retention is how long published rows are kept; older ones are
	// deleted in batches.
	Retention time.Duration
	Logger    *zap.Logger // zap.NewNop() when nil
	Metrics   *Metrics
	// AfterConfirm runs after the broker confirmed a round's messages and
	// before they are marked published; an error simulates the relay dying
	// there. For tests.
	AfterConfirm func(keys []string) error
}

func (o *Options) validate() error {
	p := options.Check("outbox")
	need := p.Need
	need(o.Pool != nil, "Pool", "is required")
	need(o.Dialer.URL != "", "Dialer.URL", "is required")
	need(o.BatchSize >= 1, "BatchSize", "must be at least 1")
	need(o.PollInterval > 0, "PollInterval", "must be positive")
	need(o.PublishTimeout > 0, "PublishTimeout", "must be positive")
	need(o.MaxAttempts >= 1, "MaxAttempts", "must be at least 1")
	need(o.MaxBackoff > 0, "MaxBackoff", "must be positive")
	need(o.Retention > 0, "Retention", "must be positive")
	need(o.Metrics != nil, "Metrics", "is required")
	if err := p.Err(); err != nil {
		return err
	}
	if o.Logger == nil {
		o.Logger = zap.NewNop()
	}
	return nil
}

// Relay publishes committed outbox rows; see the package documentation.
// Several relays may run at once.
type Relay struct {
	opts Options
	log  *zap.Logger
	wake chan struct{}
	// connected is set while the relay holds a confirm channel.
	connected atomic.Bool
	// dbDown is why PostgreSQL failed the last round; nil once one passed.
	dbDown atomic.Pointer[string]
}

// NewRelay validates opts and returns a Relay.
func NewRelay(opts Options) (*Relay, error) {
	if err := opts.validate(); err != nil {
		return nil, err
	}
	return &Relay{opts: opts, log: opts.Logger, wake: make(chan struct{}, 1)}, nil
}

// Wake makes the relay look for work now rather than at its next poll.
func (r *Relay) Wake() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// Ready is nil while the relay is connected to the broker and can publish.
func (r *Relay) Ready() error {
	if !r.connected.Load() {
		return errors.New("not publishing: RabbitMQ (AMQP_URL) not connected")
	}
	if e := r.dbDown.Load(); e != nil {
		return errors.New("not publishing: " + *e)
	}
	return nil
}

// dbError is a relay round's failure that is PostgreSQL's, not the
// broker's: it must not cost the broker connection.
type dbError struct {
	what string
	err  error
}

func (e *dbError) Error() string { return e.what + ": " + e.err.Error() }
func (e *dbError) Unwrap() error { return e.err }

func databaseError(what string, err error) error { return &dbError{what: what, err: err} }

// databaseDown records that PostgreSQL failed a round: logged once per
// outage (the rounds retried meanwhile are not), named in Ready.
func (r *Relay) databaseDown(err *dbError) {
	reason := "PostgreSQL (DATABASE_URL): " + err.Error()
	if r.dbDown.Swap(&reason) == nil {
		r.log.Warn("postgres (DATABASE_URL) failing: the outbox waits, the broker connection stays", zap.Error(err))
	}
}

func (r *Relay) databaseUp() {
	if r.dbDown.Swap(nil) != nil {
		r.log.Info("postgres (DATABASE_URL) answers again: publishing the outbox")
	}
}

// Run relays until ctx is done, reconnecting to the broker whenever the
// connection is lost, and keeps the gauges and the retention beside it.
func (r *Relay) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	if r.opts.DatabaseURL != "" {
		wg.Go(func() { r.listen(ctx) })
	}
	wg.Go(func() { r.housekeep(ctx) })
	err := broker.Supervise(ctx, r.opts.Dialer, r.log.Named("broker"), func(bool) {}, r.serve)
	wg.Wait()
	return err
}

// serve relays on one broker connection until it is lost or ctx is done.
func (r *Relay) serve(ctx context.Context, conn *amqp.Connection) error {
	ch, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("open channel: %w", err)
	}
	err = ch.ExchangeDeclare(Exchange, "topic", true, false, false, false, nil)
	_ = ch.Close()
	if err != nil {
		return fmt.Errorf("declare exchange %s: %w", Exchange, err)
	}
	pub, err := broker.OpenConfirmChannel(conn)
	if err != nil {
		return err
	}
	defer pub.Close()
	r.connected.Store(true)
	defer r.connected.Store(false)
	dbWait := 100 * time.Millisecond
	for {
		n, err := r.round(ctx, pub)
		var dbErr *dbError
		switch {
		case err != nil && ctx.Err() != nil:
			return nil
		case errors.As(err, &dbErr):
			// PostgreSQL's fault, not the broker's: the connection stays,
			// and the round is tried again once the database answers.
			r.databaseDown(dbErr)
			t := time.NewTimer(backoff.Jitter(dbWait))
			select {
			case <-ctx.Done():
				t.Stop()
				return nil
			case <-pub.Done():
				t.Stop()
				return errors.New("publish channel closed")
			case <-t.C:
			}
			dbWait = min(2*dbWait, 5*time.Second)
			continue
		case err != nil:
			return err
		}
		dbWait = 100 * time.Millisecond
		r.databaseUp()
		if n == r.opts.BatchSize {
			continue // more is waiting
		}
		t := time.NewTimer(r.opts.PollInterval)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-pub.Done():
			t.Stop()
			return errors.New("publish channel closed")
		case <-r.wake:
		case <-t.C:
		}
		t.Stop()
	}
}

// customPlan runs a statement as pgx's unnamed statement, planned by
// Postgres for the table as it is now, every time: kept prepared, the
// claim would get a generic plan after five rounds, and one made while the
// outbox was nearly empty (a new install) can be a sequential scan kept for
// the connection's life while the published rows of the retention period
// pile up (the store's statements do the same, for the same reason).
var customPlan = pgx.QueryExecModeCacheDescribe

// claim selects the rows a round publishes: unpublished, not parked, due,
// each the lowest unpublished sequence number of its object (a parked row
// holds its object's later rows back), locked so that other relays skip
// them.
const claim = `
SELECT id, idempotency_key, event_id, effect, object_id, seq, exchange, routing_key, headers, body, attempts
FROM outbox o
WHERE published_at IS NULL AND parked_at IS NULL AND next_attempt_at <= now()
	AND NOT EXISTS (SELECT 1 FROM outbox p WHERE p.object_id = o.object_id AND p.seq < o.seq AND p.published_at IS NULL)
ORDER BY id
LIMIT $1
FOR UPDATE SKIP LOCKED`

type row struct {
	id                                                int64
	key, eventID, effect, objectID, exchange, routing string
	seq                                               int64
	headers                                           map[string]string
	body                                              []byte
	attempts                                          int
	err                                               error
}

// round claims a batch, publishes it and records the outcome, in one
// transaction; it returns how many rows it claimed. Nothing is marked
// published unless the broker acked it without returning it.
func (r *Relay) round(ctx context.Context, pub *broker.ConfirmChannel) (int, error) {
	tx, err := r.opts.Pool.Begin(ctx)
	if err != nil {
		return 0, databaseError("begin", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	rs, err := tx.Query(ctx, claim, customPlan, r.opts.BatchSize)
	if err != nil {
		return 0, databaseError("claim outbox rows", err)
	}
	var rows []*row
	for rs.Next() {
		w := &row{}
		if err := rs.Scan(&w.id, &w.key, &w.eventID, &w.effect, &w.objectID, &w.seq, &w.exchange, &w.routing, &w.headers, &w.body, &w.attempts); err != nil {
			rs.Close()
			return 0, databaseError("read outbox row", err)
		}
		rows = append(rows, w)
	}
	rs.Close()
	if err := rs.Err(); err != nil {
		return 0, databaseError("claim outbox rows", err)
	}
	if len(rows) == 0 {
		if err := tx.Commit(ctx); err != nil {
			return 0, databaseError("commit outbox round", err)
		}
		return 0, nil
	}

	var wg sync.WaitGroup
	for _, w := range rows {
		wg.Go(func() { w.err = r.publish(ctx, pub, w) })
	}
	wg.Wait()
	var ok []int64
	var keys []string
	for _, w := range rows {
		switch {
		case w.err == nil:
			ok, keys = append(ok, w.id), append(keys, w.key)
		case errors.Is(w.err, broker.ErrUnavailable) || ctx.Err() != nil:
			// The broker is gone, not this row's fault: nothing is counted;
			// the rows are released and tried again after the reconnect.
			return 0, w.err
		}
	}
	if r.opts.AfterConfirm != nil {
		if err := r.opts.AfterConfirm(keys); err != nil {
			return 0, err // rolled back: the rows are published again
		}
	}
	if len(ok) > 0 {
		if _, err := tx.Exec(ctx, `UPDATE outbox SET published_at = now(), attempts = attempts + 1 WHERE id = ANY($1)`,
			customPlan, ok); err != nil {
			return 0, databaseError("mark published", err)
		}
	}
	parked := 0
	for _, w := range rows {
		if w.err == nil {
			continue
		}
		attempts := w.attempts + 1
		wait := min(r.opts.MaxBackoff, time.Duration(1<<min(attempts, 20))*100*time.Millisecond)
		park := attempts >= r.opts.MaxAttempts
		if park {
			parked++
		}
		if _, err := tx.Exec(ctx, `UPDATE outbox SET attempts = $2, last_error = $3,
			next_attempt_at = now() + $4 * interval '1 millisecond', parked_at = CASE WHEN $5 THEN now() END WHERE id = $1`,
			w.id, attempts, truncate(w.err.Error(), 1024), wait.Milliseconds(), park); err != nil {
			return 0, databaseError("record failed publish of "+w.key, err)
		}
		r.opts.Metrics.failures.WithLabelValues(failureReason(w.err)).Inc()
		level := r.log.Warn
		if park {
			level = r.log.Error
		}
		level("outbox message not published", zap.String("idempotency_key", w.key), zap.Int("attempts", attempts),
			zap.Bool("parked", park), zap.Error(w.err))
	}
	if err := tx.Commit(ctx); err != nil {
		return 0, databaseError("commit outbox round", err)
	}
	r.opts.Metrics.published.Add(float64(len(ok)))
	r.opts.Metrics.parked.Add(float64(parked))
	return len(rows), nil
}

func (r *Relay) publish(ctx context.Context, pub *broker.ConfirmChannel, w *row) error {
	h := amqp.Table{HeaderObjectID: w.objectID, HeaderSeq: w.seq, HeaderEventID: w.eventID, HeaderEffect: w.effect}
	for k, v := range w.headers {
		h[k] = v
	}
	pctx, cancel := context.WithTimeout(ctx, r.opts.PublishTimeout)
	defer cancel()
	return pub.Publish(pctx, w.exchange, w.routing, amqp.Publishing{
		ContentType: "application/octet-stream", MessageId: w.key, Timestamp: time.Now(), Headers: h, Body: w.body,
	})
}

func failureReason(err error) string {
	switch {
	case errors.Is(err, broker.ErrReturned):
		return "returned"
	case errors.Is(err, broker.ErrNacked):
		return "nacked"
	case errors.Is(err, context.DeadlineExceeded):
		return "timeout"
	}
	return "other"
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n]
}

// listen wakes the relay when an enqueue commits (NOTIFY), on a connection
// of its own, reconnecting with backoff; polling stays the truth.
func (r *Relay) listen(ctx context.Context) {
	wait := 100 * time.Millisecond
	for ctx.Err() == nil {
		err := r.listenOnce(ctx)
		if ctx.Err() != nil {
			return
		}
		r.log.Debug("outbox LISTEN connection lost", zap.Error(err))
		if !backoff.Sleep(ctx, backoff.Jitter(wait)) {
			return
		}
		wait = min(wait*2, 10*time.Second)
	}
}

func (r *Relay) listenOnce(ctx context.Context) error {
	conn, err := r.opts.DatabaseTLS.ConnectPgx(ctx, r.opts.DatabaseURL)
	if err != nil {
		return err
	}
	defer func() { _ = conn.Close(context.WithoutCancel(ctx)) }()
	if _, err := conn.Exec(ctx, "LISTEN "+Channel); err != nil {
		return err
	}
	for {
		if _, err := conn.WaitForNotification(ctx); err != nil {
			return err
		}
		r.Wake()
	}
}

// housekeeping refreshes the gauges every few seconds and deletes
// published rows older than Retention, in batches.
const (
	gaugeEvery   = 5 * time.Second
	cleanupEvery = time.Minute
	cleanupBatch = 1000
)

func (r *Relay) housekeep(ctx context.Context) {
	gauges := time.NewTicker(gaugeEvery)
	defer gauges.Stop()
	cleanup := time.NewTicker(cleanupEvery)
	defer cleanup.Stop()
	r.refreshGauges(ctx)
	for {
		select {
		case <-ctx.Done():
			return
		case <-gauges.C:
			r.refreshGauges(ctx)
		case <-cleanup.C:
			if n, err := r.Cleanup(ctx); err != nil && ctx.Err() == nil {
				r.log.Warn("outbox cleanup failed", zap.Error(err))
			} else if n > 0 {
				r.log.Info("outbox cleanup", zap.Int("deleted", n))
			}
		}
	}
}

func (r *Relay) refreshGauges(ctx context.Context) {
	var backlog, parked int64
	var oldest float64
	err := r.opts.Pool.QueryRow(ctx, `SELECT
		count(*) FILTER (WHERE parked_at IS NULL),
		count(*) FILTER (WHERE parked_at IS NOT NULL),
		coalesce(extract(epoch FROM now() - min(created_at) FILTER (WHERE parked_at IS NULL)), 0)
		FROM outbox WHERE published_at IS NULL`).Scan(&backlog, &parked, &oldest)
	if err != nil {
		if ctx.Err() == nil {
			r.log.Debug("outbox gauges unavailable", zap.Error(err))
		}
		return
	}
	r.opts.Metrics.backlog.Set(float64(backlog))
	r.opts.Metrics.parkedNow.Set(float64(parked))
	r.opts.Metrics.oldest.Set(oldest)
}

// Cleanup deletes published rows older than Retention, cleanupBatch at a
// time so that no statement holds many locks for long, and returns how
// many it deleted.
func (r *Relay) Cleanup(ctx context.Context) (int, error) {
	total := 0
	for {
		tag, err := r.opts.Pool.Exec(ctx, `DELETE FROM outbox WHERE id IN (
			SELECT id FROM outbox WHERE published_at < now() - $1 * interval '1 millisecond' ORDER BY published_at LIMIT $2)`,
			r.opts.Retention.Milliseconds(), cleanupBatch)
		if err != nil {
			return total, fmt.Errorf("delete published outbox rows: %w", err)
		}
		n := int(tag.RowsAffected())
		total += n
		r.opts.Metrics.deleted.Add(float64(n))
		if n < cleanupBatch {
			return total, nil
		}
	}
}
