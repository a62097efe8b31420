package dedupe_test

import (
	"context"
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
	chk := dedupe.Checker{Cache: down, Ledger: ledger{"evt_done": true}}

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
	chk := dedupe.Checker{Cache: c}
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
	ok, _, _, err = dedupe.Checker{Cache: down}.Committed(context.Background(), "evt_known")
	assert.Error(t, err, "an unreachable Redis is an error, so the receiver publishes")
	assert.False(t, ok)
}
