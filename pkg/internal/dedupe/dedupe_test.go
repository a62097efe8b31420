package dedupe_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotent-events/idempotent-events/pkg/internal/dedupe"
	"github.com/idempotent-events/idempotent-events/pkg/internal/servicetest"
)

func TestCommittedOnlyAfterMark(t *testing.T) {
	t.Parallel()
	c, err := dedupe.Open(servicetest.RedisURL, servicetest.RedisPrefix(t), time.Minute)
	require.NoError(t, err)
	defer c.Close()
	ctx := context.Background()

	require.NoError(t, c.Vouch(ctx, "e1", time.Minute))
	hits, err := c.Committed(ctx, []string{"evt_1", "evt_2"})
	require.NoError(t, err)
	assert.Equal(t, []string{"", ""}, hits)

	require.NoError(t, c.MarkCommitted(ctx, []dedupe.Entry{{ID: "evt_2", Digest: "d2"}}))
	hits, err = c.Committed(ctx, []string{"evt_1", "evt_2"})
	require.NoError(t, err)
	assert.Equal(t, []string{"", "d2"}, hits)

	ttl, err := c.Client().TTL(ctx, c.Key("evt_2")).Result()
	require.NoError(t, err)
	assert.InDelta(t, time.Minute.Seconds(), ttl.Seconds(), 5)
}

// An entry answers only while Redis holds the epoch it was written for: a
// ledger that changed identity (another epoch vouched), Redis that lost the
// epoch key, or a worker that could not read the epoch (Withdraw) all turn
// every entry into a miss, and the entries of the new epoch answer again.
func TestEntriesAnswerOnlyForTheVouchedEpoch(t *testing.T) {
	t.Parallel()
	prefix := servicetest.RedisPrefix(t)
	worker, err := dedupe.Open(servicetest.RedisURL, prefix, time.Minute)
	require.NoError(t, err)
	defer worker.Close()
	receiver, err := dedupe.Open(servicetest.RedisURL, prefix, time.Minute)
	require.NoError(t, err)
	defer receiver.Close()
	ctx := context.Background()
	lookup := func() string {
		t.Helper()
		hits, err := receiver.Committed(ctx, []string{"evt_1"})
		require.NoError(t, err)
		return hits[0]
	}

	require.NoError(t, worker.MarkCommitted(ctx, []dedupe.Entry{{ID: "evt_1", Digest: "d1"}}))
	assert.Empty(t, lookup(), "nothing is written before an epoch is vouched")
	require.NoError(t, worker.Vouch(ctx, "e1", time.Minute))
	require.NoError(t, worker.MarkCommitted(ctx, []dedupe.Entry{{ID: "evt_1", Digest: "d1"}}))
	assert.Equal(t, "d1", lookup())

	require.NoError(t, worker.Vouch(ctx, "e2", time.Minute))
	assert.Empty(t, lookup(), "an entry of the old ledger does not answer for the new one")
	require.NoError(t, worker.MarkCommitted(ctx, []dedupe.Entry{{ID: "evt_1", Digest: "d1"}}))
	assert.Equal(t, "d1", lookup(), "committed again in the new ledger")

	require.NoError(t, worker.Withdraw(ctx))
	assert.Empty(t, lookup(), "no epoch vouched: every lookup is a miss")
	require.NoError(t, worker.Vouch(ctx, "e2", 200*time.Millisecond))
	assert.Equal(t, "d1", lookup())
	require.Eventually(t, func() bool { return lookup() == "" }, 5*time.Second, 50*time.Millisecond,
		"the vouch is a lease: it ends on its own when no worker renews it")

	require.Error(t, worker.Vouch(ctx, "", time.Minute))
	assert.Error(t, worker.Vouch(ctx, "a:b", time.Minute))
}

func TestUnreachableRedisIsAnErrorNotAnAnswer(t *testing.T) {
	t.Parallel()
	c, err := dedupe.Open("redis://127.0.0.1:1/0", "x:", time.Minute)
	require.NoError(t, err)
	defer c.Close()
	hits, err := c.Committed(context.Background(), []string{"evt_1"})
	require.Error(t, err)
	assert.Nil(t, hits)
}

type ledger map[string]string

func (l ledger) Digests(_ context.Context, ids []string) ([]string, error) {
	out := make([]string, len(ids))
	for i, id := range ids {
		out[i] = l[id]
	}
	return out, nil
}

func TestCheckerFallsThroughToTheLedger(t *testing.T) {
	t.Parallel()
	down, err := dedupe.Open("redis://127.0.0.1:1/0", "x:", time.Minute)
	require.NoError(t, err)
	defer down.Close()
	chk := dedupe.Checker{Cache: coalesce(t, down), Ledger: ledger{"evt_done": "d1"}}

	a := chk.Committed(context.Background(), "evt_done")
	require.True(t, a.Known)
	require.Error(t, a.RedisErr)
	require.NoError(t, a.LedgerErr)
	assert.Equal(t, "d1", a.Digest)
	assert.Equal(t, dedupe.LayerPostgres, a.Layer)

	a = chk.Committed(context.Background(), "evt_new")
	require.True(t, a.Known)
	assert.Empty(t, a.Digest)
}

func TestRedisOnlyCheckerNeverGuesses(t *testing.T) {
	t.Parallel()
	c, err := dedupe.Open(servicetest.RedisURL, servicetest.RedisPrefix(t), time.Minute)
	require.NoError(t, err)
	defer c.Close()
	require.NoError(t, c.Vouch(context.Background(), "e1", time.Minute))
	require.NoError(t, c.MarkCommitted(context.Background(), []dedupe.Entry{{ID: "evt_known", Digest: "dk"}}))
	chk := dedupe.Checker{Cache: coalesce(t, c)}
	a := chk.Committed(context.Background(), "evt_known")
	require.True(t, a.Known)
	assert.Equal(t, "dk", a.Digest)
	assert.Equal(t, dedupe.LayerRedis, a.Layer)
	a = chk.Committed(context.Background(), "evt_unknown")
	require.True(t, a.Known)
	assert.Empty(t, a.Digest)

	down, err := dedupe.Open("redis://127.0.0.1:1/0", "x:", time.Minute)
	require.NoError(t, err)
	defer down.Close()
	a = dedupe.Checker{Cache: coalesce(t, down)}.Committed(context.Background(), "evt_known")
	assert.False(t, a.Known, "an unreachable Redis is no answer, so the receiver publishes")
	require.Error(t, a.RedisErr)
	assert.Empty(t, a.Digest)
}

// coalesce runs a Coalescer over c until the test ends.
func coalesce(t *testing.T, c *dedupe.Cache) *dedupe.Coalescer {
	co, err := dedupe.NewCoalescer(dedupe.CoalescerOptions{Cache: c, Timeout: time.Second, Parallel: 2})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = co.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return co
}

// Many concurrent lookups are answered correctly through shared MGETs.
func TestCoalescerAnswersConcurrentLookups(t *testing.T) {
	t.Parallel()
	c, err := dedupe.Open(servicetest.RedisURL, servicetest.RedisPrefix(t), time.Minute)
	require.NoError(t, err)
	defer c.Close()
	ctx := context.Background()
	require.NoError(t, c.Vouch(ctx, "e1", time.Minute))
	require.NoError(t, c.MarkCommitted(ctx, []dedupe.Entry{{ID: "evt_0", Digest: "d"}, {ID: "evt_2", Digest: "d"}, {ID: "evt_4", Digest: "d"}}))
	co := coalesce(t, c)
	var wg sync.WaitGroup
	for i := 0; i < 500; i++ {
		wg.Go(func() {
			id := fmt.Sprintf("evt_%d", i%6)
			digest, err := co.Committed(ctx, id)
			assert.NoError(t, err) //nolint:testifylint // on a goroutine of wg.Go: require (FailNow) must not run here
			assert.Equal(t, i%6%2 == 0 && i%6 <= 4, digest == "d", id)
		})
	}
	wg.Wait()
}
