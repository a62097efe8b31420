package store_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotent-events/idempotent-events/pkg/internal/event"
	"github.com/idempotent-events/idempotent-events/pkg/internal/servicetest"
	"github.com/idempotent-events/idempotent-events/pkg/internal/store"
)

func record(id string, amount int64) store.Record {
	sum := sha256.Sum256([]byte(id))
	return store.Record{
		Event: event.Event{ID: id, Type: "payment_intent.succeeded", Created: time.Unix(1_700_000_000, 0),
			Payment: &event.Payment{IntentID: "pi_" + id, AmountCents: amount, Currency: "usd", Status: "succeeded"}},
		Source: "stripe", PayloadSHA256: sum[:], ReceivedAt: time.Now(), Attempt: 1,
	}
}

func open(t *testing.T) *store.Store {
	t.Helper()
	st, err := store.Open(context.Background(), servicetest.Schema(t), 8)
	require.NoError(t, err)
	t.Cleanup(st.Close)
	return st
}

// probe is an effect for the tests of the ledger: it writes one row per
// event into effects_probe (created on first use), and reports the events
// named in skip as skipped.
func probe(t *testing.T, st *store.Store, recs []store.Record, skip ...string) store.Apply {
	t.Helper()
	_, err := st.Pool().Exec(context.Background(), `CREATE TABLE IF NOT EXISTS effects_probe (event_id text PRIMARY KEY, amount bigint CHECK (amount >= 0))`)
	require.NoError(t, err)
	return func(ctx context.Context, tx store.Tx, fresh []int) ([]bool, error) {
		applied := make([]bool, len(fresh))
		for j, i := range fresh {
			if slices.Contains(skip, recs[i].Event.ID) {
				continue
			}
			if _, err := tx.Exec(ctx, `INSERT INTO effects_probe VALUES ($1, $2)`, recs[i].Event.ID, recs[i].Event.Payment.AmountCents); err != nil {
				return nil, err
			}
			applied[j] = true
		}
		return applied, nil
	}
}

func count(t *testing.T, st *store.Store, query string) int {
	t.Helper()
	var n int
	require.NoError(t, st.Pool().QueryRow(context.Background(), query).Scan(&n))
	return n
}

// The ledger row and the effects of a new event commit together; a
// duplicate gets no second effect; an event no effect applied to is
// recorded as skipped.
func TestCommitAppliesTheEffectsOfNewEventsOnly(t *testing.T) {
	t.Parallel()
	st := open(t)
	ctx := context.Background()

	first := []store.Record{record("evt_a", 100), record("evt_b", 200)}
	isNew, err := st.Commit(ctx, first, probe(t, st, first))
	require.NoError(t, err)
	assert.Equal(t, []bool{true, true}, isNew)

	second := []store.Record{record("evt_b", 200), record("evt_c", 300), record("evt_s", 1)}
	isNew, err = st.Commit(ctx, second, probe(t, st, second, "evt_s"))
	require.NoError(t, err)
	assert.Equal(t, []bool{false, true, true}, isNew)

	assert.Equal(t, 3, count(t, st, "SELECT count(*) FROM effects_probe"))
	assert.Equal(t, 4, count(t, st, "SELECT count(*) FROM processed_events"))
	assert.Equal(t, 1, count(t, st, "SELECT count(*) FROM processed_events WHERE outcome = 'skipped' AND event_id = 'evt_s'"))

	found, err := st.Digests(ctx, []string{"evt_c", "evt_z", "evt_a"})
	require.NoError(t, err)
	assert.Equal(t, []string{hex.EncodeToString(record("evt_c", 0).PayloadSHA256), "", hex.EncodeToString(record("evt_a", 0).PayloadSHA256)}, found)
}

// Concurrent transactions over overlapping events, in different orders,
// commit each event once and never deadlock.
func TestConcurrentOverlappingBatches(t *testing.T) {
	t.Parallel()
	st := open(t)
	ctx := context.Background()
	ids := []string{"evt_1", "evt_2", "evt_3", "evt_4", "evt_5", "evt_6"}
	newCount := make([]int, len(ids))
	var mu sync.Mutex
	var wg sync.WaitGroup
	for w := 0; w < 8; w++ {
		wg.Go(func() {
			recs := make([]store.Record, len(ids))
			for i := range ids {
				j := (i + w) % len(ids) // each worker its own order
				recs[i] = record(ids[j], 1)
			}
			isNew, err := st.Commit(ctx, recs, nil)
			assert.NoError(t, err) //nolint:testifylint // on a goroutine of wg.Go: require (FailNow) must not run here
			mu.Lock()
			defer mu.Unlock()
			for i, n := range isNew {
				if n {
					newCount[(i+w)%len(ids)]++
				}
			}
		})
	}
	wg.Wait()
	assert.Equal(t, []int{1, 1, 1, 1, 1, 1}, newCount)
	assert.Zero(t, count(t, st, "SELECT count(*) FROM (SELECT event_id FROM processed_events GROUP BY event_id HAVING COUNT(*) > 1) d"))
}

// An effect refused by a constraint fails the whole transaction, the ledger
// row too, and the error is one no retry fixes.
func TestDataErrorsArePermanentAndLeaveNoLedgerRow(t *testing.T) {
	t.Parallel()
	st := open(t)
	recs := []store.Record{record("evt_neg", -5)} // violates effects_probe's CHECK
	_, err := st.Commit(context.Background(), recs, probe(t, st, recs))
	require.Error(t, err)
	assert.True(t, store.IsPermanent(err), "%v", err)

	found, err := st.Digests(context.Background(), []string{"evt_neg"})
	require.NoError(t, err)
	assert.Equal(t, []string{""}, found, "a failed transaction leaves no ledger row")
}

func TestConnectionErrorsAreTransient(t *testing.T) {
	t.Parallel()
	st, err := store.Open(context.Background(), "postgres://postgres@127.0.0.1:1/x?sslmode=disable&connect_timeout=1", 1)
	require.NoError(t, err)
	defer st.Close()
	_, err = st.Commit(context.Background(), []store.Record{record("evt_x", 1)}, nil)
	require.Error(t, err)
	assert.False(t, store.IsPermanent(err))
}

func TestConflictsAreRecordedOncePerContent(t *testing.T) {
	t.Parallel()
	st := open(t)
	ctx := context.Background()
	c := store.Conflict{EventID: "evt_c", Source: "stripe", StoredDigest: []byte{1}, ReceivedDigest: []byte{2}, Body: []byte(`{}`), ReceivedAt: time.Now()}
	require.NoError(t, st.RecordConflicts(ctx, []store.Conflict{c, c}))
	c.ReceivedDigest = []byte{3}
	require.NoError(t, st.RecordConflicts(ctx, []store.Conflict{c}))
	var n int
	require.NoError(t, st.Pool().QueryRow(ctx, "SELECT count(*) FROM event_conflicts WHERE event_id='evt_c'").Scan(&n))
	assert.Equal(t, 2, n)
}

// The epoch names one ledger: the same on every read while the ledger is
// the same; different for another ledger, for the same one dropped and
// created again (to the ledger, a recreated database), and after its
// identity is renewed by hand (what the runbook says to do after restoring
// a snapshot of the database's own volume).
func TestTheEpochNamesOneLedger(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := servicetest.Schema(t)
	st, err := store.Open(ctx, dbURL, 2)
	require.NoError(t, err)
	defer st.Close()
	epoch := func(st *store.Store) string {
		t.Helper()
		e, err := st.Epoch(ctx)
		require.NoError(t, err)
		require.Regexp(t, `^[0-9a-f]{16}$`, e)
		return e
	}
	first := epoch(st)
	assert.Equal(t, first, epoch(st))

	other := open(t)
	assert.NotEqual(t, first, epoch(other), "another ledger")

	servicetest.Recreate(t, dbURL)
	recreated := epoch(st)
	assert.NotEqual(t, first, recreated, "the same ledger dropped and created again")

	_, err = st.Pool().Exec(ctx, "UPDATE ledger_identity SET id = gen_random_uuid()")
	require.NoError(t, err)
	assert.NotEqual(t, recreated, epoch(st), "identity renewed by hand")
}
