package main

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idempotent-events/idempotent-events/pkg/internal/broker"
	"github.com/idempotent-events/idempotent-events/pkg/internal/faulttest"
	"github.com/idempotent-events/idempotent-events/pkg/internal/harness"
	"github.com/idempotent-events/idempotent-events/pkg/internal/servicetest"
)

const (
	secret    = "whsec_alerts"
	stripeKey = "rk_test_alerts"
	// queueStatsEvery is the workers' QUEUE_STATS_INTERVAL: the queue
	// gauges follow RabbitMQ within a second.
	queueStatsEvery = "1s"
)

// system is the running stack the alerts watch, as the chart deploys it
// with the relay apart (outbox.relay.mode=deployment): a receiver, a worker
// (the examples' orders worker: the payment state, an orders row and a
// confirmation email through the outbox), a relay (the same binary,
// OUTBOX_RELAY=only) and the downstream confirmations consumer, on a vhost,
// a schema and a Redis prefix of their own. Each dependency of each
// component that a scenario fails is reached through a TCP proxy.
type system struct {
	mon   *monitor
	stack *harness.Stack

	// recvAMQP, workAMQP, relayAMQP: RabbitMQ for the receiver, the worker,
	// the relay; workPG: the worker's Postgres; mgmt: the worker's RabbitMQ
	// management API; redis: Redis for the receiver and the worker.
	recvAMQP, workAMQP, relayAMQP, workPG, mgmt, redis *faulttest.Proxy

	httpAddr string
	good     *harness.Sender
	bad      *harness.Sender // signs with a secret the receiver does not hold
	stripe   *harness.StripeEvents

	mu    sync.Mutex
	procs map[string]*proc

	seq atomic.Int64
	// answers counts the receiver's answers by status code.
	answers sync.Map // int -> *atomic.Int64
}

// proc is a component: its process, its metrics address (the Prometheus
// target) and how to start it again.
type proc struct {
	name, bin, job, metrics string
	env                     []string
	p                       *harness.Proc
}

func newSystem(ctx context.Context, mon *monitor, binDir string) (*system, error) {
	s := &system{mon: mon, procs: map[string]*proc{}, httpAddr: harness.FreeAddr()}
	var err error
	if s.stack, err = harness.NewStack(ctx, binDir, "ie_alerts"); err != nil {
		return nil, err
	}
	for _, p := range []struct {
		dst    **faulttest.Proxy
		target string
	}{
		{&s.recvAMQP, hostOf(s.stack.AMQPURL)}, {&s.workAMQP, hostOf(s.stack.AMQPURL)}, {&s.relayAMQP, hostOf(s.stack.AMQPURL)},
		{&s.workPG, hostOf(s.stack.DatabaseURL)}, {&s.mgmt, hostOf(servicetest.RabbitAPI)}, {&s.redis, hostOf(s.stack.RedisURL)},
	} {
		if *p.dst, err = faulttest.Start(p.target); err != nil {
			s.close()
			return nil, err
		}
	}
	s.good = harness.NewSender("http://"+s.httpAddr, secret, 16)
	s.bad = harness.NewSender("http://"+s.httpAddr, "whsec_not_the_receivers", 4)
	s.stripe = harness.NewStripeEvents(stripeKey)
	mgmtURL := "http://guest:guest@" + s.mgmt.Addr()
	if u := userOf(servicetest.RabbitAPI); u != "" {
		mgmtURL = "http://" + u + "@" + s.mgmt.Addr()
	}
	redisURL := servicetest.ReplaceHost(s.stack.RedisURL, s.redis.Addr())
	s.define("receiver", "receiver", "receiver", "WEBHOOK_SECRETS="+secret, "HTTP_ADDR="+s.httpAddr,
		"AMQP_URL="+servicetest.ReplaceHost(s.stack.AMQPURL, s.recvAMQP.Addr()), "REDIS_URL="+redisURL,
		"PUBLISH_TIMEOUT=2s", "AMQP_RECONNECT_MAX_BACKOFF=1s", "SHUTDOWN_TIMEOUT=3s")
	// lock_timeout: a transaction that waits on a lock for a second fails
	// with a database error the worker retries through a tier (the
	// baseline's retries).
	workerDB := servicetest.ReplaceHost(s.stack.DatabaseURL, s.workPG.Addr())
	workerDB += map[bool]string{true: "&", false: "?"}[strings.Contains(workerDB, "?")] + "lock_timeout=1000"
	workerEnv := []string{"AMQP_URL=" + servicetest.ReplaceHost(s.stack.AMQPURL, s.workAMQP.Addr()),
		"DATABASE_URL=" + workerDB, "REDIS_URL=" + redisURL,
		"RABBITMQ_MANAGEMENT_URL=" + mgmtURL, "QUEUE_STATS_INTERVAL=" + queueStatsEvery, "OUTBOX_RELAY=off",
		"RETRY_DELAYS=1s,2s,4s", "AMQP_RECONNECT_MAX_BACKOFF=1s", "SHUTDOWN_TIMEOUT=3s", "PROCESS_TIMEOUT=5s"}
	s.define("worker", "orders", "worker", append(workerEnv, "WORKER_RELEASE="+ordersRelease)...)
	// The stock worker of the rollout scenario: another handler set, the
	// same dependencies.
	s.define("worker-stock", "worker", "worker", append(workerEnv, "WORKER_RELEASE="+stockRelease)...)
	// The relay publishes with its own connection; it reads no queue
	// statistics (the workers do).
	s.define("relay", "orders", "relay", "AMQP_URL="+servicetest.ReplaceHost(s.stack.AMQPURL, s.relayAMQP.Addr()),
		"OUTBOX_RELAY=only", "RABBITMQ_MANAGEMENT_URL=off", "OUTBOX_MAX_ATTEMPTS=2", "OUTBOX_MAX_BACKOFF=1s",
		"AMQP_RECONNECT_MAX_BACKOFF=1s", "SHUTDOWN_TIMEOUT=3s")
	// The downstream service of the outbox's confirmation emails; it
	// exports no metrics.
	s.define("consumer", "confirmations", "")
	return s, nil
}

func hostOf(rawURL string) string {
	rest := rawURL[strings.Index(rawURL, "://")+3:]
	if at := strings.LastIndex(strings.SplitN(rest, "/", 2)[0], "@"); at >= 0 {
		rest = rest[at+1:]
	}
	return strings.SplitN(strings.SplitN(rest, "/", 2)[0], "?", 2)[0]
}

func userOf(rawURL string) string {
	rest := rawURL[strings.Index(rawURL, "://")+3:]
	host := strings.SplitN(rest, "/", 2)[0]
	if at := strings.LastIndex(host, "@"); at >= 0 {
		return host[:at]
	}
	return ""
}

// define records how a component is started; its metrics address is
// fixed for the run, so a restarted component is the same target.
func (s *system) define(name, bin, job string, env ...string) {
	s.procs[name] = &proc{name: name, bin: bin, job: job, metrics: harness.FreeAddr(), env: env}
}

// start starts a component, makes it a Prometheus target and waits until
// it answers /readyz (workers: consuming) and Prometheus scraped it.
func (s *system) start(ctx context.Context, name string, ready bool) error {
	s.mu.Lock()
	c := s.procs[name]
	s.mu.Unlock()
	env := s.stack.Env(append([]string{"METRICS_ADDR=" + c.metrics}, c.env...)...)
	p, err := s.stack.Start(name, c.bin, env)
	if err != nil {
		return err
	}
	s.mu.Lock()
	c.p = p
	s.mu.Unlock()
	if c.job == "" {
		// Not scraped: the downstream consumer, ready once its queue is
		// bound (the relay's publishes are returned before).
		return waitFor(ctx, 60*time.Second, name+" declared its queue", func() (bool, error) {
			return s.queueExists(confirmationsQueue)
		})
	}
	if err := s.mon.addTarget(c.metrics, c.job); err != nil {
		return err
	}
	url := "http://" + c.metrics + "/metrics"
	if ready {
		url = "http://" + c.metrics + "/readyz"
	}
	if err := harness.WaitHTTPEvery(url, 60*time.Second, 100*time.Millisecond); err != nil {
		return fmt.Errorf("%s did not get ready: %w\n%s", name, err, lastLines(p.Log(), 15))
	}
	return s.mon.waitScraped(ctx, c.metrics, 30*time.Second)
}

// running lists the running components of the given jobs, sorted.
func (s *system) running(jobs ...string) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for name, c := range s.procs {
		if c.p != nil && slices.Contains(jobs, c.job) {
			out = append(out, name)
		}
	}
	sort.Strings(out)
	return out
}

// stop stops a component with SIGTERM, as a scale-down or a rollout does.
func (s *system) stop(name string) error {
	s.mu.Lock()
	c := s.procs[name]
	p := c.p
	c.p = nil
	s.mu.Unlock()
	if p == nil {
		return fmt.Errorf("%s is not running", name)
	}
	if code := p.Term(10 * time.Second); code != 0 {
		return fmt.Errorf("%s exited %d on SIGTERM:\n%s", name, code, lastLines(p.Log(), 15))
	}
	return nil
}

// logs returns the last lines of every running component.
func (s *system) logs(n int) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var b strings.Builder
	for _, c := range s.procs {
		if c.p != nil {
			fmt.Fprintf(&b, "--- %s:\n%s\n", c.name, lastLines(c.p.Log(), n))
		}
	}
	return b.String()
}

func (s *system) close() {
	s.mu.Lock()
	var running []*harness.Proc
	for _, c := range s.procs {
		if c.p != nil {
			running = append(running, c.p)
			c.p = nil
		}
	}
	s.mu.Unlock()
	for _, p := range running {
		p.Term(5 * time.Second)
	}
	for _, p := range []*faulttest.Proxy{s.recvAMQP, s.workAMQP, s.relayAMQP, s.workPG, s.mgmt, s.redis} {
		if p != nil {
			p.Close()
		}
	}
	if s.stripe != nil {
		s.stripe.Close()
	}
	if s.stack != nil {
		s.stack.Close()
	}
}

// nextID returns a new event id.
func (s *system) nextID(kind string) string {
	return fmt.Sprintf("evt_%s_%d", kind, s.seq.Add(1))
}

// send posts n new payment events, conc at a time, signed by sender, and
// counts the answers.
func (s *system) send(ctx context.Context, sender *harness.Sender, kind string, n, conc int) map[int]int {
	ids := make(chan string)
	go func() {
		defer close(ids)
		for range n {
			select {
			case ids <- s.nextID(kind):
			case <-ctx.Done():
				return
			}
		}
	}()
	var mu sync.Mutex
	got := map[int]int{}
	var wg sync.WaitGroup
	for range conc {
		wg.Go(func() {
			for id := range ids {
				code, _ := sender.Send(ctx, harness.Body(id))
				s.count(code)
				mu.Lock()
				got[code]++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return got
}

// resend posts the events of ids again (a provider's retry).
func (s *system) resend(ctx context.Context, ids []string) map[int]int {
	got := map[int]int{}
	for _, id := range ids {
		code, _ := s.good.Send(ctx, harness.Body(id))
		s.count(code)
		got[code]++
	}
	return got
}

func (s *system) count(code int) {
	v, _ := s.answers.LoadOrStore(code, new(atomic.Int64))
	v.(*atomic.Int64).Add(1)
}

// answered is how many requests the receiver answered with code.
func (s *system) answered(code int) int64 {
	v, ok := s.answers.Load(code)
	if !ok {
		return 0
	}
	return v.(*atomic.Int64).Load()
}

// requests is how many requests the receiver answered, all codes.
func (s *system) requests() int64 {
	var n int64
	s.answers.Range(func(_, v any) bool { n += v.(*atomic.Int64).Load(); return true })
	return n
}

// publish puts a message on main_exchange as the receiver does, with the
// given body and publish time, straight to the broker.
func (s *system) publish(ctx context.Context, id string, body []byte, at time.Time) error {
	conn, err := amqp.Dial(s.stack.AMQPURL)
	if err != nil {
		return err
	}
	defer conn.Close()
	ch, err := broker.OpenConfirmChannel(conn)
	if err != nil {
		return err
	}
	defer ch.Close()
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	return ch.Publish(pctx, broker.Exchange, broker.RoutingKey, amqp.Publishing{
		ContentType: "application/json", MessageId: id, Type: "payment_intent.succeeded", Timestamp: at, Body: body,
		DeliveryMode: amqp.Persistent,
		Headers:      amqp.Table{broker.HeaderSource: "stripe", broker.HeaderReceivedAt: at.UnixMilli()},
	})
}

// eventsctl runs the real eventsctl with the stack's environment (direct
// to the services, as an operator's shell) and returns its output.
func (s *system) eventsctl(ctx context.Context, args ...string) (string, error) {
	env := s.stack.Env("STRIPE_API_KEY="+stripeKey, "STRIPE_API_URL="+s.stripe.URL(), "DLQ_OPERATOR=alerts-suite")
	p, err := s.stack.Start("eventsctl", "eventsctl", env, args...)
	if err != nil {
		return "", err
	}
	select {
	case <-p.Exited():
	case <-time.After(2 * time.Minute):
		p.Kill()
	case <-ctx.Done():
		p.Kill()
	}
	if code := p.ExitCode(); code != 0 {
		return p.Log(), fmt.Errorf("eventsctl %s: exit %d:\n%s", strings.Join(args, " "), code, lastLines(p.Log(), 15))
	}
	return p.Log(), nil
}

// metric sums a metric family's samples as component serves them now.
func (s *system) metric(component, name string) (float64, error) {
	fams, err := harness.Scrape(s.procs[component].metrics)
	if err != nil {
		return 0, err
	}
	var sum float64
	if f, ok := fams[name]; ok {
		for _, m := range f.GetMetric() {
			sum += m.GetCounter().GetValue() + m.GetGauge().GetValue()
		}
	}
	return sum, nil
}

// queueExists reports whether the stack's vhost has queue.
func (s *system) queueExists(queue string) (bool, error) {
	conn, err := amqp.Dial(s.stack.AMQPURL)
	if err != nil {
		return false, err
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return false, err
	}
	defer ch.Close()
	_, err = ch.QueueDeclarePassive(queue, true, false, false, false, nil)
	return err == nil, nil
}

// migrate runs the real migrate with WORKER_RELEASE=release, as the
// chart's migration hook does before an upgrade or a rollback: it
// announces the release.
func (s *system) migrate(ctx context.Context, release string) error {
	p, err := s.stack.Start("migrate", "migrate", s.stack.Env("WORKER_RELEASE="+release))
	if err != nil {
		return err
	}
	select {
	case <-p.Exited():
	case <-time.After(time.Minute):
		p.Kill()
	case <-ctx.Done():
		p.Kill()
	}
	if code := p.ExitCode(); code != 0 {
		return fmt.Errorf("migrate (WORKER_RELEASE=%s): exit %d:\n%s", release, code, lastLines(p.Log(), 15))
	}
	return nil
}

// sql runs a statement on the stack's schema.
func (s *system) sql(ctx context.Context, q string, args ...any) (int64, error) {
	tag, err := s.stack.DB.Exec(ctx, q, args...)
	return tag.RowsAffected(), err
}

// count1 runs a query that returns one integer.
func (s *system) count1(ctx context.Context, q string, args ...any) (int, error) {
	var n int
	err := s.stack.DB.QueryRow(ctx, q, args...).Scan(&n)
	return n, err
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}
