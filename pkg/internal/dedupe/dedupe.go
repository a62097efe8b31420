// Package dedupe is the Redis fast path in front of Postgres.
//
// Redis is a cache of one fact: "this event's transaction has committed,
// with this content digest".
// A key is written only after COMMIT (MarkCommitted), so a hit is always
// true. A miss, an error, a timeout or an outage all mean "ask Postgres":
// the fast path can make a duplicate cheaper, never make an event be skipped.
// Keys expire after the configured TTL and may be evicted or lost on
// failover at any time; nothing depends on them being there.
package dedupe

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// Cache remembers committed event ids in Redis.
type Cache struct {
	rdb    *redis.Client
	prefix string
	ttl    time.Duration
}

// Open connects to redisURL. Keys are prefix + "processed:" + event id and
// live for ttl.
func Open(redisURL, prefix string, ttl time.Duration) (*Cache, error) {
	opts, err := redis.ParseURL(redisURL)
	if err != nil {
		return nil, fmt.Errorf("parse REDIS_URL: %w", err)
	}
	// The fast path must fail fast: a slow Redis costs every message its
	// timeout, and the answer on error is "ask Postgres" anyway.
	opts.DialTimeout = 500 * time.Millisecond
	opts.ReadTimeout = 300 * time.Millisecond
	opts.WriteTimeout = 300 * time.Millisecond
	opts.MaxRetries = 0
	opts.DialerRetries = 1
	opts.ContextTimeoutEnabled = true
	return &Cache{rdb: redis.NewClient(opts), prefix: prefix + "processed:", ttl: ttl}, nil
}

// Close closes the client.
func (c *Cache) Close() error { return c.rdb.Close() }

// Client exposes the Redis client for tests and tools.
func (c *Cache) Client() *redis.Client { return c.rdb }

// Key is the Redis key of an event id.
func (c *Cache) Key(id string) string { return c.prefix + id }

// Committed returns, for each id in order, the content digest Redis holds
// for its committed event, or "" when Redis holds nothing, in one round
// trip. On error the caller must treat every id as a miss.
func (c *Cache) Committed(ctx context.Context, ids []string) ([]string, error) {
	if len(ids) == 0 {
		return nil, nil
	}
	keys := make([]string, len(ids))
	for i, id := range ids {
		keys[i] = c.Key(id)
	}
	vals, err := c.rdb.MGet(ctx, keys...).Result()
	if err != nil {
		return nil, fmt.Errorf("redis MGET: %w", err)
	}
	if len(vals) != len(ids) {
		return nil, errors.New("redis MGET: answer has the wrong length")
	}
	out := make([]string, len(ids))
	for i, v := range vals {
		if s, ok := v.(string); ok {
			out[i] = s
		}
	}
	return out, nil
}

// Entry is a committed event: its key and content digest.
type Entry struct {
	ID     string
	Digest string
}

// MarkCommitted records entries as committed. Call it only after the
// transaction that wrote their ledger rows has committed.
func (c *Cache) MarkCommitted(ctx context.Context, entries []Entry) error {
	if len(entries) == 0 {
		return nil
	}
	_, err := c.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for _, e := range entries {
			p.Set(ctx, c.Key(e.ID), e.Digest, c.ttl)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("redis SET after commit: %w", err)
	}
	return nil
}

// quiet drops go-redis's own log lines: every Redis failure the pipeline
// cares about is returned to it, counted and logged once by the caller.
type quiet struct{}

func (quiet) Printf(context.Context, string, ...any) {}

func init() { redis.SetLogger(quiet{}) }
