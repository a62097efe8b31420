package outbox

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/idempotent-events/idempotent-events/pkg/internal/telemetry"
)

// Metrics are the relay's series.
type Metrics struct {
	published prometheus.Counter
	failures  *prometheus.CounterVec
	parked    prometheus.Counter
	backlog   prometheus.Gauge
	oldest    prometheus.Gauge
	parkedNow prometheus.Gauge
	deleted   prometheus.Counter
}

// NewMetrics registers the relay's metrics on reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	const sub = "outbox"
	m := &Metrics{
		published: prometheus.NewCounter(prometheus.CounterOpts{Namespace: telemetry.Namespace, Subsystem: sub, Name: "published_total",
			Help: "Outbox messages published (acked by the broker, not returned) and marked published."}),
		failures: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: telemetry.Namespace, Subsystem: sub, Name: "publish_failures_total",
			Help: "Failed publishes of outbox messages, by reason (returned, nacked, timeout, other): each is tried again after a backoff."}, []string{"reason"}),
		parked: prometheus.NewCounter(prometheus.CounterOpts{Namespace: telemetry.Namespace, Subsystem: sub, Name: "parked_total",
			Help: "Outbox messages parked after their last attempt; they and their object's later messages wait for an operator."}),
		backlog: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: telemetry.Namespace, Subsystem: sub, Name: "backlog",
			Help: "Outbox messages committed and not yet published (parked ones excluded)."}),
		oldest: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: telemetry.Namespace, Subsystem: sub, Name: "oldest_unpublished_age_seconds",
			Help: "Age of the oldest outbox message not yet published (parked ones excluded); 0 when none."}),
		parkedNow: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: telemetry.Namespace, Subsystem: sub, Name: "parked",
			Help: "Outbox messages parked now."}),
		deleted: prometheus.NewCounter(prometheus.CounterOpts{Namespace: telemetry.Namespace, Subsystem: sub, Name: "deleted_total",
			Help: "Published outbox rows deleted after OUTBOX_RETENTION."}),
	}
	reg.MustRegister(m.published, m.failures, m.parked, m.backlog, m.oldest, m.parkedNow, m.deleted)
	return m
}
