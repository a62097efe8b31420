package e2etest_test

import (
	"bytes"
	"context"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap/zaptest"

	"github.com/idempotent-events/idempotent-events/pkg/internal/app"
	"github.com/idempotent-events/idempotent-events/pkg/internal/broker"
	"github.com/idempotent-events/idempotent-events/pkg/internal/config"
	"github.com/idempotent-events/idempotent-events/pkg/internal/event/eventtest"
	"github.com/idempotent-events/idempotent-events/pkg/internal/receiver"
	"github.com/idempotent-events/idempotent-events/pkg/internal/servicetest"
	"github.com/idempotent-events/idempotent-events/pkg/internal/telemetry"
	"github.com/idempotent-events/idempotent-events/pkg/internal/webhook"
	"github.com/idempotent-events/idempotent-events/pkg/payments"
)

// loadConfig fills cfg from defaults plus vars, as the binaries would.
func loadConfig(t *testing.T, cfg config.Spec, vars map[string]string) {
	t.Helper()
	for _, kv := range os.Environ() {
		if name, value, _ := strings.Cut(kv, "="); isConfigVar(name) {
			t.Setenv(name, value) // restored after the test
			require.NoError(t, os.Unsetenv(name))
		}
	}
	for k, v := range vars {
		t.Setenv(k, v)
	}
	require.NoError(t, config.Load(cfg))
}

// Real traffic through app.RunReceiver and app.RunWorker (new, duplicate, bad
// signature, poison, rejected, retried) moves every counter and gauge by
// exactly the expected amount.
func TestMetricsMoveByTheExpectedAmounts(t *testing.T) {
	amqpURL := servicetest.VHost(t)
	dbURL := servicetest.Schema(t)
	httpAddr := servicetest.FreeAddr()
	common := map[string]string{
		"AMQP_URL": amqpURL, "DATABASE_URL": dbURL, "REDIS_URL": servicetest.RedisURL,
		"REDIS_KEY_PREFIX": servicetest.RedisPrefix(t), "RETRY_DELAYS": "300ms,300ms", "LOG_LEVEL": "debug",
		"WEBHOOK_SECRETS": "whsec_metrics", "HTTP_ADDR": httpAddr, "QUEUE_STATS_INTERVAL": "1s",
	}
	var rcfg config.Receiver
	common["METRICS_ADDR"] = servicetest.FreeAddr()
	loadConfig(t, &rcfg, common)
	var wcfg config.Worker
	common["METRICS_ADDR"] = servicetest.FreeAddr()
	loadConfig(t, &wcfg, common)

	// evt_m_retry fails transiently once; evt_m_rejected is refused by the
	// database every time.
	conn := servicetest.Conn(t, dbURL)
	_, err := conn.Exec(context.Background(), `
		CREATE SEQUENCE retry_once;
		CREATE FUNCTION fault() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			IF NEW.event_id = 'evt_m_retry' AND nextval('retry_once') = 1 THEN
				RAISE EXCEPTION 'transient' USING ERRCODE = 'serialization_failure';
			END IF;
			IF NEW.event_id = 'evt_m_rejected' THEN
				RAISE EXCEPTION 'rejected' USING ERRCODE = 'check_violation';
			END IF;
			RETURN NEW;
		END $$;
		CREATE TRIGGER fault BEFORE INSERT ON payments FOR EACH ROW EXECUTE FUNCTION fault();`)
	require.NoError(t, err)

	rreg, wreg := telemetry.NewRegistry("receiver"), telemetry.NewRegistry("worker")
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { assert.NoError(t, app.RunReceiver(ctx, rcfg, zaptest.NewLogger(t).Named("receiver"), rreg)) })
	wg.Go(func() {
		assert.NoError(t, app.RunWorker(ctx, wcfg, payments.Effects(), zaptest.NewLogger(t).Named("worker"), wreg))
	})
	defer func() { cancel(); wg.Wait() }()
	waitReady(t, "http://"+httpAddr+"/readyz")
	waitReady(t, "http://"+wcfg.MetricsAddr+"/readyz")

	post := func(id, secret string) int {
		body := eventtest.Payment(id, eventtest.Amount(700))
		req, err := http.NewRequest(http.MethodPost, "http://"+httpAddr+receiver.PaymentRoute, bytes.NewReader(body))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set(webhook.StripeHeader, webhook.SignStripe(secret, time.Now(), body))
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		return resp.StatusCode
	}
	w := func(name string, labels ...string) float64 { return servicetest.Metric(wreg, name, labels...) }
	r := func(name string, labels ...string) float64 { return servicetest.Metric(rreg, name, labels...) }

	for _, id := range []string{"evt_m_1", "evt_m_2", "evt_m_retry", "evt_m_rejected"} {
		require.Equal(t, 202, post(id, "whsec_metrics"))
	}
	require.Eventually(t, func() bool { return w("idempotent_events_worker_events_total", "outcome", "processed") == 3 }, 20*time.Second, 20*time.Millisecond)
	require.Equal(t, 200, post("evt_m_1", "whsec_metrics"), "committed: answered duplicate by the receiver")
	require.Equal(t, 401, post("evt_m_x", "whsec_wrong"))

	// A duplicate the receiver cannot know about yet, and a poison message
	// from another producer, straight onto the exchange.
	b := servicetest.NewBroker(t, amqpURL, broker.Topology{QueueType: rcfg.QueueType, RetryDelays: rcfg.RetryDelays, DeliveryLimit: rcfg.QuorumDeliveryLimit})
	dup := eventtest.Payment("evt_m_2", eventtest.Amount(700))
	b.PublishEvent(dup, nil)
	b.PublishEvent([]byte(`{"id":"evt_m_poison"}`), nil)
	require.Eventually(t, func() bool {
		return w("idempotent_events_worker_events_total", "outcome", "duplicate") == 1 &&
			w("idempotent_events_worker_events_total", "outcome", "dead_lettered") == 2
	}, 20*time.Second, 20*time.Millisecond)

	// Receiver.
	assert.Equal(t, 4.0, r("idempotent_events_receiver_requests_total", "code", "202"))
	assert.Equal(t, 1.0, r("idempotent_events_receiver_requests_total", "code", "200"))
	assert.Equal(t, 1.0, r("idempotent_events_receiver_requests_total", "code", "401"))
	assert.Equal(t, 1.0, r("idempotent_events_receiver_signature_failures_total", "reason", "signature_mismatch"))
	assert.Equal(t, 5.0, r("idempotent_events_receiver_signature_secret_matches_total", "secret_index", "0"))
	assert.Equal(t, 1.0, r("idempotent_events_receiver_duplicates_total"))
	assert.Equal(t, 4.0, r("idempotent_events_receiver_publish_confirm_seconds"), "one confirm per 202")
	assert.Equal(t, 6.0, r("idempotent_events_receiver_request_duration_seconds"))
	assert.Equal(t, 1.0, r("idempotent_events_receiver_broker_connected"))
	assert.Equal(t, 1.0, r("idempotent_events_build_info", "component", "receiver"))

	// Worker.
	assert.Equal(t, 3.0, w("idempotent_events_worker_events_total", "outcome", "processed"))
	assert.Equal(t, 1.0, w("idempotent_events_worker_events_total", "outcome", "retried"))
	assert.Equal(t, 1.0, w("idempotent_events_worker_retries_total", "tier", "300ms"))
	assert.Equal(t, 1.0, w("idempotent_events_worker_dead_letters_total", "reason", string(broker.ReasonInvalidPayload)))
	assert.Equal(t, 1.0, w("idempotent_events_worker_dead_letters_total", "reason", string(broker.ReasonRejectedByDatabase)))
	assert.Equal(t, 1.0, w("idempotent_events_worker_duplicates_total"))
	assert.Equal(t, 3.0, w("idempotent_events_worker_end_to_end_seconds"), "one end-to-end sample per committed event")
	assert.Equal(t, 0.0, w("idempotent_events_worker_in_flight"))
	assert.Equal(t, 1.0, w("idempotent_events_worker_broker_connected"))

	// Queue gauges, polled from the management API (it refreshes every few seconds).
	require.Eventually(t, func() bool {
		return w("idempotent_events_queue_messages", "queue", broker.DLQ, "state", "ready") == 2 &&
			w("idempotent_events_queue_consumers", "queue", broker.MainQueue) == 1 &&
			w("idempotent_events_queue_messages", "queue", broker.MainQueue, "state", "ready") == 0
	}, 30*time.Second, 200*time.Millisecond)
	assert.Equal(t, 1.0, w("idempotent_events_queue_stats_up"))
	assert.Positive(t, w("idempotent_events_queue_oldest_message_age_seconds", "queue", broker.DLQ))
}
