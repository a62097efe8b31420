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

// Answer is what a Checker found out about one event.
type Answer struct {
	// Known is false when no layer could answer: the caller must go the
	// safe way (publish, and let the worker decide).
	Known bool
	// Digest is the content digest of the committed event, "" when it has
	// not committed.
	Digest string
	// Layer is where a committed event was recognised.
	Layer Layer
	// RedisErr and LedgerErr are the failures of the layers asked; Redis
	// may fail while Postgres still answers.
	RedisErr, LedgerErr error
}

// Committed returns whether id's event has committed, with which content,
// and which layer knew.
func (c Checker) Committed(ctx context.Context, id string) Answer {
	var a Answer
	if c.Cache != nil {
		d, err := c.Cache.Committed(ctx, id)
		if err == nil && d != "" {
			return Answer{Known: true, Digest: d, Layer: LayerRedis}
		}
		a.RedisErr = err
	}
	if c.Ledger == nil {
		a.Known = a.RedisErr == nil
		return a
	}
	found, err := c.Ledger.Digests(ctx, []string{id})
	switch {
	case err != nil:
		a.LedgerErr = err
	case found[0] != "":
		a.Known, a.Digest, a.Layer = true, found[0], LayerPostgres
	default:
		a.Known = true
	}
	return a
}
