package admin

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idempotent-events/idempotent-events/pkg/internal/telemetry"
)

// Metrics are the admin server's Prometheus series. A nil *Metrics records
// nothing.
type Metrics struct {
	requests     *prometheus.CounterVec
	authFailures *prometheus.CounterVec
}

// NewMetrics registers the admin server's metrics on reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	const sub = "admin"
	m := &Metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: telemetry.Namespace, Subsystem: sub, Name: "requests_total",
			Help: "Admin API and page requests, by route pattern and status code.",
		}, []string{"route", "code"}),
		authFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: telemetry.Namespace, Subsystem: sub, Name: "auth_failures_total",
			Help: "Admin requests refused, by kind: missing (no credentials), token (wrong token), csrf (bad form token).",
		}, []string{"kind"}),
	}
	reg.MustRegister(m.requests, m.authFailures)
	return m
}

func (m *Metrics) request(route string, code int) {
	if m != nil {
		m.requests.WithLabelValues(route, strconv.Itoa(code)).Inc()
	}
}

func (m *Metrics) authFailure(kind string) {
	if m != nil {
		m.authFailures.WithLabelValues(kind).Inc()
	}
}
