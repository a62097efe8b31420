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

	digest, layer, redisErr, err := chk.Committed(context.Background(), "evt_done")
	require.NoError(t, err)
	assert.Error(t, redisErr)
	assert.Equal(t, "d1", digest)
	assert.Equal(t, dedupe.LayerPostgres, layer)

	digest, _, _, err = chk.Committed(context.Background(), "evt_new")
	require.NoError(t, err)
	assert.Empty(t, digest)
}

func TestRedisOnlyCheckerNeverGuesses(t *testing.T) {
	t.Parallel()
	c, err := dedupe.Open(servicetest.RedisURL, servicetest.RedisPrefix(t), time.Minute)
	require.NoError(t, err)
	defer c.Close()
	require.NoError(t, c.MarkCommitted(context.Background(), []dedupe.Entry{{ID: "evt_known", Digest: "dk"}}))
	chk := dedupe.Checker{Cache: coalesce(t, c)}
	digest, layer, _, err := chk.Committed(context.Background(), "evt_known")
	require.NoError(t, err)
	assert.Equal(t, "dk", digest)
	assert.Equal(t, dedupe.LayerRedis, layer)
	digest, _, _, err = chk.Committed(context.Background(), "evt_unknown")
	require.NoError(t, err)
	assert.Empty(t, digest)

	down, err := dedupe.Open("redis://127.0.0.1:1/0", "x:", time.Minute)
	require.NoError(t, err)
	defer down.Close()
	digest, _, _, err = dedupe.Checker{Cache: coalesce(t, down)}.Committed(context.Background(), "evt_known")
	assert.Error(t, err, "an unreachable Redis is an error, so the receiver publishes")
	assert.Empty(t, digest)
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
	require.NoError(t, c.MarkCommitted(ctx, []dedupe.Entry{{ID: "evt_0", Digest: "d"}, {ID: "evt_2", Digest: "d"}, {ID: "evt_4", Digest: "d"}}))
	co := coalesce(t, c)
	var wg sync.WaitGroup
	for i := 0; i < 500; i++ {
		wg.Go(func() {
			id := fmt.Sprintf("evt_%d", i%6)
			digest, err := co.Committed(ctx, id)
			assert.NoError(t, err)
			assert.Equal(t, i%6%2 == 0 && i%6 <= 4, digest == "d", id)
		})
	}
	wg.Wait()
}
