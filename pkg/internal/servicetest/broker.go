package servicetest

import (
	"context"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/idempotent-events/idempotent-events/pkg/internal/broker"
)

// Broker is a test's own connection to its vhost, for declaring, peeking
// and publishing.
type Broker struct {
	t    testing.TB
	URL  string
	conn *amqp.Connection
	ch   *amqp.Channel
}

// NewBroker connects to amqpURL and declares topo there.
func NewBroker(t testing.TB, amqpURL string, topo broker.Topology) *Broker {
	t.Helper()
	conn, err := amqp.Dial(amqpURL)
	require.NoError(t, err, "dial test broker")
	t.Cleanup(func() { _ = conn.Close() })
	ch, err := conn.Channel()
	require.NoError(t, err)
	require.NoError(t, topo.Declare(ch))
	return &Broker{t: t, URL: amqpURL, conn: conn, ch: ch}
}

// Depth returns the number of ready messages in queue. Unacked messages are
// not counted; once their consumer's channel is gone they are ready again.
func (b *Broker) Depth(queue string) int {
	b.t.Helper()
	q, err := b.ch.QueueDeclarePassive(queue, true, false, false, false, nil)
	require.NoError(b.t, err, "inspect %s", queue)
	return q.Messages
}

// Get takes one message from queue and acks it; ok is false when the queue
// is empty.
func (b *Broker) Get(queue string) (amqp.Delivery, bool) {
	b.t.Helper()
	d, ok, err := b.ch.Get(queue, true)
	require.NoError(b.t, err, "get from %s", queue)
	return d, ok
}

// Drain takes every message from queue.
func (b *Broker) Drain(queue string) []amqp.Delivery {
	b.t.Helper()
	var out []amqp.Delivery
	for {
		d, ok := b.Get(queue)
		if !ok {
			return out
		}
		out = append(out, d)
	}
}

// PublishTo publishes body straight to queue through the default exchange,
// as a DLQ replay does, and waits for the confirm.
func (b *Broker) PublishTo(queue string, body []byte) {
	b.t.Helper()
	b.publish("", queue, body, nil)
}

// PublishEvent publishes body to main_exchange with routing key events,
// with extra headers but no MessageId, and waits for the broker's confirm.
func (b *Broker) PublishEvent(body []byte, headers amqp.Table) {
	b.t.Helper()
	b.publish(broker.Exchange, broker.RoutingKey, body, headers)
}

// PublishEventWithID is PublishEvent with a MessageId.
func (b *Broker) PublishEventWithID(body []byte, messageID string, headers amqp.Table) {
	b.t.Helper()
	b.publishID(broker.Exchange, broker.RoutingKey, body, messageID, headers)
}

func (b *Broker) publish(exchange, key string, body []byte, headers amqp.Table) {
	b.t.Helper()
	b.publishID(exchange, key, body, "", headers)
}

func (b *Broker) publishID(exchange, key string, body []byte, messageID string, headers amqp.Table) {
	b.t.Helper()
	ch, err := broker.OpenConfirmChannel(b.conn)
	require.NoError(b.t, err)
	defer ch.Close()
	h := amqp.Table{broker.HeaderSource: "stripe", broker.HeaderReceivedAt: time.Now().UnixMilli()}
	for k, v := range headers {
		h[k] = v
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(b.t, ch.Publish(ctx, exchange, key, amqp.Publishing{
		ContentType: "application/json", MessageId: messageID, Body: body, Headers: h, Timestamp: time.Now(),
	}))
}
