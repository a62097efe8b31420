package admin

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/idempotent-events/idempotent-events/pkg/internal/broker"
	"github.com/idempotent-events/idempotent-events/pkg/internal/dlq"
	"github.com/idempotent-events/idempotent-events/pkg/internal/httpserver"
)

type apiHandler func(w http.ResponseWriter, r *http.Request, p principal)

// api authenticates with the bearer token only: the API takes no cookies,
// so a browser can never be made to call it on an operator's behalf.
func (s *Server) api(h apiHandler) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		p, present, ok := s.bearer(r)
		if !ok {
			kind := "missing"
			if present {
				kind = "token"
			}
			s.opts.Metrics.authFailure(kind)
			w.Header().Set("WWW-Authenticate", `Bearer realm="idempotent-events admin"`)
			httpserver.WriteJSON(w, http.StatusUnauthorized, apiError{Error: "unauthorized", Message: "send Authorization: Bearer <ADMIN_TOKEN>"})
			return
		}
		if name := r.Header.Get("X-Operator"); name != "" {
			op, err := cleanOperator(name)
			if err != nil {
				httpserver.WriteJSON(w, http.StatusBadRequest, apiError{Error: "invalid_operator", Message: "X-Operator: " + err.Error()})
				return
			}
			p.operator = op
		}
		h(w, r, p)
	}
}

type apiError struct {
	Error   string      `json:"error"`
	Message string      `json:"message,omitempty"`
	Report  *dlq.Report `json:"report,omitempty"`
}

// filterFromQuery reads a filter from URL parameters: id (repeatable or
// comma-separated), event_id, type, source, reason, older_than, newer_than.
func filterFromQuery(q url.Values) (dlq.Filter, error) {
	f := dlq.Filter{
		EventID:   strings.TrimSpace(q.Get("event_id")),
		EventType: strings.TrimSpace(q.Get("type")),
		Source:    strings.TrimSpace(q.Get("source")),
		Reason:    broker.DLQReason(strings.TrimSpace(q.Get("reason"))),
	}
	for _, v := range q["id"] {
		for _, id := range strings.Split(v, ",") {
			if id = strings.TrimSpace(id); id != "" {
				f.IDs = append(f.IDs, id)
			}
		}
	}
	var err error
	if f.OlderThan, err = parseAge("older_than", q.Get("older_than")); err != nil {
		return f, err
	}
	if f.NewerThan, err = parseAge("newer_than", q.Get("newer_than")); err != nil {
		return f, err
	}
	return f, f.Validate()
}

func parseAge(name, v string) (time.Duration, error) {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil || d < 0 {
		return 0, fmt.Errorf("%s: want a duration like 30m or 24h, got %q", name, v)
	}
	return d, nil
}

func (s *Server) apiList(w http.ResponseWriter, r *http.Request, _ principal) {
	q := r.URL.Query()
	f, err := filterFromQuery(q)
	if err != nil {
		httpserver.WriteJSON(w, http.StatusBadRequest, apiError{Error: "invalid_filter", Message: err.Error()})
		return
	}
	limit := 0
	if v := q.Get("limit"); v != "" {
		if limit, err = strconv.Atoi(v); err != nil || limit < 0 {
			httpserver.WriteJSON(w, http.StatusBadRequest, apiError{Error: "invalid_limit", Message: "limit: want a non-negative integer"})
			return
		}
	}
	l, err := s.opts.DLQ.List(r.Context(), f, limit)
	if err != nil {
		s.brokerError(w, "list", err, nil)
		return
	}
	if l.Messages == nil {
		l.Messages = []dlq.Message{}
	}
	httpserver.WriteJSON(w, http.StatusOK, l)
}

// shownMessage is a message with its body, for GET /api/dlq/{id}.
type shownMessage struct {
	dlq.Message
	Body string `json:"body"`
}

func (s *Server) apiShow(w http.ResponseWriter, r *http.Request, _ principal) {
	m, err := s.opts.DLQ.Show(r.Context(), r.PathValue("id"))
	if errors.Is(err, dlq.ErrNotFound) {
		httpserver.WriteJSON(w, http.StatusNotFound, apiError{Error: "not_found", Message: err.Error()})
		return
	}
	if err != nil {
		s.brokerError(w, "show", err, nil)
		return
	}
	httpserver.WriteJSON(w, http.StatusOK, shownMessage{Message: m, Body: m.BodyText()})
}

// mutation is the JSON body of POST /api/dlq/replay and /discard.
type mutation struct {
	IDs       []string `json:"ids"`
	EventID   string   `json:"event_id"`
	EventType string   `json:"type"`
	Source    string   `json:"source"`
	Reason    string   `json:"reason"`
	OlderThan string   `json:"older_than"`
	NewerThan string   `json:"newer_than"`
	All       bool     `json:"all"`
	Max       int      `json:"max"`
	DryRun    bool     `json:"dry_run"`
}

func (m mutation) request(p principal) (dlq.Request, error) {
	f := dlq.Filter{IDs: m.IDs, EventID: m.EventID, EventType: m.EventType, Source: m.Source, Reason: broker.DLQReason(m.Reason), All: m.All}
	var err error
	if f.OlderThan, err = parseAge("older_than", m.OlderThan); err != nil {
		return dlq.Request{}, err
	}
	if f.NewerThan, err = parseAge("newer_than", m.NewerThan); err != nil {
		return dlq.Request{}, err
	}
	if m.Max < 0 {
		return dlq.Request{}, errors.New("max: must not be negative")
	}
	return dlq.Request{Filter: f, Max: m.Max, DryRun: m.DryRun,
		Actor: dlq.Actor{Operator: p.operator, Via: p.via, Client: p.client}}, nil
}

func decodeBody(r *http.Request, v any) error {
	body, err := io.ReadAll(io.LimitReader(r.Body, 64<<10+1))
	if err != nil {
		return fmt.Errorf("read body: %w", err)
	}
	if len(body) > 64<<10 {
		return errors.New("body larger than 64 KiB")
	}
	if len(strings.TrimSpace(string(body))) == 0 {
		return nil
	}
	dec := json.NewDecoder(strings.NewReader(string(body)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("body: %w", err)
	}
	return nil
}

func (s *Server) apiMutate(action string) apiHandler {
	return func(w http.ResponseWriter, r *http.Request, p principal) {
		var m mutation
		if err := decodeBody(r, &m); err != nil {
			httpserver.WriteJSON(w, http.StatusBadRequest, apiError{Error: "invalid_request", Message: err.Error()})
			return
		}
		req, err := m.request(p)
		if err != nil {
			httpserver.WriteJSON(w, http.StatusBadRequest, apiError{Error: "invalid_request", Message: err.Error()})
			return
		}
		s.runMutation(w, r, action, req, false)
	}
}

func (s *Server) apiMutateOne(action string) apiHandler {
	return func(w http.ResponseWriter, r *http.Request, p principal) {
		var m struct {
			DryRun bool `json:"dry_run"`
		}
		if err := decodeBody(r, &m); err != nil {
			httpserver.WriteJSON(w, http.StatusBadRequest, apiError{Error: "invalid_request", Message: err.Error()})
			return
		}
		req := dlq.Request{Filter: dlq.Filter{IDs: []string{r.PathValue("id")}}, Max: 1, DryRun: m.DryRun,
			Actor: dlq.Actor{Operator: p.operator, Via: p.via, Client: p.client}}
		s.runMutation(w, r, action, req, true)
	}
}

func (s *Server) runMutation(w http.ResponseWriter, r *http.Request, action string, req dlq.Request, single bool) {
	run := s.opts.DLQ.Replay
	if action == dlq.ActionDiscard {
		run = s.opts.DLQ.Discard
	}
	rep, err := run(r.Context(), req)
	switch {
	case errors.Is(err, dlq.ErrNoSelection), errors.Is(err, dlq.ErrNoOperator), errors.Is(err, dlq.ErrInvalidFilter):
		httpserver.WriteJSON(w, http.StatusBadRequest, apiError{Error: "invalid_request", Message: err.Error()})
	case err != nil:
		s.brokerError(w, action, err, &rep)
	case single && len(rep.NotFound) > 0:
		httpserver.WriteJSON(w, http.StatusNotFound, apiError{Error: "not_found", Message: "no message " + strings.Join(rep.NotFound, ",") + " in the DLQ", Report: &rep})
	default:
		if rep.Items == nil {
			rep.Items = []dlq.Item{}
		}
		httpserver.WriteJSON(w, http.StatusOK, rep)
	}
}

// brokerError answers a failure of the broker or the database: 503, with
// what was done before it, since part of a replay may have happened.
func (s *Server) brokerError(w http.ResponseWriter, op string, err error, rep *dlq.Report) {
	s.log.Warn("dlq operation failed", zap.String("op", op), zap.Error(err))
	httpserver.WriteJSON(w, http.StatusServiceUnavailable, apiError{Error: "unavailable", Message: op + ": " + err.Error(), Report: rep})
}

func (s *Server) apiAudit(w http.ResponseWriter, r *http.Request, _ principal) {
	limit, _ := strconv.Atoi(r.URL.Query().Get("limit"))
	entries, err := s.opts.Audit.Recent(r.Context(), limit, r.URL.Query().Get("dlq_id"))
	if err != nil {
		s.brokerError(w, "audit", err, nil)
		return
	}
	if entries == nil {
		entries = []dlq.AuditEntry{}
	}
	httpserver.WriteJSON(w, http.StatusOK, map[string]any{"entries": entries})
}
