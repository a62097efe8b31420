package eventsctl_test

import (
	"context"
	"net"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kelseyhightower/envconfig"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap/zaptest"

	"github.com/idempotent-events/idempotent-events/pkg/internal/app"
	"github.com/idempotent-events/idempotent-events/pkg/internal/config"
	"github.com/idempotent-events/idempotent-events/pkg/internal/pipelinetest"
	"github.com/idempotent-events/idempotent-events/pkg/internal/servicetest"
	"github.com/idempotent-events/idempotent-events/pkg/internal/telemetry"
)

// startReceiver runs the receiver in-process on p's vhost and key prefix
// until the test ends, and returns the address it listens on.
func startReceiver(t *testing.T, p *pipelinetest.Pipeline) string {
	t.Helper()
	cfg := config.Receiver{
		Connections: config.Connections{AMQPURL: p.AMQPURL, RedisURL: servicetest.RedisURL, DatabaseURL: p.DBURL,
			AMQPReconnectMaxBackoff: 200 * time.Millisecond},
		Logging:  config.Logging{LogLevel: "debug", LogFormat: "console"},
		Topology: config.Topology{QueueType: p.Topo.QueueType, RetryDelays: config.Durations(p.Topo.RetryDelays), QuorumDeliveryLimit: p.Topo.DeliveryLimit},
		Dedupe:   config.Dedupe{RedisKeyPrefix: p.Prefix, DedupeTTL: time.Minute},
		HTTPAddr: servicetest.FreeAddr(), MetricsAddr: servicetest.FreeAddr(), WebhookSecrets: config.List{sendSecret},
		WebhookTolerance: 5 * time.Minute, WebhookMaxBody: 1 << 20, PublishTimeout: 5 * time.Second, PublishChannels: 1,
		MaxInFlight: 64, RetryAfter: time.Second, DuplicateCheck: config.DuplicateCheckRedis,
		DuplicateCheckTimeout: 100 * time.Millisecond, ShutdownTimeout: 5 * time.Second,
	}
	withDefaults(t, &cfg)
	require.NoError(t, cfg.Validate())
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() {
		assert.NoError(t, app.RunReceiver(ctx, cfg, zaptest.NewLogger(t).Named("receiver"), telemetry.NewRegistry("receiver")))
	})
	t.Cleanup(func() { cancel(); wg.Wait() })
	require.NoError(t, servicetest.AwaitHTTP("http://"+cfg.HTTPAddr+"/readyz", 200, 20*time.Second))
	return cfg.HTTPAddr
}

// withDefaults sets every field of the configuration *cfg that is still
// zero to its default, decoded as the binaries decode it (envconfig, from
// the field's default tag, under a variable no one sets), so a
// configuration built in a test keeps up with the settings added later.
func withDefaults(t *testing.T, cfg any) {
	t.Helper()
	var fill func(v reflect.Value)
	fill = func(v reflect.Value) {
		for i := 0; i < v.NumField(); i++ {
			f, ft := v.Field(i), v.Type().Field(i)
			if ft.Anonymous && ft.Type.Kind() == reflect.Struct {
				fill(f)
				continue
			}
			def, ok := ft.Tag.Lookup("default")
			if !ok || !ft.IsExported() || !f.IsZero() {
				continue
			}
			tag := reflect.StructTag(`envconfig:"IE_SEND_TEST_NEVER_SET" default:` + strconv.Quote(def))
			one := reflect.New(reflect.StructOf([]reflect.StructField{{Name: ft.Name, Type: ft.Type, Tag: tag}}))
			require.NoError(t, envconfig.Process("", one.Interface()), ft.Name)
			f.Set(one.Elem().Field(0))
		}
	}
	fill(reflect.ValueOf(cfg).Elem())
}

// A lifecycle sent shuffled and duplicated to the real receiver (found by
// $HTTP_ADDR alone) ends, through the real worker and the payment effect,
// as Stripe's object ends: one ledger row and one payment_events row per
// event, none refused or contradictory, the PaymentIntent succeeded with
// its amount received and its charge captured.
func TestSendLifecycleThroughTheRealPipeline(t *testing.T) {
	t.Parallel()
	p := pipelinetest.New(t)
	p.StartWorker("")
	addr := startReceiver(t, p)
	_, port, err := net.SplitHostPort(addr)
	require.NoError(t, err)

	types := []string{"payment_intent.created", "payment_intent.processing", "charge.succeeded", "payment_intent.succeeded"}
	env := map[string]string{"WEBHOOK_SECRETS": sendSecret, "HTTP_ADDR": ":" + port}
	code, out, stderr := sendCmd(t, env, "-object", "pi_send_e2e", "-types", strings.Join(types, ","),
		"-amount", "4200", "-shuffle", "-times", "2")
	require.Equal(t, 0, code, "%s%s", out, stderr)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	require.Len(t, lines, 2*len(types))
	for _, l := range lines {
		assert.Regexp(t, `^(202 \{"status":"accepted"|200 \{"status":"duplicate")`, l)
	}

	p.Eventually(func() bool { return p.LedgerRows() == len(types) }, "one ledger row per event")
	ctx := context.Background()
	var status string
	var amount, received int64
	require.NoError(t, p.DB.QueryRow(ctx, `SELECT status, amount, amount_received FROM payment_intents WHERE id = 'pi_send_e2e'`).
		Scan(&status, &amount, &received))
	assert.Equal(t, "succeeded", status)
	assert.Equal(t, int64(4200), amount)
	assert.Equal(t, amount, received)
	var chStatus, chIntent string
	var captured int64
	require.NoError(t, p.DB.QueryRow(ctx, `SELECT status, payment_intent_id, amount_captured FROM charges WHERE id = 'ch_send_e2e'`).
		Scan(&chStatus, &chIntent, &captured))
	assert.Equal(t, "succeeded", chStatus)
	assert.Equal(t, "pi_send_e2e", chIntent)
	assert.Equal(t, int64(4200), captured)

	rows, err := p.DB.Query(ctx, `SELECT event_type, outcome FROM payment_events`)
	require.NoError(t, err)
	var recorded []string
	for rows.Next() {
		var typ, outcome string
		require.NoError(t, rows.Scan(&typ, &outcome))
		recorded = append(recorded, typ)
		assert.Contains(t, []string{"applied", "superseded"}, outcome, "%s", typ)
	}
	require.NoError(t, rows.Err())
	assert.ElementsMatch(t, types, recorded, "one payment_events row per event")
	p.Invariant()
	assert.Zero(t, p.Depth("events.dlq"))
}
