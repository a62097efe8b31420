package admin

import (
	"context"
	"errors"
	"net"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/idempotent-events/idempotent-events/pkg/broker"
	"github.com/idempotent-events/idempotent-events/pkg/config"
	"github.com/idempotent-events/idempotent-events/pkg/dlq"
	"github.com/idempotent-events/idempotent-events/pkg/telemetry"
)

// Options configures a Server.
type Options struct {
	// Token is the bearer token of the API and the password of the page.
	// It must not be empty.
	Token string
	// Operator is the audit identity of API requests without X-Operator.
	Operator string
	// DLQ does the work; its Audit is read for the trail shown on the page.
	DLQ   *dlq.Client
	Audit *dlq.Audit
	// SessionTTL is the lifetime of a page login (8h when zero).
	SessionTTL time.Duration
	// PageSize is how many DLQ messages the page lists (100 when zero).
	PageSize int
	Logger   *zap.Logger
	Metrics  *Metrics
}

// Server is the admin HTTP server.
type Server struct {
	opts    Options
	log     *zap.Logger
	key     []byte
	handler http.Handler
	ln      net.Listener
}

// New returns a Server; it refuses an empty token.
func New(opts Options) (*Server, error) {
	if opts.Token == "" {
		return nil, errors.New("admin: no token: the admin server stays off")
	}
	if opts.DLQ == nil || opts.Audit == nil {
		return nil, errors.New("admin: DLQ client and audit are required")
	}
	if opts.Operator == "" {
		opts.Operator = "admin-api"
	}
	if opts.SessionTTL <= 0 {
		opts.SessionTTL = 8 * time.Hour
	}
	if opts.PageSize <= 0 {
		opts.PageSize = 100
	}
	if opts.Logger == nil {
		opts.Logger = zap.NewNop()
	}
	s := &Server{opts: opts, log: opts.Logger, key: deriveKey(opts.Token)}
	s.handler = s.routes()
	return s, nil
}

// FromConfig builds the admin server the worker runs, listening on
// ADMIN_ADDR, with the DLQ tools on amqpURL and the audit trail on pool. It
// returns nil when ADMIN_TOKEN is empty: the admin server is off.
func FromConfig(cfg config.Admin, amqpURL string, publishTimeout time.Duration, pool *pgxpool.Pool, log *zap.Logger, reg prometheus.Registerer) (*Server, error) {
	if !cfg.AdminEnabled() {
		return nil, nil
	}
	audit := dlq.NewAudit(pool)
	ops := dlq.New(dlq.Options{
		Dialer:         broker.Dialer{URL: amqpURL, Name: "idempotent-events admin"},
		Audit:          audit,
		ScanLimit:      cfg.AdminScanLimit,
		Rate:           cfg.AdminReplayRate,
		PublishTimeout: publishTimeout,
		Logger:         log.Named("dlq"),
		Metrics:        dlq.NewMetrics(reg),
	})
	s, err := New(Options{
		Token: cfg.AdminToken, Operator: cfg.AdminOperator, DLQ: ops, Audit: audit,
		SessionTTL: cfg.AdminSessionTTL, Logger: log, Metrics: NewMetrics(reg),
	})
	if err != nil {
		return nil, err
	}
	if s.ln, err = telemetry.Listen(cfg.AdminAddr); err != nil {
		return nil, err
	}
	return s, nil
}

// Handler serves the API and the page.
func (s *Server) Handler() http.Handler { return s.handler }

// Addr is the address FromConfig listens on.
func (s *Server) Addr() net.Addr { return s.ln.Addr() }

// Run serves on the listener FromConfig opened until ctx is done, then
// lets in-flight requests finish for up to grace.
func (s *Server) Run(ctx context.Context, grace time.Duration) error {
	s.log.Info("admin server listening", zap.String("addr", s.ln.Addr().String()))
	return Serve(ctx, s.handler, s.ln, grace)
}

// Serve runs h on ln until ctx is done. Replays are rate limited, so a
// request may legitimately take minutes: the write timeout is long. Request
// contexts derive from ctx, so a shutdown stops a running replay or discard
// between two messages (what it did not reach stays in the DLQ) and the
// handler answers with what was done, well within grace.
func Serve(ctx context.Context, h http.Handler, ln net.Listener, grace time.Duration) error {
	srv := telemetry.Server(h)
	srv.WriteTimeout = 15 * time.Minute
	srv.BaseContext = func(net.Listener) context.Context { return ctx }
	return telemetry.Serve(ctx, srv, ln, grace)
}

func (s *Server) routes() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, "/ui/dlq", http.StatusSeeOther)
	})
	mux.HandleFunc("GET /ui/style.css", serveCSS)

	mux.HandleFunc("GET /api/dlq", s.api(s.apiList))
	mux.HandleFunc("GET /api/dlq/{id}", s.api(s.apiShow))
	mux.HandleFunc("POST /api/dlq/replay", s.api(s.apiMutate(dlq.ActionReplay)))
	mux.HandleFunc("POST /api/dlq/discard", s.api(s.apiMutate(dlq.ActionDiscard)))
	mux.HandleFunc("POST /api/dlq/{id}/replay", s.api(s.apiMutateOne(dlq.ActionReplay)))
	mux.HandleFunc("POST /api/dlq/{id}/discard", s.api(s.apiMutateOne(dlq.ActionDiscard)))
	mux.HandleFunc("GET /api/audit", s.api(s.apiAudit))

	mux.HandleFunc("GET /ui/login", s.uiLoginForm)
	mux.HandleFunc("POST /ui/login", s.uiLogin)
	mux.HandleFunc("POST /ui/logout", s.ui(s.uiLogout))
	mux.HandleFunc("GET /ui/dlq", s.ui(s.uiList))
	mux.HandleFunc("GET /ui/dlq/{id}", s.ui(s.uiShow))
	mux.HandleFunc("GET /ui/dlq/{id}/{action}", s.ui(s.uiConfirm))
	mux.HandleFunc("POST /ui/dlq/{id}/{action}", s.ui(s.uiAct))

	// Go's cross-origin protection refuses state-changing requests a browser
	// marks as cross-site (Sec-Fetch-Site, Origin); the forms also carry a
	// CSRF token and the cookie is SameSite=Strict.
	cop := http.NewCrossOriginProtection()
	return s.observe(secureHeaders(cop.Handler(mux)))
}

// observe counts requests by route pattern and status.
func (s *Server) observe(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec := &statusRecorder{ResponseWriter: w, code: http.StatusOK}
		next.ServeHTTP(rec, r)
		route := r.Pattern
		if route == "" {
			route = "other"
		}
		s.opts.Metrics.request(route, rec.code)
	})
}

type statusRecorder struct {
	http.ResponseWriter
	code int
}

func (r *statusRecorder) WriteHeader(code int) {
	r.code = code
	r.ResponseWriter.WriteHeader(code)
}

func secureHeaders(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("X-Frame-Options", "DENY")
		h.Set("Referrer-Policy", "no-referrer")
		h.Set("Cache-Control", "no-store")
		h.Set("Content-Security-Policy", "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
		next.ServeHTTP(w, r)
	})
}
