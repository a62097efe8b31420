package app

import (
	"context"
	"errors"
	"io"
	"sync"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/idempotent-events/idempotent-events/pkg/effects"
	"github.com/idempotent-events/idempotent-events/pkg/internal/admin"
	"github.com/idempotent-events/idempotent-events/pkg/internal/backfill"
	"github.com/idempotent-events/idempotent-events/pkg/internal/broker"
	"github.com/idempotent-events/idempotent-events/pkg/internal/config"
	"github.com/idempotent-events/idempotent-events/pkg/internal/dedupe"
	"github.com/idempotent-events/idempotent-events/pkg/internal/dlq"
	"github.com/idempotent-events/idempotent-events/pkg/internal/httpserver"
	"github.com/idempotent-events/idempotent-events/pkg/internal/outbox"
	"github.com/idempotent-events/idempotent-events/pkg/internal/queuestats"
	"github.com/idempotent-events/idempotent-events/pkg/internal/reconcile"
	"github.com/idempotent-events/idempotent-events/pkg/internal/retention"
	"github.com/idempotent-events/idempotent-events/pkg/internal/store"
	"github.com/idempotent-events/idempotent-events/pkg/internal/telemetry"
	"github.com/idempotent-events/idempotent-events/pkg/internal/tlsconfig"
	"github.com/idempotent-events/idempotent-events/pkg/internal/worker"
)

const workerUsage = `worker: consumes events.main and commits each event's effect exactly once;
with ADMIN_TOKEN set it also serves the DLQ admin API and page; with
OUTBOX_RELAY=only it runs only the outbox relay. Configuration is environment
variables only (docs/configuration.md).

usage: worker [--check-config | --version | --help]
`

// Worker is the worker binary with the effects fx: it runs with args
// (without the program name) and returns the exit status.
func Worker(fx *effects.Registry, args []string, stdout, stderr io.Writer) int {
	var cfg config.Worker
	return binary{
		name: "worker", usage: workerUsage, cfg: &cfg,
		component: func() string {
			if cfg.RelayOnly() {
				return "relay"
			}
			return "worker"
		},
		run: func(ctx context.Context, _ string, log *zap.Logger, reg *prometheus.Registry) error {
			return RunWorker(ctx, cfg, fx, log, reg)
		},
	}.main(args, stdout, stderr)
}

// RunWorker runs a worker from a loaded cfg with the effects fx, with its
// metrics endpoint, the queue statistics and (with ADMIN_TOKEN) the admin
// server, until ctx is done and in-flight work is drained. Tests run it
// in-process.
func RunWorker(ctx context.Context, cfg config.Worker, fx *effects.Registry, log *zap.Logger, reg *prometheus.Registry) error {
	tlsc, err := loadTLS(cfg.Connections, !cfg.RelayOnly(), true)
	if err != nil {
		return err
	}
	if cfg.RelayOnly() {
		return runRelay(ctx, cfg, tlsc, log, reg)
	}
	st, err := store.OpenTLS(ctx, cfg.DatabaseURL, cfg.DBMaxConns, tlsc.db)
	if err != nil {
		return err
	}
	defer st.Close()
	wm := worker.NewMetrics(reg)
	dur := newDurability(cfg, st, log.Named("durability"), wm)
	if err := dur.start(ctx); err != nil {
		return tlsconfig.Postgres.Explain(err)
	}
	ctx, refuse := context.WithCancelCause(ctx)
	defer refuse(nil)
	cache, err := dedupe.OpenTLS(cfg.RedisURL, cfg.RedisKeyPrefix, cfg.DedupeTTL, tlsc.redis)
	if err != nil {
		return err
	}
	defer func() { _ = cache.Close() }()

	relay, err := newRelay(cfg, tlsc, st.Pool(), log.Named("outbox"), reg)
	if err != nil {
		return err
	}
	notifier := outbox.NewNotifier(st.Pool(), relay, log.Named("outbox"))

	w, err := worker.New(worker.Options{
		Dialer:          broker.Dialer{URL: cfg.AMQPURL, Name: "idempotent-events worker", MaxBackoff: cfg.AMQPReconnectMaxBackoff, TLS: tlsc.amqp},
		Topology:        topology(cfg.Topology),
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
		Effects:         fx,
		Release:         cfg.Release,
		Archive:         cfg.EventArchive,
		Outbox:          notifier.Outbox,
		Logger:          log,
		Metrics:         wm,
	})
	if err != nil {
		return err
	}

	metrics, err := httpserver.New(httpserver.Options{
		Addr: cfg.MetricsAddr, Handler: telemetry.MetricsHandler(reg, w.Ready, cfg.Pprof), ShutdownTimeout: cfg.ShutdownTimeout,
	})
	if err != nil {
		return err
	}
	defer metrics.Close()
	adm, err := newAdmin(cfg, tlsc, st.Pool(), log.Named("admin"), reg)
	if err != nil {
		return err
	}
	if adm != nil {
		defer adm.Close()
	}
	stats, err := newQueueStats(cfg, tlsc, log.Named("queuestats"), reg)
	if err != nil {
		return err
	}
	if err := reg.Register(reconcile.NewCollector(st.Pool(), log.Named("reconcile"))); err != nil {
		return err
	}
	if err := reg.Register(retention.NewCollector(st.Pool(), log.Named("prune"))); err != nil {
		return err
	}

	backfills, err := backfill.NewRunner(backfill.RunnerOptions{
		DB: st.Pool(), Ledger: st, Effects: fx, Outbox: notifier.Outbox, Fence: w.Registration,
		Logger: log.Named("backfill"), Metrics: backfill.NewMetrics(reg),
	})
	if err != nil {
		return err
	}

	var wg sync.WaitGroup
	var metricsErr, adminErr error
	if backfills != nil {
		wg.Go(func() { backfills.Run(ctx) })
	}
	if stats != nil {
		wg.Go(func() { _ = stats.Run(ctx) })
	}
	var relayErr error
	if relay != nil {
		wg.Go(func() { relayErr = relay.Run(ctx) })
	} else {
		wg.Go(func() { notifier.Run(ctx) })
	}
	wg.Go(func() { dur.run(ctx, refuse) })
	wg.Go(func() { metricsErr = metrics.Run(ctx) })
	if adm != nil {
		wg.Go(func() { adminErr = adm.Run(ctx) })
		log.Info("admin server listening", zap.String("addr", adm.Addr().String()))
	}
	log.Info("worker starting", zap.String("metrics_addr", metrics.Addr().String()))
	err = w.Run(ctx)
	wg.Wait()
	var refused *config.Error
	if cause := context.Cause(ctx); errors.As(cause, &refused) {
		err = errors.Join(err, cause)
	}
	return errors.Join(err, metricsErr, adminErr, relayErr)
}

// runRelay is the worker with OUTBOX_RELAY=only: the outbox relay and its
// metrics endpoint, nothing consumed, until ctx is done. /readyz answers
// 200 while the relay holds a broker connection. It opens neither Redis
// nor the admin server, and leaves the queue and ledger gauges to the
// workers: the relay Deployment of the chart runs it, beside workers with
// OUTBOX_RELAY=off that wake it by NOTIFY when they commit an enqueue.
func runRelay(ctx context.Context, cfg config.Worker, tlsc serviceTLS, log *zap.Logger, reg *prometheus.Registry) error {
	st, err := store.OpenTLS(ctx, cfg.DatabaseURL, cfg.DBMaxConns, tlsc.db)
	if err != nil {
		return err
	}
	defer st.Close()
	relay, err := newRelay(cfg, tlsc, st.Pool(), log.Named("outbox"), reg)
	if err != nil {
		return err
	}
	metrics, err := httpserver.New(httpserver.Options{
		Addr: cfg.MetricsAddr, Handler: telemetry.MetricsHandler(reg, relay.Ready, cfg.Pprof), ShutdownTimeout: cfg.ShutdownTimeout,
	})
	if err != nil {
		return err
	}
	defer metrics.Close()
	var wg sync.WaitGroup
	var metricsErr error
	wg.Go(func() { metricsErr = metrics.Run(ctx) })
	log.Info("outbox relay starting (OUTBOX_RELAY=only: no events consumed)", zap.String("metrics_addr", metrics.Addr().String()))
	err = relay.Run(ctx)
	wg.Wait()
	return errors.Join(err, metricsErr)
}

// newRelay builds the outbox relay, or nil with OUTBOX_RELAY=off.
func newRelay(cfg config.Worker, tlsc serviceTLS, pool *pgxpool.Pool, log *zap.Logger, reg prometheus.Registerer) (*outbox.Relay, error) {
	if !cfg.RelayEnabled() {
		return nil, nil
	}
	return outbox.NewRelay(outbox.Options{
		Pool: pool, DatabaseURL: cfg.DatabaseURL, DatabaseTLS: tlsc.db,
		Dialer:    broker.Dialer{URL: cfg.AMQPURL, Name: "idempotent-events outbox relay", MaxBackoff: cfg.AMQPReconnectMaxBackoff, TLS: tlsc.amqp},
		BatchSize: cfg.OutboxBatchSize, PollInterval: cfg.OutboxPoll, PublishTimeout: cfg.PublishTimeout,
		MaxAttempts: cfg.OutboxMaxAttempts, MaxBackoff: cfg.OutboxMaxBackoff, Retention: cfg.OutboxRetention,
		Logger: log, Metrics: outbox.NewMetrics(reg),
	})
}

// newAdmin builds the admin server the worker runs on ADMIN_ADDR: the DLQ
// tools on AMQP_URL and the audit trail on pool. It returns nil when
// ADMIN_TOKEN is empty: the admin server is off.
func newAdmin(cfg config.Worker, tlsc serviceTLS, pool *pgxpool.Pool, log *zap.Logger, reg prometheus.Registerer) (*httpserver.Server, error) {
	if !cfg.AdminEnabled() {
		return nil, nil
	}
	audit := dlq.NewAudit(pool)
	ops := dlq.New(dlq.Options{
		Dialer:         broker.Dialer{URL: cfg.AMQPURL, Name: "idempotent-events admin", TLS: tlsc.amqp},
		Audit:          audit,
		ScanLimit:      cfg.AdminScanLimit,
		Rate:           cfg.AdminReplayRate,
		PublishTimeout: cfg.PublishTimeout,
		Logger:         log.Named("dlq"),
		Metrics:        dlq.NewMetrics(reg),
	})
	s, err := admin.New(admin.Options{
		Token: cfg.AdminToken, Operator: cfg.AdminOperator, DLQ: ops, Audit: audit,
		DB: pool, RetryQueues: topology(cfg.Topology).RetryQueues(),
		SessionTTL: cfg.AdminSessionTTL, Logger: log, Metrics: admin.NewMetrics(reg),
	})
	if err != nil {
		return nil, err
	}
	return httpserver.New(s.HTTPOptions(cfg.AdminAddr, cfg.ShutdownTimeout))
}

// newQueueStats builds the collector of queue depths and ages, or nil when
// RABBITMQ_MANAGEMENT_URL is off.
func newQueueStats(cfg config.Worker, tlsc serviceTLS, log *zap.Logger, reg prometheus.Registerer) (*queuestats.Collector, error) {
	mgmt, err := queuestats.ManagementURL(cfg.RabbitMQManagementURL, cfg.AMQPURL)
	if err != nil || mgmt == "" {
		return nil, err
	}
	client, err := queuestats.ForAMQPTLS(mgmt, cfg.AMQPURL, tlsc.amqp)
	if err != nil {
		return nil, err
	}
	return queuestats.NewCollector(queuestats.CollectorOptions{
		Registerer: reg, Client: client, Prefix: broker.QueuePrefix, Interval: cfg.QueueStatsInterval,
		OnError: func(err error) { log.Warn("queue stats unavailable", zap.Error(err)) },
	})
}
