package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/idempotent-events/idempotent-events/pkg/consumer"
	"github.com/idempotent-events/idempotent-events/pkg/effects"
	"github.com/idempotent-events/idempotent-events/pkg/internal/outbox"
	"github.com/idempotent-events/idempotent-events/pkg/internal/servicetest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// env is one test's schema, vhost and queue, with the queue declared and
// bound as the consumer declares it, so messages can be published before
// the consumer starts.
type env struct {
	t       *testing.T
	amqpURL string
	pool    *pgxpool.Pool
	ch      *amqp.Channel
}

const queue, routingKey = "emails", "email.confirmation"

func newEnv(t *testing.T) *env {
	t.Helper()
	e := &env{t: t, amqpURL: servicetest.VHost(t)}
	pool, err := pgxpool.New(context.Background(), servicetest.Schema(t))
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	e.pool = pool
	_, err = pool.Exec(context.Background(), `CREATE TABLE handled (n bigint GENERATED ALWAYS AS IDENTITY, id text, batch int)`)
	require.NoError(t, err)
	conn, err := amqp.Dial(e.amqpURL)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	e.ch, err = conn.Channel()
	require.NoError(t, err)
	require.NoError(t, e.ch.ExchangeDeclare(outbox.Exchange, "topic", true, false, false, false, nil))
	_, err = e.ch.QueueDeclare(queue, true, false, false, false, nil)
	require.NoError(t, err)
	require.NoError(t, e.ch.QueueBind(queue, "email.*", outbox.Exchange, false, nil))
	return e
}

// publish publishes one message with id as the relay does.
func (e *env) publish(id string) {
	e.t.Helper()
	require.NoError(e.t, e.ch.PublishWithContext(context.Background(), outbox.Exchange, routingKey, false, false, amqp.Publishing{
		MessageId: id, DeliveryMode: amqp.Persistent, Body: []byte(id),
		Headers: amqp.Table{outbox.HeaderObjectID: "pi_1", outbox.HeaderSeq: int64(1), outbox.HeaderEventID: "evt_" + id, outbox.HeaderEffect: "email"},
	}))
}

// start runs a consumer with opts (its connection, queue and database
// filled in) until the test ends.
func (e *env) start(opts consumer.Options) {
	e.t.Helper()
	opts.Name, opts.AMQPURL, opts.Queue, opts.RoutingKeys, opts.DB = "test", e.amqpURL, queue, []string{"email.*"}, e.pool
	opts.Logger = zaptest.NewLogger(e.t, zaptest.Level(zap.ErrorLevel))
	c, err := consumer.New(context.Background(), opts)
	require.NoError(e.t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	e.t.Cleanup(func() {
		cancel()
		assert.NoError(e.t, <-done)
	})
}

// await waits until the handled table has n rows, and returns its ids in
// the order they were handled.
func (e *env) await(n int) []string {
	e.t.Helper()
	var ids []string
	require.Eventually(e.t, func() bool {
		rows, err := e.pool.Query(context.Background(), `SELECT id FROM handled ORDER BY n`)
		require.NoError(e.t, err)
		ids = ids[:0]
		for rows.Next() {
			var id string
			require.NoError(e.t, rows.Scan(&id))
			ids = append(ids, id)
		}
		require.NoError(e.t, rows.Err())
		return len(ids) >= n
	}, 30*time.Second, 10*time.Millisecond)
	return ids
}

// record is a BatchHandler writing each message and the size of its batch.
func record(batches *[]int, mu *sync.Mutex) consumer.BatchHandler {
	return func(ctx context.Context, msgs []consumer.Message, tx effects.Tx) error {
		for _, m := range msgs {
			if _, err := tx.Exec(ctx, `INSERT INTO handled (id, batch) VALUES ($1, $2)`, m.ID, len(msgs)); err != nil {
				return err
			}
		}
		mu.Lock()
		*batches = append(*batches, len(msgs))
		mu.Unlock()
		return nil
	}
}

// A batch waits for more messages until it has BatchSize of them: messages
// published one at a time, apart, are still handled BatchSize per
// transaction (BatchWait is far longer than the test).
func TestABatchWaitsForMessagesUpToItsSize(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	var mu sync.Mutex
	var batches []int
	e.start(consumer.Options{BatchHandler: record(&batches, &mu), BatchSize: 4, BatchWait: time.Hour})
	for i := range 8 {
		e.publish(fmt.Sprintf("m%d", i))
		time.Sleep(20 * time.Millisecond)
	}
	assert.Equal(t, []string{"m0", "m1", "m2", "m3", "m4", "m5", "m6", "m7"}, e.await(8))
	mu.Lock()
	defer mu.Unlock()
	assert.Equal(t, []int{4, 4}, batches)
}

// A batch handler gets each message once, whatever the redeliveries: a
// message published twice and a batch that failed once are handled once,
// and the messages after the failed one come again in their order.
func TestEachMessageIsHandledOnceThroughFailuresAndDuplicates(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	var mu sync.Mutex
	var batches []int
	var failed atomic.Bool
	handle := record(&batches, &mu)
	e.start(consumer.Options{RetryDelay: 10 * time.Millisecond, BatchSize: 3, BatchWait: -1,
		BatchHandler: func(ctx context.Context, msgs []consumer.Message, tx effects.Tx) error {
			if err := handle(ctx, msgs, tx); err != nil {
				return err
			}
			for _, m := range msgs {
				if m.ID == "m3" && failed.CompareAndSwap(false, true) {
					// Its rows (and the ledger's) are rolled back.
					return errors.New("the downstream service is down")
				}
			}
			return nil
		}})
	// m6 comes last: once it is handled, every message before it (the
	// duplicates too) was.
	for _, id := range []string{"m0", "m1", "m2", "m1", "m3", "m4", "m0", "m5", "m6"} {
		e.publish(id)
	}
	got := e.await(7)
	assert.True(t, failed.Load(), "the handler failed once")
	assert.Equal(t, []string{"m0", "m1", "m2", "m3", "m4", "m5", "m6"}, got)
	var ledger int
	require.NoError(t, e.pool.QueryRow(context.Background(), `SELECT count(*) FROM ie_consumed_messages`).Scan(&ledger))
	assert.Equal(t, 7, ledger)
}

// Handler and BatchHandler are one or the other.
func TestOptionsNeedExactlyOneHandler(t *testing.T) {
	t.Parallel()
	one := func(context.Context, consumer.Message, effects.Tx) error { return nil }
	many := func(context.Context, []consumer.Message, effects.Tx) error { return nil }
	base := consumer.Options{Name: "n", AMQPURL: "amqp://x", Queue: "q", RoutingKeys: []string{"k"}, DB: &pgxpool.Pool{}}
	for name, o := range map[string]consumer.Options{"neither": base, "both": func() consumer.Options {
		o := base
		o.Handler, o.BatchHandler = one, many
		return o
	}()} {
		_, err := consumer.New(context.Background(), o)
		require.Error(t, err, name)
		assert.Contains(t, err.Error(), "Handler", name)
	}
}
