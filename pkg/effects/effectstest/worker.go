package effectstest

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/idempotent-events/idempotent-events/pkg/effects"
	"github.com/idempotent-events/idempotent-events/pkg/internal/backfill"
	"github.com/idempotent-events/idempotent-events/pkg/internal/broker"
	"github.com/idempotent-events/idempotent-events/pkg/internal/dedupe"
	"github.com/idempotent-events/idempotent-events/pkg/internal/outbox"
	"github.com/idempotent-events/idempotent-events/pkg/internal/servicetest"
	"github.com/idempotent-events/idempotent-events/pkg/internal/store"
	"github.com/idempotent-events/idempotent-events/pkg/internal/worker"
)

// workerSpec is one in-process worker of the kit: the real worker on the
// test's schema, vhost and Redis prefix, with the outbox of the chart's
// default (written in the transaction, not published here).
type workerSpec struct {
	dbURL, amqpURL, redisPrefix string
	topo                        broker.Topology
	fx                          *effects.Registry
	release                     string
	hooks                       worker.Hooks
	prefetch, batchSize         int
	metrics                     *prometheus.Registry
	// archive keeps the committed events' bodies (EVENT_ARCHIVE), for a
	// backfill; the worker runs the backfills of its handlers either way.
	archive bool
}

// startWorker runs s until the returned stop is called, which waits for it
// and requires that it ended without an error.
func startWorker(t *testing.T, s workerSpec) (*worker.Worker, func()) {
	t.Helper()
	ctx := context.Background()
	st, err := store.Open(ctx, s.dbURL, 4)
	require.NoError(t, err)
	cache, err := dedupe.Open(servicetest.RedisURL, s.redisPrefix, time.Minute)
	require.NoError(t, err)
	if s.metrics == nil {
		s.metrics = prometheus.NewRegistry()
	}
	w, err := worker.New(worker.Options{
		Dialer:   broker.Dialer{URL: s.amqpURL, Name: t.Name() + " " + s.release, MaxBackoff: 200 * time.Millisecond, DialTimeout: time.Second},
		Topology: s.topo, Prefetch: s.prefetch, ReplayPrefetch: 4, Concurrency: 2, BatchSize: s.batchSize, BatchWait: 5 * time.Millisecond,
		ProcessTimeout: 10 * time.Second, PublishTimeout: 5 * time.Second, ShutdownTimeout: 10 * time.Second,
		Ledger: st, Cache: cache, Effects: s.fx, Release: s.release, Metrics: worker.NewMetrics(s.metrics), Hooks: s.hooks,
		Outbox:  func(tx effects.Tx) effects.Outbox { return outbox.NewBatch(tx) },
		Archive: s.archive,
		Logger:  zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel)),
	})
	require.NoError(t, err)
	backfills, err := backfill.NewRunner(backfill.RunnerOptions{
		DB: st.Pool(), Ledger: st, Effects: s.fx, Fence: w.Registration, Poll: 100 * time.Millisecond,
		Outbox: func(tx effects.Tx) effects.Outbox { return outbox.NewBatch(tx) }, Metrics: backfill.NewMetrics(s.metrics),
	})
	require.NoError(t, err)
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- w.Run(runCtx) }()
	backfillDone := make(chan struct{})
	go func() {
		defer close(backfillDone)
		if backfills != nil {
			backfills.Run(runCtx)
		}
	}()
	return w, func() {
		cancel()
		<-backfillDone
		require.NoError(t, <-done)
		_ = cache.Close()
		st.Close()
	}
}
