package webhooksecrets

import "github.com/prometheus/client_golang/prometheus"

// Reload results, the result label of reloads_total.
const (
	ResultApplied = "applied"
	ResultRefused = "refused"
)

// Metrics are the Watcher's series.
type Metrics struct {
	reloads *prometheus.CounterVec
	secrets *prometheus.GaugeVec
}

// NewMetrics registers the Watcher's metrics on reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		reloads: prometheus.NewCounterVec(prometheus.CounterOpts{
			// The namespace is telemetry.Namespace, which sits a layer above.
			Namespace: "idempotent_events", Subsystem: "receiver", Name: "webhook_secrets_reloads_total",
			Help: "Changed webhook secrets files by source and result: applied (the new secrets are in force) or refused " +
				"(unreadable, empty or unusable: the secrets in force were kept).",
		}, []string{"source", "result"}),
		secrets: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: "idempotent_events", Subsystem: "receiver", Name: "webhook_secrets",
			Help: "Webhook signing secrets in force, by source, for the sources that read them from a file " +
				"(WEBHOOK_SECRETS_FILE, WEBHOOK_SECRETS_<NAME>_FILE): 2 while a rotation is under way.",
		}, []string{"source"}),
	}
	reg.MustRegister(m.reloads, m.secrets)
	return m
}
