// Package pipelinetest runs a real pipeline for tests (of the DLQ tools in
// dlq, admin and eventsctl among others): a worker started in-process with
// app.RunWorker on the test's own vhost, schema and Redis prefix, events
// published as the receiver publishes them, and a switch that makes
// Postgres reject chosen events, so they land in the DLQ until the cause is
// fixed.
//
// It is for tests only: no product package imports it
// (pkg/internal/app/layers_test.go checks).
package pipelinetest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap/zaptest"

	"github.com/idempotent-events/idempotent-events/pkg/effects"
	"github.com/idempotent-events/idempotent-events/pkg/internal/app"
	"github.com/idempotent-events/idempotent-events/pkg/internal/broker"
	"github.com/idempotent-events/idempotent-events/pkg/internal/config"
	"github.com/idempotent-events/idempotent-events/pkg/internal/event/eventtest"
	"github.com/idempotent-events/idempotent-events/pkg/internal/servicetest"
	"github.com/idempotent-events/idempotent-events/pkg/payments"
)

// Token is the admin token the pipelines use when the admin server is on.
const Token = "test-admin-token-0123456789abcdef"

// Pipeline is one test's slice of the services plus, once started, a worker.
type Pipeline struct {
	T       testing.TB
	AMQPURL string
	DBURL   string
	Prefix  string
	Topo    broker.Topology
	Broker  *servicetest.Broker
	DB      *pgxpool.Pool
	// Effects are the worker's handlers: payments.Effects() unless the test
	// sets others before StartWorker.
	Effects *effects.Registry
	// Tune, when set, changes the worker's configuration before StartWorker
	// runs it (a larger batch for a long backlog).
	Tune func(*config.Worker)
	// Set by StartWorker.
	Reg         *prometheus.Registry
	MetricsAddr string
	AdminAddr   string
}

// New creates the vhost, schema and prefix, declares the topology and
// installs the rejection switch: a payments insert for an event id listed in
// table blocked fails with check_violation (the worker dead-letters it with
// reason rejected_by_database).
func New(t testing.TB) *Pipeline {
	t.Helper()
	p := &Pipeline{T: t, AMQPURL: servicetest.VHost(t), DBURL: servicetest.Schema(t), Prefix: servicetest.RedisPrefix(t), Effects: payments.Effects(),
		Topo: broker.Topology{QueueType: broker.QueueClassic, RetryDelays: []time.Duration{200 * time.Millisecond}, DeliveryLimit: 100}}
	p.Broker = servicetest.NewBroker(t, p.AMQPURL, p.Topo)
	pool, err := pgxpool.New(context.Background(), p.DBURL)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	p.DB = pool
	p.exec(`
		CREATE TABLE blocked (event_id text PRIMARY KEY);
		CREATE FUNCTION reject_blocked() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			IF EXISTS (SELECT 1 FROM blocked WHERE event_id = NEW.event_id) THEN
				RAISE EXCEPTION 'payment % rejected by the test', NEW.event_id USING ERRCODE = 'check_violation';
			END IF;
			RETURN NEW;
		END $$;
		CREATE TRIGGER reject_blocked BEFORE INSERT ON payments FOR EACH ROW EXECUTE FUNCTION reject_blocked();`)
	return p
}

func (p *Pipeline) exec(sql string, args ...any) {
	p.T.Helper()
	_, err := p.DB.Exec(context.Background(), sql, args...)
	require.NoError(p.T, err)
}

// Block makes Postgres reject the payments of ids.
func (p *Pipeline) Block(ids ...string) {
	p.T.Helper()
	for _, id := range ids {
		p.exec(`INSERT INTO blocked VALUES ($1) ON CONFLICT DO NOTHING`, id)
	}
}

// Unblock fixes the cause: the payments of every event are accepted again.
func (p *Pipeline) Unblock() {
	p.T.Helper()
	p.exec(`DELETE FROM blocked`)
}

// Config is the worker configuration StartWorker uses; adminToken empty
// leaves the admin server off.
func (p *Pipeline) Config(adminToken string) config.Worker {
	p.T.Helper()
	cfg := config.Worker{
		Connections: config.Connections{AMQPURL: p.AMQPURL, RedisURL: servicetest.RedisURL, DatabaseURL: p.DBURL,
			AMQPReconnectMaxBackoff: 200 * time.Millisecond},
		Logging:  config.Logging{LogLevel: "debug", LogFormat: "console"},
		Topology: config.Topology{QueueType: p.Topo.QueueType, RetryDelays: config.Durations(p.Topo.RetryDelays), QuorumDeliveryLimit: p.Topo.DeliveryLimit},
		Dedupe:   config.Dedupe{RedisKeyPrefix: p.Prefix, DedupeTTL: time.Minute},
		Admin: config.Admin{AdminAddr: servicetest.FreeAddr(), AdminToken: adminToken, AdminOperator: "test-api",
			AdminReplayRate: 50, AdminScanLimit: 1000, AdminSessionTTL: time.Hour},
		MetricsAddr: servicetest.FreeAddr(), Prefetch: 16, ReplayPrefetch: 4, Concurrency: 2, BatchSize: 8,
		BatchWait: 5 * time.Millisecond, OutageMode: "pause", DBMaxConns: 4, ProcessTimeout: 5 * time.Second,
		PublishTimeout: 5 * time.Second, ShutdownTimeout: 5 * time.Second, RabbitMQManagementURL: "off",
		QueueStatsInterval: 15 * time.Second,
		Outbox: config.Outbox{OutboxRelay: "on", OutboxBatchSize: 100, OutboxPoll: 100 * time.Millisecond, OutboxMaxAttempts: 5,
			OutboxMaxBackoff: time.Second, OutboxRetention: 168 * time.Hour},
	}
	require.NoError(p.T, cfg.Validate())
	return cfg
}

// StartWorker runs app.RunWorker in-process until the end of the test and
// waits until it consumes (and, with an admin token, until the admin server
// answers).
func (p *Pipeline) StartWorker(adminToken string) {
	p.T.Helper()
	cfg := p.Config(adminToken)
	if p.Tune != nil {
		p.Tune(&cfg)
		require.NoError(p.T, cfg.Validate())
	}
	p.Reg = prometheus.NewRegistry()
	p.MetricsAddr = cfg.MetricsAddr
	if adminToken != "" {
		p.AdminAddr = cfg.AdminAddr
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- app.RunWorker(ctx, cfg, p.Effects, zaptest.NewLogger(p.T).Named("worker"), p.Reg)
	}()
	p.T.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			require.NoError(p.T, err)
		case <-time.After(30 * time.Second):
			p.T.Error("worker did not stop within 30s")
		}
	})
	require.NoError(p.T, servicetest.AwaitHTTP("http://"+cfg.MetricsAddr+"/readyz", http.StatusOK, 20*time.Second))
	if adminToken != "" {
		require.NoError(p.T, servicetest.AwaitHTTP("http://"+cfg.AdminAddr+"/api/dlq", http.StatusUnauthorized, 20*time.Second))
	}
}

// Event returns a Stripe payment event body.
func (p *Pipeline) Event(id string) []byte {
	p.T.Helper()
	return eventtest.Payment(id, eventtest.Amount(4200))
}

// Publish publishes body to main_exchange as the receiver does (MessageId,
// Type, x-ie-source, x-ie-received-at) and waits for the confirm.
func (p *Pipeline) Publish(id, typ string, body []byte) {
	p.T.Helper()
	p.publish(broker.Exchange, broker.RoutingKey, amqp.Publishing{
		ContentType: "application/json", MessageId: id, Type: typ, Timestamp: time.Now(), Body: body,
		Headers: amqp.Table{broker.HeaderSource: "stripe", broker.HeaderReceivedAt: time.Now().UnixMilli()},
	})
}

// PublishEvent publishes a valid payment event with id.
func (p *Pipeline) PublishEvent(id string) {
	p.T.Helper()
	p.Publish(id, "payment_intent.succeeded", p.Event(id))
}

// PublishAll publishes every body as Publish does, with the message id of
// the event in it, many at a time on one confirm channel, and waits for
// every confirm.
func (p *Pipeline) PublishAll(bodies [][]byte) {
	p.T.Helper()
	conn, err := amqp.Dial(p.AMQPURL)
	require.NoError(p.T, err)
	defer conn.Close()
	ch, err := broker.OpenConfirmChannel(conn)
	require.NoError(p.T, err)
	defer ch.Close()
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, 1)
	for range 32 {
		wg.Go(func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= len(bodies) {
					return
				}
				var id struct{ ID, Type string }
				if err := json.Unmarshal(bodies[i], &id); err != nil {
					select {
					case errs <- err:
					default:
					}
					return
				}
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				err := ch.Publish(ctx, broker.Exchange, broker.RoutingKey, amqp.Publishing{
					ContentType: "application/json", MessageId: id.ID, Type: id.Type, Timestamp: time.Now(), Body: bodies[i],
					Headers: amqp.Table{broker.HeaderSource: "stripe", broker.HeaderReceivedAt: time.Now().UnixMilli()},
				})
				cancel()
				if err != nil {
					select {
					case errs <- err:
					default:
					}
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	require.NoError(p.T, <-errs)
}

// PutInDLQ publishes a message straight to events.dlq shaped as the worker
// makes DLQ copies, and returns its DLQ id.
func (p *Pipeline) PutInDLQ(eventID, reason string, body []byte, deadLetteredAt time.Time) string {
	p.T.Helper()
	var b [8]byte
	_, _ = rand.Read(b[:])
	id := hex.EncodeToString(b[:])
	at := deadLetteredAt.UTC().Format(time.RFC3339Nano)
	p.publish("", broker.DLQ, amqp.Publishing{
		ContentType: "application/json", MessageId: eventID, Type: "payment_intent.succeeded", Timestamp: time.Now(), Body: body,
		Headers: amqp.Table{
			broker.HeaderSource: "stripe", broker.HeaderReceivedAt: time.Now().Add(-time.Minute).UnixMilli(),
			broker.HeaderAttempt: int64(3), broker.HeaderDLQID: id, broker.HeaderDLQReason: reason,
			broker.HeaderFirstError: "first failure", broker.HeaderFirstFailedAt: at,
			broker.HeaderLastError: "last failure", broker.HeaderLastFailedAt: at,
			broker.HeaderDeadLetteredAt: at, broker.HeaderOriginalExchange: broker.Exchange,
			broker.HeaderOriginalRoutingKey: broker.RoutingKey,
		},
	})
	return id
}

func (p *Pipeline) publish(exchange, key string, msg amqp.Publishing) {
	p.T.Helper()
	conn, err := amqp.Dial(p.AMQPURL)
	require.NoError(p.T, err)
	defer conn.Close()
	ch, err := broker.OpenConfirmChannel(conn)
	require.NoError(p.T, err)
	defer ch.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(p.T, ch.Publish(ctx, exchange, key, msg))
}

// Depth is the number of ready messages in queue.
func (p *Pipeline) Depth(queue string) int { return p.Broker.Depth(queue) }

// LedgerRows is the number of rows in processed_events.
func (p *Pipeline) LedgerRows() int {
	p.T.Helper()
	var n int
	require.NoError(p.T, p.DB.QueryRow(context.Background(), `SELECT count(*) FROM processed_events`).Scan(&n))
	return n
}

// Rows returns the payments and processed_events rows of event id.
func (p *Pipeline) Rows(id string) (payments, ledger int) {
	p.T.Helper()
	ctx := context.Background()
	require.NoError(p.T, p.DB.QueryRow(ctx, `SELECT count(*) FROM payments WHERE event_id = $1`, id).Scan(&payments))
	require.NoError(p.T, p.DB.QueryRow(ctx, `SELECT count(*) FROM processed_events WHERE event_id = $1`, id).Scan(&ledger))
	return payments, ledger
}

// Invariant is the design's query that must return zero rows.
func (p *Pipeline) Invariant() {
	p.T.Helper()
	var n int
	require.NoError(p.T, p.DB.QueryRow(context.Background(),
		`SELECT count(*) FROM (SELECT event_id FROM processed_events GROUP BY event_id HAVING COUNT(*) > 1) d`).Scan(&n))
	require.Zero(p.T, n, "processed_events has duplicated event ids")
}

// Outcomes is the worker's idempotent_events_worker_events_total{outcome}.
func (p *Pipeline) Outcomes(outcome string) float64 {
	return max(0, servicetest.Metric(p.Reg, "idempotent_events_worker_events_total", "outcome", outcome))
}

// Eventually waits up to 20s for cond.
func (p *Pipeline) Eventually(cond func() bool, msg string, args ...any) {
	p.T.Helper()
	require.Eventually(p.T, cond, 20*time.Second, 20*time.Millisecond, append([]any{msg}, args...)...)
}

// AuditRow is what tests check in dlq_audit.
type AuditRow struct {
	Operator, Via, Action, DLQID, EventID, Reason, Outcome string
	DryRun                                                 bool
	Payload                                                []byte
}

// Audit returns the rows of dlq_audit in insertion order.
func (p *Pipeline) Audit() []AuditRow {
	p.T.Helper()
	rows, err := p.DB.Query(context.Background(),
		`SELECT operator, via, action, dlq_id, event_id, reason, outcome, dry_run, payload FROM dlq_audit ORDER BY id`)
	require.NoError(p.T, err)
	defer rows.Close()
	var out []AuditRow
	for rows.Next() {
		var r AuditRow
		require.NoError(p.T, rows.Scan(&r.Operator, &r.Via, &r.Action, &r.DLQID, &r.EventID, &r.Reason, &r.Outcome, &r.DryRun, &r.Payload))
		out = append(out, r)
	}
	require.NoError(p.T, rows.Err())
	return out
}
