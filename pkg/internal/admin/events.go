package admin

import (
	"context"
	"errors"
	"net/http"
	"strings"

	"go.uber.org/zap"

	"github.com/idempotent-events/idempotent-events/pkg/internal/broker"
	"github.com/idempotent-events/idempotent-events/pkg/internal/httpserver"
	"github.com/idempotent-events/idempotent-events/pkg/internal/lookup"
)

// findEvent is the report eventsctl events show prints: the ledger's
// tables, then events.dlq and the retry tiers.
func (s *Server) findEvent(ctx context.Context, id string) (lookup.Event, error) {
	rep, err := lookup.FindEvent(ctx, s.opts.DB, id)
	if err != nil {
		return rep, err
	}
	rep.Locate(ctx, s.opts.DLQ, id, append([]string{broker.DLQ}, s.opts.RetryQueues...))
	return rep, nil
}

// apiEvent is GET /api/events/{id}: 200 with the report when the event is
// in the ledger or a queue, 404 with it when it is nowhere.
func (s *Server) apiEvent(w http.ResponseWriter, r *http.Request, _ principal) {
	if s.opts.DB == nil {
		httpserver.WriteJSON(w, http.StatusNotFound, apiError{Error: "not_configured", Message: "the admin server has no database: event lookup is off"})
		return
	}
	rep, err := s.findEvent(r.Context(), r.PathValue("id"))
	if err != nil {
		s.log.Warn("event lookup", zap.Error(err))
		httpserver.WriteJSON(w, http.StatusServiceUnavailable, apiError{Error: "lookup_failed", Message: err.Error()})
		return
	}
	code := http.StatusOK
	if !rep.Found() {
		code = http.StatusNotFound
	}
	httpserver.WriteJSON(w, code, rep)
}

// apiObject is GET /api/objects/{id}: a PaymentIntent's or Charge's state
// and events.
func (s *Server) apiObject(w http.ResponseWriter, r *http.Request, _ principal) {
	if s.opts.DB == nil {
		httpserver.WriteJSON(w, http.StatusNotFound, apiError{Error: "not_configured", Message: "the admin server has no database: object lookup is off"})
		return
	}
	o, err := lookup.FindObject(r.Context(), s.opts.DB, r.PathValue("id"))
	switch {
	case errors.Is(err, lookup.ErrNoObject):
		httpserver.WriteJSON(w, http.StatusNotFound, apiError{Error: "not_found", Message: err.Error()})
	case err != nil:
		httpserver.WriteJSON(w, http.StatusServiceUnavailable, apiError{Error: "lookup_failed", Message: err.Error()})
	default:
		httpserver.WriteJSON(w, http.StatusOK, o)
	}
}

// uiEvent is the page of /ui/events?id=…: the same report, and the
// object's events when the id names a payment object.
func (s *Server) uiEvent(w http.ResponseWriter, r *http.Request, p principal) {
	id := strings.TrimSpace(r.URL.Query().Get("id"))
	pg := s.base(p, "Where is "+id)
	pg.LookupID = id
	code := http.StatusOK
	switch {
	case id == "":
		pg.Title = "Where is an event?"
	case s.opts.DB == nil:
		pg.Error, code = "The admin server has no database: event lookup is off.", http.StatusNotFound
	default:
		rep, err := s.findEvent(r.Context(), id)
		if err != nil {
			pg.Error, code = "Could not look it up: "+err.Error(), http.StatusServiceUnavailable
			break
		}
		pg.Event = &rep
		if o, err := lookup.FindObject(r.Context(), s.opts.DB, id); err == nil {
			pg.Object = &o
		}
		if !rep.Found() && pg.Object == nil {
			code = http.StatusNotFound
		}
	}
	s.render(w, code, "event", pg)
}
