package main

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idempotent-events/idempotent-events/pkg/internal/harness"
	"github.com/idempotent-events/idempotent-events/pkg/internal/outbox"
)

// expectation is one alert a scenario must make fire and resolve: its
// name, the labels that tell it from the same alert about something else,
// and what brings it about.
type expectation struct {
	alert  string
	labels map[string]string
	cause  string
}

// scenario induces the real condition of one or more alerts and removes
// it again. induce returns once the condition is set going (traffic it
// needs keeps flowing until remove); remove returns once the cause is
// gone.
type scenario struct {
	name    string
	expect  []expectation
	removal string
	induce  func(ctx context.Context, s *system) error
	remove  func(ctx context.Context, s *system) error
	// background: the resolution is awaited while the next steps run
	// (an alert over a long window that no traffic can shorten).
	background bool
	// resolveWithin bounds the wait for the resolution (default
	// resolveTimeout).
	resolveWithin time.Duration
}

// notInduced are the alerts the suite cannot bring about here, and why
// (docs/runbook.md says the same under each alert).
var notInduced = map[string]string{
	"IdempotentEventsDuplicateRateSpike": "compares the last 10m with the last day: in a Prometheus younger than 10m both windows " +
		"hold the same samples, so the share can never exceed three times itself; it needs more than 10 minutes of history",
}

// loop runs f every interval in a goroutine until stop is called; stop
// waits for it.
func loop(ctx context.Context, every time.Duration, f func()) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-ctx.Done():
				return
			case <-t.C:
				f()
			}
		}
	})
	var once sync.Once
	return func() { once.Do(func() { close(done); wg.Wait() }) }
}

// receiverFaults: deliveries with a wrong signature, and the receiver's
// broker connection gone while deliveries keep coming (503). Both shares
// are over the alerts' windows (10m, 5m), so they fall only when enough
// good deliveries follow: the removal sends them.
func receiverFaults() *scenario {
	var stops []func()
	return &scenario{
		name: "receiver",
		expect: []expectation{
			{"IdempotentEventsSignatureFailureSpike", map[string]string{"reason": "signature_mismatch"},
				"deliveries signed with a secret the receiver does not hold, 2/s"},
			{"IdempotentEventsReceiver5xxHigh", nil, "receiver's RabbitMQ connection refused (TCP proxy down) while deliveries come, 2/s: 503"},
			{"IdempotentEventsBrokerDisconnected", map[string]string{"job": "receiver"}, "receiver's RabbitMQ connection refused (TCP proxy down)"},
		},
		removal: "proxy up, good signatures, good deliveries until 5xx < 5% and bad signatures < 10% of all",
		induce: func(ctx context.Context, s *system) error {
			s.recvAMQP.SetDown(true)
			stops = append(stops,
				loop(ctx, 500*time.Millisecond, func() { s.send(ctx, s.bad, "badsig", 1, 1) }),
				loop(ctx, 500*time.Millisecond, func() { s.send(ctx, s.good, "nobroker", 1, 1) }))
			return nil
		},
		remove: func(ctx context.Context, s *system) error {
			for _, stop := range stops {
				stop()
			}
			s.recvAMQP.SetDown(false)
			if err := harness.WaitHTTP("http://"+s.procs["receiver"].metrics+"/readyz", 30*time.Second); err != nil {
				return fmt.Errorf("receiver not ready after its broker came back: %w", err)
			}
			var fivexx int64
			for code := 500; code < 600; code++ {
				fivexx += s.answered(code)
			}
			need := max(20*fivexx, 10*s.answered(401)) * 3 / 2
			if n := need - s.requests(); n > 0 {
				got := s.send(ctx, s.good, "dilute", int(n), 16)
				if got[202] != int(n) {
					return fmt.Errorf("dilution: %d good deliveries answered %v", n, got)
				}
			}
			return nil
		},
	}
}

// componentDown: every process that exports the component's build_info
// (those of the given jobs) stopped, as a scale to zero or a crash loop
// leaves it.
func componentDown(component string, jobs ...string) *scenario {
	var stopped []string
	return &scenario{
		name:    "no " + component,
		expect:  []expectation{{"IdempotentEventsComponentDown", map[string]string{"component": component}, "every " + component + " process stopped (SIGTERM)"}},
		removal: "started again",
		induce: func(ctx context.Context, s *system) error {
			stopped = s.running(jobs...)
			if len(stopped) == 0 {
				return fmt.Errorf("no %s runs", component)
			}
			for _, n := range stopped {
				if err := s.stop(n); err != nil {
					return err
				}
			}
			return nil
		},
		remove: func(ctx context.Context, s *system) error {
			for _, n := range stopped {
				if err := s.start(ctx, n, s.procs[n].job != "relay"); err != nil {
					return err
				}
			}
			return nil
		},
	}
}

// managementDown: the management API the workers poll for queue
// statistics refuses connections.
func managementDown() *scenario {
	return &scenario{
		name:    "management API",
		expect:  []expectation{{"IdempotentEventsQueueStatsUnavailable", nil, "worker's RabbitMQ management API refused (TCP proxy down)"}},
		removal: "proxy up",
		induce:  func(ctx context.Context, s *system) error { s.mgmt.SetDown(true); return nil },
		remove:  func(ctx context.Context, s *system) error { s.mgmt.SetDown(false); return nil },
	}
}

// reconcileArgs is an operator's reconcile of the last hour.
var reconcileArgs = []string{"reconcile", "-since", "1h", "-settle", "0s"}

// staleRuns: the last successful reconcile and prune runs are older than
// the alerts' thresholds. Real runs are made, then their times are moved
// back (the suite cannot wait a day): what the workers read from the
// tables is then what it would be a day (two) later without another run.
func staleRuns() *scenario {
	return &scenario{
		name: "stale runs",
		expect: []expectation{
			{"IdempotentEventsReconcileStale", map[string]string{"source": "stripe"},
				"a real eventsctl reconcile run, its times moved 25h back in reconcile_runs (no run for a day)"},
			{"IdempotentEventsPruneStale", nil, "a real eventsctl prune run, its times moved 49h back in prune_runs (no prune for two days)"},
		},
		removal: "eventsctl reconcile and eventsctl prune run again",
		induce: func(ctx context.Context, s *system) error {
			if _, err := s.eventsctl(ctx, reconcileArgs...); err != nil {
				return err
			}
			if _, err := s.eventsctl(ctx, "prune"); err != nil {
				return err
			}
			if _, err := s.sql(ctx, `UPDATE reconcile_runs SET started_at = started_at - interval '25 hours',
				updated_at = updated_at - interval '25 hours', finished_at = finished_at - interval '25 hours'`); err != nil {
				return err
			}
			_, err := s.sql(ctx, `UPDATE prune_runs SET started_at = started_at - interval '49 hours', finished_at = finished_at - interval '49 hours'`)
			return err
		},
		remove: func(ctx context.Context, s *system) error {
			if _, err := s.eventsctl(ctx, reconcileArgs...); err != nil {
				return err
			}
			_, err := s.eventsctl(ctx, "prune")
			return err
		},
	}
}

// reconcileMissing: the provider's event log holds an event whose webhook
// never arrived; a reconcile run finds it (and feeds it in).
func reconcileMissing() *scenario {
	var id string
	return &scenario{
		name: "reconcile missing",
		expect: []expectation{{"IdempotentEventsReconcileFoundMissing", map[string]string{"source": "stripe"},
			"an event in the provider's log never delivered; eventsctl reconcile finds it"}},
		removal: "the event committed; eventsctl reconcile runs again and finds none missing",
		induce: func(ctx context.Context, s *system) error {
			id = s.nextID("undelivered")
			body := intentAt(id, time.Now().Add(-time.Minute))
			if err := s.stripe.Add(body); err != nil {
				return err
			}
			_, err := s.eventsctl(ctx, reconcileArgs...)
			return err
		},
		remove: func(ctx context.Context, s *system) error {
			if err := waitFor(ctx, 60*time.Second, "the reconciled event committed", func() (bool, error) {
				n, err := s.count1(ctx, `SELECT count(*) FROM processed_events WHERE event_id = $1`, id)
				return n == 1, err
			}); err != nil {
				return err
			}
			_, err := s.eventsctl(ctx, reconcileArgs...)
			return err
		},
	}
}

// intentAt is a Stripe payment_intent.succeeded event created at at.
func intentAt(id string, at time.Time) []byte {
	var ev map[string]any
	if err := json.Unmarshal(harness.Body(id), &ev); err != nil {
		panic(err) // harness.Body is JSON
	}
	ev["created"] = at.Unix()
	b, err := json.Marshal(ev)
	if err != nil {
		panic(err)
	}
	return b
}

// poisonCount is how many poison messages the DLQ scenario publishes: the
// growth alert's threshold.
const poisonCount = 10

// poison: messages the worker cannot decode reach events.main (a
// publisher's bug, a replay of a corrupted body); each is dead-lettered.
func poison() *scenario {
	return &scenario{
		name: "poison",
		expect: []expectation{
			{"IdempotentEventsDLQNotEmpty", map[string]string{"queue": "events.dlq"}, fmt.Sprintf("%d poison messages published to main_exchange", poisonCount)},
			{"IdempotentEventsDLQGrowing", map[string]string{"queue": "events.dlq"}, fmt.Sprintf("the same %d messages dead-lettered within 15 minutes", poisonCount)},
		},
		removal: "eventsctl dlq discard -all",
		induce: func(ctx context.Context, s *system) error {
			for range poisonCount {
				id := s.nextID("poison")
				body := fmt.Sprintf(`{"id":%q,"object":"event","type":"payment_intent.succeeded","created":%d,"data":{"object":{"object":"payment_intent","id":"pi_%s","amount":"forty-two"}}}`,
					id, time.Now().Unix(), id)
				if err := s.publish(ctx, id, []byte(body), time.Now()); err != nil {
					return err
				}
			}
			return nil
		},
		remove: func(ctx context.Context, s *system) error {
			_, err := s.eventsctl(ctx, "dlq", "discard", "-all")
			return err
		},
	}
}

// confirmationsQueue and confirmationsKey are the downstream consumer's
// queue and the routing key of the emails the orders worker enqueues.
const (
	confirmationsQueue = "confirmation-emails"
	confirmationsKey   = "email.confirmation"
)

// bindConfirmations binds (or unbinds) the confirmations queue.
func bindConfirmations(s *system, bind bool) error {
	conn, err := amqp.Dial(s.stack.AMQPURL)
	if err != nil {
		return err
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	defer ch.Close()
	if bind {
		return ch.QueueBind(confirmationsQueue, confirmationsKey, outbox.Exchange, false, nil)
	}
	return ch.QueueUnbind(confirmationsQueue, confirmationsKey, outbox.Exchange, nil)
}

// outboxParked: the downstream queue loses its binding, so the relay's
// publishes come back unroutable until the rows are parked.
func outboxParked() *scenario {
	return &scenario{
		name: "outbox parked",
		expect: []expectation{{"IdempotentEventsOutboxParked", nil,
			"confirmation-emails unbound from the effects exchange; 5 payments: their emails are returned, parked after OUTBOX_MAX_ATTEMPTS=2"}},
		removal: "queue bound again; eventsctl outbox retry of every parked row",
		induce: func(ctx context.Context, s *system) error {
			if err := bindConfirmations(s, false); err != nil {
				return err
			}
			if got := s.send(ctx, s.good, "parked", 5, 5); got[202] != 5 {
				return fmt.Errorf("5 deliveries answered %v", got)
			}
			return nil
		},
		remove: func(ctx context.Context, s *system) error {
			if err := bindConfirmations(s, true); err != nil {
				return err
			}
			// The rows eventsctl outbox list shows, read from the table.
			rows, err := s.stack.DB.Query(ctx, `SELECT id FROM outbox WHERE parked_at IS NOT NULL AND published_at IS NULL ORDER BY id`)
			if err != nil {
				return err
			}
			ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
			if err != nil {
				return err
			}
			if len(ids) == 0 {
				return fmt.Errorf("no parked outbox row")
			}
			args := []string{"outbox", "retry"}
			for _, id := range ids {
				args = append(args, fmt.Sprint(id))
			}
			_, err = s.eventsctl(ctx, args...)
			return err
		},
	}
}

// lagEvents is how many events pile up in events.main in the lag scenario:
// over ConsumerLagHigh's threshold of 1000.
const lagEvents = 1005

// workerBroker: the worker's RabbitMQ connection is refused while the
// receiver accepts; events.main fills. The oldest message's age is the
// publish timestamp RabbitMQ reports for the head of the queue: a message
// published with a timestamp 6 minutes back stands for one that waited
// that long (the threshold, 300 s, is in the expression).
func workerBroker() *scenario {
	return &scenario{
		name: "worker broker",
		expect: []expectation{
			{"IdempotentEventsBrokerDisconnected", map[string]string{"job": "worker"}, "worker's RabbitMQ connection refused (TCP proxy down)"},
			{"IdempotentEventsNoWorkerConsuming", map[string]string{"queue": "events.main"}, "the same, while the receiver accepts events"},
			{"IdempotentEventsConsumerLagHigh", map[string]string{"queue": "events.main"}, fmt.Sprintf("the same, %d events accepted", lagEvents)},
			{"IdempotentEventsOldestMessageAgeHigh", map[string]string{"queue": "events.main"},
				"the same; at the head a message whose publish timestamp is 6m back"},
		},
		removal: "proxy up: the worker reconnects and drains events.main",
		induce: func(ctx context.Context, s *system) error {
			s.workAMQP.SetDown(true)
			// The worker's channel is gone before anything is published: its
			// prefetch would otherwise take the head of the queue.
			if err := waitFor(ctx, 30*time.Second, "worker disconnected", func() (bool, error) {
				v, err := s.mon.query(ctx, fmt.Sprintf(`idempotent_events_worker_broker_connected{instance=%q}`, s.procs["worker"].metrics), time.Time{})
				return err == nil && len(v) == 1 && v[0].Value == 0, err
			}); err != nil {
				return err
			}
			old := s.nextID("old")
			if err := s.publish(ctx, old, intentAt(old, time.Now().Add(-6*time.Minute)), time.Now().Add(-6*time.Minute)); err != nil {
				return err
			}
			if got := s.send(ctx, s.good, "lag", lagEvents, 16); got[202] != lagEvents {
				return fmt.Errorf("%d deliveries answered %v", lagEvents, got)
			}
			return nil
		},
		remove: func(ctx context.Context, s *system) error { s.workAMQP.SetDown(false); return nil },
	}
}

// noRelay: the relay is stopped and no worker runs it.
func noRelay() *scenario {
	return &scenario{
		name:    "no relay",
		expect:  []expectation{{"IdempotentEventsOutboxNoRelay", nil, "relay stopped; the worker runs OUTBOX_RELAY=off"}},
		removal: "relay started again",
		induce:  func(ctx context.Context, s *system) error { return s.stop("relay") },
		remove:  func(ctx context.Context, s *system) error { return s.start(ctx, "relay", false) },
	}
}

// postgresDown: the worker's Postgres refuses connections; the worker
// pauses consumption (WORKER_OUTAGE_MODE=pause, the default) while events
// arrive.
func postgresDown() *scenario {
	return &scenario{
		name: "worker postgres",
		expect: []expectation{{"IdempotentEventsNoWorkerConsuming", map[string]string{"queue": "events.main"},
			"worker's Postgres refused (TCP proxy down): it pauses consumption while 20 events arrive"}},
		removal: "proxy up: the worker resumes",
		induce: func(ctx context.Context, s *system) error {
			s.workPG.SetDown(true)
			if got := s.send(ctx, s.good, "nopg", 20, 4); got[202] != 20 {
				return fmt.Errorf("20 deliveries answered %v", got)
			}
			return nil
		},
		remove: func(ctx context.Context, s *system) error { s.workPG.SetDown(false); return nil },
	}
}

// outboxStalled: the relay's RabbitMQ connection is refused while handlers
// enqueue; the rows wait. Their created_at is moved 11 minutes back: the
// threshold (600 s) is in the expression, and the suite cannot wait it out.
func outboxStalled() *scenario {
	return &scenario{
		name: "outbox stalled",
		expect: []expectation{{"IdempotentEventsOutboxStalled", nil,
			"relay's RabbitMQ connection refused (TCP proxy down); 10 payments enqueue emails; their outbox rows' created_at moved 11m back"}},
		removal: "proxy up: the relay publishes them",
		induce: func(ctx context.Context, s *system) error {
			s.relayAMQP.SetDown(true)
			if got := s.send(ctx, s.good, "stalled", 10, 5); got[202] != 10 {
				return fmt.Errorf("10 deliveries answered %v", got)
			}
			if err := waitFor(ctx, 60*time.Second, "10 unpublished outbox rows", func() (bool, error) {
				n, err := s.count1(ctx, `SELECT count(*) FROM outbox WHERE published_at IS NULL AND parked_at IS NULL AND event_id LIKE 'evt_stalled_%'`)
				return n >= 10, err
			}); err != nil {
				return err
			}
			_, err := s.sql(ctx, `UPDATE outbox SET created_at = created_at - interval '11 minutes' WHERE published_at IS NULL AND parked_at IS NULL`)
			return err
		},
		remove: func(ctx context.Context, s *system) error { s.relayAMQP.SetDown(false); return nil },
	}
}

// Releases of the rollout scenario: the orders worker runs as ordersRelease
// from the start; the stock worker (another handler set) is stockRelease.
const (
	ordersRelease = "orders-v1"
	stockRelease  = "stock-v2"
)

// rollout: a rollout to another handler set (the stock worker) that does
// not finish: the chart's migration hook announces the new release, its
// worker starts and becomes current, and the orders worker, fenced, keeps
// running beside it. It is rolled back as the runbook says: the hook
// announces the old release again (helm rollback), the old worker becomes
// current again, and the new one is removed.
func rollout() *scenario {
	return &scenario{
		name: "rollout",
		expect: []expectation{{"IdempotentEventsHandlerSetsMixed", nil,
			"migrate announces release " + stockRelease + "; its stock worker (another handler set) starts and fences the orders worker"}},
		removal: "rolled back: migrate announces " + ordersRelease + " again, the orders worker is current again, the stock worker stopped",
		induce: func(ctx context.Context, s *system) error {
			if err := s.migrate(ctx, stockRelease); err != nil {
				return err
			}
			if err := s.start(ctx, "worker-stock", true); err != nil {
				return err
			}
			// Events keep coming: the orders worker's next commit is
			// refused and it is fenced.
			if got := s.send(ctx, s.good, "rollout", 10, 2); got[202] != 10 {
				return fmt.Errorf("10 deliveries answered %v", got)
			}
			return nil
		},
		remove: func(ctx context.Context, s *system) error {
			if err := s.migrate(ctx, ordersRelease); err != nil {
				return err
			}
			// The fenced worker looks every 5 s whether its release is
			// current again.
			if err := harness.WaitHTTPEvery("http://"+s.procs["worker"].metrics+"/readyz", 30*time.Second, 200*time.Millisecond); err != nil {
				return fmt.Errorf("the orders worker is not consuming again after the rollback: %w", err)
			}
			return s.stop("worker-stock")
		},
	}
}

// redisDown: Redis refuses the worker's (and the receiver's) connections
// while events flow. The alert's rate() is over 5 minutes, so it resolves
// 5 minutes after the last error whatever follows: that wait runs beside
// the next steps.
func redisDown() *scenario {
	return &scenario{
		name: "redis",
		expect: []expectation{{"IdempotentEventsRedisFailing", map[string]string{"job": "worker"},
			"Redis refused (TCP proxy down) while 20 events arrive"}},
		removal:       "proxy up (the alert's rate() then needs 5m to forget the errors)",
		background:    true,
		resolveWithin: 5*time.Minute + resolveTimeout,
		induce: func(ctx context.Context, s *system) error {
			s.redis.SetDown(true)
			if got := s.send(ctx, s.good, "noredis", 20, 4); got[202] != 20 {
				return fmt.Errorf("20 deliveries answered %v", got)
			}
			return nil
		},
		remove: func(ctx context.Context, s *system) error {
			s.redis.SetDown(false)
			return waitFor(ctx, 60*time.Second, "the events sent without Redis committed", func() (bool, error) {
				n, err := s.count1(ctx, `SELECT count(*) FROM processed_events WHERE event_id LIKE 'evt_noredis_%'`)
				return n == 20, err
			})
		},
	}
}

// waitFor polls cond every 200 ms until it is true or timeout passes.
func waitFor(ctx context.Context, timeout time.Duration, what string, cond func() (bool, error)) error {
	deadline := time.Now().Add(timeout)
	var last error
	for {
		ok, err := cond()
		if ok {
			return nil
		}
		if err != nil {
			last = err
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			if last != nil {
				return fmt.Errorf("%s: not within %s (last error: %w)", what, timeout, last)
			}
			return fmt.Errorf("%s: not within %s", what, timeout)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
