package worker

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.uber.org/zap"

	"github.com/idempotent-events/idempotent-events/pkg/effects"
	"github.com/idempotent-events/idempotent-events/pkg/internal/backoff"
	"github.com/idempotent-events/idempotent-events/pkg/internal/broker"
	"github.com/idempotent-events/idempotent-events/pkg/internal/options"
	"github.com/idempotent-events/idempotent-events/pkg/internal/store"
)

// Options configures a Worker. New refuses a zero count, a zero timeout or
// a missing part, naming the field.
type Options struct {
	// Dialer reaches RabbitMQ; Run reconnects through it.
	Dialer   broker.Dialer
	Topology broker.Topology
	Prefetch int
	// ReplayPrefetch is the prefetch of the events.replay consumer, kept small
	// so operator replays trickle in beside live traffic.
	ReplayPrefetch int
	Concurrency    int
	BatchSize      int
	BatchWait      time.Duration
	// ProcessTimeout bounds one Postgres transaction.
	ProcessTimeout time.Duration
	// PublishTimeout bounds waiting for the confirm of a retry or DLQ copy.
	PublishTimeout time.Duration
	// ShutdownTimeout bounds finishing in-flight work after ctx is done.
	ShutdownTimeout time.Duration
	// RetryOnOutage sends messages through the retry tiers when Postgres is
	// unreachable, instead of pausing consumption until it is back.
	RetryOnOutage bool

	Ledger Ledger
	Cache  Cache
	// Effects are the handlers run in each event's transaction.
	Effects *effects.Registry
	// Release names the deploy the worker belongs to (WORKER_RELEASE);
	// "": its handler set does (see store/fence.go).
	Release string
	// Outbox gives the handlers of a transaction the outbox that writes in
	// it (one with a Flush(ctx) error method is flushed after the handlers,
	// before COMMIT; one with a Committed() method is told after COMMIT);
	// effects.NoOutbox when nil (Enqueue fails, the event is retried).
	Outbox func(tx effects.Tx) effects.Outbox
	// Archive keeps every committed event's body in event_archive, in its
	// transaction (EVENT_ARCHIVE), for backfills (package backfill).
	Archive bool
	Logger  *zap.Logger // zap.NewNop() when nil
	Metrics *Metrics
	Hooks   Hooks
}

func (o *Options) validate() error {
	p := options.Check("worker")
	need := p.Need
	need(o.Dialer.URL != "", "Dialer.URL", "is required")
	need(o.Prefetch >= 1, "Prefetch", "must be at least 1")
	need(o.ReplayPrefetch >= 1, "ReplayPrefetch", "must be at least 1")
	need(o.Concurrency >= 1, "Concurrency", "must be at least 1")
	need(o.BatchSize >= 1, "BatchSize", "must be at least 1")
	need(o.BatchWait >= 0, "BatchWait", "must not be negative")
	need(o.ProcessTimeout > 0, "ProcessTimeout", "must be positive")
	need(o.PublishTimeout > 0, "PublishTimeout", "must be positive")
	need(o.ShutdownTimeout > 0, "ShutdownTimeout", "must be positive")
	need(o.Ledger != nil, "Ledger", "is required")
	need(o.Cache != nil, "Cache", "is required")
	need(o.Effects != nil, "Effects", "is required (payments.Effects() for the built-in payment effect)")
	need(o.Metrics != nil, "Metrics", "is required")
	if err := p.Err(); err != nil {
		return err
	}
	if o.Logger == nil {
		o.Logger = zap.NewNop()
	}
	if o.Outbox == nil {
		o.Outbox = func(effects.Tx) effects.Outbox { return effects.NoOutbox{} }
	}
	return nil
}

// Worker consumes events.main; see the package documentation.
type Worker struct {
	opts      Options
	log       *zap.Logger
	m         *Metrics
	consuming atomic.Bool
	// waiting is why it is not consuming (faults.go).
	waiting atomic.Pointer[string]
	redis   redisFaults
	epoch   epochState
	fence   fenceState
	// set is opts.Effects's identity, which does not change after New.
	set effects.Set
}

// New validates opts and returns a Worker.
func New(opts Options) (*Worker, error) {
	if err := opts.validate(); err != nil {
		return nil, err
	}
	return &Worker{opts: opts, log: opts.Logger, m: opts.Metrics, set: opts.Effects.Set()}, nil
}

// Ready is nil while the worker is consuming.
func (w *Worker) Ready() error {
	if reason := w.fence.fencedReason(); reason != "" {
		return errors.New("fenced: " + reason)
	}
	if !w.consuming.Load() {
		return errors.New("not consuming: " + w.waitingReason())
	}
	return nil
}

// Run consumes until ctx is done, reconnecting whenever the connection is
// lost, then drains in-flight work within ShutdownTimeout. Beside it, the
// worker renews its vouch for the ledger's epoch (see epoch.go).
func (w *Worker) Run(ctx context.Context) error {
	epochCtx, stopEpoch := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { w.keepVouching(epochCtx) })
	err := broker.Supervise(ctx, w.opts.Dialer, w.log.Named("broker"), w.m.Broker.State, w.serve)
	stopEpoch()
	wg.Wait()
	return err
}

// session is everything that belongs to one connection.
type session struct {
	consumers []*consumer
	pub       *broker.ConfirmChannel
	abortMu   sync.Once
	aborted   chan struct{}
	abortErr  error
}

// consumer is one channel consuming one queue.
type consumer struct {
	queue      string
	tag        string
	ch         *amqp.Channel
	deliveries <-chan amqp.Delivery
	closed     chan *amqp.Error
	acker      *acker
}

// abort tears the session down: closing the consumer channels makes the
// broker requeue every unacked delivery of this session.
func (s *session) abort(err error) {
	s.abortMu.Do(func() {
		s.abortErr = err
		close(s.aborted)
		for _, c := range s.consumers {
			_ = c.ch.Close()
		}
	})
}

func openConsumer(conn *amqp.Connection, queue string, prefetch int) (*consumer, error) {
	ch, err := conn.Channel()
	if err != nil {
		return nil, fmt.Errorf("open consumer channel: %w", err)
	}
	if err := ch.Qos(prefetch, 0, false); err != nil {
		return nil, fmt.Errorf("set prefetch on %s: %w", queue, err)
	}
	c := &consumer{queue: queue, tag: "idempotent-events-worker " + queue, ch: ch, acker: newAcker(ch)}
	if c.deliveries, err = ch.Consume(queue, c.tag, false, false, false, false, nil); err != nil {
		return nil, fmt.Errorf("consume %s: %w", queue, err)
	}
	c.closed = ch.NotifyClose(make(chan *amqp.Error, 1))
	return c, nil
}

func (w *Worker) serve(ctx context.Context, conn *amqp.Connection) error {
	defer w.setWaiting(waitBrokerLost)
	w.setWaiting(waitPostgres)
	if err := w.opts.Topology.DeclareOn(conn); err != nil {
		return err
	}
	pub, err := broker.OpenConfirmChannel(conn)
	if err != nil {
		return err
	}
	defer pub.Close()
	for {
		if !w.awaitDependencies(ctx) || !w.awaitCurrent(ctx) {
			return nil
		}
		err := w.consumeRound(ctx, conn, pub)
		switch {
		case errors.Is(err, errDependencyDown):
			// The consumers are closed and their deliveries back in the
			// queue; wait for Postgres on the same connection, then
			// consume again.
			w.m.pauses.Inc()
		case errors.Is(err, errFenced):
			// Another handler set is current: the deliveries are back in
			// the queue for its workers; awaitCurrent waits (fence.go).
		default:
			return err
		}
	}
}

// errDependencyDown ends a consuming round because Postgres is unreachable:
// the round's deliveries are released unacked rather than sent through the
// retry tiers, and consuming resumes once Postgres answers again.
var errDependencyDown = errors.New("postgres unreachable: pausing consumption")

// awaitDependencies returns once Postgres answers, or false when ctx is
// done first. While it waits the worker is not ready and takes no messages,
// so a Postgres outage leaves events waiting in events.main instead of
// burning through the retry tiers toward the DLQ.
func (w *Worker) awaitDependencies(ctx context.Context) bool {
	wait := 100 * time.Millisecond
	for i := 0; ; i++ {
		pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		err := w.opts.Ledger.Ping(pctx)
		cancel()
		if err == nil {
			if i > 0 {
				w.log.Info("postgres is back: resuming consumption")
				w.m.paused.Set(0)
			}
			// Before the first message of a round, and after every outage
			// (the database may have been recreated, or another primary
			// promoted), Redis learns which ledger its entries must be of.
			w.vouch(ctx)
			return true
		}
		if ctx.Err() != nil {
			return false
		}
		if i == 0 {
			w.log.Warn("postgres (DATABASE_URL) unreachable: consumption paused until it answers", zap.Error(err), zap.String("hint", store.Hint(err)))
			w.m.paused.Set(1)
		}
		w.setWaiting(postgresReason("unreachable, consumption paused", err))
		if !backoff.Sleep(ctx, backoff.Jitter(wait)) {
			return false
		}
		// A ping a second or two is nothing to a Postgres that is down,
		// and a short outage is not stretched by a long backoff.
		wait = min(wait*2, 2*time.Second)
	}
}

// consumeRound consumes events.main and events.replay until ctx is done,
// the connection or a channel is lost, or processing asks to stop.
func (w *Worker) consumeRound(ctx context.Context, conn *amqp.Connection, pub *broker.ConfirmChannel) error {
	s := &session{pub: pub, aborted: make(chan struct{})}
	defer func() {
		for _, c := range s.consumers {
			_ = c.ch.Close()
		}
	}()
	// Live traffic and operator replays have their own consumers: a replay
	// waits in events.replay and only takes its own small prefetch, so it
	// never sits at the head of the live queue.
	main, err := openConsumer(conn, broker.MainQueue, w.opts.Prefetch)
	if err != nil {
		return err
	}
	s.consumers = append(s.consumers, main)
	replay, err := openConsumer(conn, broker.ReplayQueue, max(w.opts.ReplayPrefetch, 1))
	if err != nil {
		return err
	}
	s.consumers = append(s.consumers, replay)

	// Processing outlives ctx: a shutdown finishes in-flight work. hardStop
	// ends it when the shutdown timeout runs out.
	procCtx, hardStop := context.WithCancel(context.WithoutCancel(ctx))
	defer hardStop()
	var wg sync.WaitGroup
	for i := 0; i < w.opts.Concurrency; i++ {
		wg.Go(func() { w.consume(procCtx, s, main) })
	}
	wg.Go(func() { w.consume(procCtx, s, replay) })
	w.consuming.Store(true)
	w.log.Info("consuming", zap.Strings("queues", []string{broker.MainQueue, broker.ReplayQueue}), zap.Int("prefetch", w.opts.Prefetch),
		zap.Int("concurrency", w.opts.Concurrency), zap.Int("batch_size", w.opts.BatchSize))
	defer w.consuming.Store(false)

	select {
	case <-ctx.Done():
		w.consuming.Store(false)
		return w.drain(s, &wg, hardStop)
	case <-s.aborted:
		wg.Wait()
		return s.abortErr
	case err := <-main.closed:
		return w.lost(s, &wg, err)
	case err := <-replay.closed:
		return w.lost(s, &wg, err)
	}
}

// lost ends a session whose channel closed under it. Deliveries die with the
// channel; processors finish what they hold (their acks fail, and those
// messages are redelivered).
func (w *Worker) lost(s *session, wg *sync.WaitGroup, err *amqp.Error) error {
	s.abort(errors.New("consumer channel closed"))
	wg.Wait()
	if err != nil {
		return err
	}
	return errors.New("consumer channel closed")
}

// drain cancels the consumers, lets the processors finish what was already
// delivered, and gives up after the shutdown timeout.
func (w *Worker) drain(s *session, wg *sync.WaitGroup, hardStop context.CancelFunc) error {
	deadline := time.NewTimer(w.opts.ShutdownTimeout)
	defer deadline.Stop()
	for _, c := range s.consumers {
		go func() {
			// Cancel waits for the broker's cancel-ok; after it, no new
			// deliveries arrive and the deliveries channel closes once drained.
			if err := c.ch.Cancel(c.tag, false); err != nil {
				s.abort(fmt.Errorf("cancel consumer of %s: %w", c.queue, err))
			}
		}()
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
		w.log.Info("drained in-flight deliveries")
		return nil
	case <-deadline.C:
		w.log.Warn("shutdown timeout: leaving unfinished deliveries unacked for redelivery", zap.Duration("timeout", w.opts.ShutdownTimeout))
		hardStop()
		s.abort(errors.New("shutdown timeout"))
		<-done
		return nil
	}
}

// consume collects batches from c's deliveries and handles them until the
// channel closes.
func (w *Worker) consume(ctx context.Context, s *session, c *consumer) {
	for {
		batch := w.collect(c.deliveries)
		if len(batch) == 0 {
			return
		}
		w.handle(ctx, s, c.acker, batch)
	}
}

// collect blocks for one delivery, then takes more until the batch is full,
// BatchWait has passed or the channel closes. It returns nil once the channel
// is closed and empty.
func (w *Worker) collect(deliveries <-chan amqp.Delivery) []*message {
	d, ok := <-deliveries
	if !ok {
		return nil
	}
	batch := []*message{newMessage(d)}
	if w.opts.BatchSize <= 1 {
		return batch
	}
	var timeout <-chan time.Time
	if w.opts.BatchWait > 0 {
		t := time.NewTimer(w.opts.BatchWait)
		defer t.Stop()
		timeout = t.C
	}
	for len(batch) < w.opts.BatchSize {
		if timeout == nil {
			select {
			case d, ok := <-deliveries:
				if !ok {
					return batch
				}
				batch = append(batch, newMessage(d))
				continue
			default:
				return batch
			}
		}
		select {
		case d, ok := <-deliveries:
			if !ok {
				return batch
			}
			batch = append(batch, newMessage(d))
		case <-timeout:
			return batch
		}
	}
	return batch
}

// handle processes one batch, carries out every message's outcome, and
// acks the batch.
func (w *Worker) handle(ctx context.Context, s *session, a *acker, batch []*message) {
	w.m.inFlight.Add(float64(len(batch)))
	defer w.m.inFlight.Sub(float64(len(batch)))
	w.m.batchSize.Observe(float64(len(batch)))
	start := time.Now()
	err := w.processSafely(ctx, batch)
	w.m.batchSeconds.Observe(time.Since(start).Seconds())
	if err != nil {
		// Simulated death, a processing context cut by shutdown, or the
		// fence: settle nothing; the broker redelivers.
		if !errors.Is(err, errFenced) {
			w.log.Warn("batch abandoned unacked", zap.Int("size", len(batch)), zap.Error(err))
		}
		s.abort(err)
		return
	}
	tags := make([]uint64, len(batch))
	for i, m := range batch {
		if err := w.settle(ctx, s, m); err != nil {
			w.log.Error("could not settle message; reconnecting so the broker redelivers it",
				zap.String("event_id", m.key), zap.String("outcome", m.res.Outcome.String()), zap.Error(err))
			s.abort(err)
			return
		}
		tags[i] = m.d.DeliveryTag
	}
	if err := a.settle(tags...); err != nil {
		// The channel is gone; the broker redelivers and dedupe absorbs it.
		w.m.ackFailures.Inc()
		w.log.Warn("ack failed; the batch will be redelivered", zap.Int("size", len(batch)), zap.Error(err))
	}
}

// processSafely runs process, and on a panic processes the messages one at
// a time so that only the one that panics is dead-lettered.
func (w *Worker) processSafely(ctx context.Context, batch []*message) (err error) {
	if perr := w.tryProcess(ctx, batch); perr == nil || !errors.As(perr, new(*panicked)) {
		return perr
	}
	for _, m := range batch {
		single := []*message{m}
		if err := w.tryProcess(ctx, single); err != nil {
			if !errors.As(err, new(*panicked)) {
				return err
			}
			m.res = decide(err, m.attempt, w.policy())
		}
	}
	return nil
}

// recovered turns a recovered panic into a *panicked error, logging it with
// its stack once, here.
func (w *Worker) recovered(r any) *panicked {
	p := &panicked{v: r, stack: debug.Stack()}
	w.log.Error("panic while processing", zap.Any("panic", r), zap.ByteString("stack", p.stack))
	return p
}

func (w *Worker) tryProcess(ctx context.Context, batch []*message) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = w.recovered(r)
		}
	}()
	if err := w.process(ctx, batch); err != nil {
		return err
	}
	if ctx.Err() != nil {
		return fmt.Errorf("processing stopped: %w", ctx.Err())
	}
	return nil
}
