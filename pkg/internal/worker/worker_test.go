package worker_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotent-events/idempotent-events/pkg/internal/broker"
	"github.com/idempotent-events/idempotent-events/pkg/internal/event"
	"github.com/idempotent-events/idempotent-events/pkg/internal/faulttest"
	"github.com/idempotent-events/idempotent-events/pkg/internal/servicetest"
	"github.com/idempotent-events/idempotent-events/pkg/internal/store"
	"github.com/idempotent-events/idempotent-events/pkg/internal/worker"
)

// The same event delivered 5 times at once to 2 workers: one payment row,
// four duplicates acked. Run batched and in the seed's one-at-a-time shape.
func TestSameEventFiveTimesToTwoWorkers(t *testing.T) {
	t.Parallel()
	shapes := map[string][]option{
		"batched":         {batched(16, 20*time.Millisecond), prefetch(64), concurrency(4)},
		"one-at-a-time":   {batched(1, 0), prefetch(1), concurrency(1)},
		"prefetch-spread": {batched(1, 0), prefetch(2), concurrency(2)},
	}
	for name, opts := range shapes {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, broker.QueueClassic)
			a, b := e.start(opts...), e.start(opts...)
			body := e.event("evt_five")
			var wg sync.WaitGroup
			for i := 0; i < 5; i++ {
				wg.Go(func() { e.publish(body) })
			}
			wg.Wait()
			settled := func() float64 {
				return a.outcomes("processed") + a.outcomes("duplicate") + b.outcomes("processed") + b.outcomes("duplicate")
			}
			eventually(t, func() bool { return settled() == 5 }, "all five deliveries settled")
			a.stop(t)
			b.stop(t)

			assert.Equal(t, 1.0, a.outcomes("processed")+b.outcomes("processed"))
			assert.Equal(t, 4.0, a.outcomes("duplicate")+b.outcomes("duplicate"))
			payments, ledger := e.rows("evt_five")
			assert.Equal(t, 1, payments)
			assert.Equal(t, 1, ledger)
			assert.Equal(t, 0, e.broker.Depth(broker.MainQueue), "every delivery was acked")
			e.invariant()
		})
	}
}

// A worker that commits and then dies before acking: the redelivery is
// recognised as a duplicate by Postgres, and there is one row.
func TestCommitThenDeathBeforeAckIsADuplicateOnRedelivery(t *testing.T) {
	t.Parallel()
	e := newEnv(t, broker.QueueClassic)
	var died atomic.Bool
	a := e.start(batched(1, 0), hooks(worker.Hooks{AfterCommit: func([]string) error {
		if died.CompareAndSwap(false, true) {
			return errors.New("killed after COMMIT, before ack")
		}
		return nil
	}}))
	e.publish(e.event("evt_commit_die"))
	eventually(t, died.Load, "the worker reached COMMIT")
	a.stop(t)
	payments, _ := e.rows("evt_commit_die")
	require.Equal(t, 1, payments, "the transaction committed before the death")
	require.Equal(t, 1, e.broker.Depth(broker.MainQueue), "the unacked message is back in the queue")

	b := e.start()
	eventually(t, func() bool { return b.outcomes("duplicate") == 1 }, "the redelivery is a duplicate")
	b.stop(t)
	assert.Equal(t, 1.0, b.count("idempotent_events_worker_duplicates_total", "layer", "postgres"))
	assert.Zero(t, b.outcomes("processed"))
	payments, ledger := e.rows("evt_commit_die")
	assert.Equal(t, 1, payments)
	assert.Equal(t, 1, ledger)
	assert.Equal(t, 0, e.broker.Depth(broker.MainQueue))
}

// A worker killed after the Redis step and before COMMIT: the event is still
// processed on redelivery. Redis was never told anything before COMMIT, so
// nothing can make the redelivery look like a duplicate.
func TestDeathBetweenRedisAndCommitLosesNothing(t *testing.T) {
	t.Parallel()
	e := newEnv(t, broker.QueueClassic)
	var died atomic.Bool
	a := e.start(batched(1, 0), hooks(worker.Hooks{AfterDedupeCheck: func([]string) error {
		if died.CompareAndSwap(false, true) {
			return errors.New("killed between the Redis check and COMMIT")
		}
		return nil
	}}))
	e.publish(e.event("evt_redis_die"))
	eventually(t, died.Load, "the worker passed the Redis step")
	a.stop(t)
	payments, _ := e.rows("evt_redis_die")
	require.Zero(t, payments, "nothing committed before the death")

	b := e.start()
	eventually(t, func() bool { return b.outcomes("processed") == 1 }, "the redelivery is processed")
	b.stop(t)
	payments, ledger := e.rows("evt_redis_die")
	assert.Equal(t, 1, payments)
	assert.Equal(t, 1, ledger)
}

// The seed's design marks the event in Redis (SET NX) before processing.
// Dying between that SET and COMMIT loses the event: the redelivery sees the
// key and is acked as a "duplicate" of an event that never took effect. This
// runs that algorithm against the same Redis to show the loss our worker
// does not have.
func TestSeedDesignLosesTheEventInTheSameScenario(t *testing.T) {
	t.Parallel()
	prefix := servicetest.RedisPrefix(t)
	opts, err := redis.ParseURL(servicetest.RedisURL)
	require.NoError(t, err)
	rdb := redis.NewClient(opts)
	defer rdb.Close()
	ctx := context.Background()
	committed := map[string]bool{}
	seedHandle := func(id string, die bool) (acked bool) {
		first, err := rdb.SetNX(ctx, prefix+id, "1", time.Hour).Result()
		require.NoError(t, err)
		if !first {
			return true // "duplicate": ack and skip
		}
		if die {
			return false // killed before COMMIT: no ack, the broker redelivers
		}
		committed[id] = true
		return true
	}
	require.False(t, seedHandle("evt_seed", true))
	require.True(t, seedHandle("evt_seed", false), "the redelivery is acked")
	assert.False(t, committed["evt_seed"], "the seed acked an event whose effect never committed: lost")
}

func TestRedisFlushedDuplicatesAreStillCaughtByPostgres(t *testing.T) {
	t.Parallel()
	e := newEnv(t, broker.QueueClassic)
	w := e.start()
	e.publish(e.event("evt_flush"))
	eventually(t, func() bool { return w.outcomes("processed") == 1 }, "processed")

	e.publish(e.event("evt_flush"))
	eventually(t, func() bool { return w.count("idempotent_events_worker_duplicates_total", "layer", "redis") == 1 }, "redis knows it")

	require.NoError(t, servicetest.DeleteKeys(servicetest.RedisURL, e.prefix)) // this test's FLUSHALL
	e.publish(e.event("evt_flush"))
	e.publish(e.event("evt_after_flush"))
	eventually(t, func() bool { return w.count("idempotent_events_worker_duplicates_total", "layer", "postgres") == 1 }, "postgres catches it")
	eventually(t, func() bool { return w.outcomes("processed") == 2 }, "a new event is still processed")
	w.stop(t)
	payments, _ := e.rows("evt_flush")
	assert.Equal(t, 1, payments)
	payments, _ = e.rows("evt_after_flush")
	assert.Equal(t, 1, payments)
}

func TestRedisUnreachableDegradesToPostgres(t *testing.T) {
	t.Parallel()
	e := newEnv(t, broker.QueueClassic)
	w := e.start(redisURL("redis://127.0.0.1:1/0"))
	e.publish(e.event("evt_noredis"))
	eventually(t, func() bool { return w.outcomes("processed") == 1 }, "processed without Redis")
	e.publish(e.event("evt_noredis"))
	eventually(t, func() bool { return w.outcomes("duplicate") == 1 }, "duplicate caught without Redis")
	w.stop(t)
	assert.Equal(t, 1.0, w.count("idempotent_events_worker_duplicates_total", "layer", "postgres"))
	assert.GreaterOrEqual(t, w.count("idempotent_events_worker_redis_lookups_total", "result", "error"), 2.0)
	payments, _ := e.rows("evt_noredis")
	assert.Equal(t, 1, payments)
}

// Postgres refuses connections for a while (WORKER_OUTAGE_MODE=retry): the
// event waits in the retry tiers and is processed once Postgres is back.
// Nothing reaches the DLQ.
func TestPostgresOutageRetriesThenProcesses(t *testing.T) {
	t.Parallel()
	e := newEnv(t, broker.QueueClassic, 300*time.Millisecond, 600*time.Millisecond, time.Second, 2*time.Second, 4*time.Second)
	proxy, err := faulttest.Start("127.0.0.1:5432")
	require.NoError(t, err)
	t.Cleanup(proxy.Close)
	w := e.start(retryOnOutage(), databaseURL(servicetest.ReplaceHost(e.dbURL, proxy.Addr())))
	proxy.SetDown(true)

	e.publish(e.event("evt_pg_down"))
	eventually(t, func() bool { return w.outcomes("retried") >= 2 }, "the event goes through retry tiers")
	proxy.SetDown(false)
	eventually(t, func() bool { return w.outcomes("processed") == 1 }, "processed once Postgres is back")
	w.stop(t)
	payments, ledger := e.rows("evt_pg_down")
	assert.Equal(t, 1, payments)
	assert.Equal(t, 1, ledger)
	assert.Zero(t, w.outcomes("dead_lettered"))
	assert.Equal(t, 0, e.broker.Depth(broker.DLQ))
	var attempt int
	require.NoError(t, e.store.Pool().QueryRow(context.Background(), "SELECT attempt FROM processed_events WHERE event_id='evt_pg_down'").Scan(&attempt))
	assert.GreaterOrEqual(t, attempt, 3, "the committing attempt is recorded")
}

// Postgres unreachable in the default mode: the worker stops consuming,
// events wait in events.main (no retry tier, no DLQ), and are processed
// once Postgres answers again.
func TestPostgresOutagePausesConsumption(t *testing.T) {
	t.Parallel()
	e := newEnv(t, broker.QueueClassic, 100*time.Millisecond)
	proxy, err := faulttest.Start("127.0.0.1:5432")
	require.NoError(t, err)
	t.Cleanup(proxy.Close)
	w := e.start(databaseURL(servicetest.ReplaceHost(e.dbURL, proxy.Addr())))
	proxy.SetDown(true)
	for i := 0; i < 5; i++ {
		e.publish(e.event(fmt.Sprintf("evt_pause_%d", i)))
	}
	eventually(t, func() bool { return w.count("idempotent_events_worker_dependency_paused") == 1 }, "paused")
	eventually(t, func() bool { return e.broker.Depth(broker.MainQueue) == 5 }, "the events wait in events.main")
	require.Error(t, w.w.Ready(), "not ready while paused")
	// Over several retry delays nothing may move.
	require.Never(t, func() bool {
		return e.broker.Depth(broker.MainQueue) != 5 || w.outcomes("retried") != 0 || w.outcomes("dead_lettered") != 0
	}, 500*time.Millisecond, 50*time.Millisecond, "events moved while Postgres was down")

	proxy.SetDown(false)
	eventually(t, func() bool { return w.outcomes("processed") == 5 }, "processed once Postgres is back")
	w.stop(t)
	assert.Zero(t, w.count("idempotent_events_worker_dependency_paused"))
	assert.Equal(t, 0, e.broker.Depth(broker.DLQ))
	for _, q := range e.topo.RetryQueues() {
		assert.Equal(t, 0, e.broker.Depth(q), q)
	}
}

func TestAttemptsExhaustedGoToTheDLQWithTheirHistory(t *testing.T) {
	t.Parallel()
	e := newEnv(t, broker.QueueClassic, 100*time.Millisecond, 100*time.Millisecond)
	proxy, err := faulttest.Start("127.0.0.1:5432")
	require.NoError(t, err)
	t.Cleanup(proxy.Close)
	w := e.start(retryOnOutage(), databaseURL(servicetest.ReplaceHost(e.dbURL, proxy.Addr())))
	proxy.SetDown(true)

	e.publish(e.event("evt_exhausted"))
	eventually(t, func() bool { return w.outcomes("dead_lettered") == 1 }, "dead-lettered after the last tier")
	w.stop(t)
	assert.Equal(t, 2.0, w.outcomes("retried"))
	assert.Equal(t, 2.0, w.count("idempotent_events_worker_retries_total", "tier", "100ms"))

	msgs := e.broker.Drain(broker.DLQ)
	require.Len(t, msgs, 1)
	h := msgs[0].Headers
	assert.Equal(t, string(broker.ReasonRetriesExhausted), h[broker.HeaderDLQReason])
	assert.Len(t, h[broker.HeaderDLQID], 16)
	attempts, _ := broker.Int(h, broker.HeaderAttempt)
	assert.Equal(t, int64(3), attempts)
	assert.NotEmpty(t, h[broker.HeaderFirstError])
	assert.NotEmpty(t, h[broker.HeaderLastError])
	assert.NotEmpty(t, h[broker.HeaderFirstFailedAt])
	assert.Equal(t, broker.Exchange, h[broker.HeaderOriginalExchange])
	assert.Equal(t, broker.RoutingKey, h[broker.HeaderOriginalRoutingKey])
	assert.Equal(t, "stripe", h[broker.HeaderSource], "original headers are kept")
	assert.Equal(t, e.event("evt_exhausted")[:20], msgs[0].Body[:20])
	assert.Equal(t, 0, e.broker.Depth(broker.MainQueue))
	for _, q := range e.topo.RetryQueues() {
		assert.Equal(t, 0, e.broker.Depth(q), q)
	}
}

func TestPoisonMessagesGoToTheDLQAtOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t, broker.QueueClassic)
	w := e.start()
	e.publish([]byte(`not json at all`))
	e.publish([]byte(`{"id":"evt_poison","type":"payment_intent.succeeded","data":{"payment_intent":"pi","currency":"usd","status":"ok"}}`))
	eventually(t, func() bool { return w.outcomes("dead_lettered") == 2 }, "both dead-lettered")
	w.stop(t)
	assert.Zero(t, w.outcomes("retried"), "no retry for input that can never succeed")
	assert.Equal(t, 2.0, w.count("idempotent_events_worker_dead_letters_total", "reason", string(broker.ReasonInvalidPayload)))
	msgs := e.broker.Drain(broker.DLQ)
	require.Len(t, msgs, 2)
	for _, m := range msgs {
		assert.Equal(t, string(broker.ReasonInvalidPayload), m.Headers[broker.HeaderDLQReason])
		attempts, _ := broker.Int(m.Headers, broker.HeaderAttempt)
		assert.Equal(t, int64(1), attempts)
	}
	assert.Contains(t, msgs[1].Headers[broker.HeaderLastError], "data.amount_cents")
}

// panickyLedger panics inside CommitAs whenever the batch holds id, as a
// bug in an effect would inside the transaction.
type panickyLedger struct {
	worker.Ledger
	id string
}

func (l panickyLedger) CommitAs(ctx context.Context, mine store.Fence, recs []store.Record, apply store.Apply) ([]bool, error) {
	for _, r := range recs {
		if r.Event.ID == l.id {
			panic("effect bug for " + l.id)
		}
	}
	return l.Ledger.CommitAs(ctx, mine, recs, apply)
}

// A panic inside the transaction is decided like any other failure: its
// event goes to the DLQ with reason panic, its batch falls back to one by
// one so the neighbours commit, and the worker keeps consuming (no pause).
func TestAPanicInTheTransactionDeadLettersOnlyItsEvent(t *testing.T) {
	t.Parallel()
	e := newEnv(t, broker.QueueClassic)
	ids := []string{"evt_ok_1", "evt_ok_2", "evt_panic", "evt_ok_3"}
	for _, id := range ids {
		e.publish(e.event(id))
	}
	w := e.start(batched(16, 300*time.Millisecond), concurrency(1), func(o *worker.Options, _ *env) {
		o.Ledger = panickyLedger{Ledger: o.Ledger, id: "evt_panic"}
	})
	eventually(t, func() bool { return w.outcomes("processed")+w.outcomes("dead_lettered") == 4 }, "all settled")
	w.stop(t)
	assert.Equal(t, 3.0, w.outcomes("processed"))
	assert.Equal(t, 1.0, w.count("idempotent_events_worker_dead_letters_total", "reason", string(broker.ReasonPanic)))
	assert.Zero(t, w.count("idempotent_events_worker_dependency_pauses_total"), "a panic is not an outage")
	msgs := e.broker.Drain(broker.DLQ)
	require.Len(t, msgs, 1)
	assert.Equal(t, "evt_panic", msgs[0].MessageId)
	assert.Equal(t, string(broker.ReasonPanic), msgs[0].Headers[broker.HeaderDLQReason])
	assert.Contains(t, msgs[0].Headers[broker.HeaderLastError], "panic: effect bug for evt_panic")
}

// One message Postgres rejects inside a batch: only it goes to the DLQ, its
// neighbours are committed.
func TestABadMessageDoesNotFailItsBatch(t *testing.T) {
	t.Parallel()
	e := newEnv(t, broker.QueueClassic)
	_, err := e.store.Pool().Exec(context.Background(), `
		CREATE FUNCTION reject_evt_bad() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			IF NEW.event_id = 'evt_bad' THEN
				RAISE EXCEPTION 'payment rejected' USING ERRCODE = 'check_violation';
			END IF;
			RETURN NEW;
		END $$;
		CREATE TRIGGER reject_evt_bad BEFORE INSERT ON payments FOR EACH ROW EXECUTE FUNCTION reject_evt_bad();`)
	require.NoError(t, err)
	ids := []string{"evt_ok_1", "evt_ok_2", "evt_bad", "evt_ok_3", "evt_ok_4"}
	for _, id := range ids {
		e.publish(e.event(id))
	}
	w := e.start(batched(16, 300*time.Millisecond), concurrency(1))
	eventually(t, func() bool { return w.outcomes("processed")+w.outcomes("dead_lettered") == 5 }, "all settled")
	w.stop(t)
	assert.Equal(t, 4.0, w.outcomes("processed"))
	assert.Equal(t, 1.0, w.count("idempotent_events_worker_dead_letters_total", "reason", string(broker.ReasonRejectedByDatabase)))
	for _, id := range ids {
		payments, _ := e.rows(id)
		if id == "evt_bad" {
			assert.Zero(t, payments)
		} else {
			assert.Equal(t, 1, payments, id)
		}
	}
	msgs := e.broker.Drain(broker.DLQ)
	require.Len(t, msgs, 1)
	assert.Contains(t, string(msgs[0].Body), "evt_bad")
}

// SIGTERM while busy: the consumer stops, deliveries already received are
// finished and acked, the rest stay in the queue, Run returns nil.
func TestGracefulShutdownFinishesInFlightWork(t *testing.T) {
	t.Parallel()
	e := newEnv(t, broker.QueueClassic)
	var started atomic.Int64
	slow := hooks(worker.Hooks{AfterDedupeCheck: func(ids []string) error {
		started.Add(int64(len(ids)))
		time.Sleep(300 * time.Millisecond)
		return nil
	}})
	const n = 40
	for i := 0; i < n; i++ {
		e.publish(e.event(fmt.Sprintf("evt_drain_%02d", i)))
	}
	w := e.start(slow, batched(1, 0), prefetch(4), concurrency(2), shutdownTimeout(15*time.Second))
	eventually(t, func() bool { return started.Load() >= 2 }, "work in flight")
	begin := time.Now()
	w.stop(t)
	t.Logf("drained in %s", time.Since(begin).Round(time.Millisecond))

	processed := int(w.outcomes("processed"))
	assert.Positive(t, processed)
	assert.Less(t, processed, n, "consuming stopped before the queue was empty")
	var ledger int
	require.NoError(t, e.store.Pool().QueryRow(context.Background(), "SELECT count(*) FROM processed_events").Scan(&ledger))
	assert.Equal(t, processed, ledger, "every committed event was acked as processed")
	assert.Equal(t, n-processed, e.broker.Depth(broker.MainQueue), "nothing acked without being processed, nothing left unacked")
}

func TestQuorumQueuesWorkEndToEnd(t *testing.T) {
	t.Parallel()
	e := newEnv(t, broker.QueueQuorum, 200*time.Millisecond)
	w := e.start()
	e.publish(e.event("evt_quorum"))
	e.publish(e.event("evt_quorum"))
	e.publish([]byte(`{}`))
	eventually(t, func() bool {
		return w.outcomes("processed") == 1 && w.outcomes("duplicate") == 1 && w.outcomes("dead_lettered") == 1
	}, "processed, duplicate and poison settled on quorum queues")
	w.stop(t)
	assert.Equal(t, 1, e.broker.Depth(broker.DLQ))
}

// After the broker connection is cut, the worker reconnects and keeps
// consuming; deliveries in flight at the cut are redelivered, never lost.
func TestWorkerReconnectsAfterTheConnectionIsCut(t *testing.T) {
	t.Parallel()
	e := newEnv(t, broker.QueueClassic)
	proxy, err := faulttest.Start("127.0.0.1:5672")
	require.NoError(t, err)
	t.Cleanup(proxy.Close)
	amqpURL := e.amqpURL
	e.amqpURL = servicetest.ReplaceHost(amqpURL, proxy.Addr())
	w := e.start()
	e.amqpURL = amqpURL

	for i := 0; i < 50; i++ {
		e.publish(e.event(fmt.Sprintf("evt_reconnect_%02d", i)))
	}
	proxy.Cut()
	for i := 50; i < 100; i++ {
		e.publish(e.event(fmt.Sprintf("evt_reconnect_%02d", i)))
	}
	eventually(t, func() bool { return w.outcomes("processed") == 100 }, "all 100 processed across the cut")
	w.stop(t)
	assert.GreaterOrEqual(t, w.count("idempotent_events_worker_broker_connections_total"), 2.0, "it reconnected")
	var ledger int
	require.NoError(t, e.store.Pool().QueryRow(context.Background(), "SELECT count(*) FROM payments").Scan(&ledger))
	assert.Equal(t, 100, ledger)
	assert.Equal(t, 0, e.broker.Depth(broker.MainQueue))
	e.invariant()
}

// Events replayed into events.replay go through the same dedupe: a new one
// is processed, an already processed one is a duplicate.
func TestReplayQueueIsConsumedThroughTheSamePipeline(t *testing.T) {
	t.Parallel()
	e := newEnv(t, broker.QueueClassic)
	w := e.start()
	e.publish(e.event("evt_replay_done"))
	eventually(t, func() bool { return w.outcomes("processed") == 1 }, "processed live")

	e.broker.PublishTo(broker.ReplayQueue, e.event("evt_replay_done"))
	e.broker.PublishTo(broker.ReplayQueue, e.event("evt_replay_new"))
	eventually(t, func() bool { return w.outcomes("processed") == 2 && w.outcomes("duplicate") == 1 }, "replays settled")
	w.stop(t)
	payments, _ := e.rows("evt_replay_done")
	assert.Equal(t, 1, payments)
	payments, _ = e.rows("evt_replay_new")
	assert.Equal(t, 1, payments)
	assert.Equal(t, 0, e.broker.Depth(broker.ReplayQueue))
}

// The same event id with other content is never processed twice and never
// silently taken for a duplicate: it is recorded in event_conflicts, whether
// Redis or only Postgres still knows the first content. A Stripe retry whose
// envelope changed (pending_webhooks) is an ordinary duplicate.
func TestReusedIDWithOtherContentIsRecordedAsConflict(t *testing.T) {
	t.Parallel()
	e := newEnv(t, broker.QueueClassic)
	w := e.start()
	original := e.event("evt_reused")
	e.publish(original)
	eventually(t, func() bool { return w.outcomes("processed") == 1 }, "processed")

	retried := bytes.Replace(original, []byte(`"pending_webhooks":1`), []byte(`"pending_webhooks":3`), 1)
	require.NotEqual(t, original, retried)
	e.publish(retried)
	eventually(t, func() bool { return w.outcomes("duplicate") == 1 }, "a Stripe retry is a duplicate")

	changed := bytes.Replace(original, []byte(`"amount":2500`), []byte(`"amount":1`), 1)
	require.NotEqual(t, original, changed)
	e.publish(changed) // Redis knows the first content
	eventually(t, func() bool { return w.outcomes("conflict") == 1 }, "conflict seen through Redis")
	require.NoError(t, servicetest.DeleteKeys(servicetest.RedisURL, e.prefix))
	changedAgain := bytes.Replace(original, []byte(`"amount":2500`), []byte(`"amount":2`), 1)
	e.publish(changedAgain) // only Postgres knows
	eventually(t, func() bool { return w.outcomes("conflict") == 2 }, "conflict seen through Postgres")
	w.stop(t)

	var amount int64
	require.NoError(t, e.store.Pool().QueryRow(context.Background(), "SELECT amount_cents FROM payments WHERE event_id='evt_reused'").Scan(&amount))
	assert.Equal(t, int64(2500), amount, "the first content's effect stands")
	payments, _ := e.rows("evt_reused")
	assert.Equal(t, 1, payments)
	var conflicts int
	require.NoError(t, e.store.Pool().QueryRow(context.Background(), "SELECT count(*) FROM event_conflicts WHERE event_id='evt_reused'").Scan(&conflicts))
	assert.Equal(t, 2, conflicts)
	assert.Equal(t, 0, e.broker.Depth(broker.MainQueue))
}

// Deliveries of other sources are keyed by (source, provider id): the same
// provider id from two sources is two events.
func TestOtherSourcesAreKeyedBySourceAndID(t *testing.T) {
	t.Parallel()
	e := newEnv(t, broker.QueueClassic)
	w := e.start()
	std := []byte(`{"type":"invoice.paid","data":{"payment_intent":"pi_s","amount_cents":700,"currency":"eur","status":"paid"}}`)
	for _, source := range []string{"acme", "globex"} {
		e.publishWith(std, amqp.Table{broker.HeaderSource: source, broker.HeaderScheme: "standard", broker.HeaderEventID: "msg_1"})
	}
	e.publishWith([]byte(`{"zen":"hi"}`), amqp.Table{broker.HeaderSource: "gh", broker.HeaderScheme: "github",
		broker.HeaderEventID: "d-1", broker.HeaderEventType: "ping"})
	eventually(t, func() bool { return w.outcomes("processed") == 3 }, "three distinct events")
	w.stop(t)
	for _, key := range []string{"acme:msg_1", "globex:msg_1"} {
		payments, ledger := e.rows(key)
		assert.Equal(t, 1, payments, key)
		assert.Equal(t, 1, ledger, key)
	}
	payments, ledger := e.rows("gh:d-1")
	assert.Equal(t, 0, payments, "a GitHub event has no payment")
	assert.Equal(t, 1, ledger)
	e.invariant()
}

// A connection lost under a commit while Postgres still answers is not an
// outage: the batch is tried again at once on a fresh connection, without
// pausing or a retry tier, and a COMMIT whose answer was lost is found
// there as already done — one row per event.
func TestALostCommitAnswerIsRetriedAtOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t, broker.QueueClassic, time.Minute)
	w := e.start(batched(8, 50*time.Millisecond), losingAnswers(1))
	for i := range 8 {
		e.publish(e.event(fmt.Sprintf("evt_lost_answer_%d", i)))
	}
	eventually(t, func() bool { return w.outcomes("processed")+w.outcomes("duplicate") >= 8 }, "all settled")
	w.stop(t)
	assert.Zero(t, w.count("idempotent_events_worker_dependency_pauses_total"), "no pause for one lost connection")
	assert.Zero(t, w.outcomes("retried"))
	for i := range 8 {
		payments, ledger := e.rows(fmt.Sprintf("evt_lost_answer_%d", i))
		assert.Equal(t, 1, payments)
		assert.Equal(t, 1, ledger)
	}
	e.invariant()
	assert.Equal(t, 0, e.broker.Depth(broker.MainQueue))
}

// Messages without MessageId and x-ie-digest (published by another tool or
// an older receiver) are decoded first and deduplicated all the same.
func TestMessagesWithoutIdentityHeadersAreDecodedFirst(t *testing.T) {
	t.Parallel()
	e := newEnv(t, broker.QueueClassic)
	w := e.start()
	e.publishBare(e.event("evt_bare"))
	eventually(t, func() bool { return w.outcomes("processed") == 1 }, "processed")
	e.publishBare(e.event("evt_bare"))
	e.publish(e.event("evt_bare"))
	eventually(t, func() bool { return w.count("idempotent_events_worker_duplicates_total", "layer", "redis") == 2 }, "both copies are Redis duplicates")
	w.stop(t)
	payments, ledger := e.rows("evt_bare")
	assert.Equal(t, 1, payments)
	assert.Equal(t, 1, ledger)
}

// A message Redis knows under its MessageId and x-ie-digest is a duplicate
// without its body being decoded: that is the worker's fast path, and why
// whatever publishes to main_exchange must set both from the body or leave
// them out. A digest that is not the body's costs a decode, and the body's
// digest decides; a MessageId that names another event than the body's is
// invalid and goes to the DLQ.
func TestIdentityHeadersAreTheFastPathAndTheBodyDecides(t *testing.T) {
	t.Parallel()
	e := newEnv(t, broker.QueueClassic)
	w := e.start()
	body := e.event("evt_ident")
	e.publish(body)
	eventually(t, func() bool { return w.outcomes("processed") == 1 }, "processed")
	ev, err := event.Decode(body)
	require.NoError(t, err)

	// Not JSON: only the headers were read.
	e.broker.PublishEventWithID([]byte(`{"not":"decoded"`), "evt_ident", amqp.Table{broker.HeaderDigest: ev.DigestHex()})
	eventually(t, func() bool { return w.outcomes("duplicate") == 1 }, "a Redis duplicate from the headers alone")

	e.broker.PublishEventWithID(body, "evt_ident", amqp.Table{broker.HeaderDigest: strings.Repeat("0", 64)})
	eventually(t, func() bool { return w.outcomes("duplicate") == 2 }, "the body's digest decides")

	other := e.event("evt_ident_other")
	otherEv, err := event.Decode(other)
	require.NoError(t, err)
	e.broker.PublishEventWithID(other, "evt_ident", amqp.Table{broker.HeaderDigest: otherEv.DigestHex()})
	eventually(t, func() bool { return w.outcomes("dead_lettered") == 1 }, "a MessageId that is not the body's event")
	w.stop(t)

	assert.Zero(t, w.outcomes("conflict"))
	payments, _ := e.rows("evt_ident")
	assert.Equal(t, 1, payments)
	payments, _ = e.rows("evt_ident_other")
	assert.Zero(t, payments, "the mismatched message was not processed")
	msgs := e.broker.Drain(broker.DLQ)
	require.Len(t, msgs, 1)
	assert.Equal(t, string(broker.ReasonInvalidPayload), msgs[0].Headers[broker.HeaderDLQReason])
	assert.Contains(t, msgs[0].Headers[broker.HeaderLastError], "message_id")
}
