package e2etest_test

import (
	"bytes"
	"context"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap/zaptest"

	"github.com/idempotent-events/idempotent-events/pkg/internal/app"
	"github.com/idempotent-events/idempotent-events/pkg/internal/config"
	"github.com/idempotent-events/idempotent-events/pkg/internal/event/eventtest"
	"github.com/idempotent-events/idempotent-events/pkg/internal/receiver"
	"github.com/idempotent-events/idempotent-events/pkg/internal/servicetest"
	"github.com/idempotent-events/idempotent-events/pkg/internal/telemetry"
	"github.com/idempotent-events/idempotent-events/pkg/internal/webhook"
	"github.com/idempotent-events/idempotent-events/pkg/payments"
)

// Redis outliving the ledger: the database is dropped and created again
// while Redis keeps its entries (and the receiver and worker keep running).
// The receiver answers "duplicate" from Redis while the ledger is the same;
// once the ledger is new, the old entry no longer answers, the event is
// published again and committed once in the new ledger. Without the epoch
// the receiver would answer 200 duplicate for an event the ledger lacks,
// and the provider would never send it again.
func TestARecreatedDatabaseIsNotAnsweredFromRedisEntriesOfTheOldOne(t *testing.T) {
	amqpURL := servicetest.VHost(t)
	dbURL := servicetest.Schema(t)
	httpAddr := servicetest.FreeAddr()
	common := map[string]string{
		"AMQP_URL": amqpURL, "DATABASE_URL": dbURL, "REDIS_URL": servicetest.RedisURL,
		"REDIS_KEY_PREFIX": servicetest.RedisPrefix(t), "LOG_LEVEL": "debug", "WEBHOOK_SECRETS": "whsec_ledger",
		"HTTP_ADDR": httpAddr, "RABBITMQ_MANAGEMENT_URL": "off", "DUPLICATE_CHECK": "redis",
	}
	var rcfg config.Receiver
	common["METRICS_ADDR"] = servicetest.FreeAddr()
	loadConfig(t, &rcfg, common)
	var wcfg config.Worker
	common["METRICS_ADDR"] = servicetest.FreeAddr()
	loadConfig(t, &wcfg, common)

	rreg := telemetry.NewRegistry("receiver")
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { assert.NoError(t, app.RunReceiver(ctx, rcfg, zaptest.NewLogger(t).Named("receiver"), rreg)) })
	wg.Go(func() {
		assert.NoError(t, app.RunWorker(ctx, wcfg, payments.Effects(), zaptest.NewLogger(t).Named("worker"), telemetry.NewRegistry("worker")))
	})
	defer func() { cancel(); wg.Wait() }()
	waitReady(t, "http://"+httpAddr+"/readyz")
	waitReady(t, "http://"+wcfg.MetricsAddr+"/readyz")

	body := eventtest.Payment("evt_ledger_1")
	post := func() int {
		req, err := http.NewRequest(http.MethodPost, "http://"+httpAddr+receiver.PaymentRoute, bytes.NewReader(body))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set(webhook.StripeHeader, webhook.SignStripe("whsec_ledger", time.Now(), body))
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		_ = resp.Body.Close()
		return resp.StatusCode
	}
	rows := func() (payments, ledger int) {
		conn := servicetest.Conn(t, dbURL)
		require.NoError(t, conn.QueryRow(context.Background(), `SELECT
			(SELECT count(*) FROM payments WHERE event_id = 'evt_ledger_1'),
			(SELECT count(*) FROM processed_events WHERE event_id = 'evt_ledger_1')`).Scan(&payments, &ledger))
		return payments, ledger
	}
	fromRedis := func() float64 {
		return servicetest.Metric(rreg, "idempotent_events_receiver_duplicates_total", "layer", "redis")
	}

	require.Equal(t, http.StatusAccepted, post())
	require.Eventually(t, func() bool { p, l := rows(); return p == 1 && l == 1 }, 20*time.Second, 50*time.Millisecond)
	// The same ledger: Redis answers (the control that the fast path is on).
	require.Eventually(t, func() bool { return post() == http.StatusOK }, 10*time.Second, 50*time.Millisecond)
	require.Equal(t, 1.0, fromRedis())

	servicetest.Recreate(t, dbURL)
	p, l := rows()
	require.Zero(t, p+l, "the new ledger starts empty")

	// Within one vouch refresh the old entry stops answering; the event is
	// published again and committed once in the new ledger.
	require.Eventually(t, func() bool { return post() == http.StatusAccepted }, 20*time.Second, 100*time.Millisecond,
		"the receiver kept answering duplicate from an entry of the dropped ledger")
	require.Eventually(t, func() bool { p, l := rows(); return p == 1 && l == 1 }, 20*time.Second, 50*time.Millisecond,
		"the event was not committed in the new ledger")
	require.Eventually(t, func() bool { return post() == http.StatusOK }, 10*time.Second, 50*time.Millisecond,
		"the new ledger's entry answers")
	p, l = rows()
	assert.Equal(t, 1, p, "one payments row")
	assert.Equal(t, 1, l, "one ledger row")
}
