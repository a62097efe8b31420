package worker_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotent-events/idempotent-events/pkg/effects"
	"github.com/idempotent-events/idempotent-events/pkg/internal/broker"
	"github.com/idempotent-events/idempotent-events/pkg/internal/outbox"
	"github.com/idempotent-events/idempotent-events/pkg/internal/worker"
	"github.com/idempotent-events/idempotent-events/pkg/payments"
)

// orders is a team's own effect: an orders row per event, written in the
// event's transaction. Its answers for some events are chosen by the test.
func orders(answer func(ev effects.Event) error) option {
	return func(o *worker.Options, e *env) {
		_, err := e.store.Pool().Exec(context.Background(), `CREATE TABLE IF NOT EXISTS orders (event_id text PRIMARY KEY, attempt int)`)
		require.NoError(e.t, err)
		reg := effects.NewRegistry()
		reg.HandleFunc("test.payment-intents", "stripe", "payment_intent.*", func(ctx context.Context, ev effects.Event, tx effects.Tx, _ effects.Outbox) error {
			if _, err := tx.Exec(ctx, `INSERT INTO orders VALUES ($1, $2)`, ev.Key, ev.Attempt); err != nil {
				return err
			}
			return answer(ev) // after the write: a failure must roll it back
		})
		o.Effects = reg
	}
}

// What a handler returns decides its event's fate, and only its event's: in
// one batch, the event whose handler says Permanent goes to the DLQ at
// once (reason rejected_by_handler), RetryAfter and a plain error are tried
// again through the retry tiers until they commit, Skip commits the ledger
// row with outcome skipped, and the others commit; every write of a failed
// attempt is rolled back, so each committed event has exactly one row.
func TestHandlerResultsDecideTheFateOfTheirEventOnly(t *testing.T) {
	t.Parallel()
	e := newEnv(t, broker.QueueClassic)
	ids := []string{"evt_ok", "evt_perm", "evt_retry_after", "evt_flaky", "evt_skip"}
	for _, id := range ids {
		e.publish(e.event(id))
	}
	w := e.start(batched(16, 300*time.Millisecond), concurrency(1), orders(func(ev effects.Event) error {
		switch {
		case ev.Key == "evt_perm":
			return effects.Permanent(errors.New("order refused for good"))
		case ev.Key == "evt_retry_after" && ev.Attempt == 1:
			return effects.RetryAfter(300*time.Millisecond, errors.New("stock service busy"))
		case ev.Key == "evt_flaky" && ev.Attempt == 1:
			return errors.New("transient")
		case ev.Key == "evt_skip":
			return effects.Skip("not an order")
		}
		return nil
	}))
	eventually(t, func() bool { return w.outcomes("processed")+w.outcomes("dead_lettered") == 5 }, "all settled")
	w.stop(t)

	assert.Equal(t, 4.0, w.outcomes("processed"))
	assert.Equal(t, 1.0, w.count("idempotent_events_worker_dead_letters_total", "reason", string(broker.ReasonRejectedByHandler)))
	assert.Equal(t, 1.0, w.count("idempotent_events_worker_retries_total", "tier", "400ms"), "RetryAfter(300ms) takes the first tier of at least 300ms")
	assert.Equal(t, 1.0, w.count("idempotent_events_worker_retries_total", "tier", "200ms"), "a plain error takes the attempt's tier")

	for _, id := range []string{"evt_ok", "evt_retry_after", "evt_flaky"} {
		assert.Equal(t, 1, e.queryInt(`SELECT count(*) FROM orders WHERE event_id = $1`, id), id)
		assert.Equal(t, 1, e.queryInt(`SELECT count(*) FROM processed_events WHERE event_id = $1 AND outcome = 'applied'`, id), id)
	}
	assert.Equal(t, 2, e.queryInt(`SELECT attempt FROM orders WHERE event_id = 'evt_flaky'`), "the first attempt's row was rolled back")
	assert.Zero(t, e.queryInt(`SELECT count(*) FROM orders WHERE event_id = 'evt_perm'`))
	assert.Zero(t, e.queryInt(`SELECT count(*) FROM processed_events WHERE event_id = 'evt_perm'`))
	assert.Equal(t, 1, e.queryInt(`SELECT count(*) FROM processed_events WHERE event_id = 'evt_skip' AND outcome = 'skipped'`))
	msgs := e.broker.Drain(broker.DLQ)
	require.Len(t, msgs, 1)
	assert.Equal(t, "evt_perm", msgs[0].MessageId)
	assert.Contains(t, msgs[0].Headers[broker.HeaderLastError], "order refused for good")
	e.invariant()
}

// A handler that enqueues a message and then fails leaves neither the
// message nor the ledger row: the outbox row is written in the event's
// transaction and rolled back with it. The one that succeeds leaves both.
func TestAHandlerThatEnqueuesThenFailsLeavesNeitherMessageNorLedgerRow(t *testing.T) {
	t.Parallel()
	e := newEnv(t, broker.QueueClassic)
	e.publish(e.event("evt_enq_fails"))
	e.publish(e.event("evt_enq_ok"))
	w := e.start(batched(16, 200*time.Millisecond), func(o *worker.Options, _ *env) {
		reg := effects.NewRegistry()
		reg.HandleFunc("test.outbox", "stripe", "*", func(ctx context.Context, ev effects.Event, _ effects.Tx, out effects.Outbox) error {
			if err := out.Enqueue(ctx, ev, effects.Message{Effect: "receipt", RoutingKey: "email.receipt"}); err != nil {
				return err
			}
			if ev.Key == "evt_enq_fails" {
				return effects.Permanent(errors.New("refused after enqueuing"))
			}
			return nil
		})
		o.Effects = reg
		o.Outbox = func(tx effects.Tx) effects.Outbox { return outbox.Writer{Tx: tx} }
	})
	eventually(t, func() bool { return w.outcomes("processed")+w.outcomes("dead_lettered") == 2 }, "both settled")
	w.stop(t)
	assert.Zero(t, e.queryInt(`SELECT count(*) FROM outbox WHERE event_id = 'evt_enq_fails'`))
	assert.Zero(t, e.queryInt(`SELECT count(*) FROM processed_events WHERE event_id = 'evt_enq_fails'`))
	assert.Equal(t, 1, e.queryInt(`SELECT count(*) FROM outbox WHERE idempotency_key = 'evt_enq_ok/receipt'`))
	assert.Equal(t, 1, e.queryInt(`SELECT count(*) FROM processed_events WHERE event_id = 'evt_enq_ok'`))
}

// The same with the outbox the worker binary gives handlers (outbox.Batch,
// as app wires it), which keeps a transaction's messages and writes them
// only after every handler succeeded. Both events share a batch and an
// object, and the event that commits enqueues first: when the other's
// handler fails, the batch's outbox holds both messages. The batch is then
// committed one event at a time, each with an outbox of its own, and the
// failing event leaves no outbox row, no sequence number and no ledger
// row; the other leaves one of each, its message first in the object's
// sequence.
func TestABatchOutboxKeepsNoMessageOfAHandlerThatFailed(t *testing.T) {
	t.Parallel()
	e := newEnv(t, broker.QueueClassic)
	e.publish(e.event("evt_batch_ok"))
	e.publish(e.event("evt_batch_fails"))
	var mu sync.Mutex
	var batches [][]string
	var handled []string
	w := e.start(batched(16, 200*time.Millisecond), concurrency(1), hooks(worker.Hooks{AfterDedupeCheck: func(ids []string) error {
		mu.Lock()
		defer mu.Unlock()
		batches = append(batches, slices.Clone(ids))
		return nil
	}}), func(o *worker.Options, _ *env) {
		reg := effects.NewRegistry()
		reg.HandleFunc("test.outbox", "stripe", "*", func(ctx context.Context, ev effects.Event, _ effects.Tx, out effects.Outbox) error {
			mu.Lock()
			handled = append(handled, ev.Key)
			mu.Unlock()
			err := out.Enqueue(ctx, ev, effects.Message{Effect: "receipt", ObjectID: "pi_shared", RoutingKey: "email.receipt"})
			if err != nil {
				return err
			}
			if ev.Key == "evt_batch_fails" {
				return effects.Permanent(errors.New("refused after enqueuing"))
			}
			return nil
		})
		o.Effects = reg
		o.Outbox = func(tx effects.Tx) effects.Outbox { return outbox.NewBatch(tx) } // as app/worker.go
	})
	eventually(t, func() bool { return w.outcomes("processed")+w.outcomes("dead_lettered") == 2 }, "both settled")
	w.stop(t)

	mu.Lock()
	require.NotEmpty(t, batches)
	require.Equal(t, []string{"evt_batch_ok", "evt_batch_fails"}, batches[0], "both events in one batch")
	assert.Equal(t, []string{"evt_batch_ok", "evt_batch_fails", "evt_batch_ok", "evt_batch_fails"}, handled,
		"the batch, then each event on its own")
	mu.Unlock()
	assert.Zero(t, e.queryInt(`SELECT count(*) FROM outbox WHERE event_id = 'evt_batch_fails'`))
	assert.Zero(t, e.queryInt(`SELECT count(*) FROM processed_events WHERE event_id = 'evt_batch_fails'`))
	assert.Equal(t, 1, e.queryInt(`SELECT count(*) FROM outbox WHERE idempotency_key = 'evt_batch_ok/receipt'`))
	assert.Equal(t, 1, e.queryInt(`SELECT seq FROM outbox WHERE idempotency_key = 'evt_batch_ok/receipt'`), "the failed message took no sequence number")
	assert.Equal(t, 1, e.queryInt(`SELECT last_seq FROM outbox_sequences WHERE object_id = 'pi_shared'`))
	assert.Equal(t, 1, e.queryInt(`SELECT count(*) FROM processed_events WHERE event_id = 'evt_batch_ok'`))
	msgs := e.broker.Drain(broker.DLQ)
	require.Len(t, msgs, 1)
	assert.Equal(t, "evt_batch_fails", msgs[0].MessageId)
	e.invariant()
}

// The stock worker and a team's own (the payment effect plus an orders
// handler) consume one queue, as during a rolling deploy from the stock
// image to the team's. The team's worker registered last: its handler set
// is current. The stock worker, holding a batch it took before that, is
// refused at COMMIT: the batch goes back to the queue (not to a retry tier
// or the DLQ), the stock worker takes nothing more and says so, and every
// event is committed once by the team's worker, with its orders row and
// the team's generation in its ledger row.
func TestAWorkerOfAnOlderHandlerSetIsFencedAndItsEventsWaitForTheCurrentOne(t *testing.T) {
	t.Parallel()
	e := newEnv(t, broker.QueueClassic)
	_, err := e.store.Pool().Exec(context.Background(), `CREATE TABLE orders (event_id text PRIMARY KEY)`)
	require.NoError(t, err)
	teamUp := make(chan struct{})
	stock := e.start(concurrency(1), batched(64, 200*time.Millisecond), hooks(worker.Hooks{AfterDedupeCheck: func([]string) error {
		<-teamUp // the batch in hand when the team's worker starts
		return nil
	}}))
	ids := make([]string, 40)
	for i := range ids {
		ids[i] = fmt.Sprintf("evt_fence_%02d", i)
		e.publish(e.event(ids[i]))
	}
	eventually(t, func() bool { return stock.count("idempotent_events_worker_in_flight") > 0 }, "the stock worker holds a batch")

	team := e.start(databaseURL(e.dbURL), func(o *worker.Options, _ *env) {
		reg := payments.Effects()
		reg.HandleFunc("orders.create", "stripe", "payment_intent.*", func(ctx context.Context, ev effects.Event, tx effects.Tx, _ effects.Outbox) error {
			_, err := tx.Exec(ctx, `INSERT INTO orders VALUES ($1)`, ev.Key)
			return err
		})
		o.Effects = reg
	})
	close(teamUp)

	eventually(t, func() bool { return team.outcomes("processed") == float64(len(ids)) }, "the team's worker committed every event")
	eventually(t, func() bool { return stock.count("idempotent_events_worker_fenced") == 1 }, "the stock worker is fenced")
	require.ErrorContains(t, stock.w.Ready(), "fenced: handler set")
	require.Zero(t, stock.outcomes("processed"))
	require.Zero(t, stock.outcomes("retried")+stock.outcomes("dead_lettered")+team.outcomes("retried")+team.outcomes("dead_lettered"))
	require.Equal(t, len(ids), e.queryInt(`SELECT count(*) FROM orders`))
	require.Equal(t, len(ids), e.queryInt(`SELECT count(*) FROM processed_events e JOIN handler_generations g USING (generation)
		WHERE g.handlers @> '[{"name": "orders.create"}]'`))
	require.Equal(t, 2, e.queryInt(`SELECT count(*) FROM handler_generations`))
	require.Empty(t, e.broker.Drain(broker.DLQ))
	e.invariant()
}

// A rollout that keeps the handler set (a configuration change): the new
// release's hook announces it, the running worker's next commit is refused
// and it is fenced; once a worker of the new release registers the same
// set, the fenced one finds its set current again and goes on.
func TestAFencedWorkerResumesOnceItsHandlerSetIsCurrentAgain(t *testing.T) {
	t.Parallel()
	e := newEnv(t, broker.QueueClassic)
	ctx := context.Background()
	w := e.start(func(o *worker.Options, _ *env) { o.Release = "ie-1" })
	e.publish(e.event("evt_resume_1"))
	eventually(t, func() bool { return w.outcomes("processed") == 1 }, "processed before the announcement")

	_, err := e.store.Announce(ctx, "ie-2")
	require.NoError(t, err)
	e.publish(e.event("evt_resume_2"))
	eventually(t, func() bool { return w.count("idempotent_events_worker_fenced") == 1 }, "fenced by the announcement")
	require.ErrorContains(t, w.w.Ready(), "fenced: handler set")
	require.Equal(t, 1.0, w.outcomes("processed"))

	set := payments.Effects().Set()
	_, cur, err := e.store.Register(ctx, "ie-2", set.ID, set.Handlers)
	require.NoError(t, err)
	require.Equal(t, set.ID, cur.SetID)
	eventually(t, func() bool { return w.outcomes("processed") == 2 && w.w.Ready() == nil }, "the same set goes on")
	require.Zero(t, w.count("idempotent_events_worker_fenced"))
	require.Zero(t, w.outcomes("retried")+w.outcomes("dead_lettered"))
	e.invariant()
}

// With the archive on (EVENT_ARCHIVE), every event the worker commits —
// applied or skipped — has its body and identity in event_archive, written
// in its transaction: the event a handler refused for good has neither
// ledger row nor archive row. Off, nothing is archived.
func TestTheArchiveKeepsTheBodyOfEveryCommittedEvent(t *testing.T) {
	t.Parallel()
	for _, on := range []bool{true, false} {
		t.Run(fmt.Sprintf("archive=%v", on), func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, broker.QueueClassic)
			bodies := map[string][]byte{}
			for _, id := range []string{"evt_a", "evt_skip", "evt_perm"} {
				bodies[id] = e.event(id)
				e.publish(bodies[id])
			}
			archive := func(o *worker.Options, _ *env) { o.Archive = on }
			w := e.start(batched(8, 200*time.Millisecond), orders(func(ev effects.Event) error {
				switch ev.Key {
				case "evt_perm":
					return effects.Permanent(errors.New("refused"))
				case "evt_skip":
					return effects.Skip("not an order")
				}
				return nil
			}), archive)
			eventually(t, func() bool { return w.outcomes("processed")+w.outcomes("dead_lettered") == 3 }, "all settled")
			w.stop(t)
			if !on {
				assert.Zero(t, e.queryInt(`SELECT count(*) FROM event_archive`))
				return
			}
			assert.Equal(t, 2, e.queryInt(`SELECT count(*) FROM event_archive`))
			for _, id := range []string{"evt_a", "evt_skip"} {
				var body []byte
				var source, typ, objType, objID string
				require.NoError(t, e.store.Pool().QueryRow(context.Background(),
					`SELECT body, source, event_type, object_type, object_id FROM event_archive WHERE event_id = $1`, id).
					Scan(&body, &source, &typ, &objType, &objID))
				assert.Equal(t, bodies[id], body, id)
				assert.Equal(t, "stripe", source)
				assert.Equal(t, "payment_intent.succeeded", typ)
				assert.Equal(t, "payment_intent", objType)
				assert.NotEmpty(t, objID)
			}
		})
	}
}
