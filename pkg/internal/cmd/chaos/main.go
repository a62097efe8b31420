// Command chaos runs the real receiver, workers and a downstream consumer
// as separate processes against the local services: the workers are the
// examples' orders worker (the stock payment effect, an orders row and a
// confirmation email through the outbox on every succeeded payment, its
// outbox relay inside) and the consumer is the examples' confirmations
// service (one sent_emails row per email, with the consumer kit). It sends
// N payments of three events each (payment_intent.processing,
// payment_failed, succeeded: a retried debit, 10 s apart by their created
// times) with k duplicates of every event (signed, concurrent, shuffled,
// every delivery retried until the receiver answers 2xx, as a provider
// would), injects faults while they flow, and then checks:
//
//   - processed: payments rows == 3N, and every 2xx'd event has its row (lost = 0)
//   - doubled: no event id twice in processed_events or payments
//   - DLQ and retry queues empty, events.main drained, the outbox
//     published, one orders row per payment (left)
//   - state: every payment's PaymentIntent ends as its events in order
//     leave it (succeeded), whatever order they came in
//   - emails: one sent_emails row per payment at the consumer, none lost,
//     none doubled
//
// It prints one line of figures per scenario and exits 1 on any loss,
// double, leftover or wrong state. Faults: SIGKILL of workers (and so of
// their relays), of the receiver and of the consumer, Redis FLUSHALL and
// Redis refusing connections, Postgres connections cut mid-transaction and
// Postgres refusing connections, RabbitMQ connections cut and a real broker
// restart (rabbitmqctl stop_app/start_app), latency on every dependency —
// each a scenario, and all of them combined. In relay-apart the outbox
// relay runs in processes of its own (OUTBOX_RELAY=only, the workers
// OUTBOX_RELAY=off), and those are SIGKILLed. Network faults go through TCP
// proxies (faulttest) in front of the real services.
//
// In the reconcile scenario the provider gives up on a tenth of the events
// for good (their deliveries signed with a wrong secret, answered 401), and
// the real eventsctl reconcile, run against an in-process Stripe events API
// (harness.StripeEvents) and SIGKILLed once at a random moment, must bring
// every one of them, and only them, into the ledger.
//
// In the rabbit-cluster scenario the pipeline runs on a private three-node
// RabbitMQ cluster with quorum queues (rabbitcluster); the node leading
// events.main is SIGKILLed mid-load and restarted, then the next leader.
//
// In the redis-sentinel scenario the fast path runs on a private
// Sentinel-managed Redis (redissentinel: a master, its replica, three
// sentinels), reached through REDIS_URL's failover form. Once a third of
// the deliveries were answered 2xx the master is SIGKILLed, the sentinels
// promote the replica, and the old master is restarted and made the new
// one's replica; once it has caught up (and two thirds were answered), the
// new master is killed the same way if the deliveries are still flowing.
// Redis is a hint: the failovers may only cost fast-path misses, which the
// ledger answers. The scenario's note says how many Redis errors and
// misses there were, before, during and after each failover.
//
// In the rollout scenario two worker binaries with different handler sets
// consume together while the releases alternate, as rolling deploys and
// rollbacks run them (rollout.go): the stock worker (the payment state)
// and the orders worker (plus orders.create). Each switch announces a
// release with the real migrate (WORKER_RELEASE, the chart's hook) and
// starts a worker of it; then a worker of the replaced release is
// restarted, which must say it is fenced; workers are SIGKILLed at random
// all along. Besides the usual checks (the orders and emails expected only
// for the succeeded payments committed by the orders set), every event
// must have been committed by the handler set that was current at its
// commit: none skipped, per handler. -rollout-unfenced is its negative
// control, which must fail:
//
//	go run ./pkg/internal/cmd/chaos -scenarios rollout -rollout-unfenced -events 500 -dups 3 -duration 8s
//
// The pg-failover scenario, chosen by name (it is not in "all": it runs on
// a private Postgres cluster instead of the shared one), puts the ledger
// on a primary and a synchronous standby (pgcluster), reached through a
// multi-host DATABASE_URL with target_session_attrs=read-write, and fails
// it over -pg-failovers times while events flow: the primary SIGKILLed,
// the standby promoted, the old primary rebuilt as the new one's standby.
// The checks are the same, on the final primary. With -pg-async the
// standby is asynchronous: the negative control, which loses events.
//
//	go run ./pkg/internal/cmd/chaos -events 50000 -dups 3 -duration 60s -pg-outage 60s -flushall   # make chaos
//	go run ./pkg/internal/cmd/chaos -events 500 -dups 3 -duration 8s -pg-outage 10s                # make chaos-short, part of make test
//	go run ./pkg/internal/cmd/chaos -scenarios pg-failover -events 20000 -dups 0 -duration 60s -pg-failovers 5 -pg-failover-every 10s
//	go run ./pkg/internal/cmd/chaos -scenarios pg-failover -pg-async -repeat 3 -events 2000 -dups 0 -duration 16s -pg-failovers 3 -pg-failover-every 4s
//
// (The first is in make chaos, the second, the negative control, is not.
// Each event is delivered once: a redelivery would write a row the
// failover lost again, and hide the loss.)
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/idempotent-events/idempotent-events/pkg/internal/broker"
	"github.com/idempotent-events/idempotent-events/pkg/internal/faulttest"
	"github.com/idempotent-events/idempotent-events/pkg/internal/harness"
	"github.com/idempotent-events/idempotent-events/pkg/internal/pgcluster"
	"github.com/idempotent-events/idempotent-events/pkg/internal/servicetest"
)

type options struct {
	events, dups, workers, conc int
	combinedConc                int
	// pace stretches the intervals between faults (1 in the single scenarios).
	pace, combinedPace      float64
	pgOutage, duration      time.Duration
	scenarios               string
	brokerRestart, flushAll bool
	repeat                  int
	// The pg-failover scenario's cluster and schedule.
	pgAsync                  bool
	pgFailovers              int
	pgFailoverEvery, pgDelay time.Duration
	// rolloutUnfenced is the rollout scenario's negative control.
	rolloutUnfenced bool
}

func main() {
	var o options
	flag.IntVar(&o.events, "events", 2000, "unique events per scenario")
	flag.IntVar(&o.dups, "dups", 3, "duplicates of each event (each event is delivered 1+dups times)")
	flag.IntVar(&o.workers, "workers", 2, "worker processes")
	flag.IntVar(&o.conc, "concurrency", 48, "concurrent senders")
	flag.Float64Var(&o.combinedPace, "combined-pace", 3, "in the combined scenario each fault source waits this many times longer between faults than in its own scenario (six sources at once)")
	flag.IntVar(&o.combinedConc, "combined-concurrency", 512, "concurrent senders in the combined scenario: under every fault at once most deliveries sit in a sender's retry backoff, so more are in flight, as with a provider")
	flag.DurationVar(&o.pgOutage, "pg-outage", 60*time.Second, "length of the Postgres outage scenario")
	flag.DurationVar(&o.duration, "duration", 10*time.Second, "spread each scenario's deliveries over at least this long, so faults hit them while they flow")
	flag.StringVar(&o.scenarios, "scenarios", "all", "comma-separated scenarios, or all: "+strings.Join(names(), ",")+
		" (pg-failover, on a private Postgres cluster, only by name)")
	flag.IntVar(&o.repeat, "repeat", 1, "run each selected scenario this many times")
	flag.BoolVar(&o.pgAsync, "pg-async", false, "pg-failover with asynchronous replication: the negative control, which must lose events")
	flag.IntVar(&o.pgFailovers, "pg-failovers", 3, "pg-failover: how many times the primary is SIGKILLed and the standby promoted")
	flag.DurationVar(&o.pgFailoverEvery, "pg-failover-every", 10*time.Second, "pg-failover: mean time from the end of a failover (the old primary a standby again) to the next kill, drawn from 0.5–1.5 times it")
	flag.DurationVar(&o.pgDelay, "pg-replication-delay", 2*time.Millisecond, "pg-failover: delay each way on the replication link between the nodes (a long link, not a slow one)")
	flag.BoolVar(&o.rolloutUnfenced, "rollout-unfenced", false, "rollout with the old workers unfenced (a private copy of handler_generations): the negative control, which must fail")
	flag.BoolVar(&o.brokerRestart, "broker-restart", true, "restart the real RabbitMQ (rabbitmqctl stop_app/start_app) in the broker and combined scenarios")
	flag.BoolVar(&o.flushAll, "flushall", false, "use a real FLUSHALL in the redis scenarios (it empties the whole shared Redis); otherwise the run's own keys are deleted")
	flag.Parse()

	binDir, err := os.MkdirTemp("", "ie-chaos-bin")
	check(err)
	defer os.RemoveAll(binDir)
	check(harness.Build(binDir))

	selected := names()
	if o.scenarios != "all" {
		selected = strings.Split(o.scenarios, ",")
	}
	if o.pgAsync && !slices.Contains(selected, "pg-failover") {
		check(errors.New("-pg-async applies to the pg-failover scenario, which is not selected"))
	}
	if o.rolloutUnfenced && !slices.Contains(selected, "rollout") {
		check(errors.New("-rollout-unfenced applies to the rollout scenario, which is not selected"))
	}
	fmt.Printf("%-16s %8s %8s %7s %9s %5s %7s %4s %4s %5s %6s %9s %8s  %s\n",
		"scenario", "events", "sent", "faults", "processed", "lost", "doubled", "dlq", "left", "state", "emails", "lost/dbl", "wall",
		"peak RSS receiver/worker MiB")
	failed := false
	for _, name := range selected {
		sc, ok := scenarios[name]
		if !ok {
			check(fmt.Errorf("unknown scenario %q", name))
		}
		for range o.repeat {
			r := runScenario(context.Background(), binDir, name, sc, o)
			fmt.Println(r.line())
			if r.note != "" {
				fmt.Println(r.note)
			}
			if !r.ok() {
				failed = true
				fmt.Println(r.detail)
			}
		}
	}
	if failed {
		fmt.Println("chaos: FAILED")
		os.Exit(1)
	}
	fmt.Println("chaos: every scenario: 0 lost, 0 doubled, nothing left behind")
}

func check(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, "chaos:", err)
		atExitMu.Lock() // held: a second failing goroutine waits here until the exit
		for _, f := range atExit {
			f()
		}
		os.Exit(2)
	}
}

// atExit is what check must still do before it exits: os.Exit runs no
// deferred call, and a private Postgres or RabbitMQ cluster would outlive
// the run.
var (
	atExitMu sync.Mutex
	atExit   []func()
)

// onExit adds f to what check does before it exits.
func onExit(f func()) {
	atExitMu.Lock()
	defer atExitMu.Unlock()
	atExit = append(atExit, f)
}

// faultSource injects faults into a running system until stop is closed
// and returns how many it injected.
type faultSource func(sys *system, stop <-chan struct{}, o options) int

// scenario is what goes wrong in one run.
type scenario struct {
	// faults, when set, runs while the events flow.
	faults faultSource
	// reject is the share of the events, chosen at random, that the
	// provider delivers only with a wrong signature: the receiver answers
	// 401 to each of their deliveries and the sender gives up on them for
	// good, as Stripe does at the end of its retry window while an
	// endpoint's secret is wrong. Only a recovery brings them back.
	reject float64
	// recover, when set, runs once the deliveries settled, against the
	// provider's record of every event (system.stripe).
	recover func(ctx context.Context, sys *system, ids []string, rejected map[string]bool, o options) recovery
	// rabbitCluster runs the pipeline on a private three-node RabbitMQ
	// cluster with quorum queues (system.cluster) instead of the machine's
	// broker, its deliveries spread over clusterMinDuration at least.
	rabbitCluster bool
	// redisSentinel runs the fast path on a private Sentinel-managed Redis
	// (system.sentinel) instead of the machine's Redis, its deliveries
	// spread over sentinelMinDuration at least.
	redisSentinel bool
	// relayApart runs the outbox relay as the chart's
	// outbox.relay.mode=deployment does: relayProcs processes of the
	// orders binary with OUTBOX_RELAY=only (system.relays), the workers
	// with OUTBOX_RELAY=off.
	relayApart bool
	// rollout runs the old and new workers of rollout.go (system.rollout)
	// instead of o.workers orders workers, and checks the handler sets.
	rollout bool
}

// relayProcs is how many relay processes a relayApart scenario runs.
const relayProcs = 2

// recovery is what a scenario's recovery did.
type recovery struct {
	// faults it injected itself (a SIGKILLed reconciler run).
	faults int
	// note says what it did, under the scenario's line.
	note string
	// problems are what it got wrong; any fails the scenario.
	problems []string
}

var scenarios = map[string]scenario{
	"baseline":        {},
	"kill-workers":    {faults: killWorkers},
	"kill-receiver":   {faults: killReceiver},
	"redis":           {faults: redisFaults},
	"redis-sentinel":  {faults: killRedisMasters, redisSentinel: true},
	"postgres-cuts":   {faults: postgresCuts},
	"rabbitmq":        {faults: rabbitFaults},
	"rabbit-cluster":  {faults: killClusterLeaders, rabbitCluster: true},
	"latency":         {faults: latency},
	"postgres-outage": {faults: postgresOutage},
	"relay-kill":      {faults: relayKill},
	"relay-apart":     {faults: relayKill, relayApart: true},
	"combined":        {faults: combined},
	"reconcile":       {reject: 0.1, recover: reconcileRejected},
	"rollout":         {faults: rollout, rollout: true},
	"pg-failover":     {faults: pgFailover},
}

func names() []string {
	return []string{"baseline", "kill-workers", "kill-receiver", "redis", "redis-sentinel", "postgres-cuts", "rabbitmq", "rabbit-cluster", "latency",
		"postgres-outage", "relay-kill", "relay-apart", "combined", "reconcile", "rollout"}
}

// system is the running pipeline: proxies in front of the services, one
// receiver and o.workers workers.
type system struct {
	stack             *harness.Stack
	pg, redis, rabbit *faulttest.Proxy
	// dbURL is the workers' and the consumer's DATABASE_URL: the pg proxy
	// in front of the shared Postgres, or the private cluster's multi-host
	// URL.
	dbURL string
	// pgCluster is pg-failover's private Postgres cluster; asyncLedger
	// says its standby is asynchronous, which the workers must be told to
	// accept (DURABILITY_ALLOW_ASYNC).
	pgCluster   *pgcluster.Cluster
	asyncLedger bool
	// faultErr is set when a scenario could not inject its faults.
	faultErr error
	httpAddr string
	mu       sync.Mutex
	receiver *harness.Proc
	workers  []*harness.Proc
	consumer *harness.Proc
	// relays are the relay processes of a relayApart scenario; none
	// otherwise (the relays run in the workers).
	relays                   []*harness.Proc
	receiverPeak, workerPeak int64
	// stripe is the provider's record of the scenario's events, in the
	// scenarios with a recovery.
	stripe *harness.StripeEvents
	// cluster is the rabbit-cluster scenario's broker.
	cluster *clusterRun
	// sentinel is the redis-sentinel scenario's Redis.
	sentinel *sentinelRun
	// rollout is the rollout scenario's releases and workers.
	rollout *rolloutRun
	// receiverMetrics and workerMetrics are the processes' METRICS_ADDR.
	receiverMetrics string
	workerMetrics   []string
	// answers counts the receiver's answers to the deliveries.
	answers answers
}

func (s *system) receiverEnv(metricsAddr string) []string {
	return s.stack.Env("WEBHOOK_SECRETS=whsec_chaos", "HTTP_ADDR="+s.httpAddr, "METRICS_ADDR="+metricsAddr,
		"AMQP_URL="+servicetest.ReplaceHost(s.stack.AMQPURL, s.rabbit.Addr()),
		"REDIS_URL="+servicetest.ReplaceHost(s.stack.RedisURL, s.redis.Addr()),
		"PUBLISH_TIMEOUT=3s", "AMQP_RECONNECT_MAX_BACKOFF=2s", "SHUTDOWN_TIMEOUT=5s")
}

func (s *system) workerEnv(metricsAddr string) []string {
	return s.stack.Env("METRICS_ADDR="+metricsAddr, "RABBITMQ_MANAGEMENT_URL=off",
		"AMQP_URL="+servicetest.ReplaceHost(s.stack.AMQPURL, s.rabbit.Addr()),
		"REDIS_URL="+servicetest.ReplaceHost(s.stack.RedisURL, s.redis.Addr()),
		"DATABASE_URL="+s.dbURL,
		"RETRY_DELAYS=1s,2s,5s,10s,30s", "PROCESS_TIMEOUT=5s", "PUBLISH_TIMEOUT=3s",
		"AMQP_RECONNECT_MAX_BACKOFF=2s", "SHUTDOWN_TIMEOUT=5s", fmt.Sprintf("DURABILITY_ALLOW_ASYNC=%t", s.asyncLedger))
}

// privateEnv is what every binary gets on top of its usual environment
// (later entries win) in the scenarios that run a service of their own
// instead of the machine's: rabbit-cluster's broker, redis-sentinel's
// Redis. It is empty in the other scenarios.
func (s *system) privateEnv() []string {
	var env []string
	if s.cluster != nil {
		env = append(env, s.cluster.env()...)
	}
	if s.sentinel != nil {
		env = append(env, s.sentinel.env()...)
	}
	return env
}

func (s *system) startReceiver() {
	metrics := harness.FreeAddr()
	p, err := s.stack.Start("receiver", "receiver", append(s.receiverEnv(metrics), s.privateEnv()...))
	check(err)
	s.mu.Lock()
	s.receiver, s.receiverMetrics = p, metrics
	s.mu.Unlock()
}

// startWorker starts the examples' orders worker: the stock worker's
// payment effect, an orders row and a confirmation email through the
// outbox on every succeeded payment; its outbox relay runs in it.
func (s *system) startWorker(i int) {
	metrics := harness.FreeAddr()
	env := s.workerEnv(metrics)
	if len(s.relays) > 0 {
		env = append(env, "OUTBOX_RELAY=off")
	}
	p, err := s.stack.Start(fmt.Sprintf("worker-%d", i), "orders", append(env, s.privateEnv()...))
	check(err)
	s.mu.Lock()
	s.workers[i], s.workerMetrics[i] = p, metrics
	s.mu.Unlock()
}

// startRelay starts relay i of a relayApart scenario: the orders binary
// with OUTBOX_RELAY=only, which publishes the outbox and consumes nothing.
func (s *system) startRelay(i int) {
	p, err := s.stack.Start(fmt.Sprintf("relay-%d", i), "orders",
		append(append(s.workerEnv(harness.FreeAddr()), "OUTBOX_RELAY=only"), s.privateEnv()...))
	check(err)
	s.mu.Lock()
	s.relays[i] = p
	s.mu.Unlock()
}

// startConsumer starts the examples' confirmations consumer, which writes
// one sent_emails row per confirmation email.
func (s *system) startConsumer() {
	p, err := s.stack.Start("consumer", "confirmations", append(s.stack.Env(
		"AMQP_URL="+servicetest.ReplaceHost(s.stack.AMQPURL, s.rabbit.Addr()),
		"DATABASE_URL="+s.dbURL), s.privateEnv()...))
	check(err)
	s.mu.Lock()
	s.consumer = p
	s.mu.Unlock()
}

// sampleRSS records the processes' peak RSS until stop.
func (s *system) sampleRSS(stop <-chan struct{}) {
	t := time.NewTicker(200 * time.Millisecond)
	defer t.Stop()
	for {
		s.mu.Lock()
		if _, p := s.receiver.RSS(); p > s.receiverPeak {
			s.receiverPeak = p
		}
		for _, w := range s.workers {
			if _, p := w.RSS(); p > s.workerPeak {
				s.workerPeak = p
			}
		}
		s.mu.Unlock()
		select {
		case <-stop:
			return
		case <-t.C:
		}
	}
}

type result struct {
	name                          string
	events, sent, faults          int
	processed, lost, doubled, dlq int
	left, wrongState              int
	faultErr                      error
	emails, emailsLost            int
	emailsDoubled                 int
	wall                          time.Duration
	receiverPeak, workerPeak      int64
	recoveryProblems              int
	// handlerProblems are what the rollout's handler-set checks found.
	handlerProblems int
	// note is printed under the line, detail too when the scenario failed.
	note, detail string
}

func (r result) ok() bool {
	return r.faultErr == nil && r.lost == 0 && r.doubled == 0 && r.dlq == 0 && r.left == 0 && r.wrongState == 0 && r.processed == r.events &&
		r.emailsLost == 0 && r.emailsDoubled == 0 && r.recoveryProblems == 0 && r.handlerProblems == 0
}

func (r result) line() string {
	status := "ok"
	if !r.ok() {
		status = "FAIL"
	}
	return fmt.Sprintf("%-16s %8d %8d %7d %9d %5d %7d %4d %4d %5d %6d %4d/%-4d %8s  %.0f/%.0f %s",
		r.name, r.events, r.sent, r.faults, r.processed, r.lost, r.doubled, r.dlq, r.left, r.wrongState,
		r.emails, r.emailsLost, r.emailsDoubled,
		r.wall.Round(100*time.Millisecond), float64(r.receiverPeak)/(1<<20), float64(r.workerPeak)/(1<<20), status)
}

func runScenario(ctx context.Context, binDir, name string, sc scenario, o options) result {
	sys := &system{httpAddr: harness.FreeAddr(), workers: make([]*harness.Proc, o.workers), workerMetrics: make([]string, o.workers)}
	var err error
	for _, p := range []struct {
		dst    **faulttest.Proxy
		target string
	}{{&sys.pg, "127.0.0.1:5432"}, {&sys.redis, "127.0.0.1:6379"}, {&sys.rabbit, "127.0.0.1:5672"}} {
		*p.dst, err = faulttest.Start(p.target)
		check(err)
		defer (*p.dst).Close()
	}
	if sc.rabbitCluster {
		sys.cluster = startCluster(ctx)
		defer sys.cluster.Close()
		onExit(sys.cluster.Close)
		o.duration = max(o.duration, clusterMinDuration)
	}
	if sc.redisSentinel {
		sys.sentinel = startSentinel(ctx)
		defer sys.sentinel.Close()
		onExit(sys.sentinel.Close)
		o.duration = max(o.duration, sentinelMinDuration)
	}
	if sc.rollout {
		o.duration = max(o.duration, rolloutMinDuration)
	}
	if name == "pg-failover" {
		// A private primary and standby, reached by the multi-host URL.
		sys.pgCluster, err = pgcluster.Start(ctx, pgcluster.Options{Async: o.pgAsync})
		sys.asyncLedger = o.pgAsync
		check(err)
		defer sys.pgCluster.Close()
		onExit(sys.pgCluster.Close)
		sys.pgCluster.SetReplicationDelay(o.pgDelay)
		sys.dbURL = sys.pgCluster.URL("idempotent_events")
		sys.stack, err = harness.NewStackOn(ctx, binDir, "ie_chaos", sys.dbURL)
		check(err)
		// The kills must land while commits flow: deliveries are spread
		// over the whole failover schedule at least.
		o.duration = max(o.duration, time.Duration(o.pgFailovers+1)*o.pgFailoverEvery)
	} else {
		sys.stack, err = harness.NewStack(ctx, binDir, "ie_chaos")
		check(err)
		sys.dbURL = servicetest.ReplaceHost(sys.stack.DatabaseURL, sys.pg.Addr())
	}
	stack := sys.stack
	defer stack.Close()
	sys.startReceiver()
	if sc.relayApart {
		sys.relays = make([]*harness.Proc, relayProcs)
		for i := range sys.relays {
			sys.startRelay(i)
		}
	}
	if sc.rollout {
		sys.rollout = startRollout(ctx, sys, o)
		defer sys.rollout.Close()
	} else {
		for i := range sys.workers {
			sys.startWorker(i)
		}
	}
	sys.startConsumer()
	defer func() {
		sys.mu.Lock()
		defer sys.mu.Unlock()
		sys.receiver.Term(10 * time.Second)
		for _, w := range append(slices.Clone(sys.workers), sys.relays...) {
			w.Term(10 * time.Second)
		}
		sys.consumer.Term(10 * time.Second)
	}()
	if err := harness.WaitHTTP("http://"+sys.httpAddr+"/readyz", 60*time.Second); err != nil {
		// Once in CI the receiver was not ready within 30 s at a scenario's
		// start; its log says why, if it happens again.
		sys.mu.Lock()
		log := sys.receiver.Log()
		sys.mu.Unlock()
		check(fmt.Errorf("%w\nreceiver log:\n%s", err, log))
	}

	start := time.Now()
	stopRSS := make(chan struct{})
	go sys.sampleRSS(stopRSS)
	stopFaults := make(chan struct{})
	faultsDone := make(chan int, 1)
	o.pace = 1
	if name == "combined" {
		o.conc, o.pace = o.combinedConc, o.combinedPace
	}
	go func() {
		n := 0
		if sc.faults != nil {
			n = sc.faults(sys, stopFaults, o)
		} else {
			<-stopFaults
		}
		faultsDone <- n
	}()

	// Every payment is three events, sent shuffled like the rest:
	// processing, payment_failed and succeeded, 10 s apart by their created
	// times (harness.RetriedDebitBodyAt). The payments were created one
	// after another over the -duration before the scenario's start, so
	// the provider's record of them (system.stripe) is the scenario's own,
	// in a reconciler's window of the last hour however long the suite.
	ids := make([]string, 0, 3*o.events)
	payments := make([]string, o.events)
	created := make(map[string]int64, o.events)
	span := max(int64(o.duration/time.Second), 1)
	for i := range payments {
		payments[i] = fmt.Sprintf("evt_chaos_%s_%07d", name, i)
		created[payments[i]] = start.Unix() - span + int64(i)*span/int64(o.events)
		ids = append(ids, payments[i]+"_p", payments[i]+"_f", payments[i])
	}
	bodyOf := func(id string) []byte {
		return harness.RetriedDebitBodyAt(id, created[strings.TrimSuffix(strings.TrimSuffix(id, "_p"), "_f")])
	}
	if sc.recover != nil {
		sys.stripe = harness.NewStripeEvents(stripeKey)
		defer sys.stripe.Close()
		for _, id := range ids { // within a second, in the order they were created
			check(sys.stripe.Add(bodyOf(id)))
		}
	}
	rejected := map[string]bool{}
	if sc.reject > 0 {
		for _, i := range rand.Perm(len(ids))[:int(sc.reject*float64(len(ids)))] {
			rejected[ids[i]] = true
		}
	}
	accepted, sent := sendAll(ctx, sys, ids, bodyOf, rejected, o)
	close(stopFaults)
	faults := <-faultsDone + len(rejected)
	// Heal everything, and make sure every process is running.
	sys.pg.SetDown(false)
	sys.redis.SetDown(false)
	sys.rabbit.SetDown(false)
	for _, p := range []*faulttest.Proxy{sys.pg, sys.redis, sys.rabbit} {
		p.SetLatency(0)
	}
	if sys.pgCluster != nil {
		// Every check reads the final primary itself.
		stack.DB.Close()
		stack.DB, err = pgxpool.New(ctx, sys.pgCluster.Primary().URL("idempotent_events"))
		check(err)
	}
	// A 2xx is a promise; after a recovery from the provider's record,
	// so is every event of that record.
	var promised []string
	accepted.Range(func(k, _ any) bool { promised = append(promised, k.(string)); return true })
	var rec recovery
	if sc.recover != nil {
		rec = sc.recover(ctx, sys, ids, rejected, o)
		faults += rec.faults
		promised = ids
	}
	r := settle(ctx, sys, name, ids, promised)
	r.note, r.recoveryProblems = rec.note, len(rec.problems)
	for _, p := range rec.problems {
		r.detail += "  " + p + "\n"
	}
	if o.pgAsync && name == "pg-failover" {
		r.name += "/async"
	}
	if o.rolloutUnfenced && name == "rollout" {
		r.name += "/unfenced"
	}
	if r.faultErr = sys.faultErr; r.faultErr != nil {
		r.detail += fmt.Sprintf("  the faults were not injected: %v\n", r.faultErr)
	}
	r.wrongState, err = sys.stack.WrongStates(ctx, payments)
	check(err)
	if r.wrongState > 0 {
		r.detail += fmt.Sprintf("  %d payments did not end in the state of their events in order (succeeded after a retried debit)\n", r.wrongState)
	}
	// One order, and so one email, per payment; in the rollout only per
	// succeeded payment committed by the set with the orders handler.
	wantOrders := len(payments)
	if sys.rollout != nil {
		v := sys.rollout.verify(ctx, "evt_chaos_"+name+"_%")
		wantOrders, r.handlerProblems = v.wantOrders, len(v.problems)
		r.note = strings.TrimPrefix(r.note+"\n"+v.note, "\n")
		for _, p := range v.problems {
			r.detail += "  " + p + "\n"
		}
	}
	d := settleDownstream(ctx, sys, wantOrders)
	r.emails, r.emailsDoubled = d.Emails, d.Emails-d.EmailedPayments
	r.emailsLost = wantOrders - d.EmailedPayments
	if d.Orders != wantOrders || d.Unpublished != 0 {
		r.left += abs(d.Orders-wantOrders) + d.Unpublished
		r.detail += fmt.Sprintf("  downstream: %d orders for %d payments, %d outbox rows unpublished\n", d.Orders, wantOrders, d.Unpublished)
	}
	close(stopRSS)
	r.events, r.sent, r.faults, r.wall = len(ids), sent, faults, time.Since(start)
	r.receiverPeak, r.workerPeak = sys.receiverPeak, sys.workerPeak
	if sys.cluster != nil {
		r.note = strings.TrimPrefix(r.note+"\n"+sys.cluster.note(r, len(promised), sys.answers.unavailable.Load()), "\n")
	}
	if sys.sentinel != nil {
		r.note = strings.TrimPrefix(r.note+"\n"+sys.sentinel.note(sys), "\n")
	}
	return r
}

// sendAll delivers every event 1+dups times in a shuffled order, each
// delivery retried (as Stripe does, with backoff) until it is answered 2xx;
// the deliveries of a rejected event are signed with a wrong secret, and
// given up after the receiver's 401. It returns which events got a 2xx and
// how many requests were made.
func sendAll(ctx context.Context, sys *system, ids []string, bodyOf func(string) []byte, rejected map[string]bool, o options) (*sync.Map, int) {
	var deliveries []string
	for d := 0; d <= o.dups; d++ {
		deliveries = append(deliveries, ids...)
	}
	rand.Shuffle(len(deliveries), func(i, j int) { deliveries[i], deliveries[j] = deliveries[j], deliveries[i] })
	sender := harness.NewSender("http://"+sys.httpAddr, "whsec_chaos", o.conc)
	sender.Client.Timeout = 10 * time.Second
	// The provider signs these with a secret the endpoint does not have
	// (it was rotated on one side only).
	misconfigured := &harness.Sender{URL: sender.URL, Secret: "whsec_chaos_rotated", Client: sender.Client}
	accepted := &sync.Map{}
	var requests atomic.Int64
	// Release deliveries on a schedule that spans o.duration at least.
	work := make(chan string)
	go func() {
		defer close(work)
		interval := o.duration / time.Duration(len(deliveries))
		start := time.Now()
		for i, id := range deliveries {
			if d := time.Until(start.Add(time.Duration(i) * interval)); d > 0 {
				time.Sleep(d)
			}
			work <- id
		}
	}()
	var wg sync.WaitGroup
	for c := 0; c < o.conc; c++ {
		wg.Go(func() {
			for id := range work {
				body, s := bodyOf(id), sender
				if rejected[id] {
					s = misconfigured
				}
				backoff := 50 * time.Millisecond
				for {
					requests.Add(1)
					code, _ := s.Send(ctx, body)
					sys.answers.count(code)
					if code == 202 || code == 200 {
						accepted.Store(id, true)
						if sys.stripe != nil {
							sys.stripe.Delivered(id)
						}
						break
					}
					if code == 401 && rejected[id] {
						break
					}
					if code >= 400 && code < 500 {
						check(fmt.Errorf("receiver answered %d to a valid signed event %s", code, id))
					}
					time.Sleep(backoff + rand.N(backoff))
					backoff = min(backoff*2, 2*time.Second)
				}
			}
		})
	}
	wg.Wait()
	return accepted, int(requests.Load())
}

// settleDownstream waits until the outbox is published and the consumer
// has an email for every payment, or until the downstream stops moving.
func settleDownstream(ctx context.Context, sys *system, payments int) harness.Downstream {
	deadline := time.Now().Add(3 * time.Minute)
	var last harness.Downstream
	stable := 0
	for {
		d, err := sys.stack.ReadDownstream(ctx)
		check(err)
		if d == last {
			stable++
		} else {
			stable = 0
		}
		last = d
		done := d.Unpublished == 0 && d.EmailedPayments >= payments
		if (done && stable >= 10) || stable >= 100 || time.Now().After(deadline) {
			return d
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func abs(n int) int {
	if n < 0 {
		return -n
	}
	return n
}

// settle waits until the queues are drained and the ledger stops changing,
// then checks it: every one of ids once, every promised one there.
func settle(ctx context.Context, sys *system, name string, ids, promised []string) result {
	r := result{name: name}
	var last harness.Ledger
	last, r.left, r.dlq = drain(ctx, sys, len(ids))
	r.processed, r.doubled = last.Payments, last.Doubled
	missing, err := sys.stack.Missing(ctx, promised)
	check(err)
	r.lost = len(missing)
	if !r.ok() {
		var b strings.Builder
		fmt.Fprintf(&b, "  %d events were promised (answered 2xx, or recovered); missing: %v\n", len(promised), head(missing, 10))
		sys.mu.Lock()
		for _, w := range append(slices.Clone(sys.workers), sys.relays...) {
			fmt.Fprintf(&b, "  --- %s (last lines)\n%s\n", w.Name, lastLines(w.Log(), 15))
		}
		fmt.Fprintf(&b, "  --- receiver (last lines)\n%s\n", lastLines(sys.receiver.Log(), 15))
		sys.mu.Unlock()
		r.detail = b.String()
	}
	return r
}

// drain waits until the queues are empty and the ledger has stopped
// changing: for a second once it holds want payments rows, for 5 s short
// of them, 5 minutes at most. It returns the ledger and the messages left
// in the queues and in the DLQ.
func drain(ctx context.Context, sys *system, want int) (last harness.Ledger, left, dlq int) {
	conn, err := sys.dialBroker()
	check(err)
	defer conn.Close()
	ch, err := conn.Channel()
	check(err)
	queues := append(append([]string{broker.MainQueue, broker.ReplayQueue},
		"events.retry.1s", "events.retry.2s", "events.retry.5s", "events.retry.10s", "events.retry.30s"), broker.DLQ)
	depth := func() (left, dlq int) {
		for _, q := range queues {
			st, err := ch.QueueDeclarePassive(q, true, false, false, false, nil)
			check(err)
			if q == broker.DLQ {
				dlq = st.Messages
			} else {
				left += st.Messages
			}
		}
		return left, dlq
	}
	deadline := time.Now().Add(5 * time.Minute)
	stable := 0
	for {
		l, err := sys.stack.ReadLedger(ctx)
		check(err)
		left, dlq = depth()
		// Unacked deliveries are invisible to a passive declare; a ledger
		// that stopped moving with empty queues means they are settled too.
		if left == 0 && l == last {
			stable++
		} else {
			stable = 0
		}
		last = l
		if (stable >= 10 && l.Payments == want) || time.Now().After(deadline) || (stable >= 50) {
			return last, left, dlq
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func head(s []string, n int) []string {
	if len(s) > n {
		return s[:n]
	}
	return s
}

func lastLines(s string, n int) string {
	lines := strings.Split(s, "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// every calls f at random intervals in [lo, hi) × pace until stop,
// returning how many times it ran.
func every(stop <-chan struct{}, pace float64, lo, hi time.Duration, f func()) int {
	lo, hi = time.Duration(float64(lo)*pace), time.Duration(float64(hi)*pace)
	n := 0
	for {
		select {
		case <-stop:
			return n
		case <-time.After(lo + rand.N(hi-lo)):
			f()
			n++
		}
	}
}

func killWorkers(sys *system, stop <-chan struct{}, o options) int {
	return every(stop, o.pace, 300*time.Millisecond, 1500*time.Millisecond, func() {
		i := rand.N(len(sys.workers))
		sys.mu.Lock()
		w := sys.workers[i]
		sys.mu.Unlock()
		w.Kill()
		time.Sleep(rand.N(500 * time.Millisecond))
		sys.startWorker(i)
	})
}

// relayKill SIGKILLs the outbox relays (the relay processes of a
// relayApart scenario, else the workers they run in) and the downstream
// consumer, one at a time, while the confirmation emails flow.
func relayKill(sys *system, stop <-chan struct{}, o options) int {
	return every(stop, o.pace, 300*time.Millisecond, 1500*time.Millisecond, func() {
		sys.mu.Lock()
		relays, start := sys.workers, sys.startWorker
		if len(sys.relays) > 0 {
			relays, start = sys.relays, sys.startRelay
		}
		i := rand.N(len(relays) + 1)
		p := sys.consumer
		if i < len(relays) {
			p = relays[i]
		}
		sys.mu.Unlock()
		p.Kill()
		time.Sleep(rand.N(500 * time.Millisecond))
		if i < len(relays) {
			start(i)
		} else {
			sys.startConsumer()
		}
	})
}

func killReceiver(sys *system, stop <-chan struct{}, o options) int {
	return every(stop, o.pace, 500*time.Millisecond, 2*time.Second, func() {
		sys.mu.Lock()
		r := sys.receiver
		sys.mu.Unlock()
		r.Kill()
		time.Sleep(rand.N(300 * time.Millisecond))
		sys.startReceiver()
	})
}

func redisFaults(sys *system, stop <-chan struct{}, o options) int {
	opts, err := redis.ParseURL(sys.stack.RedisURL)
	check(err)
	rdb := redis.NewClient(opts)
	defer rdb.Close()
	return every(stop, o.pace, 300*time.Millisecond, 1200*time.Millisecond, func() {
		if rand.N(2) == 0 {
			if o.flushAll {
				check(rdb.FlushAll(context.Background()).Err())
				return
			}
			// Deleting this run's keys is a FLUSHALL as far as the pipeline
			// can tell, without emptying other users of a shared Redis.
			check(servicetest.DeleteKeys(sys.stack.RedisURL, sys.stack.RedisPrefix))
			return
		}
		sys.redis.SetDown(true)
		time.Sleep(500*time.Millisecond + rand.N(1500*time.Millisecond))
		sys.redis.SetDown(false)
	})
}

func postgresCuts(sys *system, stop <-chan struct{}, o options) int {
	return every(stop, o.pace, 200*time.Millisecond, time.Second, func() {
		if rand.N(4) == 0 {
			sys.pg.SetDown(true)
			time.Sleep(time.Second + rand.N(2*time.Second))
			sys.pg.SetDown(false)
			return
		}
		sys.pg.Cut()
	})
}

func rabbitFaults(sys *system, stop <-chan struct{}, o options) int {
	n := 0
	if o.brokerRestart {
		restartBroker()
		n++
	}
	return n + every(stop, o.pace, 500*time.Millisecond, 2*time.Second, func() {
		if rand.N(3) == 0 {
			sys.rabbit.SetDown(true)
			time.Sleep(500*time.Millisecond + rand.N(time.Second))
			sys.rabbit.SetDown(false)
			return
		}
		sys.rabbit.Cut()
	})
}

// restartBroker restarts the real RabbitMQ application; durable queues and
// persistent messages must survive it.
func restartBroker() {
	out, err := exec.Command("rabbitmqctl", "stop_app").CombinedOutput()
	check(errorf(err, "rabbitmqctl stop_app: %s", out))
	time.Sleep(time.Second)
	out, err = exec.Command("rabbitmqctl", "start_app").CombinedOutput()
	check(errorf(err, "rabbitmqctl start_app: %s", out))
}

func errorf(err error, format string, args ...any) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf(format+": %w", append(args, err)...)
}

func latency(sys *system, stop <-chan struct{}, o options) int {
	for _, p := range []*faulttest.Proxy{sys.pg, sys.redis, sys.rabbit} {
		p.SetLatency(5 * time.Millisecond)
	}
	n := every(stop, o.pace, 500*time.Millisecond, 1500*time.Millisecond, func() {
		p := []*faulttest.Proxy{sys.pg, sys.redis, sys.rabbit}[rand.N(3)]
		p.SetLatency(time.Duration(rand.N(40)+1) * time.Millisecond)
	})
	return n + 3
}

// postgresOutage refuses every Postgres connection for o.pgOutage while
// events flow: they must wait, not land in the DLQ.
func postgresOutage(sys *system, stop <-chan struct{}, o options) int {
	time.Sleep(500 * time.Millisecond)
	sys.pg.SetDown(true)
	// The outage lasts its full length even when sending finishes first
	// (the receiver does not need Postgres).
	time.Sleep(o.pgOutage)
	sys.pg.SetDown(false)
	return 1
}

func combined(sys *system, stop <-chan struct{}, o options) int {
	var total atomic.Int64
	var wg sync.WaitGroup
	for _, f := range []faultSource{killWorkers, killReceiver, redisFaults, postgresCuts, rabbitFaults, latency} {
		wg.Go(func() { total.Add(int64(f(sys, stop, o))) })
	}
	wg.Wait()
	return int(total.Load())
}

// pgFailover fails the ledger over o.pgFailovers times while events flow:
// the primary is SIGKILLed as a crashed machine (its replication link cut
// with it), the standby is promoted, and the old primary is rebuilt as the
// new primary's standby, so that the next failover again has a
// synchronous standby. The next kill comes 0.5–1.5 × o.pgFailoverEvery
// after a rejoin. The whole schedule runs even when sending ends first:
// the workers still commit the backlog.
func pgFailover(sys *system, _ <-chan struct{}, o options) int {
	ctx := context.Background()
	c := sys.pgCluster
	for i := range o.pgFailovers {
		time.Sleep(o.pgFailoverEvery/2 + rand.N(o.pgFailoverEvery))
		// Aim: kill while the primary holds WAL no standby has yet (in
		// a synchronous cluster, commits still waiting for it), as long
		// as commits flow at all.
		unreplicated := int64(-1)
		for deadline := time.Now().Add(o.pgFailoverEvery); unreplicated <= 0 && time.Now().Before(deadline); {
			var err error
			if unreplicated, err = c.Unreplicated(ctx); err != nil {
				sys.faultErr = fmt.Errorf("failover %d: %w", i+1, err)
				return i
			}
			if unreplicated <= 0 {
				time.Sleep(5 * time.Millisecond)
			}
		}
		old, next := c.Primary(), c.Standbys()[0]
		start := time.Now()
		old.Kill()
		if err := c.Promote(ctx, next); err != nil {
			sys.faultErr = fmt.Errorf("failover %d: %w\n%s", i+1, err, c.Logs(20))
			return i
		}
		promoted := time.Since(start)
		if err := c.Rejoin(ctx, old); err != nil {
			sys.faultErr = fmt.Errorf("failover %d: %w\n%s", i+1, err, c.Logs(20))
			return i + 1
		}
		fmt.Fprintf(os.Stderr, "pg-failover %d: %s killed with %d bytes of WAL unreplicated, %s promoted after %s, %s a standby again after %s\n",
			i+1, old.Name, unreplicated, next.Name, promoted.Round(time.Millisecond), old.Name, time.Since(start).Round(time.Millisecond))
	}
	return o.pgFailovers
}
