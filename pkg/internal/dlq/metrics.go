package dlq

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/idempotent-events/idempotent-events/pkg/internal/telemetry"
)

// Metrics are the DLQ tools' Prometheus series. A nil *Metrics records
// nothing (eventsctl is a short-lived process with no /metrics).
type Metrics struct {
	operations *prometheus.CounterVec
	scanned    prometheus.Counter
}

// NewMetrics registers the DLQ tools' metrics on reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	const sub = "dlq"
	m := &Metrics{
		operations: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: telemetry.Namespace, Subsystem: sub, Name: "operations_total",
			Help: "Messages acted on by DLQ operators, by action (replay, discard) and outcome " +
				"(replayed, discarded, would_replay, would_discard, failed).",
		}, []string{"action", "outcome"}),
		scanned: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: telemetry.Namespace, Subsystem: sub, Name: "scanned_messages_total",
			Help: "DLQ messages read (and returned or acted on) by list, show, replay and discard.",
		}),
	}
	reg.MustRegister(m.operations, m.scanned)
	return m
}

func (m *Metrics) operation(action, outcome string) {
	if m != nil {
		m.operations.WithLabelValues(action, outcome).Inc()
	}
}

func (m *Metrics) scan(n int) {
	if m != nil {
		m.scanned.Add(float64(n))
	}
}
