// Package consumer gives a downstream service exactly-once effects from the
// messages idempotent-events' outbox relay publishes, with the same ledger
// pattern the worker uses: a message's effect is written in one
// transaction with a row keyed on its MessageId (the outbox's idempotency
// key), and the message is acked only after COMMIT. Messages are taken a
// batch at a time (up to BatchSize, waiting at most BatchWait after the
// first for more to arrive), one transaction each, handled in their order.
//
//   - A redelivery (the relay published it again after dying before it
//     marked the row, or the consumer died before its ack) finds the row and
//     is acked without running the handler again.
//   - A handler error rolls the transaction back; after RetryDelay the
//     connection is closed, so the message and every one after it are
//     delivered again, in their order, and tried again.
//   - A crash anywhere before COMMIT leaves the message unacked: RabbitMQ
//     delivers it again.
//
// Per object (the message's x-ie-object-id) the relay publishes messages in
// their sequence order (x-ie-seq), one at a time: a queue with one consumer
// sees them in that order (a Consumer handles its deliveries in the order
// they arrive; several consumers on one queue share them out of order).
package consumer

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"
	"go.uber.org/zap"

	"github.com/idempotent-events/idempotent-events/pkg/effects"
	"github.com/idempotent-events/idempotent-events/pkg/internal/backoff"
	"github.com/idempotent-events/idempotent-events/pkg/internal/broker"
	"github.com/idempotent-events/idempotent-events/pkg/internal/options"
	"github.com/idempotent-events/idempotent-events/pkg/internal/outbox"
)

// Message is one message from the outbox, as a handler sees it.
type Message struct {
	// ID is the idempotency key: "<event key>/<effect>".
	ID string
	// EventID and Effect are the event and the effect that enqueued it.
	EventID, Effect string
	// ObjectID and Seq are its ordering key and its place in it.
	ObjectID string
	Seq      int64
	// RoutingKey is the key it was published with.
	RoutingKey string
	Headers    map[string]string
	Body       []byte
}

// Handler does a message's effect in tx, the transaction of its ledger row.
type Handler func(ctx context.Context, m Message, tx effects.Tx) error

// BatchHandler does the effects of several messages in tx, the transaction
// of their ledger rows: one statement for a batch instead of one per
// message. msgs are the batch's new messages (duplicates already dropped),
// in their order.
type BatchHandler func(ctx context.Context, msgs []Message, tx effects.Tx) error

// Options configures a Consumer.
type Options struct {
	// Name names the consumer: its ledger rows are keyed (Name, message
	// id), so several consumers can share a database.
	Name string
	// AMQPURL is the RabbitMQ the relay publishes to.
	AMQPURL string
	// Queue is declared (durable) and bound to the outbox exchange with
	// each of RoutingKeys (topic patterns: "email.*").
	Queue       string
	RoutingKeys []string
	// Quorum declares the queue as a quorum queue (the production mode of
	// RabbitMQ clusters).
	Quorum bool
	// DB is the consumer's own database; the ledger table
	// ie_consumed_messages is created there if missing.
	DB *pgxpool.Pool
	// Handler, or BatchHandler (exactly one of them), does the effects.
	Handler      Handler
	BatchHandler BatchHandler
	// Prefetch bounds the unacked messages (64 when zero).
	Prefetch int
	// BatchSize is how many messages one transaction takes at most (32
	// when zero).
	BatchSize int
	// BatchWait is how long a batch waits after its first message for
	// more, while it has fewer than BatchSize: under a steady stream a
	// transaction then takes many messages, not one, and the consumer
	// keeps up; an idle queue's message waits this long at most (5ms when
	// zero; negative: take only the messages already delivered).
	BatchWait time.Duration
	// RetryDelay is how long a failed message waits before it is given
	// back to the queue (1s when zero).
	RetryDelay time.Duration
	Logger     *zap.Logger // zap.NewNop() when nil
}

func (o *Options) validate() error {
	p := options.Check("consumer")
	need := p.Need
	need(o.Name != "", "Name", "is required")
	need(o.AMQPURL != "", "AMQPURL", "is required")
	need(o.Queue != "", "Queue", "is required")
	need(len(o.RoutingKeys) > 0, "RoutingKeys", "must name at least one key")
	need(o.DB != nil, "DB", "is required")
	need((o.Handler != nil) != (o.BatchHandler != nil), "Handler", "or BatchHandler is required, not both")
	need(o.Prefetch >= 0, "Prefetch", "must not be negative")
	need(o.BatchSize >= 0, "BatchSize", "must not be negative")
	if err := p.Err(); err != nil {
		return err
	}
	if o.Prefetch == 0 {
		o.Prefetch = 64
	}
	if o.BatchSize == 0 {
		o.BatchSize = 32
	}
	if o.BatchWait == 0 {
		o.BatchWait = 5 * time.Millisecond
	}
	if o.Handler != nil {
		h := o.Handler
		o.BatchHandler = func(ctx context.Context, msgs []Message, tx effects.Tx) error {
			for _, m := range msgs {
				if err := h(ctx, m, tx); err != nil {
					return fmt.Errorf("message %s: %w", m.ID, err)
				}
			}
			return nil
		}
	}
	if o.RetryDelay <= 0 {
		o.RetryDelay = time.Second
	}
	if o.Logger == nil {
		o.Logger = zap.NewNop()
	}
	return nil
}

// Consumer consumes one queue; see the package documentation.
type Consumer struct {
	opts Options
	log  *zap.Logger
}

// New validates opts, creates the ledger table if it is missing, and
// returns a Consumer.
func New(ctx context.Context, opts Options) (*Consumer, error) {
	if err := opts.validate(); err != nil {
		return nil, err
	}
	if _, err := opts.DB.Exec(ctx, ledgerDDL); err != nil {
		return nil, fmt.Errorf("consumer: create ie_consumed_messages: %w", err)
	}
	return &Consumer{opts: opts, log: opts.Logger}, nil
}

const ledgerDDL = `CREATE TABLE IF NOT EXISTS ie_consumed_messages (
	consumer    text        NOT NULL,
	message_id  text        NOT NULL,
	object_id   text        NOT NULL,
	seq         bigint      NOT NULL,
	consumed_at timestamptz NOT NULL DEFAULT now(),
	PRIMARY KEY (consumer, message_id))`

// Run consumes until ctx is done, reconnecting whenever the connection is
// lost; a message being handled when ctx ends is finished first.
func (c *Consumer) Run(ctx context.Context) error {
	d := broker.Dialer{URL: c.opts.AMQPURL, Name: "idempotent-events consumer " + c.opts.Name}
	return broker.Supervise(ctx, d, c.log.Named("broker"), func(bool) {}, c.serve)
}

func (c *Consumer) serve(ctx context.Context, conn *amqp.Connection) error {
	ch, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("open channel: %w", err)
	}
	defer func() { _ = ch.Close() }()
	if err := ch.ExchangeDeclare(outbox.Exchange, "topic", true, false, false, false, nil); err != nil {
		return fmt.Errorf("declare exchange %s: %w", outbox.Exchange, err)
	}
	var args amqp.Table
	if c.opts.Quorum {
		args = amqp.Table{"x-queue-type": "quorum"}
	}
	if _, err := ch.QueueDeclare(c.opts.Queue, true, false, false, false, args); err != nil {
		return fmt.Errorf("declare queue %s: %w", c.opts.Queue, err)
	}
	for _, key := range c.opts.RoutingKeys {
		if err := ch.QueueBind(c.opts.Queue, key, outbox.Exchange, false, nil); err != nil {
			return fmt.Errorf("bind %s to %s with %q: %w", c.opts.Queue, outbox.Exchange, key, err)
		}
	}
	if err := ch.Qos(c.opts.Prefetch, 0, false); err != nil {
		return fmt.Errorf("set prefetch: %w", err)
	}
	deliveries, err := ch.Consume(c.opts.Queue, "", false, false, false, false, nil)
	if err != nil {
		return fmt.Errorf("consume %s: %w", c.opts.Queue, err)
	}
	closed := ch.NotifyClose(make(chan *amqp.Error, 1))
	work := context.WithoutCancel(ctx) // a batch being handled is finished
	batch := make([]amqp.Delivery, 0, c.opts.BatchSize)
	for {
		batch = batch[:0]
		select {
		case <-ctx.Done():
			return nil
		case err := <-closed:
			return fmt.Errorf("channel closed: %w", err)
		case d, ok := <-deliveries:
			if !ok {
				return errors.New("deliveries closed")
			}
			batch = append(batch, d)
		}
		batch = c.fill(ctx, batch, deliveries)
		if err := c.handle(work, batch); err != nil {
			c.log.Warn("messages not handled; they and the later ones come again", zap.String("first_message_id", batch[0].MessageId), zap.Error(err))
			backoff.Sleep(ctx, c.opts.RetryDelay)
			return fmt.Errorf("handle %s…: %w", batch[0].MessageId, err)
		}
	}
}

// fill adds to batch the deliveries that arrive within BatchWait of its
// first, up to BatchSize; it stops early when ctx ends or deliveries
// closes (the loop sees either next).
func (c *Consumer) fill(ctx context.Context, batch []amqp.Delivery, deliveries <-chan amqp.Delivery) []amqp.Delivery {
	var deadline <-chan time.Time
	if c.opts.BatchWait > 0 {
		t := time.NewTimer(c.opts.BatchWait)
		defer t.Stop()
		deadline = t.C
	}
	for len(batch) < c.opts.BatchSize {
		// What is already here is taken first, without waiting.
		select {
		case d, ok := <-deliveries:
			if !ok {
				return batch
			}
			batch = append(batch, d)
			continue
		default:
		}
		if deadline == nil {
			return batch
		}
		select {
		case d, ok := <-deliveries:
			if !ok {
				return batch
			}
			batch = append(batch, d)
		case <-deadline:
			return batch
		case <-ctx.Done():
			return batch
		}
	}
	return batch
}

// message reads a delivery's message.
func message(d amqp.Delivery) Message {
	m := Message{ID: d.MessageId, RoutingKey: d.RoutingKey, Body: d.Body, Headers: map[string]string{}}
	for k, v := range d.Headers {
		switch k {
		case outbox.HeaderObjectID:
			m.ObjectID, _ = v.(string)
		case outbox.HeaderSeq:
			m.Seq, _ = broker.Int(d.Headers, k)
		case outbox.HeaderEventID:
			m.EventID, _ = v.(string)
		case outbox.HeaderEffect:
			m.Effect, _ = v.(string)
		default:
			if s, ok := v.(string); ok {
				m.Headers[k] = s
			}
		}
	}
	return m
}

// handle writes the ledger rows of a batch of deliveries and, in their
// order, the effects of the messages whose rows are new, in one
// transaction, then acks the batch.
func (c *Consumer) handle(ctx context.Context, batch []amqp.Delivery) error {
	msgs := make([]Message, 0, len(batch))
	ids, objects, seqs := make([]string, 0, len(batch)), make([]string, 0, len(batch)), make([]int64, 0, len(batch))
	for _, d := range batch {
		m := message(d)
		if m.ID == "" {
			c.log.Error("message without a MessageId: not from the outbox; rejected", zap.String("routing_key", d.RoutingKey))
			if err := d.Reject(false); err != nil {
				return err
			}
			continue
		}
		msgs = append(msgs, m)
		ids, objects, seqs = append(ids, m.ID), append(objects, m.ObjectID), append(seqs, m.Seq)
	}
	err := c.inTx(ctx, ids, objects, seqs, func(fresh []string, tx effects.Tx) error {
		isNew := make(map[string]bool, len(fresh))
		for _, id := range fresh {
			isNew[id] = true
		}
		var todo []Message
		for _, m := range msgs {
			if !isNew[m.ID] {
				continue // consumed before (or twice in this batch): a duplicate
			}
			delete(isNew, m.ID)
			todo = append(todo, m)
		}
		if len(todo) == 0 {
			return nil
		}
		return c.opts.BatchHandler(ctx, todo, tx)
	})
	if err != nil {
		return err
	}
	return batch[len(batch)-1].Ack(true)
}

// insertLedger writes a batch's ledger rows and returns the ids it
// inserted: a message whose row exists was consumed before.
const insertLedger = `INSERT INTO ie_consumed_messages (consumer, message_id, object_id, seq)
SELECT $1, * FROM unnest($2::text[], $3::text[], $4::bigint[]) ON CONFLICT DO NOTHING RETURNING message_id`

// inTx runs fn in a transaction whose BEGIN and ledger insert go to
// Postgres in one round trip; fresh are the ids the insert wrote. It
// commits when fn returns nil, and rolls back otherwise.
func (c *Consumer) inTx(ctx context.Context, ids, objects []string, seqs []int64, fn func(fresh []string, tx effects.Tx) error) error {
	conn, err := c.opts.DB.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	b := &pgx.Batch{}
	b.Queue("BEGIN")
	b.Queue(insertLedger, c.opts.Name, ids, objects, seqs)
	br := conn.SendBatch(ctx, b)
	_, err = br.Exec()
	var fresh []string
	if err == nil {
		var rows pgx.Rows
		if rows, err = br.Query(); err == nil {
			fresh, err = pgx.CollectRows(rows, pgx.RowTo[string])
		}
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = fn(fresh, conn)
	}
	if err == nil {
		_, err = conn.Exec(ctx, "COMMIT")
		if err == nil {
			return nil
		}
	}
	// The connection may be mid-transaction or broken: roll back what can
	// be; the pool drops a connection that is not idle afterwards.
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	_, _ = conn.Exec(rctx, "ROLLBACK")
	return err
}
