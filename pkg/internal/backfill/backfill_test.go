package backfill_test

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotent-events/idempotent-events/pkg/effects"
	"github.com/idempotent-events/idempotent-events/pkg/internal/backfill"
	"github.com/idempotent-events/idempotent-events/pkg/internal/event"
	"github.com/idempotent-events/idempotent-events/pkg/internal/servicetest"
	"github.com/idempotent-events/idempotent-events/pkg/internal/store"
)

// ledger is one test's ledger: a migrated schema, with the table the
// backfilled handler writes (no key on it, so a second run shows as a
// second row).
type ledger struct {
	st *store.Store
	db *pgxpool.Pool
}

func newLedger(t *testing.T) *ledger {
	t.Helper()
	st, err := store.Open(context.Background(), servicetest.Schema(t), 16)
	require.NoError(t, err)
	t.Cleanup(st.Close)
	_, err = st.Pool().Exec(context.Background(), `CREATE TABLE orders (event_id text NOT NULL, object_id text NOT NULL, origin text NOT NULL)`)
	require.NoError(t, err)
	return &ledger{st: st, db: st.Pool()}
}

// Two releases: "v1" without orders.create, "v2" with it. A
// payment_intent.* handler (orders.create) and a charge one, so routes are
// matched.
func v1() *effects.Registry {
	r := effects.NewRegistry()
	r.HandleFunc("payments", "stripe", "*", func(context.Context, effects.Event, effects.Tx, effects.Outbox) error { return nil })
	return r
}

func v2(h effects.HandlerFunc) *effects.Registry {
	r := v1()
	r.Handle("orders.create", "stripe", "payment_intent.*", h)
	r.OnTransitionFunc("receipts", "payment_intent", "succeeded", func(context.Context, effects.Transition, effects.Tx, effects.Outbox) error { return nil })
	return r
}

// writeOrder is orders.create: one orders row per event.
func writeOrder(ctx context.Context, ev effects.Event, tx effects.Tx, _ effects.Outbox) error {
	_, err := tx.Exec(ctx, `INSERT INTO orders (event_id, object_id, origin) VALUES ($1, $2, $3)`, ev.Key, ev.Object.ID, string(ev.Origin))
	return err
}

// register registers reg's set as release and returns its fence.
func (l *ledger) register(t *testing.T, release string, reg *effects.Registry) store.Fence {
	t.Helper()
	set := reg.Set()
	mine, _, err := l.st.Register(context.Background(), release, set.ID, set.Handlers)
	require.NoError(t, err)
	return mine
}

// commit commits events of typ as mine, archiving them when archive is set,
// and returns their keys.
func (l *ledger) commit(t *testing.T, mine store.Fence, prefix, typ string, n int, archive bool) []string {
	t.Helper()
	recs := make([]store.Record, n)
	evs := make([]effects.Event, n)
	keys := make([]string, n)
	for i := range recs {
		id := fmt.Sprintf("evt_%s_%03d", prefix, i)
		sum := sha256.Sum256([]byte(id))
		recs[i] = store.Record{Event: event.Event{ID: id, Type: typ}, Source: "stripe", PayloadSHA256: sum[:], Attempt: 1}
		evs[i] = effects.Event{Source: "stripe", ID: id, Key: id, Type: typ, Created: time.Unix(1_700_000_000, 0).UTC(),
			Object: effects.Object{Type: "payment_intent", ID: "pi_" + id}, Raw: []byte(`{"id":"` + id + `"}`)}
		keys[i] = id
	}
	_, err := l.st.CommitAs(context.Background(), mine, recs, func(ctx context.Context, tx store.Tx, fresh []int) ([]bool, error) {
		if archive {
			if err := backfill.Archive(ctx, tx, evs); err != nil {
				return nil, err
			}
		}
		return make([]bool, len(fresh)), nil
	})
	require.NoError(t, err)
	return keys
}

func (l *ledger) runner(t *testing.T, reg *effects.Registry, mine store.Fence) *backfill.Runner {
	t.Helper()
	r, err := backfill.NewRunner(backfill.RunnerOptions{
		DB: l.db, Ledger: l.st, Effects: reg, Fence: func() store.Fence { return mine }, Poll: 20 * time.Millisecond, MaxAttempts: 3,
	})
	require.NoError(t, err)
	require.NotNil(t, r)
	return r
}

// drain steps r until backfill id is finished.
func (l *ledger) drain(t *testing.T, r *backfill.Runner, id int64) backfill.Progress {
	t.Helper()
	ctx := context.Background()
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		if _, err := r.Step(ctx); err != nil {
			require.NoError(t, err)
		}
		p, err := backfill.ProgressOf(ctx, l.db, id)
		require.NoError(t, err)
		if p.Finished {
			return p
		}
	}
	t.Fatalf("backfill %d did not finish within a minute", id)
	return backfill.Progress{}
}

// orders returns how many orders rows each key has, and their origins.
func (l *ledger) orders(t *testing.T) (map[string]int, map[string]int) {
	t.Helper()
	rows, err := l.db.Query(context.Background(), `SELECT event_id, origin FROM orders`)
	require.NoError(t, err)
	defer rows.Close()
	per, origins := map[string]int{}, map[string]int{}
	for rows.Next() {
		var id, origin string
		require.NoError(t, rows.Scan(&id, &origin))
		per[id]++
		origins[origin]++
	}
	require.NoError(t, rows.Err())
	return per, origins
}

func since() backfill.Request {
	return backfill.Request{Handler: "orders.create", Since: time.Now().Add(-time.Hour)}
}

// The plan takes exactly the events the handler's routes take that a set
// without it committed, tells the ones without a body apart, and refuses
// what cannot be backfilled.
func TestPlanFindsTheEventsCommittedWithoutTheHandler(t *testing.T) {
	t.Parallel()
	l := newLedger(t)
	ctx := context.Background()
	old := l.register(t, "v1", v1())
	archived := l.commit(t, old, "a", "payment_intent.succeeded", 7, true)
	noBody := l.commit(t, old, "b", "payment_intent.created", 3, false)
	l.commit(t, old, "c", "charge.succeeded", 5, true) // not its route
	// Without a generation (before handler sets were recorded).
	_, err := l.st.Commit(ctx, []store.Record{{Event: event.Event{ID: "evt_unrecorded", Type: "payment_intent.succeeded"}, Source: "stripe", PayloadSHA256: make([]byte, 32)}}, nil)
	require.NoError(t, err)

	_, err = backfill.MakePlan(ctx, l.db, since())
	require.ErrorIs(t, err, backfill.ErrNotBackfillable, "v1 is current and does not run orders.create")

	cur := l.register(t, "v2", v2(writeOrder))
	l.commit(t, cur, "d", "payment_intent.succeeded", 4, true) // committed with it

	p, err := backfill.MakePlan(ctx, l.db, since())
	require.NoError(t, err)
	assert.Equal(t, effects.HandlerInfo{Name: "orders.create", Source: "stripe", EventType: "payment_intent.*"}, p.Handler)
	assert.Equal(t, cur.Generation, p.Generation)
	assert.Equal(t, int64(len(archived)+len(noBody)), p.Missed)
	assert.Equal(t, int64(len(archived)), p.Archived)
	assert.Equal(t, int64(len(archived)), p.ToQueue())
	assert.Equal(t, int64(1), p.Unrecorded)
	assert.Equal(t, noBody, p.NoBody)

	withUnrecorded := since()
	withUnrecorded.Unrecorded = true
	p, err = backfill.MakePlan(ctx, l.db, withUnrecorded)
	require.NoError(t, err)
	assert.Equal(t, int64(len(archived)+len(noBody)+1), p.Missed)

	_, err = backfill.MakePlan(ctx, l.db, backfill.Request{Handler: "receipts", Since: time.Now().Add(-time.Hour)})
	require.ErrorIs(t, err, backfill.ErrNotBackfillable)
	assert.Contains(t, err.Error(), "transition handler")
	_, err = backfill.MakePlan(ctx, l.db, backfill.Request{Handler: "nobody", Since: time.Now().Add(-time.Hour)})
	require.ErrorIs(t, err, backfill.ErrNotBackfillable)

	// A window that ends before the events: nothing.
	p, err = backfill.MakePlan(ctx, l.db, backfill.Request{Handler: "orders.create", Since: time.Now().Add(-2 * time.Hour), Until: time.Now().Add(-time.Hour)})
	require.NoError(t, err)
	assert.Zero(t, p.Missed)
}

// A handler whose route widened between sets runs only over the events its
// old route did not take.
func TestPlanCountsAnOldRouteAsRun(t *testing.T) {
	t.Parallel()
	l := newLedger(t)
	narrow := v1()
	narrow.HandleFunc("orders.create", "stripe", "payment_intent.succeeded", writeOrder)
	old := l.register(t, "v1", narrow)
	l.commit(t, old, "ran", "payment_intent.succeeded", 3, true)
	missed := l.commit(t, old, "missed", "payment_intent.created", 2, true)
	l.register(t, "v2", v2(writeOrder))
	p, err := backfill.MakePlan(context.Background(), l.db, since())
	require.NoError(t, err)
	assert.Equal(t, int64(len(missed)), p.Missed)
}

// Queued twice, or by two operators at once, each (event, handler) is
// queued once; the workers' runs — several at once, one of them killed
// mid-transaction and another started in its place — apply each exactly
// once, in the transaction that marks it done.
func TestBackfillRunsEachEventOnceWhateverHappens(t *testing.T) {
	t.Parallel()
	l := newLedger(t)
	ctx := context.Background()
	old := l.register(t, "v1", v1())
	keys := l.commit(t, old, "x", "payment_intent.succeeded", 60, true)

	var killAt atomic.Int32
	killAt.Store(10)
	var kill context.CancelFunc
	var killed atomic.Bool
	handler := func(ctx context.Context, ev effects.Event, tx effects.Tx, out effects.Outbox) error {
		if err := writeOrder(ctx, ev, tx, out); err != nil {
			return err
		}
		if killAt.Add(-1) == 0 && kill != nil {
			kill() // the worker dies after the effect's write, before COMMIT
			killed.Store(true)
			<-ctx.Done()
			return ctx.Err()
		}
		return nil
	}
	reg := v2(handler)
	cur := l.register(t, "v2", reg)

	var wg sync.WaitGroup
	ids := make([]int64, 3)
	queued := make([]int64, 3)
	for i := range ids {
		wg.Go(func() {
			var err error
			ids[i], queued[i], err = backfill.Queue(ctx, l.db, since(), 1000, "test")
			assert.NoError(t, err)
		})
	}
	wg.Wait()
	assert.Equal(t, int64(len(keys)), queued[0]+queued[1]+queued[2], "queued once between three operators")
	_, again, err := backfill.Queue(ctx, l.db, since(), 1000, "test")
	require.NoError(t, err)
	assert.Zero(t, again, "run twice: nothing queued again")

	// The first worker is killed mid-transaction.
	kctx, cancel := context.WithCancel(ctx)
	kill = cancel
	victim := l.runner(t, reg, cur)
	for !killed.Load() {
		_, _ = victim.Step(kctx)
	}
	// Three workers at once take the rest, and what the killed one held.
	for range 3 {
		r := l.runner(t, reg, cur)
		wg.Go(func() {
			for _, id := range ids {
				if id != 0 {
					l.drain(t, r, id)
				}
			}
		})
	}
	wg.Wait()
	per, origins := l.orders(t)
	for _, k := range keys {
		assert.Equal(t, 1, per[k], "orders rows of %s", k)
	}
	assert.Len(t, per, len(keys))
	assert.Equal(t, map[string]int{"backfill": len(keys)}, origins)
	var total backfill.Progress
	for _, id := range ids {
		p, err := backfill.ProgressOf(ctx, l.db, id)
		require.NoError(t, err)
		assert.True(t, p.Finished)
		total.Applied += p.Applied
		total.Failed += p.Failed
	}
	assert.Equal(t, int64(len(keys)), total.Applied)
	assert.Zero(t, total.Failed)
}

// A worker whose handler set is not current runs no backfill: its
// transaction is fenced and nothing is written or marked.
func TestAFencedWorkerRunsNoBackfill(t *testing.T) {
	t.Parallel()
	l := newLedger(t)
	ctx := context.Background()
	old := l.register(t, "v1", v1())
	l.commit(t, old, "f", "payment_intent.succeeded", 5, true)
	reg := v2(writeOrder)
	cur := l.register(t, "v2", reg)
	id, queued, err := backfill.Queue(ctx, l.db, since(), 1000, "test")
	require.NoError(t, err)
	require.Equal(t, int64(5), queued)
	// v3 becomes current with the same handlers under another release:
	// same set, so still current; a rollback to v1 fences v2.
	_, err = l.st.Announce(ctx, "v1")
	require.NoError(t, err)
	r := l.runner(t, reg, cur)
	_, err = r.Step(ctx)
	require.ErrorIs(t, err, store.ErrFenced)
	per, _ := l.orders(t)
	assert.Empty(t, per)
	p, err := backfill.ProgressOf(ctx, l.db, id)
	require.NoError(t, err)
	assert.Equal(t, int64(5), p.Pending)
}

// The rate holds across workers: the slots are the backfill's, not each
// worker's.
func TestBackfillRateIsSharedByTheWorkers(t *testing.T) {
	t.Parallel()
	l := newLedger(t)
	ctx := context.Background()
	old := l.register(t, "v1", v1())
	l.commit(t, old, "r", "payment_intent.succeeded", 12, true)
	reg := v2(writeOrder)
	cur := l.register(t, "v2", reg)
	const rate = 20.0
	start := time.Now() // before the first slot, which is the queueing's
	id, _, err := backfill.Queue(ctx, l.db, since(), rate, "test")
	require.NoError(t, err)
	var wg sync.WaitGroup
	for range 3 {
		r := l.runner(t, reg, cur)
		wg.Go(func() { l.drain(t, r, id) })
	}
	wg.Wait()
	// 12 slots at 20/s are 11 intervals of 50 ms after the first: the
	// three workers together cannot finish in less than 550 ms. (A floor,
	// not a timing: it holds however slow the machine is.)
	assert.GreaterOrEqual(t, time.Since(start), 550*time.Millisecond)
	per, _ := l.orders(t)
	assert.Len(t, per, 12)
}

// A failing handler is tried again after a backoff and recorded failed
// once its attempts are used up; Permanent fails at once; Skip is recorded
// skipped. A pruned body fails its item with the reason.
func TestBackfillRecordsFailuresAndSkips(t *testing.T) {
	t.Parallel()
	l := newLedger(t)
	ctx := context.Background()
	old := l.register(t, "v1", v1())
	keys := l.commit(t, old, "e", "payment_intent.succeeded", 4, true)
	pruned := l.commit(t, old, "p", "payment_intent.succeeded", 1, true)[0]
	handler := func(ctx context.Context, ev effects.Event, tx effects.Tx, out effects.Outbox) error {
		switch ev.Key {
		case keys[0]:
			return errors.New("downstream table locked")
		case keys[1]:
			return effects.Permanent(errors.New("bad event"))
		case keys[2]:
			return effects.Skip("not ours")
		}
		return writeOrder(ctx, ev, tx, out)
	}
	reg := v2(handler)
	cur := l.register(t, "v2", reg)
	id, n, err := backfill.Queue(ctx, l.db, since(), 1000, "test")
	require.NoError(t, err)
	require.Equal(t, int64(5), n)
	_, err = l.db.Exec(ctx, `UPDATE backfill_items SET attempts = 1 WHERE event_id = $1`, keys[0]) // one try before the last
	require.NoError(t, err)
	// A body pruned after it was queued.
	_, err = l.db.Exec(ctx, `DELETE FROM event_archive WHERE event_id = $1`, pruned)
	require.NoError(t, err)

	p := l.drain(t, l.runner(t, reg, cur), id)
	assert.Equal(t, int64(1), p.Applied)
	assert.Equal(t, int64(1), p.Skipped)
	assert.Equal(t, int64(3), p.Failed)
	errs := map[string]string{}
	attempts := map[string]int{}
	rows, err := l.db.Query(ctx, `SELECT event_id, coalesce(last_error, ''), attempts FROM backfill_items`)
	require.NoError(t, err)
	for rows.Next() {
		var id, e string
		var a int
		require.NoError(t, rows.Scan(&id, &e, &a))
		errs[id], attempts[id] = e, a
	}
	require.NoError(t, rows.Err())
	assert.Equal(t, "downstream table locked", errs[keys[0]])
	assert.Equal(t, 3, attempts[keys[0]], "tried again after a backoff until its attempts were used up")
	assert.Contains(t, errs[keys[1]], "bad event")
	assert.Equal(t, 1, attempts[keys[1]], "Permanent: not tried again")
	assert.Contains(t, errs[pruned], "no longer in event_archive")
	per, _ := l.orders(t)
	assert.Equal(t, map[string]int{keys[3]: 1}, per)
}

// Cancel unqueues what has not run; a new backfill can queue it again.
func TestCancelUnqueues(t *testing.T) {
	t.Parallel()
	l := newLedger(t)
	ctx := context.Background()
	old := l.register(t, "v1", v1())
	l.commit(t, old, "k", "payment_intent.succeeded", 3, true)
	l.register(t, "v2", v2(writeOrder))
	id, _, err := backfill.Queue(ctx, l.db, since(), 1, "test")
	require.NoError(t, err)
	n, err := backfill.Cancel(ctx, l.db, id)
	require.NoError(t, err)
	assert.Equal(t, int64(3), n)
	open, err := backfill.Open(ctx, l.db)
	require.NoError(t, err)
	assert.Empty(t, open)
	_, n, err = backfill.Queue(ctx, l.db, since(), 1, "test")
	require.NoError(t, err)
	assert.Equal(t, int64(3), n)
}
