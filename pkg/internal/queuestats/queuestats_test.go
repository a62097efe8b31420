package queuestats_test

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotent-events/idempotent-events/pkg/internal/broker"
	"github.com/idempotent-events/idempotent-events/pkg/internal/queuestats"
	"github.com/idempotent-events/idempotent-events/pkg/internal/servicetest"
)

func TestManagementURLDerivation(t *testing.T) {
	u, err := queuestats.ManagementURL("auto", "amqp://bob:pw@rabbit.svc:5672/prod")
	require.NoError(t, err)
	assert.Equal(t, "http://bob:pw@rabbit.svc:15672", u)
	u, err = queuestats.ManagementURL("off", "amqp://x")
	require.NoError(t, err)
	assert.Empty(t, u)
}

func TestCollectorReportsDepthConsumersAndAge(t *testing.T) {
	t.Parallel()
	amqpURL := servicetest.VHost(t)
	topo := broker.Topology{QueueType: broker.QueueClassic, RetryDelays: []time.Duration{time.Minute}, DeliveryLimit: 10}
	b := servicetest.NewBroker(t, amqpURL, topo)
	for i := 0; i < 3; i++ {
		b.PublishEvent([]byte(`{}`), nil)
	}
	mgmt, err := queuestats.ManagementURL("auto", servicetest.AMQPBase)
	require.NoError(t, err)
	client, err := queuestats.ForAMQP(mgmt, amqpURL)
	require.NoError(t, err)
	reg := prometheus.NewRegistry()
	c, err := queuestats.NewCollector(queuestats.CollectorOptions{Registerer: reg, Client: client, Prefix: broker.QueuePrefix, Interval: time.Minute})
	require.NoError(t, err)

	// The management API refreshes its numbers every few seconds.
	require.Eventually(t, func() bool {
		require.NoError(t, c.Poll(context.Background()))
		return servicetest.Metric(reg, "idempotent_events_queue_messages", "queue", "events.main", "state", "ready") == 3
	}, 30*time.Second, 500*time.Millisecond)
	assert.Equal(t, 1.0, servicetest.Metric(reg, "idempotent_events_queue_stats_up"))
	n, err := testutil.GatherAndCount(reg, "idempotent_events_queue_consumers")
	require.NoError(t, err)
	assert.Equal(t, 4, n, "events.main, events.replay, events.retry.1m, events.dlq")

	qs, err := client.Queues(context.Background(), broker.QueuePrefix)
	require.NoError(t, err)
	require.Len(t, qs, 4)
	assert.Equal(t, "events.dlq", qs[0].Name)

	bad, err := queuestats.New("http://guest:guest@127.0.0.1:1", "/")
	require.NoError(t, err)
	down, err := queuestats.NewCollector(queuestats.CollectorOptions{Registerer: prometheus.NewRegistry(), Client: bad, Prefix: broker.QueuePrefix, Interval: time.Minute})
	require.NoError(t, err)
	assert.Error(t, down.Poll(context.Background()))
}
