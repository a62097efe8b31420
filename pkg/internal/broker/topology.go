package broker

import (
	"errors"
	"fmt"
	"strconv"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Names of the topology. They are part of the public interface.
const (
	Exchange   = "main_exchange"
	RoutingKey = "events"
	MainQueue  = "events.main"
	// ReplayQueue receives events an operator replays from the DLQ. It is
	// published to directly (default exchange) and consumed beside
	// events.main with a small prefetch, so a replay never blocks live traffic.
	ReplayQueue = "events.replay"
	DLQ         = "events.dlq"
	// QueuePrefix starts the name of every queue of the pipeline.
	QueuePrefix = "events."
	// RetryQueuePrefix starts the name of every retry tier queue; the delay
	// follows, e.g. events.retry.30s.
	RetryQueuePrefix = "events.retry."
)

// Queue types.
const (
	QueueClassic = "classic"
	QueueQuorum  = "quorum"
)

// Topology is the set of exchanges and queues the pipeline needs.
type Topology struct {
	// QueueType is QueueClassic or QueueQuorum.
	QueueType string
	// RetryDelays has one delay per retry attempt.
	RetryDelays []time.Duration
	// DeliveryLimit is x-delivery-limit for quorum queues.
	DeliveryLimit int
}

// RetryQueue returns the name of the retry tier queue for delay.
func RetryQueue(delay time.Duration) string {
	return RetryQueuePrefix + FormatDelay(delay)
}

// FormatDelay writes a delay in the largest whole unit: 5s, 2m, 1h, 250ms.
func FormatDelay(d time.Duration) string {
	switch {
	case d%time.Hour == 0:
		return strconv.FormatInt(int64(d/time.Hour), 10) + "h"
	case d%time.Minute == 0:
		return strconv.FormatInt(int64(d/time.Minute), 10) + "m"
	case d%time.Second == 0:
		return strconv.FormatInt(int64(d/time.Second), 10) + "s"
	}
	return strconv.FormatInt(d.Milliseconds(), 10) + "ms"
}

// RetryQueues returns the distinct retry tier queues in attempt order.
func (t Topology) RetryQueues() []string {
	var names []string
	seen := map[string]bool{}
	for _, d := range t.RetryDelays {
		n := RetryQueue(d)
		if !seen[n] {
			seen[n] = true
			names = append(names, n)
		}
	}
	return names
}

// Queues returns every queue of the topology: main, retry tiers, DLQ.
func (t Topology) Queues() []string {
	return append(append([]string{MainQueue, ReplayQueue}, t.RetryQueues()...), DLQ)
}

// DeclareOn declares the topology on a short-lived channel of conn.
//
// Every declaration and binding is sent without waiting for its answer and
// one passive declaration at the end collects them: one round trip instead
// of one per queue, which is what makes a reconnect over a slow or flaky
// link quick. If the broker refused any of them, the topology is declared
// again step by step on a fresh channel, so the error names the queue.
func (t Topology) DeclareOn(conn *amqp.Connection) error {
	ch, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("open channel: %w", err)
	}
	err = t.declare(ch, true)
	if err == nil {
		_, err = ch.QueueDeclarePassive(DLQ, true, false, false, false, nil)
	}
	_ = ch.Close()
	if err == nil {
		return nil
	}
	if conn.IsClosed() {
		// The connection failed, not a declaration.
		return fmt.Errorf("declare topology: %w", err)
	}
	if ch, err = conn.Channel(); err != nil {
		return fmt.Errorf("open channel: %w", err)
	}
	defer ch.Close()
	return t.Declare(ch)
}

// Declare creates the topology, or checks it exists with the same
// arguments, waiting for each answer. A queue that exists with other
// arguments (another QUEUE_TYPE, say) is reported by name; RabbitMQ closes
// ch in that case.
func (t Topology) Declare(ch *amqp.Channel) error {
	return t.declare(ch, false)
}

// declare sends the topology's declarations on ch; with noWait it does not
// wait for the broker's answers (a refusal then closes ch, and the next
// synchronous call on ch reports it).
func (t Topology) declare(ch *amqp.Channel, noWait bool) error {
	if err := ch.ExchangeDeclare(Exchange, amqp.ExchangeDirect, true, false, false, noWait, nil); err != nil {
		return fmt.Errorf("declare exchange %s: %w", Exchange, err)
	}
	// events.main dead-letters to the DLQ: with quorum queues that is where a
	// message beyond the delivery limit goes, instead of being dropped.
	mainArgs := t.args(true)
	mainArgs["x-dead-letter-exchange"] = ""
	mainArgs["x-dead-letter-routing-key"] = DLQ
	if t.QueueType == QueueQuorum {
		mainArgs["x-delivery-limit"] = t.DeliveryLimit
	}
	if err := declareQueue(ch, MainQueue, mainArgs, noWait); err != nil {
		return err
	}
	if err := ch.QueueBind(MainQueue, RoutingKey, Exchange, noWait, nil); err != nil {
		return fmt.Errorf("bind %s to %s: %w", MainQueue, Exchange, err)
	}
	if err := declareQueue(ch, ReplayQueue, mainArgs, noWait); err != nil {
		return err
	}
	for _, d := range t.RetryDelays {
		args := t.args(true)
		args[amqp.QueueMessageTTLArg] = d.Milliseconds()
		args["x-dead-letter-exchange"] = Exchange
		args["x-dead-letter-routing-key"] = RoutingKey
		if err := declareQueue(ch, RetryQueue(d), args, noWait); err != nil {
			return err
		}
	}
	dlqArgs := t.args(false)
	if t.QueueType == QueueQuorum {
		// The DLQ has nowhere to dead-letter to, and its messages are
		// browsed (taken and requeued) by the DLQ tools: a delivery limit
		// would drop them. RabbitMQ 4 sets one by default (20), so it is set
		// out of reach explicitly.
		dlqArgs["x-delivery-limit"] = dlqDeliveryLimit
	}
	return declareQueue(ch, DLQ, dlqArgs, noWait)
}

// dlqDeliveryLimit is x-delivery-limit of a quorum events.dlq: high enough
// never to be reached by browsing.
const dlqDeliveryLimit = 1 << 30

func (t Topology) queueType() string {
	if t.QueueType == QueueQuorum {
		return amqp.QueueTypeQuorum
	}
	return amqp.QueueTypeClassic
}

// args returns the arguments common to every queue; deadLetters says the
// queue dead-letters somewhere, which on quorum queues must be at-least-once.
func (t Topology) args(deadLetters bool) amqp.Table {
	args := amqp.Table{amqp.QueueTypeArg: t.queueType()}
	if t.QueueType == QueueQuorum && deadLetters {
		// at-least-once dead-lettering needs reject-publish overflow.
		args["x-dead-letter-strategy"] = "at-least-once"
		args[amqp.QueueOverflowArg] = amqp.QueueOverflowRejectPublish
	}
	return args
}

func declareQueue(ch *amqp.Channel, name string, args amqp.Table, noWait bool) error {
	if _, err := ch.QueueDeclare(name, true, false, false, noWait, args); err != nil {
		var aerr *amqp.Error
		if errors.As(err, &aerr) && aerr.Code == amqp.PreconditionFailed {
			return fmt.Errorf("declare queue %s: it exists with other arguments (another QUEUE_TYPE or RETRY_DELAYS?): %w", name, err)
		}
		return fmt.Errorf("declare queue %s: %w", name, err)
	}
	return nil
}
