package worker

import (
	"context"
	"errors"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/idempotent-events/idempotent-events/pkg/admin"
	"github.com/idempotent-events/idempotent-events/pkg/broker"
	"github.com/idempotent-events/idempotent-events/pkg/config"
	"github.com/idempotent-events/idempotent-events/pkg/dedupe"
	"github.com/idempotent-events/idempotent-events/pkg/queuestats"
	"github.com/idempotent-events/idempotent-events/pkg/store"
	"github.com/idempotent-events/idempotent-events/pkg/telemetry"
)

// Run wires a Worker from cfg and runs it with its metrics endpoint until
// ctx is done and in-flight work is drained.
func Run(ctx context.Context, cfg config.Worker, log *zap.Logger, reg *prometheus.Registry) error {
	st, err := store.Open(ctx, cfg.DatabaseURL, cfg.DBMaxConns)
	if err != nil {
		return err
	}
	defer st.Close()
	cache, err := dedupe.Open(cfg.RedisURL, cfg.RedisKeyPrefix, cfg.DedupeTTL)
	if err != nil {
		return err
	}
	defer cache.Close()

	w := New(Options{
		Topology:        cfg.Topology.Broker(),
		Prefetch:        cfg.Prefetch,
		ReplayPrefetch:  cfg.ReplayPrefetch,
		Concurrency:     cfg.Concurrency,
		BatchSize:       cfg.BatchSize,
		BatchWait:       cfg.BatchWait,
		ProcessTimeout:  cfg.ProcessTimeout,
		PublishTimeout:  cfg.PublishTimeout,
		ShutdownTimeout: cfg.ShutdownTimeout,
		RetryOnOutage:   cfg.OutageMode == "retry",
		Ledger:          st,
		Cache:           cache,
		Logger:          log,
		Metrics:         NewMetrics(reg),
	})

	metricsLn, err := telemetry.Listen(cfg.MetricsAddr)
	if err != nil {
		return err
	}
	// The DLQ admin API and page, only when ADMIN_TOKEN is set.
	adm, err := admin.FromConfig(cfg.Admin, cfg.AMQPURL, cfg.PublishTimeout, st.Pool(), log.Named("admin"), reg)
	if err != nil {
		_ = metricsLn.Close()
		return err
	}
	var wg sync.WaitGroup
	mgmt, err := queuestats.ManagementURL(cfg.RabbitMQManagementURL, cfg.AMQPURL)
	if err != nil {
		return err
	}
	if mgmt != "" {
		client, err := queuestats.ForAMQP(mgmt, cfg.AMQPURL)
		if err != nil {
			return err
		}
		stats := queuestats.NewCollector(reg, client, broker.QueuePrefix)
		qlog := log.Named("queuestats")
		wg.Go(func() {
			stats.Run(ctx, cfg.QueueStatsInterval, func(err error) { qlog.Warn("queue stats unavailable", zap.Error(err)) })
		})
	}
	var metricsErr, adminErr error
	wg.Go(func() {
		metricsErr = telemetry.Serve(ctx, telemetry.Server(telemetry.MetricsHandler(reg, w.Ready, cfg.Pprof)), metricsLn, cfg.ShutdownTimeout)
	})
	if adm != nil {
		wg.Go(func() { adminErr = adm.Run(ctx, cfg.ShutdownTimeout) })
	}
	log.Info("worker starting", zap.String("metrics_addr", metricsLn.Addr().String()))
	err = w.Run(ctx, broker.Dialer{URL: cfg.AMQPURL, Name: "idempotent-events worker", MaxBackoff: cfg.AMQPReconnectMaxBackoff})
	wg.Wait()
	return errors.Join(err, metricsErr, adminErr)
}
