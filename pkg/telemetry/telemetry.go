// Package telemetry serves what operators and Kubernetes look at: Prometheus
// metrics, liveness and readiness. Metrics are registered on a registry made
// per process and injected into every component, never on globals.
package telemetry

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"
	"runtime"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Version is set at build time with -ldflags "-X …/pkg/telemetry.Version=…".
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

// WriteJSON writes v as the JSON answer with status code.
func WriteJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

// HealthRoutes adds GET /livez and GET /readyz to mux.
func HealthRoutes(mux *http.ServeMux, ready ReadyFunc) {
	mux.HandleFunc("GET /livez", func(w http.ResponseWriter, _ *http.Request) {
		WriteJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		if err := ready(); err != nil {
			WriteJSON(w, http.StatusServiceUnavailable, map[string]string{"status": "not_ready", "reason": err.Error()})
			return
		}
		WriteJSON(w, http.StatusOK, map[string]string{"status": "ready"})
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

// Timeouts against slow clients (slowloris): headers must arrive within
// ReadHeaderTimeout, the whole request within ReadTimeout.
type Timeouts struct {
	ReadHeader, Read, Write, Idle time.Duration
}

// DefaultTimeouts suit webhook requests of at most a few megabytes.
var DefaultTimeouts = Timeouts{ReadHeader: 5 * time.Second, Read: 30 * time.Second, Write: 30 * time.Second, Idle: 90 * time.Second}

// Server is an http.Server with the timeouts and header limit every
// listener of the project needs against slow and oversized clients.
func Server(h http.Handler) *http.Server { return ServerWithTimeouts(h, DefaultTimeouts) }

// ServerWithTimeouts is Server with other timeouts.
func ServerWithTimeouts(h http.Handler, t Timeouts) *http.Server {
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: t.ReadHeader,
		ReadTimeout:       t.Read,
		WriteTimeout:      t.Write,
		IdleTimeout:       t.Idle,
		MaxHeaderBytes:    16 << 10,
	}
}

// Listen opens addr, so a bad or taken address is reported before the
// component starts.
func Listen(addr string) (net.Listener, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", addr, err)
	}
	return ln, nil
}

// Serve runs srv on ln until ctx is done, then shuts it down, letting
// in-flight requests finish for up to grace.
func Serve(ctx context.Context, srv *http.Server, ln net.Listener, grace time.Duration) error {
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return fmt.Errorf("serve %s: %w", ln.Addr(), err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), grace)
	defer cancel()
	err := srv.Shutdown(sctx)
	if serr := <-errc; serr != nil && !errors.Is(serr, http.ErrServerClosed) && err == nil {
		err = serr
	}
	if err != nil {
		return fmt.Errorf("shut down %s: %w", ln.Addr(), err)
	}
	return nil
}
