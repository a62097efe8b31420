package dlq

import (
	"context"
	"errors"
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.uber.org/zap"
	"golang.org/x/time/rate"

	"github.com/idempotent-events/idempotent-events/pkg/internal/backoff"
	"github.com/idempotent-events/idempotent-events/pkg/internal/broker"
	"github.com/idempotent-events/idempotent-events/pkg/internal/lookup"
)

// Defaults of Options.
const (
	DefaultScanLimit      = 1000
	DefaultRate           = 20
	DefaultPublishTimeout = 5 * time.Second
	// maxHold bounds how long one pass holds messages unacked, well inside
	// RabbitMQ's consumer ack timeout (30 min by default).
	maxHold = 10 * time.Minute
)

// Errors of the operations.
var (
	// ErrNotFound: no message with that id was seen in the DLQ.
	ErrNotFound = errors.New("not found in " + broker.DLQ)
	// ErrNoSelection: a replay or discard named no message and no criterion.
	ErrNoSelection = errors.New("select messages by id or filter, or ask for all explicitly")
	// ErrNoOperator: a replay or discard without an operator identity.
	ErrNoOperator = errors.New("an operator identity is required for the audit trail")
	// ErrNoAudit: the Client has no audit trail, so it may not mutate.
	ErrNoAudit = errors.New("no audit trail configured: replay and discard need DATABASE_URL")
)

// Hooks are fault-injection points for tests. A non-nil error simulates the
// process dying there: the connection is dropped without another ack or
// nack, exactly as a crash would leave it.
type Hooks struct {
	// AfterConfirm runs once the broker confirmed a replayed copy, before
	// the DLQ message is acked.
	AfterConfirm func(Message) error
	// AfterAudit runs once a discard's audit row committed, before the DLQ
	// message is acked.
	AfterAudit func(Message) error
}

// Options configures a Client.
type Options struct {
	// Dialer reaches the broker (the vhost of the pipeline).
	Dialer broker.Dialer
	// Audit records replays and discards; without it they are refused.
	Audit *Audit
	// ScanLimit bounds the messages read from the DLQ in one pass.
	ScanLimit int
	// Rate bounds replays per second (shared by every request of the
	// Client); Burst is 1.
	Rate float64
	// PublishTimeout bounds waiting for the confirm of a replayed copy.
	PublishTimeout time.Duration
	Logger         *zap.Logger
	Metrics        *Metrics
	Hooks          Hooks
}

// Client lists, shows, replays and discards DLQ messages. It is safe for
// concurrent use; its operations run one at a time (see the package
// documentation for why).
type Client struct {
	opts    Options
	log     *zap.Logger
	sem     chan struct{}
	limiter *rate.Limiter
}

// New returns a Client.
func New(opts Options) *Client {
	if opts.ScanLimit <= 0 {
		opts.ScanLimit = DefaultScanLimit
	}
	if opts.Rate <= 0 {
		opts.Rate = DefaultRate
	}
	if opts.PublishTimeout <= 0 {
		opts.PublishTimeout = DefaultPublishTimeout
	}
	if opts.Logger == nil {
		opts.Logger = zap.NewNop()
	}
	if opts.Dialer.Name == "" {
		opts.Dialer.Name = "idempotent-events dlq"
	}
	return &Client{
		opts:    opts,
		log:     opts.Logger,
		sem:     make(chan struct{}, 1),
		limiter: rate.NewLimiter(rate.Limit(opts.Rate), 1),
	}
}

// Listing is what List saw.
type Listing struct {
	// Messages are the matches, in queue order, at most the limit asked for.
	Messages []Message `json:"messages"`
	// Matched counts every match among the scanned messages.
	Matched int `json:"matched"`
	// Scanned is how many messages were read; Depth is the number of ready
	// messages when the scan began.
	Scanned int `json:"scanned"`
	Depth   int `json:"depth"`
	// Complete is false when the scan stopped at the scan limit before the
	// end of the queue: messages beyond it were not looked at.
	Complete bool `json:"complete"`
}

// List returns the DLQ messages that match f, at most limit of them (all
// when limit <= 0). Every message read is returned to the queue.
func (c *Client) List(ctx context.Context, f Filter, limit int) (Listing, error) {
	if err := f.Validate(); err != nil {
		return Listing{}, err
	}
	release, err := c.acquire(ctx)
	if err != nil {
		return Listing{}, err
	}
	defer release()
	s, err := c.open(ctx, broker.DLQ, false)
	if err != nil {
		return Listing{}, err
	}
	defer s.close()
	hs, exhausted, err := s.scan(c.opts.ScanLimit)
	c.opts.Metrics.scan(len(hs))
	l := Listing{Scanned: len(hs), Depth: s.depth, Complete: exhausted || len(hs) >= s.depth}
	now := time.Now()
	for _, h := range hs {
		if f.Match(h.m, now) {
			l.Matched++
			if limit <= 0 || len(l.Messages) < limit {
				l.Messages = append(l.Messages, h.m)
			}
		}
	}
	if err != nil {
		return l, err
	}
	return l, s.release(hs)
}

// Locate looks for the messages of event key in queues (events.dlq and
// the retry tiers: where an event waits that is not in the ledger), up to
// the scan limit of each, and returns every message read to its queue. A
// requeued message keeps its expiry, so a retry tier's delay is not reset.
func (c *Client) Locate(ctx context.Context, key string, queues []string) (lookup.Queues, error) {
	release, err := c.acquire(ctx)
	if err != nil {
		return lookup.Queues{}, err
	}
	defer release()
	var found lookup.Queues
	for _, q := range queues {
		s, err := c.open(ctx, q, false)
		var aerr *amqp.Error
		if errors.As(err, &aerr) && aerr.Code == amqp.NotFound {
			// No such tier here (RETRY_DELAYS differs from the workers'):
			// nothing can wait in it.
			found.Scanned = append(found.Scanned, lookup.Scan{Queue: q, Missing: true, Complete: true})
			continue
		}
		if err != nil {
			return found, err
		}
		hs, exhausted, err := s.scan(c.opts.ScanLimit)
		found.Scanned = append(found.Scanned, lookup.Scan{Queue: q, Read: len(hs), Depth: s.depth, Complete: exhausted || len(hs) >= s.depth})
		for _, h := range hs {
			if h.m.EventID != key {
				continue
			}
			found.Hits = append(found.Hits, lookup.QueueHit{Queue: q, ID: h.m.ID, Reason: string(h.m.Reason), Attempts: h.m.Attempts,
				LastError: h.m.LastError, At: h.m.DeadLetteredAt, FailedAt: h.m.LastFailedAt})
		}
		if err == nil {
			err = s.release(hs)
		}
		s.close()
		if err != nil {
			return found, err
		}
	}
	return found, nil
}

// Show returns the message with DLQ id, with its headers and body, and
// leaves it in the queue.
func (c *Client) Show(ctx context.Context, id string) (Message, error) {
	release, err := c.acquire(ctx)
	if err != nil {
		return Message{}, err
	}
	defer release()
	s, err := c.open(ctx, broker.DLQ, false)
	if err != nil {
		return Message{}, err
	}
	defer s.close()
	hs, exhausted, err := s.scan(c.opts.ScanLimit)
	c.opts.Metrics.scan(len(hs))
	if err != nil {
		return Message{}, err
	}
	for _, h := range hs {
		if h.m.ID == id {
			m := h.m
			m.Headers = jsonHeaders(h.d.Headers)
			return m, s.release(hs)
		}
	}
	if err := s.release(hs); err != nil {
		return Message{}, err
	}
	if !exhausted && len(hs) < s.depth {
		return Message{}, fmt.Errorf("message %s: %w among the first %d of %d messages (raise the scan limit)", id, ErrNotFound, len(hs), s.depth)
	}
	return Message{}, fmt.Errorf("message %s: %w", id, ErrNotFound)
}

// Request is a replay or discard.
type Request struct {
	Filter Filter
	// Max bounds the number of messages acted on; 0 means no bound.
	Max int
	// DryRun only says what would happen to each message (and records
	// that in the audit trail as dry_run); nothing is published or removed.
	DryRun bool
	Actor  Actor
}

// Item is what happened to one message.
type Item struct {
	Message Message `json:"message"`
	// Outcome is replayed, discarded, would_replay, would_discard, failed
	// or pending (the operation was cut between the publish and the ack).
	Outcome string `json:"outcome"`
	Detail  string `json:"detail,omitempty"`
	AuditID int64  `json:"audit_id,omitempty"`
}

// Report is the result of a replay or discard.
type Report struct {
	Action string `json:"action"`
	DryRun bool   `json:"dry_run"`
	Items  []Item `json:"items"`
	// NotFound lists requested ids that were not in the DLQ.
	NotFound []string `json:"not_found,omitempty"`
	Scanned  int      `json:"scanned"`
	Depth    int      `json:"depth"`
	// Complete is false when a pass stopped at the scan limit and later
	// messages could not be reached (see the package documentation).
	Complete bool `json:"complete"`
}

// Count returns the number of items with outcome.
func (r Report) Count(outcome string) int {
	n := 0
	for _, it := range r.Items {
		if it.Outcome == outcome {
			n++
		}
	}
	return n
}

// Replay publishes a copy of every selected message to events.replay,
// through the normal dedupe, and removes each from the DLQ once the broker
// confirmed its copy. Replays are rate limited.
func (c *Client) Replay(ctx context.Context, req Request) (Report, error) {
	return c.mutate(ctx, ActionReplay, req)
}

// Discard removes every selected message from the DLQ, each only after
// its audit row (which keeps the message) committed.
func (c *Client) Discard(ctx context.Context, req Request) (Report, error) {
	return c.mutate(ctx, ActionDiscard, req)
}

func (c *Client) mutate(ctx context.Context, action string, req Request) (Report, error) {
	rep := Report{Action: action, DryRun: req.DryRun}
	if err := req.Filter.Validate(); err != nil {
		return rep, err
	}
	if !req.Filter.Selective() && !req.Filter.All {
		return rep, ErrNoSelection
	}
	if req.Actor.Operator == "" {
		return rep, ErrNoOperator
	}
	if c.opts.Audit == nil {
		return rep, ErrNoAudit
	}
	release, err := c.acquire(ctx)
	if err != nil {
		return rep, err
	}
	defer release()
	s, err := c.open(ctx, broker.DLQ, action == ActionReplay && !req.DryRun)
	if err != nil {
		return rep, err
	}
	defer s.close()
	rep.Depth = s.depth

	started := time.Now()
	done := map[string]bool{}
	want := map[string]bool{}
	for _, id := range req.Filter.IDs {
		want[id] = true
	}
	perPass := max(1, int(c.opts.Rate*maxHold.Seconds()))
	idRetries := 2
	for {
		hs, exhausted, err := s.scan(c.opts.ScanLimit)
		c.opts.Metrics.scan(len(hs))
		rep.Scanned += len(hs)
		rep.Complete = rep.Complete || exhausted || len(hs) >= s.depth
		if err != nil {
			return rep, err
		}
		now := time.Now()
		acted := 0
		for i := range hs {
			h := &hs[i]
			if !c.selected(h.m, req.Filter, done, started, now) {
				continue
			}
			if (req.Max > 0 && len(rep.Items) >= req.Max) || acted >= perPass {
				break
			}
			done[h.m.ID] = true
			delete(want, h.m.ID)
			acted++
			item, err := c.act(ctx, s, action, req, h)
			rep.Items = append(rep.Items, item)
			if err != nil {
				// Whatever is not acked goes back to the queue: by the nack, or
				// by the broker when the connection is closed.
				_ = s.release(hs)
				return rep, err
			}
		}
		if err := s.release(hs); err != nil {
			return rep, err
		}
		switch {
		case req.DryRun, req.Max > 0 && len(rep.Items) >= req.Max:
		case len(req.Filter.IDs) > 0 && len(want) == 0:
		case len(want) > 0 && exhausted && idRetries > 0:
			// Another operator may hold the missing ones for a moment.
			idRetries--
			if !backoff.Sleep(ctx, 300*time.Millisecond) {
				return rep, ctx.Err()
			}
			continue
		case acted >= perPass:
			// This pass stopped at its holding budget; the rest was returned.
			continue
		case acted > 0 && !exhausted:
			// This pass removed messages; the queue holds more than one pass
			// could read, so look again.
			continue
		}
		break
	}
	for _, id := range req.Filter.IDs {
		if want[id] {
			rep.NotFound = append(rep.NotFound, id)
		}
	}
	return rep, nil
}

// selected decides whether a scanned message is acted on. Besides the
// filter, it skips messages this operation already handled and messages
// that came back to the DLQ after this operation began (a replayed poison
// message that failed again), so a replay never loops.
func (c *Client) selected(m Message, f Filter, done map[string]bool, started, now time.Time) bool {
	if done[m.ID] || (m.ReplayOf != "" && done[m.ReplayOf]) {
		return false
	}
	if !m.DeadLetteredAt.IsZero() && m.DeadLetteredAt.After(started) {
		return false
	}
	return f.Match(m, now)
}

func (c *Client) act(ctx context.Context, s *session, action string, req Request, h *held) (Item, error) {
	if req.DryRun {
		outcome := OutcomeWouldReplay
		if action == ActionDiscard {
			outcome = OutcomeWouldDiscard
		}
		item := Item{Message: h.m, Outcome: outcome}
		id, err := c.opts.Audit.record(ctx, req.Actor, action, true, h.m, outcome, "filter: "+req.Filter.String(), nil)
		item.AuditID = id
		if err != nil {
			item.Outcome, item.Detail = OutcomeFailed, err.Error()
			c.opts.Metrics.operation(action, OutcomeFailed)
			return item, err
		}
		c.opts.Metrics.operation(action, outcome)
		return item, nil
	}
	if action == ActionReplay {
		return c.replay(ctx, s, req.Actor, h)
	}
	return c.discard(ctx, s, req.Actor, h)
}

// replay: audit row (pending) -> publish to events.replay and wait for the
// confirm -> ack the DLQ message -> audit row replayed. A crash before the
// confirm leaves the message in the DLQ (and maybe a copy in events.replay);
// after it, the copy is in events.replay and the message is in the DLQ until
// the ack. Either way nothing is lost, and a second replay is a duplicate.
func (c *Client) replay(ctx context.Context, s *session, who Actor, h *held) (Item, error) {
	item := Item{Message: h.m, Outcome: OutcomeFailed}
	if err := c.limiter.Wait(ctx); err != nil {
		item.Detail = "not replayed: " + err.Error()
		return item, fmt.Errorf("replay %s: %w", h.m.ID, err)
	}
	id, err := c.opts.Audit.record(ctx, who, ActionReplay, false, h.m, OutcomePending, "publishing to "+broker.ReplayQueue, nil)
	if err != nil {
		item.Detail = "not replayed: " + err.Error()
		c.opts.Metrics.operation(ActionReplay, OutcomeFailed)
		return item, err
	}
	item.AuditID = id
	// Bookkeeping after this point must happen even if ctx ends.
	bctx := context.WithoutCancel(ctx)
	pctx, cancel := context.WithTimeout(ctx, c.opts.PublishTimeout)
	err = s.pub.Publish(pctx, "", broker.ReplayQueue, replayCopy(h.d, h.m, who.Operator, time.Now()))
	cancel()
	if err != nil {
		item.Detail = "not confirmed, so still in the DLQ (if a copy reached " + broker.ReplayQueue +
			" anyway, replaying again is a duplicate): " + err.Error()
		c.finish(bctx, id, OutcomeFailed, item.Detail)
		c.opts.Metrics.operation(ActionReplay, OutcomeFailed)
		return item, fmt.Errorf("replay %s: publish to %s: %w", h.m.ID, broker.ReplayQueue, err)
	}
	if hook := c.opts.Hooks.AfterConfirm; hook != nil {
		if err := hook(h.m); err != nil {
			s.crash()
			item.Outcome, item.Detail = OutcomePending, "crashed after the confirm: "+err.Error()
			return item, err
		}
	}
	if err := s.ch.Ack(h.d.DeliveryTag, false); err != nil {
		item.Outcome = OutcomeReplayed
		item.Detail = "replayed, but removing it from the DLQ failed: it stays there, and replaying it again is a duplicate (" + err.Error() + ")"
		c.finish(bctx, id, OutcomeReplayed, item.Detail)
		c.opts.Metrics.operation(ActionReplay, OutcomeReplayed)
		return item, fmt.Errorf("replay %s: ack: %w", h.m.ID, err)
	}
	h.settled = true
	item.Outcome = OutcomeReplayed
	c.finish(bctx, id, OutcomeReplayed, "published to "+broker.ReplayQueue)
	c.opts.Metrics.operation(ActionReplay, OutcomeReplayed)
	c.log.Info("dlq message replayed", zap.String("dlq_id", h.m.ID), zap.String("event_id", h.m.EventID),
		zap.String("reason", string(h.m.Reason)), zap.String("operator", who.Operator), zap.String("via", who.Via))
	return item, nil
}

// discard: audit row with the message (committed) -> ack. A crash before
// the commit leaves the message in the DLQ with no row; after it, the row
// exists and the message is in the DLQ until the ack.
func (c *Client) discard(ctx context.Context, s *session, who Actor, h *held) (Item, error) {
	item := Item{Message: h.m, Outcome: OutcomeFailed}
	keep := &kept{body: h.d.Body, properties: map[string]any{
		"headers": jsonHeaders(h.d.Headers), "message_id": h.d.MessageId, "type": h.d.Type,
		"content_type": h.d.ContentType, "content_encoding": h.d.ContentEncoding, "app_id": h.d.AppId,
		"timestamp": jsonValue(h.d.Timestamp),
	}}
	id, err := c.opts.Audit.record(ctx, who, ActionDiscard, false, h.m, OutcomeDiscarded, "", keep)
	if err != nil {
		item.Detail = "not discarded: " + err.Error()
		c.opts.Metrics.operation(ActionDiscard, OutcomeFailed)
		return item, err
	}
	item.AuditID = id
	if hook := c.opts.Hooks.AfterAudit; hook != nil {
		if err := hook(h.m); err != nil {
			s.crash()
			item.Outcome, item.Detail = OutcomePending, "crashed after the audit row: "+err.Error()
			return item, err
		}
	}
	if err := s.ch.Ack(h.d.DeliveryTag, false); err != nil {
		item.Detail = "audited, but removing it from the DLQ failed: it is still there (" + err.Error() + ")"
		c.finish(context.WithoutCancel(ctx), id, OutcomeFailed, item.Detail)
		c.opts.Metrics.operation(ActionDiscard, OutcomeFailed)
		return item, fmt.Errorf("discard %s: ack: %w", h.m.ID, err)
	}
	h.settled = true
	item.Outcome = OutcomeDiscarded
	c.opts.Metrics.operation(ActionDiscard, OutcomeDiscarded)
	c.log.Info("dlq message discarded", zap.String("dlq_id", h.m.ID), zap.String("event_id", h.m.EventID),
		zap.String("reason", string(h.m.Reason)), zap.String("operator", who.Operator), zap.String("via", who.Via), zap.Int64("audit_id", id))
	return item, nil
}

func (c *Client) finish(ctx context.Context, id int64, outcome, detail string) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := c.opts.Audit.finish(ctx, id, outcome, detail); err != nil {
		c.log.Warn("audit row not updated", zap.Int64("audit_id", id), zap.String("outcome", outcome), zap.Error(err))
	}
}

// acquire runs one operation of this Client at a time: two scans of the
// same process would hide messages from each other.
func (c *Client) acquire(ctx context.Context) (func(), error) {
	select {
	case c.sem <- struct{}{}:
		return func() { <-c.sem }, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// held is a DLQ message taken unacked by this session.
type held struct {
	d       amqp.Delivery
	m       Message
	settled bool
}

// session is one connection with its get channel (and, for a replay, a
// confirm channel). Delivery tags belong to it and die with it: whatever it
// has not acked is back in the DLQ once it is closed.
type session struct {
	queue string
	conn  *amqp.Connection
	ch    *amqp.Channel
	pub   *broker.ConfirmChannel
	depth int
	stop  func() bool
}

func (c *Client) open(ctx context.Context, queue string, publisher bool) (*session, error) {
	conn, err := c.opts.Dialer.Dial()
	if err != nil {
		return nil, fmt.Errorf("connect to the broker: %w", err)
	}
	// The broker's calls take no context: a cancelled operation closes the
	// connection, which fails them and requeues what was held.
	s := &session{queue: queue, conn: conn, stop: context.AfterFunc(ctx, func() { _ = conn.Close() })}
	fail := func(err error) (*session, error) {
		s.close()
		return nil, err
	}
	if s.ch, err = conn.Channel(); err != nil {
		return fail(fmt.Errorf("open channel: %w", err))
	}
	q, err := s.ch.QueueDeclarePassive(queue, true, false, false, false, nil)
	if err != nil {
		var aerr *amqp.Error
		if errors.As(err, &aerr) && aerr.Code == amqp.NotFound {
			return fail(fmt.Errorf("queue %s does not exist in this vhost (has a worker or receiver declared the topology?): %w", queue, err))
		}
		return fail(fmt.Errorf("inspect %s: %w", queue, err))
	}
	s.depth = q.Messages
	if publisher {
		if s.pub, err = broker.OpenConfirmChannel(conn); err != nil {
			return fail(err)
		}
	}
	return s, nil
}

// scan takes up to limit messages unacked. exhausted is true when the
// queue had no more ready messages.
func (s *session) scan(limit int) (hs []held, exhausted bool, err error) {
	for len(hs) < limit {
		d, ok, err := s.ch.Get(s.queue, false)
		if err != nil {
			return hs, false, fmt.Errorf("get from %s: %w", s.queue, err)
		}
		if !ok {
			return hs, true, nil
		}
		hs = append(hs, held{d: d, m: fromDelivery(d)})
	}
	return hs, false, nil
}

// release returns every unsettled message of hs to the queue with one
// basic.nack (multiple, requeue). basic.nack, not basic.reject: on quorum
// queues of RabbitMQ 4.3+ it does not count as a failed delivery.
func (s *session) release(hs []held) error {
	var last uint64
	for i := range hs {
		if !hs[i].settled {
			last = max(last, hs[i].d.DeliveryTag)
		}
	}
	if last == 0 {
		return nil
	}
	if err := s.ch.Nack(last, true, true); err != nil {
		return fmt.Errorf("return messages to %s: %w", s.queue, err)
	}
	for i := range hs {
		if hs[i].d.DeliveryTag <= last {
			hs[i].settled = true
		}
	}
	return nil
}

// crash drops the connection as a dying process would.
func (s *session) crash() { _ = s.conn.Close() }

// close closes the connection; the broker requeues whatever is unacked.
func (s *session) close() {
	s.stop()
	if s.pub != nil {
		_ = s.pub.Close()
	}
	_ = s.conn.Close()
}
