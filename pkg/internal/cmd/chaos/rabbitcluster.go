package main

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idempotent-events/idempotent-events/pkg/internal/broker"
	"github.com/idempotent-events/idempotent-events/pkg/internal/rabbitcluster"
)

// clusterMinDuration is the least the rabbit-cluster scenario's deliveries
// span: both kills, each followed by the node's restart and its replica of
// events.main catching up (10–20 s on the 2-core machine), come while
// they flow.
const clusterMinDuration = 45 * time.Second

// clusterRun is the rabbit-cluster scenario's broker: a private three-node
// RabbitMQ cluster (rabbitcluster) on loopback ports, with quorum queues.
type clusterRun struct {
	*rabbitcluster.Cluster
	// notes say what the faults did, one line each.
	notes []string
}

// startCluster boots the cluster, before the scenario's processes start.
func startCluster(ctx context.Context) *clusterRun {
	started := time.Now()
	c, err := rabbitcluster.Start(ctx, 3)
	check(err)
	return &clusterRun{Cluster: c, notes: []string{fmt.Sprintf("nodes %s, %s, %s on ports %d, %d, %d, booted and joined in %s; quorum queues",
		c.Node(0), c.Node(1), c.Node(2), c.Port(0), c.Port(1), c.Port(2), time.Since(started).Round(100*time.Millisecond))}}
}

// env is what every binary of the rabbit-cluster scenario gets on top of
// its usual environment (system.privateEnv): the cluster's nodes as
// AMQP_URL, and quorum queues.
func (c *clusterRun) env() []string {
	return []string{"AMQP_URL=" + c.AMQPURL(), "QUEUE_TYPE=quorum"}
}

// dialBroker connects the checks to the broker the pipeline runs on,
// without a fault proxy.
func (s *system) dialBroker() (*amqp.Connection, error) {
	if s.cluster != nil {
		return broker.Dialer{URL: s.cluster.AMQPURL(), Name: "chaos checks"}.Dial()
	}
	return amqp.Dial(s.stack.AMQPURL)
}

// killClusterLeaders SIGKILLs the node leading events.main once a
// quarter of the deliveries were answered 2xx, restarts it and waits until
// its replica of events.main has caught up; then, once half of them were,
// does the same to the node that leads events.main by then (the one
// elected after the first kill). It runs to the end even when the
// deliveries are done first: both nodes are back before the checks.
func killClusterLeaders(sys *system, stop <-chan struct{}, o options) int {
	c := sys.cluster
	start := time.Now()
	deliveries := int64(3 * o.events * (1 + o.dups))
	const down = 3 * time.Second
	for k := int64(1); k <= 2; k++ {
		answered := awaitAnswers(sys, stop, deliveries*k/4)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		leader, err := c.LeaderOf(ctx, broker.MainQueue)
		check(err)
		at := time.Since(start)
		check(c.Kill(leader))
		sending := "while sending"
		select {
		case <-stop:
			sending = "after the last delivery was answered"
		default:
		}
		killed := time.Now()
		next, err := c.LeaderOf(ctx, broker.MainQueue)
		check(err)
		elected := time.Since(killed)
		time.Sleep(max(down-time.Since(killed), 0))
		restarted := time.Now()
		check(c.Restart(ctx, leader))
		booted := time.Since(restarted)
		rejoined := time.Now()
		check(c.AwaitMember(ctx, leader, broker.MainQueue))
		cancel()
		c.notes = append(c.notes, fmt.Sprintf("kill %d: node %d, leader of %s, SIGKILLed at %s (%d of %d deliveries answered 2xx) %s; "+
			"node %d led it %s later; restarted after %s down, running in %s, its replica caught up %s later",
			k, leader+1, broker.MainQueue, at.Round(100*time.Millisecond), answered, deliveries, sending,
			next+1, elected.Round(100*time.Millisecond), down, booted.Round(100*time.Millisecond),
			time.Since(rejoined).Round(100*time.Millisecond)))
	}
	return 2
}

// awaitAnswers returns the number of deliveries answered 2xx once it
// reaches want, or once the deliveries are done.
func awaitAnswers(sys *system, stop <-chan struct{}, want int64) int64 {
	for {
		n := sys.answers.ok.Load()
		if n >= want {
			return n
		}
		select {
		case <-stop:
			return n
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// answers counts the receiver's answers to the deliveries: 2xx, and 503.
type answers struct {
	ok, unavailable atomic.Int64
}

func (a *answers) count(code int) {
	switch code {
	case 200, 202:
		a.ok.Add(1)
	case 503:
		a.unavailable.Add(1)
	}
}

// note is what the scenario prints under its line: the cluster and its
// kills, and the receiver's answers.
func (c *clusterRun) note(r result, accepted int, answered503 int64) string {
	lines := append([]string{}, c.notes...)
	kept := "every one processed"
	if r.lost > 0 {
		kept = fmt.Sprintf("%d of them NOT processed", r.lost)
	}
	lines = append(lines, fmt.Sprintf("receiver: %d events answered 2xx, %s; %d deliveries answered 503 (of %d requests)",
		accepted, kept, answered503, r.sent))
	for i := range lines {
		lines[i] = "  rabbit-cluster: " + lines[i]
	}
	return strings.Join(lines, "\n")
}
