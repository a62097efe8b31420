package worker

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.uber.org/zap"

	"github.com/idempotent-events/idempotent-events/pkg/effects"
	"github.com/idempotent-events/idempotent-events/pkg/internal/backfill"
	"github.com/idempotent-events/idempotent-events/pkg/internal/broker"
	"github.com/idempotent-events/idempotent-events/pkg/internal/dedupe"
	"github.com/idempotent-events/idempotent-events/pkg/internal/event"
	"github.com/idempotent-events/idempotent-events/pkg/internal/store"
)

// Ledger commits events; *store.Store is the real one.
type Ledger interface {
	// CommitAs commits as the worker's registration; see store.CommitAs.
	CommitAs(ctx context.Context, mine store.Fence, recs []store.Record, apply store.Apply) ([]bool, error)
	Digests(ctx context.Context, ids []string) ([]string, error)
	RecordConflicts(ctx context.Context, cs []store.Conflict) error
	Ping(ctx context.Context) error
	// Epoch names the ledger; see store.Epoch.
	Epoch(ctx context.Context) (string, error)
	// Register records the worker's handler set; see store.Register.
	Register(ctx context.Context, release, setID string, handlers any) (store.Fence, store.Generation, error)
	// Current reads the current generation; see store.Current.
	Current(ctx context.Context) (store.Generation, error)
}

// Cache is the Redis fast path; *dedupe.Cache is the real one.
type Cache interface {
	Committed(ctx context.Context, ids []string) ([]string, error)
	MarkCommitted(ctx context.Context, entries []dedupe.Entry) error
	Vouch(ctx context.Context, epoch string, lease time.Duration) error
	Withdraw(ctx context.Context) error
}

// Hook runs at a point of processing with the event ids of the batch. A
// non-nil error simulates the process dying there: the batch is abandoned
// unsettled and the session torn down. Hooks exist for tests.
type Hook func(ids []string) error

// Hooks are the fault-injection points.
type Hooks struct {
	// AfterDedupeCheck runs after the Redis lookup, before the transaction.
	AfterDedupeCheck Hook
	// BeforeCommit runs inside the transaction, after the effects ran,
	// before COMMIT: an error rolls everything back.
	BeforeCommit Hook
	// AfterCommit runs after COMMIT, before anything is acked.
	AfterCommit Hook
}

// errAbandoned says a hook simulated a crash.
var errAbandoned = errors.New("batch abandoned by fault-injection hook")

// message is one delivery on its way through the pipeline.
type message struct {
	d       amqp.Delivery
	attempt int
	// key and digest identify the event: the dedupe key and the content
	// digest in hex. They come from the message's MessageId and x-ie-digest
	// when the receiver set them, and from the decoded body otherwise.
	key, digest string
	// ev is the decoded body; decoded says it is set. providerID is the
	// event's id as the provider sent it (key qualifies it by source).
	ev         event.Event
	providerID string
	decoded    bool
	res        Result
	// stored is the digest the ledger holds when it differs from ours.
	stored string
}

func newMessage(d amqp.Delivery) *message {
	return &message{d: d, attempt: broker.Attempt(d.Headers)}
}

// identify takes the dedupe key and content digest the receiver put on the
// message, which is all the Redis lookup needs. It reports false for a
// message without them (published by another tool or an older receiver).
func (m *message) identify() bool {
	key, digest := m.d.MessageId, broker.String(m.d.Headers, broker.HeaderDigest)
	if key == "" || len(digest) != event.DigestHexLen {
		return false
	}
	m.key, m.digest = key, digest
	return true
}

// decode parses m's body. The body is the truth: its digest replaces the
// header's, and a MessageId that names another event than the body makes
// the message invalid. On failure m gets its DLQ or retry result and decode
// reports false.
func (w *Worker) decode(m *message) bool {
	if m.decoded {
		return true
	}
	h := m.d.Headers
	ev, err := event.Parse(broker.String(h, broker.HeaderScheme), broker.String(h, broker.HeaderEventID),
		broker.String(h, broker.HeaderEventType), m.d.Body)
	if err == nil {
		m.providerID = ev.ID
		ev.ID = event.Key(sourceOf(h), ev.ID)
		if m.key != "" && m.key != ev.ID {
			err = &event.FieldError{Field: "message_id", Problem: fmt.Sprintf("names event %q but the body is event %q", m.key, ev.ID)}
		}
	}
	if err != nil {
		m.res = decide(err, m.attempt, w.policy())
		return false
	}
	if originOf(h) == effects.OriginReconcile {
		// Fetched from the provider's API, not signed: its bytes may differ
		// from a webhook's of the same event (event.AnyDigest).
		ev.Digest = event.AnyDigest
	}
	m.ev, m.decoded = ev, true
	m.key, m.digest = ev.ID, ev.DigestHex()
	return true
}

// process decides the Result of every message. It returns errAbandoned if a
// hook simulated a crash; the results are then meaningless.
func (w *Worker) process(ctx context.Context, msgs []*message) error {
	pending := make([]*message, 0, len(msgs))
	for _, m := range msgs {
		if m.identify() || w.decode(m) {
			pending = append(pending, m)
		}
	}
	// Copies of one event in the same batch go in later rounds, where the
	// earlier round's commit makes them duplicates.
	for len(pending) > 0 {
		var round, later []*message
		seen := make(map[string]bool, len(pending))
		for _, m := range pending {
			if seen[m.key] {
				later = append(later, m)
				continue
			}
			seen[m.key] = true
			round = append(round, m)
		}
		if err := w.processRound(ctx, round); err != nil {
			return err
		}
		pending = later
	}
	return nil
}

// processRound handles messages with distinct event keys. A message whose
// content Redis knows as committed is a duplicate without its body being
// decoded; the others are decoded and go on to Postgres.
func (w *Worker) processRound(ctx context.Context, msgs []*message) error {
	ids := make([]string, len(msgs))
	for i, m := range msgs {
		ids[i] = m.key
	}
	hits, err := w.opts.Cache.Committed(ctx, ids)
	if err != nil {
		// Degrade to Postgres only: a miss, never a skip.
		w.m.redisLookups.WithLabelValues("error").Add(float64(len(ids)))
		w.redis.failed(w.log, "lookup", err)
		hits = nil
	} else {
		w.redis.ok(w.log)
	}
	var todo, conflicts []*message
	for i, m := range msgs {
		hit := ""
		if hits != nil {
			hit = hits[i]
			if hit == "" {
				w.m.redisLookups.WithLabelValues("miss").Inc()
			} else {
				w.m.redisLookups.WithLabelValues("hit").Inc()
			}
		}
		if hit != "" && event.SameContent(hit, m.digest) {
			m.res = Result{Outcome: Duplicate, Layer: dedupe.LayerRedis}
			continue
		}
		if !w.decode(m) {
			continue
		}
		switch {
		case hit == "":
			todo = append(todo, m)
		case event.SameContent(hit, m.digest):
			// The header's digest was not the body's; the body's is.
			m.res = Result{Outcome: Duplicate, Layer: dedupe.LayerRedis}
		default:
			m.stored = hit
			conflicts = append(conflicts, m)
		}
	}
	if err := w.recordConflicts(ctx, conflicts); err != nil {
		return err
	}
	if len(todo) == 0 {
		return nil
	}
	if err := runHook(w.opts.Hooks.AfterDedupeCheck, todo); err != nil {
		return err
	}
	return w.commit(ctx, todo, true)
}

// recordConflicts keeps deliveries whose id committed with other content in
// event_conflicts. They are never processed; once recorded, they are acked.
func (w *Worker) recordConflicts(ctx context.Context, msgs []*message) error {
	if len(msgs) == 0 {
		return nil
	}
	cs := make([]store.Conflict, len(msgs))
	for i, m := range msgs {
		stored, _ := hex.DecodeString(m.stored)
		cs[i] = store.Conflict{EventID: m.ev.ID, Source: sourceOf(m.d.Headers), StoredDigest: stored,
			ReceivedDigest: m.ev.Digest[:], Body: m.d.Body, ReceivedAt: broker.ReceivedAt(m.d.Headers)}
	}
	tctx, cancel := context.WithTimeout(ctx, w.opts.ProcessTimeout)
	defer cancel()
	if err := w.opts.Ledger.RecordConflicts(tctx, cs); err != nil {
		return w.failed(msgs, err)
	}
	for _, m := range msgs {
		m.res = Result{Outcome: Conflict}
	}
	return nil
}

// failed decides the fate of msgs whose database step failed with err.
// When decide gives them back (Postgres unreachable), the round stops
// unsettled and the worker pauses.
func (w *Worker) failed(msgs []*message, err error) error {
	for _, m := range msgs {
		m.res = decide(err, m.attempt, w.policy())
	}
	if len(msgs) > 0 && msgs[0].res.Outcome == Requeue {
		return fmt.Errorf("%w: %w", errDependencyDown, err)
	}
	return nil
}

func (w *Worker) policy() policy {
	return policy{delays: w.opts.Topology.RetryDelays, retryOnOutage: w.opts.RetryOnOutage}
}

// commit writes msgs in one transaction. When that fails for a reason that
// may lie with one message, and isolate is set, each message is tried on its
// own so that only the bad one is retried or dead-lettered.
func (w *Worker) commit(ctx context.Context, msgs []*message, isolate bool) error {
	isNew, err := w.commitOnce(ctx, msgs)
	if errors.Is(err, store.ErrFenced) {
		return w.fenced(err)
	}
	if err != nil && w.stillReachable(ctx, err) {
		// One connection was lost but Postgres answers: try once more on a
		// fresh connection before calling it an outage. If the lost answer
		// was COMMIT's, the rows are there and this run finds them as
		// duplicates — still one row each.
		isNew, err = w.commitOnce(ctx, msgs)
		if errors.Is(err, store.ErrFenced) {
			return w.fenced(err)
		}
	}
	if errors.Is(err, errAbandoned) {
		return err
	}
	if err != nil {
		if isolate && len(msgs) > 1 && isolating(err) {
			w.log.Warn("batch rejected; committing its messages one by one", zap.Int("size", len(msgs)), zap.Error(err))
			for _, m := range msgs {
				if err := w.commit(ctx, []*message{m}, false); err != nil {
					return err
				}
			}
			return nil
		}
		return w.failed(msgs, err)
	}

	now := time.Now()
	var dups []*message
	for i, m := range msgs {
		if isNew[i] {
			m.res = Result{Outcome: Processed}
			if at := broker.ReceivedAt(m.d.Headers); !at.IsZero() {
				w.m.endToEnd.Observe(now.Sub(at).Seconds())
			}
		} else {
			dups = append(dups, m)
		}
	}
	if err := runHook(w.opts.Hooks.AfterCommit, msgs); err != nil {
		return err
	}
	if err := w.checkDuplicates(ctx, dups); err != nil {
		return err
	}
	// Only now may Redis learn of them. A failure costs a Postgres lookup
	// later, nothing more.
	var entries []dedupe.Entry
	for _, m := range msgs {
		if m.res.Outcome == Processed || m.res.Outcome == Duplicate {
			entries = append(entries, dedupe.Entry{ID: m.key, Digest: m.digest})
		}
	}
	mctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	if err := w.opts.Cache.MarkCommitted(mctx, entries); err != nil {
		w.m.redisWrites.WithLabelValues("error").Inc()
		w.redis.failed(w.log, "write after commit", err)
	} else {
		w.m.redisWrites.WithLabelValues("ok").Inc()
	}
	return nil
}

// checkDuplicates compares the content of deliveries the ledger already had
// with what it holds: the same content is a duplicate, other content a
// conflict to record.
func (w *Worker) checkDuplicates(ctx context.Context, dups []*message) error {
	if len(dups) == 0 {
		return nil
	}
	ids := make([]string, len(dups))
	for i, m := range dups {
		ids[i] = m.key
	}
	tctx, cancel := context.WithTimeout(ctx, w.opts.ProcessTimeout)
	stored, err := w.opts.Ledger.Digests(tctx, ids)
	cancel()
	if err != nil {
		return w.failed(dups, err)
	}
	var conflicts []*message
	for i, m := range dups {
		// "" means the row is gone again (pruned): it existed at COMMIT.
		if stored[i] == "" || event.SameContent(stored[i], m.digest) {
			m.res = Result{Outcome: Duplicate, Layer: dedupe.LayerPostgres}
			continue
		}
		m.stored = stored[i]
		conflicts = append(conflicts, m)
	}
	return w.recordConflicts(ctx, conflicts)
}

// commitOnce runs one transaction; a panic in it is returned as a
// *panicked error.
func (w *Worker) commitOnce(ctx context.Context, msgs []*message) (isNew []bool, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = w.recovered(r)
		}
	}()
	recs := make([]store.Record, len(msgs))
	for i, m := range msgs {
		recs[i] = store.Record{
			Event:         m.ev,
			Source:        sourceOf(m.d.Headers),
			PayloadSHA256: m.ev.Digest[:],
			ReceivedAt:    broker.ReceivedAt(m.d.Headers),
			Attempt:       m.attempt,
		}
	}
	var out effects.Outbox
	apply := func(ctx context.Context, tx store.Tx, fresh []int) ([]bool, error) {
		evs := make([]effects.Event, len(fresh))
		for j, i := range fresh {
			evs[j] = msgs[i].effectsEvent()
		}
		out = w.opts.Outbox(tx)
		applied, err := w.opts.Effects.Apply(ctx, evs, tx, out)
		if err == nil && w.opts.Archive {
			err = backfill.Archive(ctx, tx, evs)
		}
		if err == nil {
			if f, ok := out.(interface{ Flush(context.Context) error }); ok {
				err = f.Flush(ctx) // an outbox that writes its messages at the end
			}
		}
		if err != nil {
			return nil, &handlerError{err: err}
		}
		if err := runHook(w.opts.Hooks.BeforeCommit, msgs); err != nil {
			return nil, err
		}
		return applied, nil
	}
	tctx, cancel := context.WithTimeout(ctx, w.opts.ProcessTimeout)
	defer cancel()
	start := time.Now()
	isNew, err = w.opts.Ledger.CommitAs(tctx, w.fence.registration(), recs, apply)
	w.m.txSeconds.Observe(time.Since(start).Seconds())
	if err != nil {
		if store.IsPermanent(err) && !isHandlerResult(err) {
			return nil, permanent(broker.ReasonRejectedByDatabase, err)
		}
		return nil, err
	}
	if c, ok := out.(interface{ Committed() }); ok {
		c.Committed() // an outbox that tells the relays after COMMIT
	}
	return isNew, nil
}

// effectsEvent is the event as handlers see it.
func (m *message) effectsEvent() effects.Event {
	return effects.Event{
		Source: sourceOf(m.d.Headers), ID: m.providerID, Key: m.key, Type: m.ev.Type, Created: m.ev.Created,
		Object: effects.Object{Type: m.ev.Object.Type, ID: m.ev.Object.ID}, Raw: m.d.Body,
		Attempt: m.attempt, Origin: originOf(m.d.Headers),
	}
}

// originOf says how a message reached the worker: the reconciler marks its
// messages, the DLQ tools mark replays.
func originOf(h amqp.Table) effects.Origin {
	switch {
	case broker.String(h, broker.HeaderOrigin) == string(effects.OriginReconcile):
		return effects.OriginReconcile
	case broker.String(h, broker.HeaderReplayOf) != "":
		return effects.OriginReplay
	}
	return effects.OriginWebhook
}

// stillReachable reports whether err looks like an outage while Postgres
// does answer a ping: a connection cut, not Postgres down.
func (w *Worker) stillReachable(ctx context.Context, err error) bool {
	if isPermanent(err) || errors.As(err, new(*handlerError)) || errors.Is(err, errAbandoned) || !store.IsOutage(err) || ctx.Err() != nil {
		return false
	}
	pctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	return w.opts.Ledger.Ping(pctx) == nil
}

// isolating reports an error that may lie with one event of a batch: a
// permanent one, or any handler's.
func isolating(err error) bool { return isPermanent(err) || errors.As(err, new(*handlerError)) }

// isPermanent reports an error no retry can fix: a permanent database
// error, a panic, or a handler's Permanent. (store.IsOutage takes every
// error that is not Postgres's own for a connection problem, so this is
// asked first.)
func isPermanent(err error) bool {
	return errors.As(err, new(*permanentError)) || errors.As(err, new(*panicked)) || errors.As(err, new(*effects.PermanentError))
}

// isHandlerResult reports a result a handler chose (Permanent, RetryAfter):
// decide takes it as the handler meant it.
func isHandlerResult(err error) bool {
	return errors.As(err, new(*effects.PermanentError)) || errors.As(err, new(*effects.RetryAfterError))
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
		ids[i] = m.key
	}
	if err := h(ids); err != nil {
		return fmt.Errorf("%w: %w", errAbandoned, err)
	}
	return nil
}
