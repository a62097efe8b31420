package dedupe

import (
	"context"
)

// Layer names where a duplicate was recognised; it is a metric label.
type Layer string

// Layers, cheapest first.
const (
	LayerRedis    Layer = "redis"
	LayerPostgres Layer = "postgres"
)

// Ledger is the source of truth: processed_events in Postgres.
type Ledger interface {
	Processed(ctx context.Context, ids []string) ([]bool, error)
}

// Checker answers "has this event committed?" from Redis, then Postgres.
// It says yes only when one of them has a record written after COMMIT; a
// Redis error falls through to Postgres, and a Postgres error is returned
// so the caller can go the safe way (publish and let the worker decide).
// Without a Ledger only Redis is asked, and a Redis error is returned.
type Checker struct {
	Cache  *Cache
	Ledger Ledger
}

// Committed reports whether id has committed and which layer knew it.
// redisErr is set when Redis failed but Postgres still answered.
func (c Checker) Committed(ctx context.Context, id string) (ok bool, layer Layer, redisErr, err error) {
	ids := []string{id}
	if c.Cache != nil {
		hits, rerr := c.Cache.Committed(ctx, ids)
		if rerr == nil && hits[0] {
			return true, LayerRedis, nil, nil
		}
		redisErr = rerr
	}
	if c.Ledger == nil {
		return false, "", redisErr, redisErr
	}
	found, err := c.Ledger.Processed(ctx, ids)
	if err != nil {
		return false, "", redisErr, err
	}
	if found[0] {
		return true, LayerPostgres, redisErr, nil
	}
	return false, "", redisErr, nil
}
