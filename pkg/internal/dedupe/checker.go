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
	// Digests returns, for each id, the content digest of its committed
	// event, or "" when it has none.
	Digests(ctx context.Context, ids []string) ([]string, error)
}

// Checker answers "has this event committed, and with which content?" from
// Redis, then Postgres. It answers only from a record written after COMMIT;
// a Redis error falls through to Postgres, and a Postgres error is returned
// so the caller can go the safe way (publish and let the worker decide).
// Without a Ledger only Redis is asked, and a Redis error is returned.
type Checker struct {
	Cache  Lookup
	Ledger Ledger
}

// Lookup answers for one event the digest Redis holds for it;
// *Coalescer is the one the receiver uses.
type Lookup interface {
	Committed(ctx context.Context, id string) (string, error)
}

// Committed returns the content digest of id's committed event ("" when it
// has not committed) and which layer knew. redisErr is set when Redis
// failed but Postgres still answered.
func (c Checker) Committed(ctx context.Context, id string) (digest string, layer Layer, redisErr, err error) {
	if c.Cache != nil {
		d, rerr := c.Cache.Committed(ctx, id)
		if rerr == nil && d != "" {
			return d, LayerRedis, nil, nil
		}
		redisErr = rerr
	}
	if c.Ledger == nil {
		return "", "", redisErr, redisErr
	}
	found, err := c.Ledger.Digests(ctx, []string{id})
	if err != nil {
		return "", "", redisErr, err
	}
	if found[0] != "" {
		return found[0], LayerPostgres, redisErr, nil
	}
	return "", "", redisErr, nil
}
