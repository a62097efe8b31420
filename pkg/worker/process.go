package worker

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.uber.org/zap"

	"github.com/idempotent-events/idempotent-events/pkg/broker"
	"github.com/idempotent-events/idempotent-events/pkg/dedupe"
	"github.com/idempotent-events/idempotent-events/pkg/event"
	"github.com/idempotent-events/idempotent-events/pkg/store"
)

// Ledger commits events; *store.Store is the real one.
type Ledger interface {
	Commit(ctx context.Context, recs []store.Record) ([]bool, error)
	Ping(ctx context.Context) error
}

// Cache is the Redis fast path; *dedupe.Cache is the real one.
type Cache interface {
	Committed(ctx context.Context, ids []string) ([]bool, error)
	MarkCommitted(ctx context.Context, ids []string) error
}

// Hook runs at a point of processing with the event ids of the batch. A
// non-nil error simulates the process dying there: the batch is abandoned
// unsettled and the session torn down. Hooks exist for tests.
type Hook func(ids []string) error

// Hooks are the fault-injection points.
type Hooks struct {
	// AfterDedupeCheck runs after the Redis lookup, before the transaction.
	AfterDedupeCheck Hook
	// AfterCommit runs after COMMIT, before anything is acked.
	AfterCommit Hook
}

// errAbandoned says a hook simulated a crash.
var errAbandoned = errors.New("batch abandoned by fault-injection hook")

// message is one delivery on its way through the pipeline.
type message struct {
	d       amqp.Delivery
	attempt int
	ev      event.Event
	digest  []byte
	res     Result
}

func newMessage(d amqp.Delivery) *message {
	return &message{d: d, attempt: broker.Attempt(d.Headers)}
}

// process decides the Result of every message. It returns errAbandoned if a
// hook simulated a crash; the results are then meaningless.
func (w *Worker) process(ctx context.Context, msgs []*message) error {
	pending := make([]*message, 0, len(msgs))
	for _, m := range msgs {
		ev, err := event.Decode(m.d.Body)
		if err != nil {
			m.res = decide(err, m.attempt, w.opts.Topology.RetryDelays)
			continue
		}
		m.ev = ev
		sum := sha256.Sum256(m.d.Body)
		m.digest = sum[:]
		pending = append(pending, m)
	}
	// Copies of one event in the same batch go in later rounds, where the
	// earlier round's commit makes them duplicates.
	for len(pending) > 0 {
		var round, later []*message
		seen := make(map[string]bool, len(pending))
		for _, m := range pending {
			if seen[m.ev.ID] {
				later = append(later, m)
				continue
			}
			seen[m.ev.ID] = true
			round = append(round, m)
		}
		if err := w.processRound(ctx, round); err != nil {
			return err
		}
		pending = later
	}
	return nil
}

// processRound handles messages with distinct event ids.
func (w *Worker) processRound(ctx context.Context, msgs []*message) error {
	ids := make([]string, len(msgs))
	for i, m := range msgs {
		ids[i] = m.ev.ID
	}
	hits, err := w.opts.Cache.Committed(ctx, ids)
	if err != nil {
		// Degrade to Postgres only: a miss, never a skip.
		w.m.redisLookups.WithLabelValues("error").Add(float64(len(ids)))
		w.log.Debug("redis lookup failed; asking postgres", zap.Error(err))
		hits = nil
	}
	var todo []*message
	for i, m := range msgs {
		if hits != nil && hits[i] {
			w.m.redisLookups.WithLabelValues("hit").Inc()
			m.res = Result{Outcome: Duplicate, Layer: dedupe.LayerRedis}
			continue
		}
		if hits != nil {
			w.m.redisLookups.WithLabelValues("miss").Inc()
		}
		todo = append(todo, m)
	}
	if len(todo) == 0 {
		return nil
	}
	if err := runHook(w.opts.Hooks.AfterDedupeCheck, todo); err != nil {
		return err
	}
	return w.commit(ctx, todo, true)
}

// commit writes msgs in one transaction. When that fails for a reason that
// may lie with one message, and isolate is set, each message is tried on its
// own so that only the bad one is retried or dead-lettered.
func (w *Worker) commit(ctx context.Context, msgs []*message, isolate bool) error {
	isNew, err := w.commitOnce(ctx, msgs)
	if err != nil {
		if isolate && len(msgs) > 1 && !isTransient(err) {
			w.log.Warn("batch rejected; committing its messages one by one", zap.Int("size", len(msgs)), zap.Error(err))
			for _, m := range msgs {
				if err := w.commit(ctx, []*message{m}, false); err != nil {
					return err
				}
			}
			return nil
		}
		if !w.opts.RetryOnOutage && store.IsOutage(err) {
			// Nothing is wrong with these messages: give them back and wait.
			return fmt.Errorf("%w: %v", errDependencyDown, err)
		}
		for _, m := range msgs {
			m.res = decide(err, m.attempt, w.opts.Topology.RetryDelays)
		}
		return nil
	}

	ids := make([]string, len(msgs))
	now := time.Now()
	for i, m := range msgs {
		ids[i] = m.ev.ID
		if isNew[i] {
			m.res = Result{Outcome: Processed}
			if at := broker.ReceivedAt(m.d.Headers); !at.IsZero() {
				w.m.endToEnd.Observe(now.Sub(at).Seconds())
			}
		} else {
			m.res = Result{Outcome: Duplicate, Layer: dedupe.LayerPostgres}
		}
	}
	if err := runHook(w.opts.Hooks.AfterCommit, msgs); err != nil {
		return err
	}
	// Only now may Redis learn of them. A failure costs a Postgres lookup
	// later, nothing more.
	mctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	if err := w.opts.Cache.MarkCommitted(mctx, ids); err != nil {
		w.m.redisWrites.WithLabelValues("error").Inc()
		w.log.Debug("redis write after commit failed", zap.Error(err))
	} else {
		w.m.redisWrites.WithLabelValues("ok").Inc()
	}
	return nil
}

// commitOnce runs one transaction, turning a panic into a permanent error.
func (w *Worker) commitOnce(ctx context.Context, msgs []*message) (isNew []bool, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = permanent(ReasonPanic, fmt.Errorf("panic: %v", r))
		}
	}()
	recs := make([]store.Record, len(msgs))
	for i, m := range msgs {
		recs[i] = store.Record{
			Event:         m.ev,
			Source:        sourceOf(m.d.Headers),
			PayloadSHA256: m.digest,
			ReceivedAt:    broker.ReceivedAt(m.d.Headers),
			Attempt:       m.attempt,
		}
	}
	tctx, cancel := context.WithTimeout(ctx, w.opts.ProcessTimeout)
	defer cancel()
	start := time.Now()
	isNew, err = w.opts.Ledger.Commit(tctx, recs)
	w.m.txSeconds.Observe(time.Since(start).Seconds())
	if err != nil {
		if store.IsPermanent(err) {
			return nil, permanent(ReasonRejectedByDatabase, err)
		}
		return nil, err
	}
	return isNew, nil
}

func isTransient(err error) bool {
	var pe *permanentError
	return !errors.As(err, &pe)
}

func sourceOf(h amqp.Table) string {
	if s := broker.String(h, broker.HeaderSource); s != "" {
		return s
	}
	return "stripe"
}

func runHook(h Hook, msgs []*message) error {
	if h == nil {
		return nil
	}
	ids := make([]string, len(msgs))
	for i, m := range msgs {
		ids[i] = m.ev.ID
	}
	if err := h(ids); err != nil {
		return fmt.Errorf("%w: %v", errAbandoned, err)
	}
	return nil
}
