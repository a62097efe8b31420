package dedupe_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotent-events/idempotent-events/pkg/dedupe"
	"github.com/idempotent-events/idempotent-events/pkg/testenv"
)

func TestCommittedOnlyAfterMark(t *testing.T) {
	t.Parallel()
	c, err := dedupe.Open(testenv.RedisURL, testenv.RedisPrefix(t), time.Minute)
	require.NoError(t, err)
	defer c.Close()
	ctx := context.Background()

	hits, err := c.Committed(ctx, []string{"evt_1", "evt_2"})
	require.NoError(t, err)
	assert.Equal(t, []bool{false, false}, hits)

	require.NoError(t, c.MarkCommitted(ctx, []string{"evt_2"}))
	hits, err = c.Committed(ctx, []string{"evt_1", "evt_2"})
	require.NoError(t, err)
	assert.Equal(t, []bool{false, true}, hits)

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

type ledger map[string]bool

func (l ledger) Processed(_ context.Context, ids []string) ([]bool, error) {
	out := make([]bool, len(ids))
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
	chk := dedupe.Checker{Cache: coalesce(t, down), Ledger: ledger{"evt_done": true}}

	ok, layer, redisErr, err := chk.Committed(context.Background(), "evt_done")
	require.NoError(t, err)
	assert.Error(t, redisErr)
	assert.True(t, ok)
	assert.Equal(t, dedupe.LayerPostgres, layer)

	ok, _, _, err = chk.Committed(context.Background(), "evt_new")
	require.NoError(t, err)
	assert.False(t, ok)
}

func TestRedisOnlyCheckerNeverGuesses(t *testing.T) {
	t.Parallel()
	c, err := dedupe.Open(testenv.RedisURL, testenv.RedisPrefix(t), time.Minute)
	require.NoError(t, err)
	defer c.Close()
	require.NoError(t, c.MarkCommitted(context.Background(), []string{"evt_known"}))
	chk := dedupe.Checker{Cache: coalesce(t, c)}
	ok, layer, _, err := chk.Committed(context.Background(), "evt_known")
	require.NoError(t, err)
	assert.True(t, ok)
	assert.Equal(t, dedupe.LayerRedis, layer)
	ok, _, _, err = chk.Committed(context.Background(), "evt_unknown")
	require.NoError(t, err)
	assert.False(t, ok)

	down, err := dedupe.Open("redis://127.0.0.1:1/0", "x:", time.Minute)
	require.NoError(t, err)
	defer down.Close()
	ok, _, _, err = dedupe.Checker{Cache: coalesce(t, down)}.Committed(context.Background(), "evt_known")
	assert.Error(t, err, "an unreachable Redis is an error, so the receiver publishes")
	assert.False(t, ok)
}

// coalesce runs a Coalescer over c until the test ends.
func coalesce(t *testing.T, c *dedupe.Cache) *dedupe.Coalescer {
	co := dedupe.NewCoalescer(c, time.Second)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); co.Run(ctx, 2) }()
	t.Cleanup(func() { cancel(); <-done })
	return co
}

// Many concurrent lookups are answered correctly through shared MGETs.
func TestCoalescerAnswersConcurrentLookups(t *testing.T) {
	t.Parallel()
	c, err := dedupe.Open(testenv.RedisURL, testenv.RedisPrefix(t), time.Minute)
	require.NoError(t, err)
	defer c.Close()
	ctx := context.Background()
	require.NoError(t, c.MarkCommitted(ctx, []string{"evt_0", "evt_2", "evt_4"}))
	co := coalesce(t, c)
	var wg sync.WaitGroup
	for i := 0; i < 500; i++ {
		wg.Go(func() {
			id := fmt.Sprintf("evt_%d", i%6)
			hit, err := co.Committed(ctx, id)
			assert.NoError(t, err)
			assert.Equal(t, i%6%2 == 0 && i%6 <= 4, hit, id)
		})
	}
	wg.Wait()
}
