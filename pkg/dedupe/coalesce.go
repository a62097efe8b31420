package dedupe

import (
	"context"
	"sync"
	"time"
)

// Coalescer merges the single-event lookups of concurrent requests into
// one MGET per round trip: under load, dozens of webhook requests share a
// Redis call instead of paying one each. Its answers mean exactly what
// Cache.Committed's do.
type Coalescer struct {
	cache   *Cache
	timeout time.Duration
	reqs    chan lookup
}

type lookup struct {
	id    string
	reply chan lookupResult // buffered: the coalescer never blocks on it
}

type lookupResult struct {
	digest string
	err    error
}

// maxCoalesce bounds one MGET.
const maxCoalesce = 256

// NewCoalescer returns a coalescer over cache; each MGET is bounded by
// timeout.
func NewCoalescer(cache *Cache, timeout time.Duration) *Coalescer {
	return &Coalescer{cache: cache, timeout: timeout, reqs: make(chan lookup, maxCoalesce)}
}

// Run serves lookups with parallel round trips until ctx is done.
func (c *Coalescer) Run(ctx context.Context, parallel int) {
	var wg sync.WaitGroup
	for i := 0; i < parallel; i++ {
		wg.Go(func() { c.loop(ctx) })
	}
	wg.Wait()
}

func (c *Coalescer) loop(ctx context.Context) {
	batch := make([]lookup, 0, maxCoalesce)
	ids := make([]string, 0, maxCoalesce)
	for {
		batch, ids = batch[:0], ids[:0]
		select {
		case <-ctx.Done():
			return
		case l := <-c.reqs:
			batch = append(batch, l)
		}
		// Take whatever else is already waiting, without waiting for more.
	more:
		for len(batch) < maxCoalesce {
			select {
			case l := <-c.reqs:
				batch = append(batch, l)
			default:
				break more
			}
		}
		for _, l := range batch {
			ids = append(ids, l.id)
		}
		mctx, cancel := context.WithTimeout(ctx, c.timeout)
		hits, err := c.cache.Committed(mctx, ids)
		cancel()
		for i, l := range batch {
			if err != nil {
				l.reply <- lookupResult{err: err}
				continue
			}
			l.reply <- lookupResult{digest: hits[i]}
		}
	}
}

// Committed returns the digest Redis holds for id, "" for none; see
// Cache.Committed.
func (c *Coalescer) Committed(ctx context.Context, id string) (string, error) {
	l := lookup{id: id, reply: make(chan lookupResult, 1)}
	select {
	case c.reqs <- l:
	case <-ctx.Done():
		return "", ctx.Err()
	}
	select {
	case r := <-l.reply:
		return r.digest, r.err
	case <-ctx.Done():
		return "", ctx.Err()
	}
}
