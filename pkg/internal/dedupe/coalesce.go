package dedupe

import (
	"context"
	"errors"
	"sync"
	"time"
)

// Coalescer merges the single-event lookups of concurrent requests into
// one MGET per round trip: under load, dozens of webhook requests share a
// Redis call instead of paying one each. Its answers mean exactly what
// Cache.Committed's do.
type Coalescer struct {
	opts CoalescerOptions
	reqs chan lookup
}

// CoalescerOptions configures a Coalescer.
type CoalescerOptions struct {
	Cache *Cache
	// Timeout bounds one MGET.
	Timeout time.Duration
	// Parallel is how many MGETs may be in flight at once.
	Parallel int
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

// NewCoalescer validates opts and returns a Coalescer; lookups wait until
// Run serves them.
func NewCoalescer(opts CoalescerOptions) (*Coalescer, error) {
	switch {
	case opts.Cache == nil:
		return nil, errors.New("dedupe: CoalescerOptions.Cache is required")
	case opts.Timeout <= 0:
		return nil, errors.New("dedupe: CoalescerOptions.Timeout must be positive")
	case opts.Parallel < 1:
		return nil, errors.New("dedupe: CoalescerOptions.Parallel must be at least 1")
	}
	return &Coalescer{opts: opts, reqs: make(chan lookup, maxCoalesce)}, nil
}

// Run serves lookups with Parallel round trips until ctx is done. It
// always returns nil: a failed MGET is the answer of the lookups in it.
func (c *Coalescer) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	for i := 0; i < c.opts.Parallel; i++ {
		wg.Go(func() { c.loop(ctx) })
	}
	wg.Wait()
	return nil
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
		mctx, cancel := context.WithTimeout(ctx, c.opts.Timeout)
		hits, err := c.opts.Cache.Committed(mctx, ids)
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
