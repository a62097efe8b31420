package broker

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/idempotent-events/idempotent-events/pkg/internal/telemetry"
)

// ConnMetrics are the connection series of one component that Supervise
// keeps connected: <namespace>_<subsystem>_broker_connected and
// _broker_connections_total.
type ConnMetrics struct {
	connected prometheus.Gauge
	connects  prometheus.Counter
}

// NewConnMetrics registers the connection series of subsystem (receiver,
// worker) on reg.
func NewConnMetrics(reg prometheus.Registerer, subsystem string) *ConnMetrics {
	m := &ConnMetrics{
		connected: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: telemetry.Namespace, Subsystem: subsystem, Name: "broker_connected",
			Help: "1 while the " + subsystem + " holds a connection to RabbitMQ.",
		}),
		connects: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: telemetry.Namespace, Subsystem: subsystem, Name: "broker_connections_total",
			Help: "Connections made to RabbitMQ; more than one means reconnects.",
		}),
	}
	reg.MustRegister(m.connected, m.connects)
	return m
}

// State is the state callback of Supervise.
func (m *ConnMetrics) State(connected bool) {
	if connected {
		m.connects.Inc()
		m.connected.Set(1)
		return
	}
	m.connected.Set(0)
}
