package store_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idempotent-events/idempotent-events/pkg/internal/servicetest"
	"github.com/idempotent-events/idempotent-events/pkg/internal/store"
)

// workers opens n stores on one migrated schema: the processes of a
// rolling deploy, sharing a ledger.
func workers(t *testing.T, n int) []*worker {
	t.Helper()
	url := servicetest.Schema(t)
	ws := make([]*worker, n)
	for i := range ws {
		st, err := store.Open(context.Background(), url, 8)
		require.NoError(t, err)
		t.Cleanup(st.Close)
		ws[i] = &worker{st: st}
	}
	return ws
}

// worker is one registered worker: its ledger and its registration.
type worker struct {
	st   *store.Store
	mine store.Fence
}

func (w *worker) register(t *testing.T, release, set string) store.Generation {
	t.Helper()
	mine, cur, err := w.st.Register(context.Background(), release, set, []string{set})
	require.NoError(t, err)
	w.mine = mine
	return cur
}

func (w *worker) commit(id string) error {
	_, err := w.st.CommitAs(context.Background(), w.mine, []store.Record{record(id, 1)}, nil)
	return err
}

// A new handler set fences the old one from the COMMIT of its
// registration: the old worker's commits are refused with nothing written,
// a restarted old worker is fenced from its first transaction, and every
// ledger row records the generation that committed it.
func TestTheNewestHandlerSetFencesTheOthers(t *testing.T) {
	t.Parallel()
	ws := workers(t, 3)
	old, newer, restarted := ws[0], ws[1], ws[2]

	cur := old.register(t, "", "set-a")
	require.Equal(t, store.Fence{Generation: 1, SetID: "set-a"}, old.mine)
	require.Equal(t, "set-a", cur.SetID)
	require.NoError(t, old.commit("evt_before"))

	cur = newer.register(t, "", "set-b")
	require.Equal(t, int64(2), newer.mine.Generation)
	require.Equal(t, "set-b", cur.SetID)

	err := old.commit("evt_old")
	require.ErrorIs(t, err, store.ErrFenced)
	require.ErrorContains(t, err, "handler set set-a (generation 1) is not current: generation 2 runs handler set set-b")
	require.NoError(t, newer.commit("evt_new"))

	// An old worker restarting mid-rollout keeps its set's generation.
	cur = restarted.register(t, "", "set-a")
	require.Equal(t, int64(1), restarted.mine.Generation)
	require.Equal(t, "set-b", cur.SetID)
	require.ErrorIs(t, restarted.commit("evt_restarted"), store.ErrFenced)

	// The unfenced Commit of tools is not a worker's.
	_, err = old.st.Commit(context.Background(), []store.Record{record("evt_tool", 1)}, nil)
	require.NoError(t, err)

	st := old.st
	require.Equal(t, 0, count(t, st, `SELECT count(*) FROM processed_events WHERE event_id IN ('evt_old', 'evt_restarted')`))
	require.Equal(t, 1, count(t, st, `SELECT count(*) FROM processed_events WHERE event_id = 'evt_before' AND generation = 1`))
	require.Equal(t, 1, count(t, st, `SELECT count(*) FROM processed_events WHERE event_id = 'evt_new' AND generation = 2`))
	// "Which events ran without handler X" is one query.
	require.Equal(t, 1, count(t, st, `SELECT count(*) FROM processed_events e JOIN handler_generations g USING (generation)
		WHERE NOT g.handlers ? 'set-b'`))
}

// The chart's hook announces a release before its pods start: from then
// on nobody commits until a worker of the release registers; workers of
// the same handler set then go on (a rollout that changed only
// configuration). A rollback announces the old release again, as the
// newest generation.
func TestAnAnnouncedReleaseHoldsEveryCommitUntilItsWorkerRegisters(t *testing.T) {
	t.Parallel()
	ws := workers(t, 3)
	rev1, rev2, rev1again := ws[0], ws[1], ws[2]
	ctx := context.Background()

	rev1.register(t, "ie-1", "set-a")
	require.NoError(t, rev1.commit("evt_1"))

	gen, err := rev1.st.Announce(ctx, "ie-2")
	require.NoError(t, err)
	require.Equal(t, int64(2), gen)
	require.ErrorIs(t, rev1.commit("evt_2"), store.ErrFenced)

	cur := rev2.register(t, "ie-2", "set-a")
	require.Equal(t, int64(2), rev2.mine.Generation)
	require.Equal(t, "ie-2", cur.Release)
	require.NoError(t, rev1.commit("evt_2"), "the same handler set goes on")
	require.NoError(t, rev2.commit("evt_3"))

	// A rollout to another set, then the rollback.
	_, err = rev1.st.Announce(ctx, "ie-3")
	require.NoError(t, err)
	rev2.register(t, "ie-3", "set-b")
	require.ErrorIs(t, rev1.commit("evt_4"), store.ErrFenced)

	gen, err = rev1.st.Announce(ctx, "ie-1")
	require.NoError(t, err)
	require.Equal(t, int64(4), gen)
	require.ErrorIs(t, rev2.commit("evt_4"), store.ErrFenced, "set-b after the rollback")
	cur = rev1again.register(t, "ie-1", "set-a")
	require.Equal(t, int64(4), rev1again.mine.Generation)
	require.Equal(t, "set-a", cur.SetID)
	require.NoError(t, rev1again.commit("evt_4"))
}

// One release, one handler set: a second image deployed as the same
// release is refused, not silently committed beside the first.
func TestAReleaseRunsOneHandlerSet(t *testing.T) {
	t.Parallel()
	ws := workers(t, 2)
	ws[0].register(t, "ie-1", "set-a")
	_, _, err := ws[1].st.Register(context.Background(), "ie-1", "set-b", nil)
	require.ErrorIs(t, err, store.ErrGenerationTaken)
	require.ErrorContains(t, err, "release ie-1 (generation 1) runs handler set set-a, not this worker's set-b")
}

// The fence has no window: an announcement waits for the transactions in
// flight, and once it has returned no worker of the old set commits again.
// Workers of set A commit continuously while a release of set B is
// announced; the ledger's count of set A's events taken when Announce
// returns must be final.
func TestNoOldSetCommitLandsAfterTheAnnouncementReturns(t *testing.T) {
	t.Parallel()
	ws := workers(t, 5)
	for _, w := range ws[:4] {
		w.register(t, "ie-1", "set-a")
	}
	ctx := context.Background()
	var committed, fenced atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for n, w := range ws[:4] {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				err := w.commit(fmt.Sprintf("evt_w%d_%d", n, i))
				switch {
				case err == nil:
					committed.Add(1)
				case errIsFenced(err):
					fenced.Add(1)
				default:
					t.Errorf("commit: %v", err)
					return
				}
			}
		})
	}
	require.Eventually(t, func() bool { return committed.Load() >= 200 }, 30*time.Second, 10*time.Millisecond)
	_, err := ws[4].st.Announce(ctx, "ie-2")
	require.NoError(t, err)
	atAnnounce := count(t, ws[4].st, `SELECT count(*) FROM processed_events WHERE generation = 1`)
	require.Eventually(t, func() bool { return fenced.Load() >= 200 }, 30*time.Second, 10*time.Millisecond)
	close(stop)
	wg.Wait()
	require.Equal(t, atAnnounce, count(t, ws[4].st, `SELECT count(*) FROM processed_events WHERE generation = 1`))
	require.Equal(t, int(committed.Load()), atAnnounce, "every commit reported before or after the announcement is in the ledger")
	require.Zero(t, count(t, ws[4].st, `SELECT count(*) FROM processed_events WHERE generation = 1
		AND processed_at > (SELECT announced_at FROM handler_generations WHERE release = 'ie-2')`),
		"announced_at is taken under the lock: every commit of set A is before it")
	t.Logf("%d commits of set A before the announcement, %d refused after it", atAnnounce, fenced.Load())
}

func errIsFenced(err error) bool {
	var fe *store.FencedError
	return errors.As(err, &fe)
}
