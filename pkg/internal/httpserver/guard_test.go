package httpserver_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotent-events/idempotent-events/pkg/internal/httpserver"
)

// webhooks is a stand-in for the receiver: POST /hook reads the body and
// answers 401 unless it is "good"; GET /readyz answers 200.
type webhooks struct {
	mux     *http.ServeMux
	reached atomic.Int64
	readErr atomic.Value
}

func newWebhooks() *webhooks {
	h := &webhooks{mux: http.NewServeMux()}
	h.mux.HandleFunc("POST /hook", func(w http.ResponseWriter, r *http.Request) {
		h.reached.Add(1)
		body, err := io.ReadAll(r.Body)
		if err != nil {
			h.readErr.Store(err.Error())
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		if string(body) != "good" {
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		w.WriteHeader(http.StatusAccepted)
	})
	h.mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
	return h
}

func post(h http.Handler, path, remote, body string, header ...string) *httptest.ResponseRecorder {
	r := httptest.NewRequest(http.MethodPost, path, strings.NewReader(body))
	r.RemoteAddr = remote
	for i := 0; i+1 < len(header); i += 2 {
		r.Header.Add(header[i], header[i+1])
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

// A client that spent its budget of failures is answered 429 before the
// handler reads anything, with Retry-After and the connection closed; its
// valid requests too (it is throttled as a client, never trusted by a 2xx).
// Another client, and GET requests, are not affected.
func TestGuardThrottlesAClientThatKeepsFailing(t *testing.T) {
	hooks := newWebhooks()
	reg := prometheus.NewRegistry()
	g := httpserver.Guard(hooks.mux, httpserver.GuardOptions{FailureRate: 0.01, FailureBurst: 3,
		Metrics: httpserver.NewGuardMetrics(reg, "receiver")})
	const flooder, sender = "192.0.2.1:4000", "192.0.2.2:4000"

	for i := 0; i < 3; i++ {
		w := post(g, "/hook", flooder, "bad")
		require.Equal(t, http.StatusUnauthorized, w.Code)
		assert.Equal(t, "close", w.Header().Get("Connection"), "a failure closes the connection")
	}
	before := hooks.reached.Load()
	w := post(g, "/hook", flooder, "bad")
	assert.Equal(t, http.StatusTooManyRequests, w.Code)
	assert.Equal(t, "close", w.Header().Get("Connection"))
	assert.NotEmpty(t, w.Header().Get("Retry-After"))
	assert.JSONEq(t, `{"error":"too_many_failures","message":"too many failed requests from this client; retry later"}`, w.Body.String())
	assert.Equal(t, http.StatusTooManyRequests, post(g, "/hook", flooder, "good").Code)
	assert.Equal(t, before, hooks.reached.Load(), "a throttled request never reaches the handler")

	assert.Equal(t, http.StatusAccepted, post(g, "/hook", sender, "good").Code)
	assert.Equal(t, http.StatusUnauthorized, post(g, "/hook", sender, "bad").Code)
	r := httptest.NewRequest(http.MethodGet, "/readyz", nil)
	r.RemoteAddr = flooder
	rec := httptest.NewRecorder()
	g.ServeHTTP(rec, r)
	assert.Equal(t, http.StatusOK, rec.Code, "GETs are never limited")

	assert.Equal(t, 2.0, counter(t, reg, "idempotent_events_receiver_throttled_total", "/hook"))
	assert.Equal(t, 2.0, gauge(t, reg, "idempotent_events_receiver_failure_tracked_clients"))
}

// A client that was answered 2xx (a proxy that carries a provider's
// deliveries beside a flood) is not throttled, however many failures come
// through it, until TrustFor has passed since its last success: the flood
// then costs the valid deliveries latency, not their acceptance.
func TestGuardDoesNotThrottleAClientThatCarriesValidDeliveries(t *testing.T) {
	hooks := newWebhooks()
	g := httpserver.Guard(hooks.mux, httpserver.GuardOptions{FailureRate: 0.01, FailureBurst: 2, TrustFor: 300 * time.Millisecond})
	const proxy = "10.0.0.9:5000"
	require.Equal(t, http.StatusAccepted, post(g, "/hook", proxy, "good").Code)
	for i := 0; i < 20; i++ {
		require.Equal(t, http.StatusUnauthorized, post(g, "/hook", proxy, "bad").Code, "request %d", i)
	}
	require.Equal(t, http.StatusAccepted, post(g, "/hook", proxy, "good").Code)
	require.Eventually(t, func() bool { return post(g, "/hook", proxy, "bad").Code == http.StatusTooManyRequests },
		5*time.Second, 20*time.Millisecond, "the trust ends TrustFor after the last success")
}

// The budget refills at FailureRate: a throttled client is served again.
func TestGuardRefillsTheBudget(t *testing.T) {
	hooks := newWebhooks()
	g := httpserver.Guard(hooks.mux, httpserver.GuardOptions{FailureRate: 20, FailureBurst: 1})
	const client = "192.0.2.1:4000"
	require.Equal(t, http.StatusUnauthorized, post(g, "/hook", client, "bad").Code)
	require.Equal(t, http.StatusTooManyRequests, post(g, "/hook", client, "good").Code)
	require.Eventually(t, func() bool { return post(g, "/hook", client, "good").Code == http.StatusAccepted },
		5*time.Second, 10*time.Millisecond)
}

// Failures are counted per route the handler serves: requests to paths it
// does not serve add no bucket, whatever their number.
func TestGuardCountsOnlyRoutesTheHandlerServes(t *testing.T) {
	hooks := newWebhooks()
	reg := prometheus.NewRegistry()
	g := httpserver.Guard(hooks.mux, httpserver.GuardOptions{FailureRate: 0.01, FailureBurst: 1,
		Metrics: httpserver.NewGuardMetrics(reg, "receiver")})
	for i := 0; i < 50; i++ {
		assert.Equal(t, http.StatusNotFound, post(g, fmt.Sprintf("/nope/%d", i), "192.0.2.1:1", "bad").Code)
	}
	assert.Equal(t, 0.0, gauge(t, reg, "idempotent_events_receiver_failure_tracked_clients"))
	assert.Equal(t, http.StatusUnauthorized, post(g, "/hook", "192.0.2.1:1", "bad").Code)
	assert.Equal(t, 1.0, gauge(t, reg, "idempotent_events_receiver_failure_tracked_clients"))
}

// Behind a proxy the client is the right-most address of ClientIPHeader (the
// one the nearest proxy added); a value that is no address falls back to
// the connection's. IPv6 clients count per /64.
func TestGuardClientAddress(t *testing.T) {
	hooks := newWebhooks()
	g := httpserver.Guard(hooks.mux, httpserver.GuardOptions{FailureRate: 0.01, FailureBurst: 1, ClientIPHeader: "X-Forwarded-For"})
	const proxy = "10.0.0.9:5000"
	require.Equal(t, http.StatusUnauthorized, post(g, "/hook", proxy, "bad", "X-Forwarded-For", "203.0.113.7, 198.51.100.1").Code)
	assert.Equal(t, http.StatusTooManyRequests, post(g, "/hook", proxy, "good", "X-Forwarded-For", "192.0.2.50, 198.51.100.1").Code,
		"the forged left-most address does not pick another bucket")
	assert.Equal(t, http.StatusAccepted, post(g, "/hook", proxy, "good", "X-Forwarded-For", "198.51.100.2").Code)
	require.Equal(t, http.StatusUnauthorized, post(g, "/hook", proxy, "bad", "X-Forwarded-For", "not-an-address").Code)
	assert.Equal(t, http.StatusTooManyRequests, post(g, "/hook", proxy, "good").Code, "counted under the proxy's address")

	require.Equal(t, http.StatusUnauthorized, post(g, "/hook", "[2001:db8:1:2::1]:443", "bad").Code)
	assert.Equal(t, http.StatusTooManyRequests, post(g, "/hook", "[2001:db8:1:2:ffff::9]:443", "good").Code, "same /64")
	assert.Equal(t, http.StatusAccepted, post(g, "/hook", "[2001:db8:1:3::1]:443", "good").Code, "another /64")
}

// The table of clients stays within MaxClients, whatever the number of
// addresses that fail.
func TestGuardBoundsTheClientsTracked(t *testing.T) {
	hooks := newWebhooks()
	reg := prometheus.NewRegistry()
	g := httpserver.Guard(hooks.mux, httpserver.GuardOptions{FailureRate: 0.01, FailureBurst: 5, MaxClients: 100,
		Metrics: httpserver.NewGuardMetrics(reg, "receiver")})
	for i := 0; i < 1000; i++ {
		post(g, "/hook", fmt.Sprintf("10.%d.%d.1:1", i/256, i%256), "bad")
	}
	assert.LessOrEqual(t, gauge(t, reg, "idempotent_events_receiver_failure_tracked_clients"), 100.0)
}

// A body that trickles is cut off at BodyTimeout, long before the server's
// Read timeout, and counts as a failure of its client.
func TestGuardCutsOffASlowBody(t *testing.T) {
	hooks := newWebhooks()
	reg := prometheus.NewRegistry()
	g := httpserver.Guard(hooks.mux, httpserver.GuardOptions{BodyTimeout: 300 * time.Millisecond, FailureRate: 0.01, FailureBurst: 1,
		Metrics: httpserver.NewGuardMetrics(reg, "receiver")})
	srv, err := httpserver.New(httpserver.Options{Addr: "127.0.0.1:0", Handler: g, ShutdownTimeout: time.Second,
		Timeouts: httpserver.Timeouts{ReadHeader: time.Minute, Read: time.Minute, Write: time.Minute, Idle: time.Minute}})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	t.Cleanup(func() { cancel(); assert.NoError(t, <-done) })

	conn, err := net.Dial("tcp", srv.Addr().String())
	require.NoError(t, err)
	defer conn.Close()
	_, err = fmt.Fprintf(conn, "POST /hook HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{")
	require.NoError(t, err)
	require.NoError(t, conn.SetReadDeadline(time.Now().Add(20*time.Second)))
	status, err := io.ReadAll(conn)
	if err != nil && !errors.Is(err, io.EOF) {
		require.NoError(t, err)
	}
	assert.True(t, strings.HasPrefix(string(status), "HTTP/1.1 400"), "%q", status)
	assert.Contains(t, hooks.readErr.Load(), "timeout")
	assert.Equal(t, 1.0, counter(t, reg, "idempotent_events_receiver_body_read_errors_total", "/hook"))

	resp, err := http.Post("http://"+srv.Addr().String()+"/hook", "text/plain", strings.NewReader("good"))
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusTooManyRequests, resp.StatusCode, "the slow body counted as the client's failure")
}

// counter is the value of the counter name for route.
func counter(t *testing.T, reg *prometheus.Registry, name, route string) float64 {
	t.Helper()
	families, err := reg.Gather()
	require.NoError(t, err)
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "route" && l.GetValue() == route {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

func gauge(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	families, err := reg.Gather()
	require.NoError(t, err)
	for _, f := range families {
		if f.GetName() == name {
			return f.GetMetric()[0].GetGauge().GetValue()
		}
	}
	return 0
}
