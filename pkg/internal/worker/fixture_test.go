package worker_test

import (
	"context"
	"errors"
	"maps"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap/zaptest"

	"github.com/idempotent-events/idempotent-events/pkg/internal/broker"
	"github.com/idempotent-events/idempotent-events/pkg/internal/dedupe"
	"github.com/idempotent-events/idempotent-events/pkg/internal/event"
	"github.com/idempotent-events/idempotent-events/pkg/internal/event/eventtest"
	"github.com/idempotent-events/idempotent-events/pkg/internal/servicetest"
	"github.com/idempotent-events/idempotent-events/pkg/internal/store"
	"github.com/idempotent-events/idempotent-events/pkg/internal/worker"
	"github.com/idempotent-events/idempotent-events/pkg/payments"
)

// env is one test's pipeline: its vhost, schema and Redis prefix.
type env struct {
	t       *testing.T
	amqpURL string
	dbURL   string
	prefix  string
	topo    broker.Topology
	broker  *servicetest.Broker
	store   *store.Store
}

func newEnv(t *testing.T, queueType string, delays ...time.Duration) *env {
	t.Helper()
	if len(delays) == 0 {
		delays = []time.Duration{200 * time.Millisecond, 400 * time.Millisecond}
	}
	e := &env{t: t, amqpURL: servicetest.VHost(t), dbURL: servicetest.Schema(t), prefix: servicetest.RedisPrefix(t),
		topo: broker.Topology{QueueType: queueType, RetryDelays: delays, DeliveryLimit: 100}}
	e.broker = servicetest.NewBroker(t, e.amqpURL, e.topo)
	st, err := store.Open(context.Background(), e.dbURL, 4)
	require.NoError(t, err)
	t.Cleanup(st.Close)
	e.store = st
	return e
}

// running is a worker started by a test.
type running struct {
	w       *worker.Worker
	reg     *prometheus.Registry
	cancel  context.CancelFunc
	done    chan error
	stopped sync.Once
}

type option func(*worker.Options, *env)

func batched(size int, wait time.Duration) option {
	return func(o *worker.Options, _ *env) { o.BatchSize, o.BatchWait = size, wait }
}

func prefetch(n int) option { return func(o *worker.Options, _ *env) { o.Prefetch = n } }

func concurrency(n int) option { return func(o *worker.Options, _ *env) { o.Concurrency = n } }

func hooks(h worker.Hooks) option { return func(o *worker.Options, _ *env) { o.Hooks = h } }

func databaseURL(url string) option {
	return func(o *worker.Options, e *env) {
		st, err := store.Open(context.Background(), url, 4)
		require.NoError(e.t, err)
		e.t.Cleanup(st.Close)
		o.Ledger = st
	}
}

func redisURL(url string) option {
	return func(o *worker.Options, e *env) {
		c, err := dedupe.Open(url, e.prefix, time.Minute)
		require.NoError(e.t, err)
		e.t.Cleanup(func() { _ = c.Close() })
		o.Cache = c
	}
}

// retryOnOutage sends messages through the retry tiers while Postgres is
// unreachable, instead of pausing.
func retryOnOutage() option { return func(o *worker.Options, _ *env) { o.RetryOnOutage = true } }

func shutdownTimeout(d time.Duration) option {
	return func(o *worker.Options, _ *env) { o.ShutdownTimeout = d }
}

// start runs a worker until stop or the end of the test, and waits until
// it consumes.
func (e *env) start(opts ...option) *running {
	e.t.Helper()
	r := e.startNoWait(opts...)
	require.Eventually(e.t, func() bool { return r.w.Ready() == nil }, 10*time.Second, 10*time.Millisecond, "worker never consumed")
	return r
}

// startNoWait is start without waiting until the worker consumes.
func (e *env) startNoWait(opts ...option) *running {
	e.t.Helper()
	o := worker.Options{
		Dialer:   broker.Dialer{URL: e.amqpURL, Name: e.t.Name(), MaxBackoff: 200 * time.Millisecond, DialTimeout: time.Second},
		Topology: e.topo, Prefetch: 64, ReplayPrefetch: 4, Concurrency: 2, BatchSize: 16, BatchWait: 5 * time.Millisecond,
		ProcessTimeout: 3 * time.Second, PublishTimeout: 3 * time.Second, ShutdownTimeout: 10 * time.Second,
		Ledger: e.store, Effects: payments.Effects(), Logger: zaptest.NewLogger(e.t),
	}
	c, err := dedupe.Open(servicetest.RedisURL, e.prefix, time.Minute)
	require.NoError(e.t, err)
	e.t.Cleanup(func() { _ = c.Close() })
	o.Cache = c
	for _, opt := range opts {
		opt(&o, e)
	}
	r := &running{reg: prometheus.NewRegistry(), done: make(chan error, 1)}
	o.Metrics = worker.NewMetrics(r.reg)
	w, err := worker.New(o)
	require.NoError(e.t, err)
	r.w = w
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel = cancel
	go func() { r.done <- r.w.Run(ctx) }()
	e.t.Cleanup(func() { r.stop(e.t) })
	return r
}

// stop shuts the worker down as SIGTERM would and waits for Run; calling
// it again does nothing.
func (r *running) stop(t *testing.T) {
	t.Helper()
	r.stopped.Do(func() {
		r.cancel()
		select {
		case err := <-r.done:
			require.NoError(t, err)
		case <-time.After(30 * time.Second):
			t.Fatal("worker did not stop within 30s")
		}
	})
}

// count is the value of a worker metric, 0 when it has no series yet.
func (r *running) count(name string, labels ...string) float64 {
	return max(0, servicetest.Metric(r.reg, name, labels...))
}

func (r *running) outcomes(outcome string) float64 {
	return r.count("idempotent_events_worker_events_total", "outcome", outcome)
}

func (e *env) event(id string) []byte {
	return eventtest.Payment(id)
}

// publish publishes body as the receiver does: MessageId the dedupe key and
// x-ie-digest the content digest (when the body decodes, as it always does
// for the receiver).
func (e *env) publish(body []byte) { e.publishWith(body, nil) }

func (e *env) publishWith(body []byte, h amqp.Table) {
	e.t.Helper()
	h = maps.Clone(h)
	if h == nil {
		h = amqp.Table{}
	}
	source := broker.String(h, broker.HeaderSource)
	if source == "" {
		source = event.DefaultSource
	}
	ev, err := event.Parse(broker.String(h, broker.HeaderScheme), broker.String(h, broker.HeaderEventID),
		broker.String(h, broker.HeaderEventType), body)
	if err != nil {
		e.broker.PublishEvent(body, h)
		return
	}
	h[broker.HeaderDigest] = ev.DigestHex()
	e.broker.PublishEventWithID(body, event.Key(source, ev.ID), h)
}

// publishBare publishes body with neither MessageId nor x-ie-digest, as a
// tool or an older receiver might.
func (e *env) publishBare(body []byte) { e.broker.PublishEvent(body, nil) }

// rows returns the number of payments and processed_events rows of id.
func (e *env) rows(id string) (payments, ledger int) {
	ctx := context.Background()
	require.NoError(e.t, e.store.Pool().QueryRow(ctx, "SELECT count(*) FROM payments WHERE event_id=$1", id).Scan(&payments))
	require.NoError(e.t, e.store.Pool().QueryRow(ctx, "SELECT count(*) FROM processed_events WHERE event_id=$1", id).Scan(&ledger))
	return payments, ledger
}

// queryInt runs a query of one integer column and one row.
func (e *env) queryInt(q string, args ...any) int {
	e.t.Helper()
	var n int
	require.NoError(e.t, e.store.Pool().QueryRow(context.Background(), q, args...).Scan(&n), q)
	return n
}

// invariant is the design's query that must always return zero rows.
func (e *env) invariant() {
	var n int
	require.NoError(e.t, e.store.Pool().QueryRow(context.Background(),
		"SELECT count(*) FROM (SELECT event_id, COUNT(*) FROM processed_events GROUP BY event_id HAVING COUNT(*) > 1) d").Scan(&n))
	require.Zero(e.t, n, "processed_events has duplicated event ids")
}

func eventually(t *testing.T, cond func() bool, msg string) {
	t.Helper()
	require.Eventually(t, cond, 20*time.Second, 10*time.Millisecond, msg)
}

// lostAnswers is a ledger whose first n commits reach the database but
// whose answers are lost, as when a connection is cut right after COMMIT.
type lostAnswers struct {
	worker.Ledger
	left atomic.Int32
}

func (l *lostAnswers) CommitAs(ctx context.Context, mine store.Fence, recs []store.Record, apply store.Apply) ([]bool, error) {
	isNew, err := l.Ledger.CommitAs(ctx, mine, recs, apply)
	if err == nil && l.left.Add(-1) >= 0 {
		return nil, errors.New("read tcp 127.0.0.1:5432: connection reset by peer")
	}
	return isNew, err
}

// losingAnswers wraps the ledger so that its first n commit answers are lost.
func losingAnswers(n int32) option {
	return func(o *worker.Options, _ *env) {
		l := &lostAnswers{Ledger: o.Ledger}
		l.left.Store(n)
		o.Ledger = l
	}
}
