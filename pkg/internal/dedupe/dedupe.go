// Package dedupe is the Redis fast path in front of Postgres.
//
// Redis is a cache of one fact: "this event's transaction has committed in
// this ledger, with this content digest". An entry is written only after
// COMMIT (MarkCommitted), so a hit is true of the ledger that wrote it. A
// miss, an error, a timeout or an outage all mean "ask Postgres": the fast
// path can make a duplicate cheaper, never make an event be skipped.
// Entries expire after the configured TTL and may be evicted or lost on
// failover at any time; nothing depends on them being there.
//
// # Redis outliving the ledger
//
// Redis may keep entries of a ledger that is gone: the database was dropped
// and created again, restored from a backup, or a standby that lacks the
// last commits was promoted. Taken at their word, those entries would make
// the receiver answer "duplicate" for an event the ledger does not have,
// and the event would be lost. So every entry is tagged with the epoch of
// the ledger it was written for (store.Epoch, read from Postgres), and
// answers only while Redis holds the same epoch under the epoch key.
//
// Only the worker, which reads the epoch from Postgres, vouches for it
// (Vouch): at start, after every outage, and every few seconds, as a lease
// that expires on its own. When the worker cannot read the epoch it
// withdraws it (Withdraw), and while no epoch is vouched every lookup is a
// miss. A lookup reads the epoch key and the entries in one MGET, so the
// receiver needs no Postgres connection to apply the rule. The one window
// left: after the ledger changes and before the next refresh (seconds),
// an entry of the old ledger can still answer.
package dedupe

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idempotent-events/idempotent-events/pkg/internal/config"
	"github.com/idempotent-events/idempotent-events/pkg/internal/tlsconfig"
)

// Cache remembers committed event ids in Redis.
type Cache struct {
	rdb redis.UniversalClient
	// cluster: keys live on different nodes, so one MGET cannot read them
	// all (CROSSSLOT); a pipeline of GETs, split by node, does.
	cluster  bool
	prefix   string
	epochKey string
	ttl      time.Duration
	// vouched is the epoch this Cache last vouched for; MarkCommitted tags
	// entries with it.
	vouched atomic.Pointer[string]
}

// Open connects to redisURL. Entries are prefix + "committed:" + event id,
// live for ttl and hold "<epoch>:<digest>"; the epoch key is prefix +
// "ledger-epoch".
//
// redisURL names one server (redis://host:6379/0), a Sentinel-managed
// master (redis://sentinel-0:26379?master_name=mymaster&addr=sentinel-1:26379,
// go-redis's failover URL: the client asks the sentinels where the master
// is and follows a failover), or a Redis Cluster
// (redis://node-0:6379?addr=node-1:6379&addr=node-2:6379, its cluster URL).
// Whichever it is, Redis stays a hint: a failover that forgets entries
// only costs Postgres lookups.
func Open(redisURL, prefix string, ttl time.Duration) (*Cache, error) {
	return OpenTLS(redisURL, prefix, ttl, nil)
}

// OpenTLS is Open with the TLS of the REDIS_TLS_* files: every connection
// to every server (master, replicas, sentinels, cluster nodes) is TLS
// verified against the host it dials, made with the files as they are at
// that moment, and its TLS failures name Redis. A nil tc is Open.
func OpenTLS(redisURL, prefix string, ttl time.Duration, tc *tlsconfig.Client) (*Cache, error) {
	opts, cluster, err := config.ParseRedisURL(redisURL)
	if err != nil {
		return nil, fmt.Errorf("parse REDIS_URL: %w", err)
	}
	// The fast path must fail fast: a slow Redis costs every message its
	// timeout, and the answer on error is "ask Postgres" anyway.
	opts.DialTimeout = 500 * time.Millisecond
	if tc != nil {
		opts.TLSConfig = nil // the dialer does TLS, with fresh files
		opts.Dialer = tc.RedisDialer(opts.DialTimeout)
	}
	opts.ReadTimeout = 300 * time.Millisecond
	opts.WriteTimeout = 300 * time.Millisecond
	opts.MaxRetries = 0
	opts.DialerRetries = 1
	opts.ContextTimeoutEnabled = true
	c := &Cache{prefix: prefix + "committed:", epochKey: prefix + "ledger-epoch", ttl: ttl, cluster: cluster}
	if cluster {
		c.rdb = redis.NewClusterClient(opts.Cluster())
	} else {
		c.rdb = redis.NewUniversalClient(opts)
	}
	if tc != nil {
		c.rdb.AddHook(tlsconfig.RedisHook())
	}
	return c, nil
}

// Close closes the client.
func (c *Cache) Close() error { return c.rdb.Close() }

// Client exposes the Redis client for tests and tools.
func (c *Cache) Client() redis.UniversalClient { return c.rdb }

// Key is the Redis key of an event id.
func (c *Cache) Key(id string) string { return c.prefix + id }

// EpochKey is the Redis key of the vouched epoch.
func (c *Cache) EpochKey() string { return c.epochKey }

// Committed returns, for each id in order, the content digest Redis holds
// for its committed event, or "" when Redis holds nothing for the vouched
// epoch, in one round trip. With no epoch vouched every id is a miss. On
// error the caller must treat every id as a miss.
func (c *Cache) Committed(ctx context.Context, ids []string) ([]string, error) {
	if len(ids) == 0 {
		return nil, nil
	}
	keys := make([]string, len(ids)+1)
	keys[0] = c.epochKey
	for i, id := range ids {
		keys[i+1] = c.Key(id)
	}
	vals, err := c.get(ctx, keys)
	if err != nil {
		return nil, err
	}
	if len(vals) != len(keys) {
		return nil, errors.New("redis MGET: answer has the wrong length")
	}
	out := make([]string, len(ids))
	epoch, _ := vals[0].(string)
	if epoch == "" {
		return out, nil
	}
	for i, v := range vals[1:] {
		s, _ := v.(string)
		if e, digest, ok := strings.Cut(s, ":"); ok && e == epoch {
			out[i] = digest
		}
	}
	return out, nil
}

// get reads keys in one round trip (one per node of a cluster).
func (c *Cache) get(ctx context.Context, keys []string) ([]any, error) {
	if !c.cluster {
		vals, err := c.rdb.MGet(ctx, keys...).Result()
		if err != nil {
			return nil, fmt.Errorf("redis MGET: %w", err)
		}
		return vals, nil
	}
	cmds := make([]*redis.StringCmd, len(keys))
	_, err := c.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, k := range keys {
			cmds[i] = p.Get(ctx, k)
		}
		return nil
	})
	if err != nil && !errors.Is(err, redis.Nil) {
		return nil, fmt.Errorf("redis GET: %w", err)
	}
	vals := make([]any, len(keys))
	for i, cmd := range cmds {
		if v, err := cmd.Result(); err == nil {
			vals[i] = v
		}
	}
	return vals, nil
}

// Entry is a committed event: its key and content digest.
type Entry struct {
	ID     string
	Digest string
}

// MarkCommitted records entries as committed, tagged with the epoch this
// Cache vouched for last. Call it only after the transaction that wrote
// their ledger rows has committed. Before the first Vouch it writes
// nothing: no lookup could trust it.
func (c *Cache) MarkCommitted(ctx context.Context, entries []Entry) error {
	epoch := c.vouched.Load()
	if len(entries) == 0 || epoch == nil {
		return nil
	}
	_, err := c.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for _, e := range entries {
			p.Set(ctx, c.Key(e.ID), *epoch+":"+e.Digest, c.ttl)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("redis SET after commit: %w", err)
	}
	return nil
}

// Vouch states that the ledger's epoch is epoch, for lease: lookups trust
// the entries of that epoch until the lease ends or another epoch is
// vouched. Only a process that has just read epoch from Postgres may call
// it.
func (c *Cache) Vouch(ctx context.Context, epoch string, lease time.Duration) error {
	if epoch == "" || strings.Contains(epoch, ":") {
		return fmt.Errorf("vouch for epoch %q: not an epoch", epoch)
	}
	c.vouched.Store(&epoch)
	if err := c.rdb.Set(ctx, c.epochKey, epoch, lease).Err(); err != nil {
		return fmt.Errorf("redis SET %s: %w", c.epochKey, err)
	}
	return nil
}

// Withdraw removes the vouched epoch, so every lookup is a miss until the
// next Vouch: what a process does when it cannot read the epoch.
func (c *Cache) Withdraw(ctx context.Context) error {
	if err := c.rdb.Del(ctx, c.epochKey).Err(); err != nil {
		return fmt.Errorf("redis DEL %s: %w", c.epochKey, err)
	}
	return nil
}

// quiet drops go-redis's own log lines.
type quiet struct{}

func (quiet) Printf(context.Context, string, ...any) {}

// SilenceClientLogs stops go-redis from writing log lines of its own: every
// Redis failure the pipeline cares about is returned to it, counted and
// logged once by the caller. The binaries call it once at start (it sets a
// global of the library).
func SilenceClientLogs() { redis.SetLogger(quiet{}) }
