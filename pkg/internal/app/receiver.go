package app

import (
	"context"
	"errors"
	"io"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	amqp "github.com/rabbitmq/amqp091-go"
	"go.uber.org/zap"

	"github.com/idempotent-events/idempotent-events/pkg/internal/broker"
	"github.com/idempotent-events/idempotent-events/pkg/internal/config"
	"github.com/idempotent-events/idempotent-events/pkg/internal/dedupe"
	"github.com/idempotent-events/idempotent-events/pkg/internal/httpserver"
	"github.com/idempotent-events/idempotent-events/pkg/internal/receiver"
	"github.com/idempotent-events/idempotent-events/pkg/internal/store"
	"github.com/idempotent-events/idempotent-events/pkg/internal/telemetry"
)

const receiverUsage = `receiver: takes payment-provider webhooks and publishes them to RabbitMQ,
answering 2xx only after the broker confirmed. Configuration is environment
variables only (docs/configuration.md).

usage: receiver [--check-config | --version | --help]
`

// Sizes of the receiver's duplicate check; not worth a setting each.
const (
	// lookupRoundTrips is how many coalesced Redis MGETs may be in flight.
	lookupRoundTrips = 4
	// ledgerConns is the Postgres pool of DUPLICATE_CHECK=postgres: one
	// indexed lookup per request on a Redis miss.
	ledgerConns = 8
)

// Receiver is the receiver binary: it runs with args (without the program
// name) and returns the exit status.
func Receiver(args []string, stdout, stderr io.Writer) int {
	var cfg config.Receiver
	var sources []receiver.Source
	return binary{
		name: "receiver", usage: receiverUsage, cfg: &cfg,
		check: func() (err error) { sources, err = sourcesOf(cfg); return err },
		run: func(ctx context.Context, _ string, log *zap.Logger, reg *prometheus.Registry) error {
			return runReceiver(ctx, cfg, sources, log, reg)
		},
	}.main(args, stdout, stderr)
}

// RunReceiver runs the receiver wiring of a loaded cfg in-process until ctx
// is done; for tests.
func RunReceiver(ctx context.Context, cfg config.Receiver, log *zap.Logger, reg *prometheus.Registry) error {
	sources, err := sourcesOf(cfg)
	if err != nil {
		return err
	}
	return runReceiver(ctx, cfg, sources, log, reg)
}

// sourcesOf returns the routes cfg configures, each with the registry's
// provider of its scheme (receiver.SourcesOf); what a provider refuses is a
// *config.Error naming the variable.
func sourcesOf(cfg config.Receiver) ([]receiver.Source, error) {
	return receiver.SourcesOf(cfg)
}

// topology is the RabbitMQ topology the settings describe.
func topology(t config.Topology) broker.Topology {
	return broker.Topology{QueueType: t.QueueType, RetryDelays: t.RetryDelays, DeliveryLimit: t.QuorumDeliveryLimit}
}

// runReceiver serves webhooks until ctx is done, then stops taking
// requests, lets the ones in flight finish (up to SHUTDOWN_TIMEOUT) and
// closes the broker connection last, so no accepted request loses its
// confirm.
func runReceiver(ctx context.Context, cfg config.Receiver, sources []receiver.Source, log *zap.Logger, reg *prometheus.Registry) error {
	m := receiver.NewMetrics(reg)
	topo := topology(cfg.Topology)
	pub := &broker.Publisher{}
	if cfg.InsecureSkipVerify {
		log.Warn("INSECURE_SKIP_SIGNATURE_VERIFICATION is set: webhooks are accepted without a signature and can be forged")
	}
	secretFiles, err := watchSecretFiles(cfg, sources, log.Named("secrets"), reg)
	if err != nil {
		return err
	}

	opts := receiver.Options{
		Sources:               sources,
		Publisher:             pub,
		DuplicateCheckTimeout: cfg.DuplicateCheckTimeout,
		MaxBodyBytes:          cfg.WebhookMaxBody,
		PublishTimeout:        cfg.PublishTimeout,
		RetryAfter:            cfg.RetryAfter,
		MaxInFlight:           cfg.MaxInFlight,
		Logger:                log.Named("http"),
		Metrics:               m,
	}
	tlsc, err := loadTLS(cfg.Connections, cfg.DuplicateCheck != config.DuplicateCheckOff, cfg.DuplicateCheck == config.DuplicateCheckPostgres)
	if err != nil {
		return err
	}
	var lookups *dedupe.Coalescer
	if cfg.DuplicateCheck != config.DuplicateCheckOff {
		cache, err := dedupe.OpenTLS(cfg.RedisURL, cfg.RedisKeyPrefix, cfg.DedupeTTL, tlsc.redis)
		if err != nil {
			return err
		}
		defer func() { _ = cache.Close() }()
		if lookups, err = dedupe.NewCoalescer(dedupe.CoalescerOptions{Cache: cache, Timeout: cfg.DuplicateCheckTimeout, Parallel: lookupRoundTrips}); err != nil {
			return err
		}
		chk := dedupe.Checker{Cache: lookups}
		if cfg.DuplicateCheck == config.DuplicateCheckPostgres {
			st, err := store.OpenTLS(ctx, cfg.DatabaseURL, ledgerConns, tlsc.db)
			if err != nil {
				return err
			}
			defer st.Close()
			chk.Ledger = st
		}
		opts.Duplicates = chk
	}
	h, err := receiver.NewHandler(opts)
	if err != nil {
		return err
	}

	web, err := httpserver.New(httpserver.Options{
		Addr: cfg.HTTPAddr, Handler: httpserver.Guard(h, guardOptions(cfg, reg)), ShutdownTimeout: cfg.ShutdownTimeout, ErrorLog: zap.NewStdLog(log.Named("http")),
	})
	if err != nil {
		return err
	}
	defer web.Close()
	metrics, err := httpserver.New(httpserver.Options{
		Addr: cfg.MetricsAddr, Handler: telemetry.MetricsHandler(reg, h.Ready, cfg.Pprof), ShutdownTimeout: cfg.ShutdownTimeout,
	})
	if err != nil {
		return err
	}
	defer metrics.Close()

	// The broker connection and the Redis lookups outlive the HTTP server:
	// requests being drained still need their confirms and answers.
	backCtx, stopBack := context.WithCancel(context.WithoutCancel(ctx))
	defer stopBack()
	var back, front sync.WaitGroup
	back.Go(func() {
		dialer := broker.Dialer{URL: cfg.AMQPURL, Name: "idempotent-events receiver", MaxBackoff: cfg.AMQPReconnectMaxBackoff, TLS: tlsc.amqp}
		_ = broker.Supervise(backCtx, dialer, log.Named("broker"), m.Broker.State, func(ctx context.Context, conn *amqp.Connection) error {
			if err := topo.DeclareOn(conn); err != nil {
				return err
			}
			return pub.Serve(ctx, conn, cfg.PublishChannels)
		})
	})
	if lookups != nil {
		back.Go(func() { _ = lookups.Run(backCtx) })
	}
	if secretFiles != nil {
		front.Go(func() { secretFiles.Run(ctx) })
	}
	var metricsErr error
	front.Go(func() { metricsErr = metrics.Run(ctx) })

	log.Info("receiver listening", zap.String("http_addr", web.Addr().String()), zap.String("metrics_addr", metrics.Addr().String()))
	err = web.Run(ctx)
	front.Wait()
	stopBack()
	back.Wait()
	return errors.Join(err, metricsErr)
}
