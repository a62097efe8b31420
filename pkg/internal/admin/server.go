package admin

import (
	"errors"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/zap"

	"github.com/idempotent-events/idempotent-events/pkg/internal/dlq"
	"github.com/idempotent-events/idempotent-events/pkg/internal/httpserver"
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
	// DB is the ledger's database, for the event and object lookups
	// (/api/events/{id}, /ui/events); RetryQueues are the retry tiers they
	// scan besides events.dlq. Without DB the lookups answer 404.
	DB          *pgxpool.Pool
	RetryQueues []string
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

// Handler serves the API and the page.
func (s *Server) Handler() http.Handler { return s.handler }

// HTTPOptions is how the admin server is served on addr. Replays are rate
// limited, so a request may legitimately take minutes: the write timeout is
// long. Request contexts follow the server's, so a shutdown stops a running
// replay or discard between two messages (what it did not reach stays in
// the DLQ) and the handler answers with what was done, well within
// shutdownTimeout.
func (s *Server) HTTPOptions(addr string, shutdownTimeout time.Duration) httpserver.Options {
	t := httpserver.DefaultTimeouts
	t.Write = 15 * time.Minute
	return httpserver.Options{
		Addr: addr, Handler: s.handler, ShutdownTimeout: shutdownTimeout, Timeouts: t,
		RequestsFollowRun: true, ErrorLog: zap.NewStdLog(s.log),
	}
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
	mux.HandleFunc("GET /api/events/{id}", s.api(s.apiEvent))
	mux.HandleFunc("GET /api/objects/{id}", s.api(s.apiObject))
	mux.HandleFunc("GET /ui/events", s.ui(s.uiEvent))

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
