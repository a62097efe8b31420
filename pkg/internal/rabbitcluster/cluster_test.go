package rabbitcluster_test

import (
	"context"
	"errors"
	"net"
	"os"
	"strconv"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/idempotent-events/idempotent-events/pkg/internal/broker"
	"github.com/idempotent-events/idempotent-events/pkg/internal/rabbitcluster"
)

// Every goroutine a test starts must be stopped by the time it ends.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// One cluster for the package: booting three nodes takes about half a
// minute on a busy 2-core machine. Each subtest leaves every node running.
func TestCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("a three-node cluster takes half a minute to boot; make test runs it")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	c, err := rabbitcluster.Start(ctx, 3)
	if errors.Is(err, rabbitcluster.ErrNotInstalled) {
		skipOrFail(t, err.Error())
	}
	require.NoError(t, err)
	defer c.Close()

	t.Run("forms", func(t *testing.T) { testForms(ctx, t, c) })
	t.Run("a quorum queue keeps a confirmed message across its leader's kill", func(t *testing.T) { testLeaderKill(ctx, t, c) })
	t.Run("the dialer passes over node 1 while it is down", func(t *testing.T) { testDialerPassesOver(ctx, t, c) })
}

// skipOrFail fails in CI, where rabbitmq-server is installed, and skips
// elsewhere.
func skipOrFail(t *testing.T, msg string) {
	t.Helper()
	if os.Getenv("CI") != "" {
		t.Fatal(msg)
	}
	t.Skip("SKIPPED: " + msg)
}

func testForms(ctx context.Context, t *testing.T, c *rabbitcluster.Cluster) {
	for i := range c.Size() {
		running, err := c.RunningNodes(ctx, i)
		require.NoError(t, err)
		require.ElementsMatch(t, []string{c.Node(0), c.Node(1), c.Node(2)}, running, "as node %d sees it", i+1)
		conn, err := amqp.Dial(c.NodeURL(i))
		require.NoError(t, err, "node %d", i+1)
		require.NoError(t, conn.Close())
	}
	require.Len(t, broker.Nodes(c.AMQPURL()), 3)
	// Nothing of the cluster listens on the machine's own node's ports.
	for i := range c.Size() {
		require.NotEqual(t, 5672, c.Port(i))
	}
}

func testLeaderKill(ctx context.Context, t *testing.T, c *rabbitcluster.Cluster) {
	conn, err := amqp.Dial(c.NodeURL(0))
	require.NoError(t, err)
	defer conn.Close()
	ch, err := conn.Channel()
	require.NoError(t, err)
	const queue = "leader-kill"
	_, err = ch.QueueDeclare(queue, true, false, false, false, amqp.Table{amqp.QueueTypeArg: amqp.QueueTypeQuorum})
	require.NoError(t, err)
	require.NoError(t, ch.Confirm(false))
	dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", queue, true, false,
		amqp.Publishing{DeliveryMode: amqp.Persistent, Body: []byte("confirmed before the kill")})
	require.NoError(t, err)
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	acked, err := dc.WaitContext(wctx)
	require.NoError(t, err)
	require.True(t, acked)
	require.NoError(t, conn.Close())

	leader, err := c.LeaderOf(wctx, queue)
	require.NoError(t, err)
	require.NoError(t, c.Kill(leader))
	require.False(t, c.Running(leader))

	// A survivor serves the queue once a new leader is elected.
	conn, err = broker.Dialer{URL: c.AMQPURL()}.Dial()
	require.NoError(t, err)
	defer conn.Close()
	ch, err = conn.Channel()
	require.NoError(t, err)
	deliveries, err := ch.Consume(queue, "", false, false, false, false, nil)
	require.NoError(t, err)
	select {
	case d := <-deliveries:
		require.Equal(t, "confirmed before the kill", string(d.Body))
		require.NoError(t, d.Ack(false))
	case <-time.After(30 * time.Second):
		t.Fatal("the message confirmed before the leader's kill was not delivered within 30s")
	}
	newLeader, err := c.LeaderOf(wctx, queue)
	require.NoError(t, err)
	require.NotEqual(t, leader, newLeader)
	require.NoError(t, conn.Close())

	require.NoError(t, c.Restart(ctx, leader))
	require.NoError(t, c.AwaitMember(wctx, leader, queue))
}

func testDialerPassesOver(ctx context.Context, t *testing.T, c *rabbitcluster.Cluster) {
	require.NoError(t, c.Kill(0))
	down := strconv.Itoa(c.Port(0))
	d := broker.Dialer{URL: c.AMQPURL(), DialTimeout: 5 * time.Second}
	// Every start of the rotation, node 1's included, ends on a survivor.
	for range 2 * c.Size() {
		conn, err := d.Dial()
		require.NoError(t, err)
		_, port, err := net.SplitHostPort(conn.RemoteAddr().String())
		require.NoError(t, err)
		require.NotEqual(t, down, port)
		require.NoError(t, conn.Close())
	}
	_, err := broker.Dialer{URL: c.NodeURL(0)}.Dial()
	require.Error(t, err, "node 1 alone is down")
	require.NoError(t, c.Restart(ctx, 0))
}
