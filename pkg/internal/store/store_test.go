package store_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
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

func TestCommitWritesLedgerAndPaymentOnceAndReportsDuplicates(t *testing.T) {
	t.Parallel()
	st := open(t)
	ctx := context.Background()

	isNew, err := st.Commit(ctx, []store.Record{record("evt_a", 100), record("evt_b", 200)})
	require.NoError(t, err)
	assert.Equal(t, []bool{true, true}, isNew)

	isNew, err = st.Commit(ctx, []store.Record{record("evt_b", 200), record("evt_c", 300)})
	require.NoError(t, err)
	assert.Equal(t, []bool{false, true}, isNew)

	var payments, ledger int
	require.NoError(t, st.Pool().QueryRow(ctx, "SELECT count(*) FROM payments").Scan(&payments))
	require.NoError(t, st.Pool().QueryRow(ctx, "SELECT count(*) FROM processed_events").Scan(&ledger))
	assert.Equal(t, 3, payments)
	assert.Equal(t, 3, ledger)

	found, err := st.Digests(ctx, []string{"evt_c", "evt_z", "evt_a"})
	require.NoError(t, err)
	assert.Equal(t, []string{hex.EncodeToString(record("evt_c", 0).PayloadSHA256), "", hex.EncodeToString(record("evt_a", 0).PayloadSHA256)}, found)
}

func TestEventsWithoutPaymentGetOnlyALedgerRow(t *testing.T) {
	t.Parallel()
	st := open(t)
	ctx := context.Background()
	r := record("evt_customer", 0)
	r.Event.Payment = nil
	_, err := st.Commit(ctx, []store.Record{r})
	require.NoError(t, err)
	var payments int
	require.NoError(t, st.Pool().QueryRow(ctx, "SELECT count(*) FROM payments").Scan(&payments))
	assert.Zero(t, payments)
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
			isNew, err := st.Commit(ctx, recs)
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
	var dup int
	require.NoError(t, st.Pool().QueryRow(ctx,
		"SELECT count(*) FROM (SELECT event_id FROM processed_events GROUP BY event_id HAVING COUNT(*) > 1) d").Scan(&dup))
	assert.Zero(t, dup)
}

func TestDataErrorsArePermanent(t *testing.T) {
	t.Parallel()
	st := open(t)
	r := record("evt_neg", -5) // violates the amount_cents CHECK
	_, err := st.Commit(context.Background(), []store.Record{r})
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
	_, err = st.Commit(context.Background(), []store.Record{record("evt_x", 1)})
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
