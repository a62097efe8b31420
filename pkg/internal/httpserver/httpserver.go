// Package httpserver runs the project's HTTP listeners (the receiver's
// webhook port, every metrics port, the admin API) with one lifecycle:
// New opens the listener, so a bad or taken address fails before anything
// starts; Run serves until its context is done, then lets in-flight requests
// finish for up to ShutdownTimeout; Close releases a listener that never ran.
//
// Every server gets the same defences against slow and oversized clients:
// read, write and idle timeouts and a 16 KiB header limit. A server of
// bodies from untrusted senders (the receiver's webhook port) also wraps its
// handler in Guard: a deadline on reading the body, and a budget of failed
// requests per client and route, past which the client is answered 429
// before anything is read or verified (docs/security.md).
package httpserver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"net"
	"net/http"
	"sync"
	"time"
)

// Timeouts against slow clients (slowloris): headers must arrive within
// ReadHeader, the whole request within Read.
type Timeouts struct {
	ReadHeader, Read, Write, Idle time.Duration
}

// DefaultTimeouts suit webhook requests of at most a few megabytes.
var DefaultTimeouts = Timeouts{ReadHeader: 5 * time.Second, Read: 30 * time.Second, Write: 30 * time.Second, Idle: 90 * time.Second}

// MaxHeaderBytes is the header limit of every server.
const MaxHeaderBytes = 16 << 10

// Options configures a Server.
type Options struct {
	// Addr is host:port or :port; port 0 picks a free one (see Addr).
	Addr    string
	Handler http.Handler
	// ShutdownTimeout bounds letting in-flight requests finish once the
	// context of Run is done. It must be positive.
	ShutdownTimeout time.Duration
	// Timeouts default to DefaultTimeouts when zero.
	Timeouts Timeouts
	// RequestsFollowRun derives every request's context from the context of
	// Run, so a shutdown reaches handlers that work for a long time (the
	// admin API's rate-limited replays) and they can stop between steps.
	RequestsFollowRun bool
	// ErrorLog receives the server's own errors (bad requests, TLS); the
	// standard logger when nil.
	ErrorLog *log.Logger
}

func (o *Options) validate() error {
	switch {
	case o.Handler == nil:
		return errors.New("httpserver: Handler is required")
	case o.ShutdownTimeout <= 0:
		return errors.New("httpserver: ShutdownTimeout must be positive")
	}
	if o.Timeouts == (Timeouts{}) {
		o.Timeouts = DefaultTimeouts
	}
	return nil
}

// Server is one listener and the http.Server on it.
type Server struct {
	opts      Options
	srv       *http.Server
	ln        net.Listener
	closeOnce sync.Once
}

// New validates opts and opens the listener.
func New(opts Options) (*Server, error) {
	if err := opts.validate(); err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", opts.Addr)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", opts.Addr, err)
	}
	srv := HTTPServer(opts.Handler, opts.Timeouts)
	srv.ErrorLog = opts.ErrorLog
	return &Server{opts: opts, srv: srv, ln: ln}, nil
}

// HTTPServer is the http.Server every Server runs: h behind timeouts t and
// the header limit. Tests that need an httptest.Server use it directly.
func HTTPServer(h http.Handler, t Timeouts) *http.Server {
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: t.ReadHeader,
		ReadTimeout:       t.Read,
		WriteTimeout:      t.Write,
		IdleTimeout:       t.Idle,
		MaxHeaderBytes:    MaxHeaderBytes,
	}
}

// Addr is the address the server listens on.
func (s *Server) Addr() net.Addr { return s.ln.Addr() }

// Run serves until ctx is done, then shuts down, letting in-flight requests
// finish for up to ShutdownTimeout. It returns nil after a clean shutdown.
func (s *Server) Run(ctx context.Context) error {
	if s.opts.RequestsFollowRun {
		s.srv.BaseContext = func(net.Listener) context.Context { return ctx }
	}
	errc := make(chan error, 1)
	go func() { errc <- s.srv.Serve(s.ln) }()
	select {
	case err := <-errc:
		return fmt.Errorf("serve %s: %w", s.ln.Addr(), err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), s.opts.ShutdownTimeout)
	defer cancel()
	err := s.srv.Shutdown(sctx)
	if serr := <-errc; serr != nil && !errors.Is(serr, http.ErrServerClosed) && err == nil {
		err = serr
	}
	if err != nil {
		return fmt.Errorf("shut down %s: %w", s.ln.Addr(), err)
	}
	return nil
}

// Close releases the listener of a server whose Run never started. It is
// safe to call after Run and more than once.
func (s *Server) Close() {
	s.closeOnce.Do(func() { _ = s.ln.Close() })
}

// WriteJSON writes v as the JSON answer with status code.
func WriteJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}
