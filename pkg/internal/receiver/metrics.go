package receiver

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/idempotent-events/idempotent-events/pkg/internal/broker"
	"github.com/idempotent-events/idempotent-events/pkg/internal/telemetry"
)

// Metrics are the receiver's Prometheus series.
type Metrics struct {
	requests          *prometheus.CounterVec
	signatureFailures *prometheus.CounterVec
	secretMatches     *prometheus.CounterVec
	publishSeconds    prometheus.Histogram
	publishFailures   *prometheus.CounterVec
	duration          prometheus.Histogram
	duplicates        *prometheus.CounterVec
	conflicts         *prometheus.CounterVec
	dedupeErrors      *prometheus.CounterVec
	// Broker is the connection state Supervise reports.
	Broker *broker.ConnMetrics
}

// NewMetrics registers the receiver's metrics on reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	const sub = "receiver"
	m := &Metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: telemetry.Namespace, Subsystem: sub, Name: "requests_total",
			Help: "Webhook requests by route and HTTP status code.",
		}, []string{"route", "code"}),
		signatureFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: telemetry.Namespace, Subsystem: sub, Name: "signature_failures_total",
			Help: "Webhook requests rejected with 401, by source and reason.",
		}, []string{"source", "reason"}),
		secretMatches: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: telemetry.Namespace, Subsystem: sub, Name: "signature_secret_matches_total",
			Help: "Verified requests by source and the position of the matching secret in its secret list; retire a secret once its count stops growing.",
		}, []string{"source", "secret_index"}),
		publishSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: telemetry.Namespace, Subsystem: sub, Name: "publish_confirm_seconds",
			Help:    "Time from publish to the broker's confirm (or failure).",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5},
		}),
		publishFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: telemetry.Namespace, Subsystem: sub, Name: "publish_failures_total",
			Help: "Publishes that ended without a confirm (answered 503), by cause.",
		}, []string{"cause"}),
		duration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: telemetry.Namespace, Subsystem: sub, Name: "request_duration_seconds",
			Help:    "Time to answer a webhook request.",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5},
		}),
		duplicates: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: telemetry.Namespace, Subsystem: sub, Name: "duplicates_total",
			Help: "Events answered 200 duplicate without a publish, by the layer that knew.",
		}, []string{"layer"}),
		conflicts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: telemetry.Namespace, Subsystem: sub, Name: "conflicts_total",
			Help: "Deliveries answered 409: their event id was processed before with different content.",
		}, []string{"source"}),
		dedupeErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: telemetry.Namespace, Subsystem: sub, Name: "duplicate_check_errors_total",
			Help: "Failed duplicate lookups (the event was published anyway), by layer.",
		}, []string{"layer"}),
	}
	reg.MustRegister(m.requests, m.signatureFailures, m.secretMatches, m.publishSeconds, m.publishFailures,
		m.duration, m.duplicates, m.conflicts, m.dedupeErrors)
	m.Broker = broker.NewConnMetrics(reg, sub)
	return m
}
