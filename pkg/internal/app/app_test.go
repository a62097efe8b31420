package app_test

import (
	"bytes"
	"context"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"go.uber.org/zap/zaptest"

	"github.com/idempotent-events/idempotent-events/pkg/internal/app"
	"github.com/idempotent-events/idempotent-events/pkg/internal/broker"
	"github.com/idempotent-events/idempotent-events/pkg/internal/config"
	"github.com/idempotent-events/idempotent-events/pkg/internal/outbox"
	"github.com/idempotent-events/idempotent-events/pkg/internal/pipelinetest"
	"github.com/idempotent-events/idempotent-events/pkg/internal/servicetest"
	"github.com/idempotent-events/idempotent-events/pkg/internal/store"
	"github.com/idempotent-events/idempotent-events/pkg/payments"
)

// Every goroutine a test starts must be stopped by the time it ends; a
// run function that fails half-way must not leave its pools behind.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

type binaryFunc func(args []string, stdout, stderr io.Writer) int

func binaries() map[string]binaryFunc {
	worker := func(args []string, stdout, stderr io.Writer) int {
		return app.Worker(payments.Effects(), args, stdout, stderr)
	}
	return map[string]binaryFunc{"receiver": app.Receiver, "worker": worker, "migrate": app.Migrate}
}

func call(bin binaryFunc, args ...string) (int, string, string) {
	var stdout, stderr bytes.Buffer
	code := bin(args, &stdout, &stderr)
	return code, stdout.String(), stderr.String()
}

// Help is not an error: -h and --help print the usage on stdout and exit 0;
// an argument the binary does not take exits 2 with the usage on stderr.
func TestHelpExitsZeroAndUnknownArgumentsTwo(t *testing.T) {
	for name, bin := range binaries() {
		for _, arg := range []string{"-h", "--help"} {
			code, stdout, stderr := call(bin, arg)
			assert.Equal(t, app.ExitOK, code, "%s %s", name, arg)
			assert.Contains(t, stdout, "usage: "+name, "%s %s", name, arg)
			assert.Empty(t, stderr)
		}
		code, stdout, stderr := call(bin, "--frobnicate")
		assert.Equal(t, app.ExitUsage, code, name)
		assert.Empty(t, stdout)
		assert.Contains(t, stderr, `unknown argument "--frobnicate"`, name)
	}
}

// What only the signature package can judge (a scheme's name, the form of
// a Standard Webhooks secret) is still a configuration error: exit 2, one
// line naming the variable, before anything starts.
func TestReceiverRefusesUnknownSchemesAndUnusableSecretsNamingTheVariable(t *testing.T) {
	t.Setenv("WEBHOOK_SECRETS", "whsec_stripe")
	for _, c := range []struct{ sources, secretsVar, secrets, variable string }{
		{"acme:soap", "WEBHOOK_SECRETS_ACME", "s1", "WEBHOOK_SOURCES"},
		{"acme:standard", "WEBHOOK_SECRETS_ACME", "not base64 !", "WEBHOOK_SECRETS_ACME"},
	} {
		t.Setenv("WEBHOOK_SOURCES", c.sources)
		t.Setenv(c.secretsVar, c.secrets)
		code, stdout, stderr := call(binaries()["receiver"], "--check-config")
		assert.Equal(t, app.ExitUsage, code, c.sources)
		assert.Empty(t, stdout)
		lines := strings.Split(strings.TrimSpace(stderr), "\n")
		require.Len(t, lines, 1, stderr)
		assert.True(t, strings.HasPrefix(lines[0], "invalid configuration: "+c.variable+": "), lines[0])
		assert.NotContains(t, stderr, c.secrets)
	}
	t.Setenv("WEBHOOK_SOURCES", "acme:standard")
	t.Setenv("WEBHOOK_SECRETS_ACME", "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
	code, stdout, _ := call(binaries()["receiver"], "--check-config")
	assert.Equal(t, app.ExitOK, code)
	assert.Equal(t, "receiver: configuration ok\n", stdout)
}

// --check-config names every bad variable at once, one line each, exit 2:
// two that do not parse, one that parses to a value out of range, and a URL
// whose password must not be printed.
func TestCheckConfigNamesEveryBadVariableOnceAndNoPassword(t *testing.T) {
	t.Setenv("WORKER_BATCH_SIZE", "abc")
	t.Setenv("WORKER_CONCURRENCY", "x")
	t.Setenv("WORKER_PREFETCH", "0")
	t.Setenv("AMQP_URL", "amqp://app:S3cretCanary-CheckConfig/x@rabbit:5672/")
	code, stdout, stderr := call(binaries()["worker"], "--check-config")
	require.Equal(t, app.ExitUsage, code, stderr)
	require.Empty(t, stdout)
	require.NotContains(t, stderr, "S3cretCanary-CheckConfig")
	var named []string
	for _, line := range strings.Split(strings.TrimSpace(stderr), "\n") {
		variable, _, ok := strings.Cut(strings.TrimPrefix(line, "invalid configuration: "), ": ")
		require.True(t, ok, line)
		named = append(named, variable)
	}
	require.ElementsMatch(t, []string{"AMQP_URL", "WORKER_PREFETCH", "WORKER_CONCURRENCY", "WORKER_BATCH_SIZE"}, named, stderr)
}

// What the signature package refuses is reported with the rest, not after
// the rest is fixed.
func TestCheckConfigNamesWhatTheSignaturePackageRefusesWithTheRest(t *testing.T) {
	t.Setenv("WEBHOOK_SECRETS", "whsec_stripe")
	t.Setenv("WEBHOOK_SOURCES", "acme:soap")
	t.Setenv("WEBHOOK_SECRETS_ACME", "s1")
	t.Setenv("RECEIVER_MAX_IN_FLIGHT", "lots")
	code, stdout, stderr := call(binaries()["receiver"], "--check-config")
	require.Equal(t, app.ExitUsage, code, stderr)
	require.Empty(t, stdout)
	lines := strings.Split(strings.TrimSpace(stderr), "\n")
	require.Len(t, lines, 2, stderr)
	require.Contains(t, stderr, "invalid configuration: RECEIVER_MAX_IN_FLIGHT: ")
	require.Contains(t, stderr, "invalid configuration: WEBHOOK_SOURCES: source acme: ")
}

// A worker whose start fails after it opened its listeners, pools and
// clients releases every one of them: the ports can be bound again at once,
// and goleak (TestMain) finds no goroutine of a pool left behind. Here the
// queue statistics fail to register (their names are taken on the
// registry), the last step before the worker runs.
func TestRunWorkerReleasesWhatItOpenedWhenAStepFails(t *testing.T) {
	p := pipelinetest.New(t)
	cfg := p.Config(pipelinetest.Token)
	cfg.RabbitMQManagementURL = "auto"
	reg := prometheus.NewRegistry()
	reg.MustRegister(prometheus.NewGauge(prometheus.GaugeOpts{Name: "idempotent_events_queue_stats_up", Help: "taken by the test"}))

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err := app.RunWorker(ctx, cfg, payments.Effects(), zaptest.NewLogger(t), reg)
	require.ErrorContains(t, err, "queuestats")
	for _, addr := range []string{cfg.MetricsAddr, cfg.AdminAddr} {
		ln, err := net.Listen("tcp", addr)
		require.NoError(t, err, "%s is still held after the failed start", addr)
		require.NoError(t, ln.Close())
	}
}

// The same when the failing step is a listener: an admin address already
// in use releases the metrics listener opened before it.
func TestRunWorkerReleasesTheMetricsListenerWhenTheAdminAddressIsTaken(t *testing.T) {
	p := pipelinetest.New(t)
	cfg := p.Config(pipelinetest.Token)
	taken, err := net.Listen("tcp", cfg.AdminAddr)
	require.NoError(t, err)
	defer func() { _ = taken.Close() }()

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err = app.RunWorker(ctx, cfg, payments.Effects(), zaptest.NewLogger(t), prometheus.NewRegistry())
	require.ErrorContains(t, err, "listen on "+cfg.AdminAddr)
	ln, err := net.Listen("tcp", cfg.MetricsAddr)
	require.NoError(t, err, "the metrics listener is still held")
	require.NoError(t, ln.Close())
}

// A worker with OUTBOX_RELAY=only (the chart's relay Deployment) is ready
// once its relay holds a broker connection, publishes what waits in the
// outbox, and consumes no event: events.main has no consumer, keeps its
// message, and the ledger stays empty.
func TestARelayOnlyWorkerPublishesTheOutboxAndConsumesNothing(t *testing.T) {
	p := pipelinetest.New(t)
	conn, err := amqp.Dial(p.AMQPURL)
	require.NoError(t, err)
	defer func() { _ = conn.Close() }()
	ch, err := conn.Channel()
	require.NoError(t, err)
	require.NoError(t, ch.ExchangeDeclare(outbox.Exchange, "topic", true, false, false, false, nil))
	_, err = ch.QueueDeclare("downstream", true, false, false, false, nil)
	require.NoError(t, err)
	require.NoError(t, ch.QueueBind("downstream", "#", outbox.Exchange, false, nil))
	_, err = p.DB.Exec(context.Background(), `INSERT INTO outbox (idempotency_key, event_id, effect, object_id, seq, exchange, routing_key, body)
		VALUES ('evt_relay_only/email', 'evt_relay_only', 'email', 'pi_relay_only', 1, $1, 'email.sent', 'hello')`, outbox.Exchange)
	require.NoError(t, err)
	p.PublishEvent("evt_relay_only_waits")

	p.Tune = func(c *config.Worker) { c.OutboxRelay = "only" }
	p.StartWorker("") // returns once /readyz answers 200
	p.Eventually(func() bool { return p.Depth("downstream") == 1 }, "the relay-only worker did not publish the outbox row")
	d, ok := p.Broker.Get("downstream")
	require.True(t, ok)
	assert.Equal(t, "evt_relay_only/email", d.MessageId)

	q, err := ch.QueueDeclarePassive(broker.MainQueue, true, false, false, false, nil)
	require.NoError(t, err)
	assert.Equal(t, 0, q.Consumers, "a relay-only worker consumes %s", broker.MainQueue)
	assert.Equal(t, 1, q.Messages)
	assert.Equal(t, 0, p.LedgerRows())
}

// The chart's migration hook runs `migrate` with WORKER_RELEASE: after the
// migrations it announces the release as the newest generation (no worker
// of another handler set commits from then on); again, as a rollback
// does, it is announced anew.
func TestMigrateWithAReleaseAnnouncesIt(t *testing.T) {
	dbURL := servicetest.Schema(t)
	t.Setenv("DATABASE_URL", dbURL)
	t.Setenv("WORKER_RELEASE", "ie-7")
	for range 2 {
		code, _, stderr := call(app.Migrate, "up")
		require.Equal(t, 0, code, stderr)
	}
	st, err := store.Open(context.Background(), dbURL, 1)
	require.NoError(t, err)
	defer st.Close()
	gens, err := st.Generations(context.Background())
	require.NoError(t, err)
	require.Len(t, gens, 2)
	for i, g := range gens {
		require.Equal(t, int64(2-i), g.Generation)
		require.Equal(t, "ie-7", g.Release)
		require.Empty(t, g.SetID, "announced: no worker registered")
	}
}
