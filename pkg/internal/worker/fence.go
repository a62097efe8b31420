package worker

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/idempotent-events/idempotent-events/pkg/internal/backoff"
	"github.com/idempotent-events/idempotent-events/pkg/internal/store"
)

// A worker registers its handler set before it consumes, and commits only
// while that set is the current generation's (package store, fence.go).
// When a commit is refused (another set became current) or the set is not
// current at registration, the worker is fenced: the round's deliveries go
// back to the queue unacked (never to a retry tier or the DLQ: they wait
// for the current workers), the worker stops consuming, /readyz says why,
// idempotent_events_worker_fenced is 1, and it checks every fencePoll
// whether its set is current again (an operator made it so), until it is
// stopped. In Kubernetes the rollout replaces it in the meantime.

// fencePoll is how often a fenced worker reads the current generation.
const fencePoll = 5 * time.Second

// errFenced ends a consuming round because the handler set is not current.
var errFenced = errors.New("handler set not current: stopped taking events")

// fenceState is the worker's registration and whether it is fenced.
type fenceState struct {
	mu     sync.Mutex
	mine   store.Fence
	reason string // "" while current
}

func (f *fenceState) set(mine store.Fence, reason string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.mine, f.reason = mine, reason
}

// Registration is the worker's registration, the zero Fence before it
// registered: work it does beside its events (a backfill) runs in a
// transaction fenced by it (store.InFence).
func (w *Worker) Registration() store.Fence { return w.fence.registration() }

// registration is the worker's Fence.
func (f *fenceState) registration() store.Fence {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.mine
}

// fencedReason is why the worker is fenced, "" while it is not.
func (f *fenceState) fencedReason() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.reason
}

// register records the handler set and reports whether it is current. An
// error is the database's (the caller waits for it as for any outage).
func (w *Worker) register(ctx context.Context) (bool, error) {
	rctx, cancel := context.WithTimeout(ctx, w.opts.ProcessTimeout)
	defer cancel()
	mine, cur, err := w.opts.Ledger.Register(rctx, w.opts.Release, w.set.ID, w.set.Handlers)
	if err != nil {
		return false, err
	}
	w.m.handlerSet.Reset()
	w.m.handlerSet.WithLabelValues(mine.SetID, strconv.FormatInt(mine.Generation, 10)).Set(1)
	if cur.SetID == mine.SetID {
		w.fence.set(mine, "")
		w.m.fenced.Set(0)
		w.log.Info("handler set registered; it is current", zap.String("set", mine.SetID), zap.Int64("generation", mine.Generation),
			zap.Int("handlers", len(w.set.Handlers)))
		return true, nil
	}
	w.fenceOff(mine, cur)
	return false, nil
}

// fenceOff marks the worker fenced by cur and says so once.
func (w *Worker) fenceOff(mine store.Fence, cur store.Generation) {
	reason := (&store.FencedError{Mine: mine, Current: cur}).Error()
	if w.fence.fencedReason() == reason {
		return
	}
	w.fence.set(mine, reason)
	w.m.fenced.Set(1)
	w.log.Warn("fenced: this worker takes no events and commits none until its handler set is current again; the current workers process them",
		zap.String("set", mine.SetID), zap.Int64("generation", mine.Generation),
		zap.Int64("current_generation", cur.Generation), zap.String("current_release", cur.Release), zap.String("current_set", cur.SetID))
}

// awaitCurrent returns once the worker's handler set is current, or false
// when ctx is done first. While it waits the worker is not ready. A fenced
// worker registers again only when the current generation may be its own
// (mayBeCurrent): a registration takes the fence's lock exclusively, which
// holds every worker's commits for a moment.
func (w *Worker) awaitCurrent(ctx context.Context) bool {
	for registered := false; ; {
		if registered && !w.mayBeCurrent(ctx) {
			if !backoff.Sleep(ctx, fencePoll) {
				return false
			}
			continue
		}
		w.setWaiting(waitRegistering)
		current, err := w.register(ctx)
		registered = err == nil || errors.Is(err, store.ErrGenerationTaken)
		switch {
		case err == nil && current:
			return true
		case err != nil && ctx.Err() != nil:
			return false
		case errors.Is(err, store.ErrGenerationTaken):
			// Not the database's fault: the release runs another handler
			// set (two images deployed as one release).
			if w.fence.fencedReason() != err.Error() {
				w.fence.set(store.Fence{SetID: w.set.ID}, err.Error())
				w.m.fenced.Set(1)
				w.log.Error("fenced: the handler set cannot be registered", zap.Error(err))
			}
		case err != nil:
			w.setWaiting(postgresReason("cannot register the handler set", err))
			w.log.Warn("cannot register the handler set in postgres (DATABASE_URL); trying again", zap.Error(err), zap.String("hint", store.Hint(err)))
		}
		if !backoff.Sleep(ctx, fencePoll) {
			return false
		}
	}
}

// mayBeCurrent reports whether the current generation runs the worker's
// handler set, or is its release announced and not yet registered.
func (w *Worker) mayBeCurrent(ctx context.Context) bool {
	rctx, cancel := context.WithTimeout(ctx, w.opts.ProcessTimeout)
	defer cancel()
	cur, err := w.opts.Ledger.Current(rctx)
	if err != nil {
		return false
	}
	mine := w.fence.registration()
	return cur.SetID == mine.SetID || (cur.SetID == "" && cur.Release == store.ReleaseOf(w.opts.Release, mine.SetID))
}

// fenced turns a commit refused by the fence into errFenced, after which
// the round stops with every delivery unsettled.
func (w *Worker) fenced(err error) error {
	var fe *store.FencedError
	if errors.As(err, &fe) {
		w.fenceOff(fe.Mine, fe.Current)
	}
	return fmt.Errorf("%w: %w", errFenced, err)
}
