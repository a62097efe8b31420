package httpserver

import (
	"io"
	"math"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// GuardOptions configure Guard: the limits an unauthenticated sender meets
// before a handler reads and verifies what it sends.
type GuardOptions struct {
	// BodyTimeout bounds reading a POST body once the headers are in. A
	// client that trickles its body is cut off then (the handler's read
	// fails) instead of holding a connection for the server's whole Read
	// timeout. 0 leaves the Read timeout alone.
	BodyTimeout time.Duration
	// FailureRate and FailureBurst bound the failed POSTs of one client on
	// one route: a token bucket of FailureBurst tokens, refilled at
	// FailureRate per second, loses one per failure (an answer of 401, 413
	// or 415, or a body that could not be read). A client without a token
	// is answered 429 before its body is read or verified, until a token is
	// back. FailureRate 0 turns the limit off.
	FailureRate  float64
	FailureBurst int
	// ClientIPHeader names the header the client's address is read from
	// (its last, right-most value: the one the nearest proxy added) when
	// the server sits behind a proxy that sets it, such as an Ingress
	// controller's X-Forwarded-For; "" uses the connection's address. Only
	// set it behind such a proxy: a client that reaches the server directly
	// can write the header, and so choose the bucket it spends.
	ClientIPHeader string
	// MaxClients bounds the clients tracked (DefaultMaxClients when 0): a
	// sender of many addresses cannot grow the table without bound.
	MaxClients int
	// TrustFor is how long a client that was answered 2xx on a route is
	// never throttled there (DefaultTrustFor when 0). A sender without the
	// secret cannot earn it; a proxy that carries a provider's deliveries
	// beside a flood does, and its requests are then all served, as
	// without the limit, instead of all refused.
	TrustFor time.Duration
	// Metrics, when set, counts what the guard refuses.
	Metrics *GuardMetrics
}

// Defaults of GuardOptions.
const (
	// DefaultMaxClients bounds the table to about 10 MB.
	DefaultMaxClients = 65536
	// DefaultTrustFor outlasts the gaps between a provider's deliveries
	// on a quiet endpoint.
	DefaultTrustFor = 10 * time.Minute
)

// Guard wraps h, a handler of POST bodies from untrusted clients, with the
// limits of opts. Other methods pass through untouched: health and
// readiness checks are never limited.
//
// Failures are counted per route and client, and only on routes h serves
// (r.Pattern is set once h's ServeMux has matched), so random paths add no
// buckets. A client answered 2xx is trusted for TrustFor: when clients
// cannot be told apart (a proxy in front that does not say who the client
// is), a flood then costs the valid deliveries latency, as it would without
// the limit, not their acceptance. IPv6 clients are counted per /64, the block one host usually
// holds. The failure answers (401, 413, 415 and unread bodies) close the
// connection, so a flood pays a TCP handshake per request and its unread
// bytes are never drained by the server.
func Guard(h http.Handler, opts GuardOptions) http.Handler {
	if opts.MaxClients <= 0 {
		opts.MaxClients = DefaultMaxClients
	}
	if opts.TrustFor <= 0 {
		opts.TrustFor = DefaultTrustFor
	}
	return &guard{next: h, opts: opts, buckets: map[string]*bucket{}, now: time.Now}
}

type guard struct {
	next http.Handler
	opts GuardOptions
	now  func() time.Time

	mu      sync.Mutex
	buckets map[string]*bucket
}

// bucket is one client's failure budget on one route.
type bucket struct {
	tokens float64
	at     time.Time
	// trustedUntil is set by an answer 2xx: until then the client is not
	// throttled.
	trustedUntil time.Time
}

func (g *guard) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		g.next.ServeHTTP(w, r)
		return
	}
	limited := g.opts.FailureRate > 0
	key := r.URL.Path + " " + g.client(r)
	if limited {
		if wait, ok := g.allow(key); !ok {
			g.throttle(w, r, wait)
			return
		}
	}
	if g.opts.BodyTimeout > 0 {
		// An error means a writer that cannot set deadlines (a test
		// recorder); the server's Read timeout still applies.
		_ = http.NewResponseController(w).SetReadDeadline(g.now().Add(g.opts.BodyTimeout))
	}
	body := &watchedBody{ReadCloser: r.Body}
	r.Body = body
	sw := &statusWriter{ResponseWriter: w, body: body}
	g.next.ServeHTTP(sw, r)

	if body.err != nil && g.opts.Metrics != nil && r.Pattern != "" {
		g.opts.Metrics.bodyErrors.WithLabelValues(r.URL.Path).Inc()
	}
	if limited && r.Pattern != "" {
		switch {
		case failure(sw.code) || body.err != nil:
			g.fail(key)
		case sw.code >= 200 && sw.code < 300:
			g.trust(key)
		}
	}
}

// failure reports whether an answer tells of a sender without the secret
// or one that sends what no provider sends.
func failure(code int) bool {
	switch code {
	case http.StatusUnauthorized, http.StatusRequestEntityTooLarge, http.StatusUnsupportedMediaType:
		return true
	}
	return false
}

func (g *guard) throttle(w http.ResponseWriter, r *http.Request, wait time.Duration) {
	if g.opts.Metrics != nil {
		// Only routes the handler serves have buckets, so the label is
		// bounded by them.
		g.opts.Metrics.throttled.WithLabelValues(r.URL.Path).Inc()
	}
	w.Header().Set("Retry-After", strconv.Itoa(int(math.Ceil(wait.Seconds()))))
	w.Header().Set("Connection", "close")
	WriteJSON(w, http.StatusTooManyRequests, map[string]string{
		"error":   "too_many_failures",
		"message": "too many failed requests from this client; retry later",
	})
}

// allow reports whether key has a token, and else how long until it has.
func (g *guard) allow(key string) (time.Duration, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	b := g.buckets[key]
	if b == nil {
		return 0, true
	}
	g.refill(b)
	if b.tokens >= 1 || g.now().Before(b.trustedUntil) {
		return 0, true
	}
	wait := time.Duration((1 - b.tokens) / g.opts.FailureRate * float64(time.Second))
	return max(wait, time.Second), false
}

// fail takes a token from key's bucket.
func (g *guard) fail(key string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	b := g.bucket(key)
	g.refill(b)
	b.tokens = max(b.tokens-1, 0)
}

// trust marks key as a client that was answered 2xx.
func (g *guard) trust(key string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.bucket(key).trustedUntil = g.now().Add(g.opts.TrustFor)
}

// bucket returns key's bucket, adding a full one first; g.mu is held.
func (g *guard) bucket(key string) *bucket {
	b := g.buckets[key]
	if b != nil {
		return b
	}
	if len(g.buckets) >= g.opts.MaxClients {
		g.evict()
	}
	b = &bucket{tokens: float64(g.opts.FailureBurst), at: g.now()}
	g.buckets[key] = b
	if g.opts.Metrics != nil {
		g.opts.Metrics.clients.Set(float64(len(g.buckets)))
	}
	return b
}

func (g *guard) refill(b *bucket) {
	now := g.now()
	b.tokens = min(float64(g.opts.FailureBurst), b.tokens+now.Sub(b.at).Seconds()*g.opts.FailureRate)
	b.at = now
}

// evict makes room in a full table: first the buckets that have refilled
// and are not trusted (they hold no memory), else an arbitrary one, whose
// client starts again with a full budget and no trust.
func (g *guard) evict() {
	now := g.now()
	for k, b := range g.buckets {
		g.refill(b)
		if b.tokens >= float64(g.opts.FailureBurst) && !now.Before(b.trustedUntil) {
			delete(g.buckets, k)
		}
	}
	if len(g.buckets) < g.opts.MaxClients {
		return
	}
	for k := range g.buckets {
		delete(g.buckets, k)
		break
	}
}

// client is the address a request's failures are counted under.
func (g *guard) client(r *http.Request) string {
	var addr netip.Addr
	if g.opts.ClientIPHeader != "" {
		if vs := r.Header.Values(g.opts.ClientIPHeader); len(vs) > 0 {
			last := vs[len(vs)-1]
			if i := strings.LastIndexByte(last, ','); i >= 0 {
				last = last[i+1:]
			}
			addr, _ = netip.ParseAddr(strings.TrimSpace(last))
		}
	}
	if !addr.IsValid() {
		host, _, err := net.SplitHostPort(r.RemoteAddr)
		if err != nil {
			host = r.RemoteAddr
		}
		addr, _ = netip.ParseAddr(host)
	}
	addr = addr.Unmap()
	if addr.Is6() {
		p, _ := addr.Prefix(64)
		return p.String()
	}
	return addr.String()
}

// watchedBody remembers the first error reading the body, other than its
// end: a body cut off by BodyTimeout or by the client.
type watchedBody struct {
	io.ReadCloser
	err error
}

func (b *watchedBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err != nil && err != io.EOF && b.err == nil {
		b.err = err
	}
	return n, err
}

// statusWriter records the answer's status code and closes the connection
// after a failure.
type statusWriter struct {
	http.ResponseWriter
	body *watchedBody
	code int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.code == 0 {
		w.code = code
		if failure(code) || w.body.err != nil {
			w.Header().Set("Connection", "close")
		}
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(p []byte) (int, error) {
	if w.code == 0 {
		w.WriteHeader(http.StatusOK)
	}
	return w.ResponseWriter.Write(p)
}

// Unwrap lets http.ResponseController reach the connection (deadlines,
// flushes).
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// GuardMetrics count what Guard refuses.
type GuardMetrics struct {
	throttled  *prometheus.CounterVec
	bodyErrors *prometheus.CounterVec
	clients    prometheus.Gauge
}

// NewGuardMetrics registers Guard's metrics on reg, named
// idempotent_events_<subsystem>_… .
func NewGuardMetrics(reg prometheus.Registerer, subsystem string) *GuardMetrics {
	// The namespace is telemetry.Namespace, a layer above this package.
	const ns = "idempotent_events"
	m := &GuardMetrics{
		throttled: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Subsystem: subsystem, Name: "throttled_total",
			Help: "POSTs answered 429 before their body was read: their client had spent its budget of failed requests " +
				"(401, 413, 415, unread body) on the route.",
		}, []string{"route"}),
		bodyErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Subsystem: subsystem, Name: "body_read_errors_total",
			Help: "POST bodies that could not be read whole: cut off by the body timeout or by the client.",
		}, []string{"route"}),
		clients: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: ns, Subsystem: subsystem, Name: "failure_tracked_clients",
			Help: "Clients (per route) whose failed requests are being counted, or that were answered 2xx recently and are trusted.",
		}),
	}
	reg.MustRegister(m.throttled, m.bodyErrors, m.clients)
	return m
}
