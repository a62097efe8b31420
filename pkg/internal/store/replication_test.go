package store_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotent-events/idempotent-events/pkg/internal/migrate"
	"github.com/idempotent-events/idempotent-events/pkg/internal/pgcluster"
	"github.com/idempotent-events/idempotent-events/pkg/internal/store"
)

// On a primary with a synchronous standby, a batch of nothing but
// duplicates still waits for the standby before its COMMIT returns
// (SetSynchronous): the ack of a duplicate then rests on WAL the standby
// has, which holds the first COMMIT of the event. The replication link is
// delayed by 1 s each way, so such a COMMIT cannot return in under 2 s.
func TestDuplicatesWaitForTheSynchronousStandby(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a private PostgreSQL primary and standby; skipped with -short")
	}
	t.Parallel()
	c := pgcluster.New(t, pgcluster.Options{})
	ctx := context.Background()
	dbURL := c.URL("idempotent_events")
	_, err := migrate.Up(ctx, dbURL, time.Minute)
	require.NoError(t, err)
	st, err := store.Open(ctx, dbURL, 4)
	require.NoError(t, err)
	defer st.Close()
	d, err := st.ReadDurability(ctx)
	require.NoError(t, err)
	require.Equal(t, store.DurabilitySync, d.Mode(), "%+v", d)

	recs := []store.Record{record("evt_sync_dup", 100)}
	isNew, err := st.Commit(ctx, recs, nil)
	require.NoError(t, err)
	require.Equal(t, []bool{true}, isNew)

	c.SetReplicationDelay(time.Second)
	fresh := time.Now()
	_, err = st.Commit(ctx, []store.Record{record("evt_sync_fresh", 100)}, nil)
	require.NoError(t, err)
	t.Logf("a new event committed in %s", time.Since(fresh))
	st.SetSynchronous(true)
	start := time.Now()
	isNew, err = st.Commit(ctx, recs, nil)
	took := time.Since(start)
	require.NoError(t, err)
	assert.Equal(t, []bool{false}, isNew)
	assert.GreaterOrEqual(t, took, 2*time.Second, "the duplicate's COMMIT returned before the standby could have confirmed it")
	t.Logf("a duplicate-only batch committed in %s over a link delayed 1 s each way", took)
}
