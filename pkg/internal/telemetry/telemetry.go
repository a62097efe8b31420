// Package telemetry is what operators and Kubernetes look at: the Prometheus
// registry of a process, the /metrics, /livez and /readyz handler, and the
// build version. Metrics are registered on a registry made per process and
// injected into every component, never on globals.
package telemetry

import (
	"net/http"
	"net/http/pprof"
	"runtime"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/idempotent-events/idempotent-events/pkg/internal/httpserver"
)

// Version is set at build time with -ldflags "-X …/pkg/internal/telemetry.Version=…".
var Version = "dev"

// Namespace prefixes every metric of the project.
const Namespace = "idempotent_events"

// NewRegistry returns a registry with the Go runtime and process collectors
// and an idempotent_events_build_info gauge for component.
func NewRegistry(component string) *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	)
	info := prometheus.NewGauge(prometheus.GaugeOpts{
		Namespace:   Namespace,
		Name:        "build_info",
		Help:        "Always 1; labels carry the version and Go version of the running binary.",
		ConstLabels: prometheus.Labels{"component": component, "version": Version, "goversion": runtime.Version()},
	})
	info.Set(1)
	reg.MustRegister(info)
	return reg
}

// ReadyFunc returns nil when the component can do its work, or why not.
type ReadyFunc func() error

// HealthRoutes adds GET /livez and GET /readyz to mux.
func HealthRoutes(mux *http.ServeMux, ready ReadyFunc) {
	mux.HandleFunc("GET /livez", func(w http.ResponseWriter, _ *http.Request) {
		httpserver.WriteJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		if err := ready(); err != nil {
			httpserver.WriteJSON(w, http.StatusServiceUnavailable, map[string]string{"status": "not_ready", "reason": err.Error()})
			return
		}
		httpserver.WriteJSON(w, http.StatusOK, map[string]string{"status": "ready"})
	})
}

// MetricsHandler serves /metrics from reg plus /livez and /readyz, and Go's
// /debug/pprof profiles when withPprof is set.
func MetricsHandler(reg *prometheus.Registry, ready ReadyFunc, withPprof bool) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	HealthRoutes(mux, ready)
	if withPprof {
		mux.HandleFunc("GET /debug/pprof/", pprof.Index)
		mux.HandleFunc("GET /debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("GET /debug/pprof/trace", pprof.Trace)
	}
	return mux
}
