package receiver

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	amqp "github.com/rabbitmq/amqp091-go"
	"go.uber.org/zap"

	"github.com/idempotent-events/idempotent-events/pkg/broker"
	"github.com/idempotent-events/idempotent-events/pkg/config"
	"github.com/idempotent-events/idempotent-events/pkg/dedupe"
	"github.com/idempotent-events/idempotent-events/pkg/event"
	"github.com/idempotent-events/idempotent-events/pkg/store"
	"github.com/idempotent-events/idempotent-events/pkg/telemetry"
	"github.com/idempotent-events/idempotent-events/pkg/webhook"
)

// SourcesOf returns the routes cfg configures: the default Stripe source
// on PaymentRoute, then every WEBHOOK_SOURCES entry on /webhooks/{name}.
func SourcesOf(cfg config.Receiver) ([]Source, error) {
	sources := []Source{{Name: event.DefaultSource, Route: PaymentRoute, Scheme: webhook.SchemeStripe}}
	if !cfg.InsecureSkipVerify {
		sources[0].Verifier = webhook.NewStripeVerifier(cfg.WebhookSecrets, cfg.WebhookTolerance)
	}
	for _, sc := range cfg.Sources {
		src := Source{Name: sc.Name, Route: "/webhooks/" + sc.Name, Scheme: sc.Scheme}
		if !cfg.InsecureSkipVerify {
			switch sc.Scheme {
			case webhook.SchemeStripe:
				src.Verifier = webhook.NewStripeVerifier(sc.Secrets, cfg.WebhookTolerance)
			case webhook.SchemeStandard:
				v, err := webhook.NewStandardVerifier(sc.Secrets, cfg.WebhookTolerance)
				if err != nil {
					return nil, fmt.Errorf("%s: %w", sc.SecretsVar, err)
				}
				src.Verifier = v
			case webhook.SchemeGitHub:
				src.Verifier = webhook.NewGitHubVerifier(sc.Secrets)
			}
		}
		sources = append(sources, src)
	}
	return sources, nil
}

// Run serves webhooks until ctx is done, then stops taking requests, lets
// the ones in flight finish (up to SHUTDOWN_TIMEOUT) and closes the broker
// connection last, so no accepted request loses its confirm.
func Run(ctx context.Context, cfg config.Receiver, log *zap.Logger, reg *prometheus.Registry) error {
	m := NewMetrics(reg)
	topo := cfg.Topology.Broker()
	pub := &broker.Publisher{}

	sources, err := SourcesOf(cfg)
	if err != nil {
		return err
	}
	if cfg.InsecureSkipVerify {
		log.Warn("INSECURE_SKIP_SIGNATURE_VERIFICATION is set: webhooks are accepted without a signature and can be forged")
	}

	opts := Options{
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
	if cfg.DuplicateCheck != config.DuplicateCheckOff {
		cache, err := dedupe.Open(cfg.RedisURL, cfg.RedisKeyPrefix, cfg.DedupeTTL)
		if err != nil {
			return err
		}
		defer cache.Close()
		lookups := dedupe.NewCoalescer(cache, cfg.DuplicateCheckTimeout)
		lookupCtx, stopLookups := context.WithCancel(context.WithoutCancel(ctx))
		lookupsDone := make(chan struct{})
		go func() { defer close(lookupsDone); lookups.Run(lookupCtx, 4) }()
		defer func() { stopLookups(); <-lookupsDone }()
		chk := dedupe.Checker{Cache: lookups}
		if cfg.DuplicateCheck == config.DuplicateCheckPostgres {
			st, err := store.Open(ctx, cfg.DatabaseURL, 8)
			if err != nil {
				return err
			}
			defer st.Close()
			chk.Ledger = st
		}
		opts.Duplicates = chk
	}
	h := NewHandler(opts)

	httpLn, err := telemetry.Listen(cfg.HTTPAddr)
	if err != nil {
		return err
	}
	metricsLn, err := telemetry.Listen(cfg.MetricsAddr)
	if err != nil {
		_ = httpLn.Close()
		return err
	}

	// The broker connection outlives the HTTP server: requests being drained
	// still need their confirms.
	brokerCtx, stopBroker := context.WithCancel(context.WithoutCancel(ctx))
	var wg sync.WaitGroup
	wg.Go(func() {
		dialer := broker.Dialer{URL: cfg.AMQPURL, Name: "idempotent-events receiver", MaxBackoff: cfg.AMQPReconnectMaxBackoff}
		_ = broker.Supervise(brokerCtx, dialer, log.Named("broker"), m.brokerState, func(ctx context.Context, conn *amqp.Connection) error {
			if err := topo.DeclareOn(conn); err != nil {
				return err
			}
			return pub.Serve(ctx, conn, cfg.PublishChannels)
		})
	})
	var metricsErr error
	wg.Go(func() {
		metricsErr = telemetry.Serve(ctx, telemetry.Server(telemetry.MetricsHandler(reg, h.Ready, cfg.Pprof)), metricsLn, cfg.ShutdownTimeout)
	})

	log.Info("receiver listening", zap.String("http_addr", httpLn.Addr().String()), zap.String("metrics_addr", metricsLn.Addr().String()))
	srv := telemetry.Server(h)
	srv.ErrorLog = zap.NewStdLog(log.Named("http"))
	err = telemetry.Serve(ctx, srv, httpLn, cfg.ShutdownTimeout)
	stopBroker()
	wg.Wait()
	return errors.Join(err, metricsErr)
}
