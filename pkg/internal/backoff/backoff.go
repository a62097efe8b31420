// Package backoff holds the two pieces every retry loop of the project
// shares: a jittered delay, so that many clients recovering from the same
// outage do not retry in lockstep, and a sleep that ends early when its
// context does.
package backoff

import (
	"context"
	"math/rand/v2"
	"time"
)

// Jitter picks a wait in [d/2, d].
func Jitter(d time.Duration) time.Duration {
	half := d / 2
	return half + rand.N(half+1)
}

// Sleep waits d, or less if ctx is done first; it reports whether the full
// wait passed.
func Sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
