package worker

import (
	"context"
	"sync"
	"time"

	"go.uber.org/zap"
)

// The worker is the one that vouches for the ledger's epoch in Redis (see
// package dedupe): it reads the epoch from Postgres before every consuming
// round and every epochRefresh while it runs, and vouches for it for
// epochLease. A worker that cannot read it withdraws the epoch, and when
// no worker renews it the lease ends: either way the Redis entries stop
// answering and every lookup goes to Postgres. After the ledger changes,
// entries of the old ledger answer for at most one epochRefresh.
const (
	epochRefresh = 5 * time.Second
	epochLease   = 3 * epochRefresh
	// epochTimeout bounds one read of the epoch and one write to Redis.
	epochTimeout = 2 * time.Second
)

// epochState is the epoch this worker last vouched for, for its logs.
type epochState struct {
	mu      sync.Mutex
	current string // "" while none is vouched
	failing bool   // the last read failed
}

// swap records epoch as current (a failed read: "") and returns the one
// before and whether the previous read had failed too.
func (s *epochState) swap(epoch string) (old string, wasFailing bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	old, wasFailing = s.current, s.failing
	s.current, s.failing = epoch, epoch == ""
	return old, wasFailing
}

// keepVouching renews the vouch every epochRefresh until ctx is done.
func (w *Worker) keepVouching(ctx context.Context) {
	t := time.NewTicker(epochRefresh)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			w.vouch(ctx)
		}
	}
}

// vouch reads the ledger's epoch and vouches for it in Redis; when the
// epoch cannot be read it withdraws whatever was vouched. Redis errors are
// logged only: they cost the fast path, never correctness.
func (w *Worker) vouch(ctx context.Context) {
	rctx, cancel := context.WithTimeout(ctx, epochTimeout)
	defer cancel()
	epoch, err := w.opts.Ledger.Epoch(rctx)
	if err != nil {
		if ctx.Err() != nil {
			return // shutting down: the lease ends on its own
		}
		wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), epochTimeout)
		defer cancel()
		werr := w.opts.Cache.Withdraw(wctx)
		if old, wasFailing := w.epoch.swap(""); !wasFailing {
			w.log.Warn("cannot read the ledger epoch: Redis entries do not answer until it can",
				zap.String("epoch", old), zap.Error(err), zap.NamedError("withdraw_error", werr))
		}
		return
	}
	if err := w.opts.Cache.Vouch(rctx, epoch, epochLease); err != nil {
		w.redis.failed(w.log, "vouch for the ledger epoch", err)
	}
	switch old, _ := w.epoch.swap(epoch); {
	case old == epoch:
	case old == "":
		w.log.Info("vouching for the ledger epoch", zap.String("epoch", epoch))
	default:
		w.log.Warn("the ledger changed (database recreated, restored or failed over): Redis entries of the old one no longer answer",
			zap.String("old_epoch", old), zap.String("epoch", epoch))
	}
}
