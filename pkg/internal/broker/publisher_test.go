package broker_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap/zaptest"

	"github.com/idempotent-events/idempotent-events/pkg/internal/broker"
	"github.com/idempotent-events/idempotent-events/pkg/internal/faulttest"
	"github.com/idempotent-events/idempotent-events/pkg/internal/servicetest"
)

var topo = broker.Topology{QueueType: broker.QueueClassic, RetryDelays: []time.Duration{time.Second, 5 * time.Second, 5 * time.Second}, DeliveryLimit: 100}

// startPublisher runs a supervised Publisher against amqpURL until the test
// ends, and waits until it is ready.
func startPublisher(t *testing.T, amqpURL string) *broker.Publisher {
	t.Helper()
	pub := &broker.Publisher{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		d := broker.Dialer{URL: amqpURL, Name: t.Name(), MaxBackoff: 200 * time.Millisecond, DialTimeout: time.Second}
		_ = broker.Supervise(ctx, d, zaptest.NewLogger(t), func(bool) {}, func(ctx context.Context, conn *amqp.Connection) error {
			if err := topo.DeclareOn(conn); err != nil {
				return err
			}
			return pub.Serve(ctx, conn, 2)
		})
	}()
	t.Cleanup(func() { cancel(); <-done })
	require.Eventually(t, pub.Ready, 10*time.Second, 10*time.Millisecond, "publisher never became ready")
	return pub
}

func publish(pub *broker.Publisher, key, body string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return pub.Publish(ctx, broker.Exchange, key, amqp.Publishing{Body: []byte(body)})
}

func TestPublishIsConfirmedAndPersistent(t *testing.T) {
	t.Parallel()
	url := servicetest.VHost(t)
	b := servicetest.NewBroker(t, url, topo)
	pub := startPublisher(t, url)

	require.NoError(t, publish(pub, broker.RoutingKey, `{"n":1}`))
	d, ok := b.Get(broker.MainQueue)
	require.True(t, ok)
	assert.Equal(t, `{"n":1}`, string(d.Body))
	assert.Equal(t, amqp.Persistent, d.DeliveryMode)
}

func TestUnroutablePublishIsAnError(t *testing.T) {
	t.Parallel()
	url := servicetest.VHost(t)
	b := servicetest.NewBroker(t, url, topo)
	pub := startPublisher(t, url)

	err := publish(pub, "no-such-binding", "x")
	require.ErrorIs(t, err, broker.ErrReturned)
	assert.Equal(t, 0, b.Depth(broker.MainQueue))
}

// Returns and confirms of many concurrent publishes must be matched to the
// right publisher: exactly the unroutable ones fail.
func TestConcurrentPublishesMatchReturnsToTheirPublish(t *testing.T) {
	t.Parallel()
	url := servicetest.VHost(t)
	b := servicetest.NewBroker(t, url, topo)
	pub := startPublisher(t, url)

	const n = 2000
	errs := make([]error, n)
	var wg sync.WaitGroup
	sem := make(chan struct{}, 128)
	for i := 0; i < n; i++ {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			key := broker.RoutingKey
			if i%3 == 0 {
				key = "unroutable"
			}
			errs[i] = publish(pub, key, fmt.Sprint(i))
		})
	}
	wg.Wait()
	routed := 0
	for i, err := range errs {
		if i%3 == 0 {
			require.ErrorIs(t, err, broker.ErrReturned, "publish %d", i)
		} else {
			require.NoError(t, err, "publish %d", i)
			routed++
		}
	}
	require.Eventually(t, func() bool { return b.Depth(broker.MainQueue) == routed }, 10*time.Second, 50*time.Millisecond)
}

func TestPublishFailsFastWhileDisconnectedAndRecovers(t *testing.T) {
	t.Parallel()
	url := servicetest.VHost(t)
	b := servicetest.NewBroker(t, url, topo)
	proxy, err := faulttest.Start("127.0.0.1:5672")
	require.NoError(t, err)
	t.Cleanup(proxy.Close)
	pub := startPublisher(t, viaProxy(url, proxy))

	proxy.SetDown(true)
	require.Eventually(t, func() bool { return !pub.Ready() }, 10*time.Second, 10*time.Millisecond)
	err = publish(pub, broker.RoutingKey, "lost?")
	require.ErrorIs(t, err, broker.ErrUnavailable)

	proxy.SetDown(false)
	require.Eventually(t, pub.Ready, 10*time.Second, 10*time.Millisecond)
	require.NoError(t, publish(pub, broker.RoutingKey, "after"))
	assert.Equal(t, 1, b.Depth(broker.MainQueue), "only the confirmed publish is in the queue")
}

func TestTopologyDeclareIsIdempotentForBothQueueTypes(t *testing.T) {
	t.Parallel()
	for _, qt := range []string{broker.QueueClassic, broker.QueueQuorum} {
		url := servicetest.VHost(t)
		tp := topo
		tp.QueueType = qt
		conn, err := amqp.Dial(url)
		require.NoError(t, err)
		defer conn.Close()
		require.NoError(t, tp.DeclareOn(conn), qt)
		require.NoError(t, tp.DeclareOn(conn), "second declare of %s", qt)
		ch, err := conn.Channel()
		require.NoError(t, err)
		for _, q := range tp.Queues() {
			_, err := ch.QueueDeclarePassive(q, true, false, false, false, nil)
			require.NoError(t, err, "queue %s (%s)", q, qt)
		}
		assert.Equal(t, []string{"events.main", "events.replay", "events.retry.1s", "events.retry.5s", "events.dlq"}, tp.Queues())
	}
}

func TestTopologyConflictNamesTheQueue(t *testing.T) {
	t.Parallel()
	conn := declaredVHost(t)
	quorum := topo
	quorum.QueueType = broker.QueueQuorum
	err := quorum.DeclareOn(conn)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "events.main")
	var aerr *amqp.Error
	assert.ErrorAs(t, err, &aerr)
}

// Retry tier queues hold a message for their TTL, then dead-letter it back
// to main_exchange/events.
func TestRetryTierDeadLettersBackToMain(t *testing.T) {
	t.Parallel()
	url := servicetest.VHost(t)
	b := servicetest.NewBroker(t, url, topo)
	conn, err := amqp.Dial(url)
	require.NoError(t, err)
	defer conn.Close()
	cc, err := broker.OpenConfirmChannel(conn)
	require.NoError(t, err)
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	require.NoError(t, cc.Publish(ctx, "", broker.RetryQueue(time.Second), amqp.Publishing{Body: []byte("later")}))
	assert.Equal(t, 1, b.Depth(broker.RetryQueue(time.Second)))
	require.Eventually(t, func() bool { return b.Depth(broker.MainQueue) == 1 }, 10*time.Second, 50*time.Millisecond)
	assert.Equal(t, 0, b.Depth(broker.RetryQueue(time.Second)))
}

func TestFormatDelay(t *testing.T) {
	for d, want := range map[time.Duration]string{
		5 * time.Second: "5s", 30 * time.Second: "30s", 2 * time.Minute: "2m", time.Hour: "1h",
		90 * time.Second: "90s", 250 * time.Millisecond: "250ms",
	} {
		assert.Equal(t, want, broker.FormatDelay(d))
	}
}

func viaProxy(amqpURL string, p *faulttest.Proxy) string {
	return servicetest.ReplaceHost(amqpURL, p.Addr())
}

// The pipelined declaration also names a queue refused late in the
// sequence, and a reconnect on an unchanged topology costs no error.
func TestTopologyConflictOnALaterQueueIsNamed(t *testing.T) {
	t.Parallel()
	conn := declaredVHost(t)
	other := topo
	other.RetryDelays = []time.Duration{time.Second, 5 * time.Second}
	ch, err := conn.Channel()
	require.NoError(t, err)
	// events.dlq exists with another queue type than the topology says.
	_, err = ch.QueueDelete(broker.DLQ, false, false, false)
	require.NoError(t, err)
	_, err = ch.QueueDeclare(broker.DLQ, true, false, false, false, amqp.Table{amqp.QueueTypeArg: amqp.QueueTypeQuorum})
	require.NoError(t, err)
	require.NoError(t, ch.Close())
	err = other.DeclareOn(conn)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "declare queue events.dlq")
	assert.False(t, conn.IsClosed(), "a refused declaration closes a channel, not the connection")
}

// declaredVHost connects to a new vhost holding topo.
func declaredVHost(t *testing.T) *amqp.Connection {
	t.Helper()
	conn, err := amqp.Dial(servicetest.VHost(t))
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	require.NoError(t, topo.DeclareOn(conn))
	return conn
}
