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
	Cache  Lookup
	Ledger Ledger
}

// Lookup answers for one event whether Redis says it committed; *Coalescer
// is the one the receiver uses.
type Lookup interface {
	Committed(ctx context.Context, id string) (bool, error)
}

// Committed reports whether id has committed and which layer knew it.
// redisErr is set when Redis failed but Postgres still answered.
func (c Checker) Committed(ctx context.Context, id string) (ok bool, layer Layer, redisErr, err error) {
	if c.Cache != nil {
		hit, rerr := c.Cache.Committed(ctx, id)
		if rerr == nil && hit {
			return true, LayerRedis, nil, nil
		}
		redisErr = rerr
	}
	if c.Ledger == nil {
		return false, "", redisErr, redisErr
	}
	found, err := c.Ledger.Processed(ctx, []string{id})
	if err != nil {
		return false, "", redisErr, err
	}
	if found[0] {
		return true, LayerPostgres, redisErr, nil
	}
	return false, "", redisErr, nil
}
