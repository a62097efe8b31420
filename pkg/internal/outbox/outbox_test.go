package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"
	"go.uber.org/zap/zaptest/observer"

	"github.com/idempotent-events/idempotent-events/pkg/consumer"
	"github.com/idempotent-events/idempotent-events/pkg/effects"
	"github.com/idempotent-events/idempotent-events/pkg/internal/broker"
	"github.com/idempotent-events/idempotent-events/pkg/internal/faulttest"
	"github.com/idempotent-events/idempotent-events/pkg/internal/outbox"
	"github.com/idempotent-events/idempotent-events/pkg/internal/servicetest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// env is one test's schema and vhost.
type env struct {
	t       *testing.T
	dbURL   string
	amqpURL string
	pool    *pgxpool.Pool
}

func newEnv(t *testing.T) *env {
	t.Helper()
	e := &env{t: t, dbURL: servicetest.Schema(t), amqpURL: servicetest.VHost(t)}
	pool, err := pgxpool.New(context.Background(), e.dbURL)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	e.pool = pool
	return e
}

// enqueue writes one message per (event, effect) in a transaction of its
// own, as a handler would.
func (e *env) enqueue(eventKey, effect, object string) {
	e.t.Helper()
	ctx := context.Background()
	err := pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
		return outbox.Writer{Tx: tx}.Enqueue(ctx, effects.Event{Key: eventKey}, effects.Message{
			Effect: effect, ObjectID: object, RoutingKey: "test.message", Body: []byte(eventKey + "/" + effect)})
	})
	require.NoError(e.t, err)
}

// relayOptions are the options of the tests' relays: claiming batch rows
// a round, polling every 50 ms, woken by LISTEN.
func (e *env) relayOptions(amqpURL string, batch int) outbox.Options {
	return outbox.Options{
		Pool: e.pool, DatabaseURL: e.dbURL,
		Dialer:    broker.Dialer{URL: amqpURL, Name: e.t.Name(), MaxBackoff: 100 * time.Millisecond, DialTimeout: time.Second},
		BatchSize: batch, PollInterval: 50 * time.Millisecond, PublishTimeout: 5 * time.Second,
		MaxAttempts: 3, MaxBackoff: 200 * time.Millisecond, Retention: time.Hour,
		Logger: zaptest.NewLogger(e.t, zaptest.Level(zap.WarnLevel)), Metrics: outbox.NewMetrics(prometheus.NewRegistry()),
	}
}

// relay starts a relay with opts until the test ends, and returns it.
func (e *env) relayWith(opts outbox.Options) *outbox.Relay {
	e.t.Helper()
	r, err := outbox.NewRelay(opts)
	require.NoError(e.t, err)
	e.run(r.Run)
	return r
}

// relay starts a relay claiming batch rows a round until the test ends.
func (e *env) relay(amqpURL string, batch int, afterConfirm func([]string) error) {
	e.t.Helper()
	opts := e.relayOptions(amqpURL, batch)
	opts.AfterConfirm = afterConfirm
	e.relayWith(opts)
}

// consume starts the consumer kit on queue q, recording every message it
// handles (in arrival order) into received, until the test ends. It
// returns once q consumes, so q is bound: a relay started after it is not
// answered "unroutable" for a message published before the binding (a
// relay polling once an hour would not retry it in the test's time).
func (e *env) consume(q string) {
	e.t.Helper()
	ctx := context.Background()
	_, err := e.pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS received (n bigint GENERATED ALWAYS AS IDENTITY, id text, object_id text, seq bigint)`)
	require.NoError(e.t, err)
	c, err := consumer.New(ctx, consumer.Options{
		Name: "test", AMQPURL: e.amqpURL, Queue: q, RoutingKeys: []string{"test.*"}, DB: e.pool, Prefetch: 64,
		Logger: zaptest.NewLogger(e.t, zaptest.Level(zap.WarnLevel)),
		Handler: func(ctx context.Context, m consumer.Message, tx effects.Tx) error {
			_, err := tx.Exec(ctx, `INSERT INTO received (id, object_id, seq) VALUES ($1, $2, $3)`, m.ID, m.ObjectID, m.Seq)
			return err
		},
	})
	require.NoError(e.t, err)
	e.run(c.Run)
	conn, err := amqp.Dial(e.amqpURL)
	require.NoError(e.t, err)
	defer func() { _ = conn.Close() }()
	require.Eventuallyf(e.t, func() bool {
		ch, err := conn.Channel()
		if err != nil {
			return false
		}
		defer func() { _ = ch.Close() }()
		info, err := ch.QueueDeclarePassive(q, true, false, false, false, nil)
		return err == nil && info.Consumers > 0
	}, 30*time.Second, 10*time.Millisecond, "the consumer never consumed %s", q)
}

func (e *env) run(f func(context.Context) error) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- f(ctx) }()
	e.t.Cleanup(func() {
		cancel()
		assert.NoError(e.t, <-done)
	})
}

func (e *env) count(q string, args ...any) int {
	e.t.Helper()
	var n int
	require.NoError(e.t, e.pool.QueryRow(context.Background(), q, args...).Scan(&n))
	return n
}

// The relay dies after the broker confirmed and before the rows are marked
// published, a hundred times, at random: the consumer's table still has
// exactly one row per idempotency key, and every key arrived.
func TestARelayKilledBetweenConfirmAndMarkIsDedupedDownstream(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.consume("crash_window")
	const n = 300
	for i := range n {
		e.enqueue(fmt.Sprintf("evt_cw_%d", i), "notify", "")
	}
	var kills atomic.Int64
	rng := rand.New(rand.NewPCG(7, 7))
	var mu sync.Mutex
	// One row a round, so that each kill is one message published again.
	e.relay(e.amqpURL, 1, func([]string) error {
		mu.Lock()
		defer mu.Unlock()
		if kills.Load() < 100 && rng.IntN(2) == 0 {
			kills.Add(1)
			return errors.New("relay killed after the confirm")
		}
		return nil
	})
	require.Eventually(t, func() bool {
		return e.count(`SELECT count(*) FROM outbox WHERE published_at IS NULL`) == 0
	}, 60*time.Second, 50*time.Millisecond, "every row published")
	require.Eventually(t, func() bool { return e.count(`SELECT count(DISTINCT id) FROM received`) == n }, 30*time.Second, 50*time.Millisecond)
	assert.Equal(t, int64(100), kills.Load(), "the relay died 100 times")
	assert.Equal(t, n, e.count(`SELECT count(*) FROM received`), "one row per key in the consumer's table")
	assert.Equal(t, n, e.count(`SELECT count(*) FROM ie_consumed_messages`))
}

// 1,000 objects with 10 messages each, three relays at once, and a broker
// whose latency changes all the time: at the single consumer, each object's
// sequence numbers arrive strictly increasing, and every message once.
func TestEachObjectsMessagesArriveInOrder(t *testing.T) {
	t.Parallel()
	objects, perObject := 1000, 10
	if testing.Short() {
		objects = 100
	}
	e := newEnv(t)
	e.consume("ordered")
	// Enqueued in rounds: effect k of every object, then k+1.
	for k := range perObject {
		ctx := context.Background()
		require.NoError(t, pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
			for o := range objects {
				if err := (outbox.Writer{Tx: tx}).Enqueue(ctx, effects.Event{Key: fmt.Sprintf("evt_o%d_%d", o, k)},
					effects.Message{Effect: "e", ObjectID: fmt.Sprintf("obj_%d", o), RoutingKey: "test.ordered"}); err != nil {
					return err
				}
			}
			return nil
		}))
	}
	proxy, err := faulttest.Start("127.0.0.1:5672")
	require.NoError(t, err)
	t.Cleanup(proxy.Close)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		rng := rand.New(rand.NewPCG(3, 3))
		for {
			select {
			case <-stop:
				proxy.SetLatency(0)
				return
			case <-time.After(100 * time.Millisecond):
				proxy.SetLatency(time.Duration(rng.IntN(5)) * time.Millisecond)
			}
		}
	})
	viaProxy := servicetest.ReplaceHost(e.amqpURL, proxy.Addr())
	for range 3 {
		e.relay(viaProxy, 50, nil)
	}
	total := objects * perObject
	require.Eventually(t, func() bool { return e.count(`SELECT count(*) FROM received`) >= total }, 3*time.Minute, 100*time.Millisecond)
	close(stop)
	wg.Wait()
	assert.Equal(t, total, e.count(`SELECT count(DISTINCT id) FROM received`))
	assert.Zero(t, e.count(`SELECT count(*) FROM (
		SELECT seq <= lag(seq) OVER (PARTITION BY object_id ORDER BY n) AS backwards FROM received) r WHERE backwards`),
		"an object's sequence went backwards at the consumer")
	assert.Zero(t, e.count(`SELECT count(*) FROM (SELECT object_id, count(DISTINCT seq) AS n FROM received GROUP BY 1) r WHERE n <> $1`, perObject))
}

// Two transactions that commit out of the order of their ids: the later id
// commits and is published first; the earlier one, committed afterwards,
// is still found and published. The relay claims by state, not by an id
// high-water mark.
func TestARowCommittedAfterALaterOneIsNotSkipped(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.consume("gap")
	e.relay(e.amqpURL, 50, nil)
	ctx := context.Background()
	slow, err := e.pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = slow.Rollback(ctx) }()
	require.NoError(t, outbox.Writer{Tx: slow}.Enqueue(ctx, effects.Event{Key: "evt_gap_first"},
		effects.Message{Effect: "e", RoutingKey: "test.gap"}))
	e.enqueue("evt_gap_second", "e", "")
	require.Eventually(t, func() bool { return e.count(`SELECT count(*) FROM received WHERE id = 'evt_gap_second/e'`) == 1 },
		20*time.Second, 20*time.Millisecond, "the later id, committed first, is published")
	var firstID, secondID int64
	require.NoError(t, slow.QueryRow(ctx, `SELECT id FROM outbox WHERE idempotency_key = 'evt_gap_first/e'`).Scan(&firstID))
	require.NoError(t, e.pool.QueryRow(ctx, `SELECT id FROM outbox WHERE idempotency_key = 'evt_gap_second/e'`).Scan(&secondID))
	require.Less(t, firstID, secondID, "the slow transaction holds the lower id")
	require.NoError(t, slow.Commit(ctx))
	require.Eventually(t, func() bool { return e.count(`SELECT count(*) FROM received WHERE id = 'evt_gap_first/e'`) == 1 },
		20*time.Second, 20*time.Millisecond, "the row committed late was skipped")
}

// A message no queue takes is returned by the broker: its attempts count,
// and after MaxAttempts it is parked and holds back its object's later
// messages; another object's messages go on.
func TestAnUnroutableMessageIsParkedAndHoldsItsObjectBack(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.consume("parking") // bound to test.*: "nobody.home" reaches no queue
	ctx := context.Background()
	for _, m := range []struct{ key, object, routing string }{
		{"evt_p1", "obj_stuck", "nobody.home"}, {"evt_p2", "obj_stuck", "test.after"}, {"evt_p3", "obj_free", "test.free"},
	} {
		require.NoError(t, pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
			return outbox.Writer{Tx: tx}.Enqueue(ctx, effects.Event{Key: m.key}, effects.Message{Effect: "e", ObjectID: m.object, RoutingKey: m.routing})
		}))
	}
	e.relay(e.amqpURL, 50, nil)
	require.Eventually(t, func() bool { return e.count(`SELECT count(*) FROM outbox WHERE parked_at IS NOT NULL`) == 1 },
		30*time.Second, 50*time.Millisecond, "the unroutable message is parked")
	require.Eventually(t, func() bool { return e.count(`SELECT count(*) FROM received WHERE id = 'evt_p3/e'`) == 1 },
		20*time.Second, 20*time.Millisecond, "another object's message is published")
	assert.Equal(t, 3, e.count(`SELECT attempts FROM outbox WHERE idempotency_key = 'evt_p1/e'`))
	assert.Contains(t, func() string {
		var s string
		require.NoError(t, e.pool.QueryRow(ctx, `SELECT last_error FROM outbox WHERE idempotency_key = 'evt_p1/e'`).Scan(&s))
		return s
	}(), "unroutable")
	require.Never(t, func() bool { return e.count(`SELECT count(*) FROM received WHERE id = 'evt_p2/e'`) > 0 },
		time.Second, 50*time.Millisecond, "a parked message holds its object's later messages back")
}

// A relay whose database fails (here: its schema has no outbox table, as
// before migrate ran) keeps its broker connection: it says PostgreSQL in
// Ready and in one warning, never "broker connection lost", and publishes
// once the table is there, on the same connection.
func TestADatabaseErrorDoesNotCostTheBrokerConnection(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	var migrated string
	require.NoError(t, e.pool.QueryRow(ctx, `SELECT current_schema()`).Scan(&migrated))
	empty := servicetest.Name("ie_relay_empty")
	_, err := e.pool.Exec(ctx, "CREATE SCHEMA "+empty)
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = e.pool.Exec(context.Background(), "DROP SCHEMA "+empty+" CASCADE") })
	pool, err := pgxpool.New(ctx, servicetest.WithSearchPath(servicetest.DatabaseURL, empty))
	require.NoError(t, err)
	t.Cleanup(pool.Close)

	core, logs := observer.New(zap.InfoLevel)
	opts := e.relayOptions(e.amqpURL, 10)
	opts.Pool, opts.DatabaseURL, opts.Logger = pool, "", zap.New(core)
	r := e.relayWith(opts)
	var ready error
	require.Eventually(t, func() bool {
		ready = r.Ready()
		return ready != nil && strings.Contains(ready.Error(), "PostgreSQL (DATABASE_URL)")
	}, 10*time.Second, 10*time.Millisecond, "readiness: %v", func() any { return ready })
	assert.Contains(t, ready.Error(), "claim outbox rows")
	time.Sleep(2 * time.Second) // rounds keep failing meanwhile
	assert.Empty(t, logs.FilterMessageSnippet("broker connection lost").All(), "the broker connection was dropped for a database error")
	assert.Len(t, logs.FilterMessageSnippet("postgres (DATABASE_URL) failing").All(), 1, "one warning per outage")
	connects := len(logs.FilterMessageSnippet("broker connected").All())

	_, err = e.pool.Exec(ctx, fmt.Sprintf(`CREATE TABLE %[1]s.outbox (LIKE %[2]s.outbox INCLUDING ALL);
		CREATE TABLE %[1]s.outbox_sequences (LIKE %[2]s.outbox_sequences INCLUDING ALL)`, empty, migrated))
	require.NoError(t, err)
	require.Eventually(t, func() bool { return r.Ready() == nil }, 15*time.Second, 20*time.Millisecond, "ready once the table exists")
	assert.Len(t, logs.FilterMessageSnippet("postgres (DATABASE_URL) answers again").All(), 1)
	assert.Len(t, logs.FilterMessageSnippet("broker connected").All(), connects, "no reconnect")
}
