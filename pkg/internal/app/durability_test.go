package app_test

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap/zaptest"

	"github.com/idempotent-events/idempotent-events/pkg/internal/app"
	"github.com/idempotent-events/idempotent-events/pkg/internal/config"
	"github.com/idempotent-events/idempotent-events/pkg/internal/migrate"
	"github.com/idempotent-events/idempotent-events/pkg/internal/pgcluster"
	"github.com/idempotent-events/idempotent-events/pkg/internal/pipelinetest"
	"github.com/idempotent-events/idempotent-events/pkg/internal/servicetest"
	"github.com/idempotent-events/idempotent-events/pkg/payments"
)

// On a primary whose only standby is asynchronous the worker refuses to
// start, naming DURABILITY_ALLOW_ASYNC; with it set, it starts and exports
// the mode.
func TestTheWorkerRefusesAnAsynchronousPrimary(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a private PostgreSQL primary and standby; skipped with -short")
	}
	t.Parallel()
	c := pgcluster.New(t, pgcluster.Options{Async: true})
	ctx := context.Background()
	dbURL := c.URL("idempotent_events")
	_, err := migrate.Up(ctx, dbURL, time.Minute)
	require.NoError(t, err)
	p := pipelinetest.New(t)
	cfg := p.Config("")
	cfg.DatabaseURL = dbURL

	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	err = app.RunWorker(wctx, cfg, payments.Effects(), zaptest.NewLogger(t), prometheus.NewRegistry())
	var cerr *config.Error
	require.ErrorAs(t, err, &cerr, "want a configuration error")
	assert.Contains(t, err.Error(), "DURABILITY_ALLOW_ASYNC")

	cfg.DurabilityAllowAsync = true
	reg := prometheus.NewRegistry()
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- app.RunWorker(runCtx, cfg, payments.Effects(), zaptest.NewLogger(t), reg) }()
	require.NoError(t, servicetest.AwaitHTTP("http://"+cfg.MetricsAddr+"/readyz", 200, 30*time.Second))
	assert.Equal(t, float64(1), servicetest.Metric(reg, "idempotent_events_worker_ledger_durability", "mode", "async"))
	assert.Equal(t, float64(1), servicetest.Metric(reg, "idempotent_events_worker_durability_allow_async"))
	stop()
	require.NoError(t, <-done)
}
