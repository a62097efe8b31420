package admin

import (
	"bytes"
	"embed"
	"errors"
	"html/template"
	"net/http"
	"net/url"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/idempotent-events/idempotent-events/pkg/internal/broker"
	"github.com/idempotent-events/idempotent-events/pkg/internal/dlq"
	"github.com/idempotent-events/idempotent-events/pkg/internal/lookup"
)

//go:embed templates
var files embed.FS

var funcs = template.FuncMap{
	"short": func(s string, n int) string {
		if r := []rune(s); len(r) > n {
			return string(r[:n]) + "…"
		}
		return s
	},
	"age": func(t time.Time) string {
		if t.IsZero() {
			return "?"
		}
		d := time.Since(t)
		switch {
		case d < time.Minute:
			return d.Round(time.Second).String()
		case d < time.Hour:
			return d.Round(time.Minute).String()
		case d < 72*time.Hour:
			return d.Round(time.Hour).String()
		}
		return d.Round(24*time.Hour).String() + " (" + t.UTC().Format("2006-01-02") + ")"
	},
	"stamp": func(v any) string {
		var t time.Time
		switch v := v.(type) {
		case time.Time:
			t = v
		case *time.Time:
			if v != nil {
				t = *v
			}
		}
		if t.IsZero() {
			return ""
		}
		return t.UTC().Format(time.RFC3339)
	},
}

var pages = map[string]*template.Template{}

func init() {
	for _, name := range []string{"login", "list", "message", "event"} {
		pages[name] = template.Must(template.New(name).Funcs(funcs).ParseFS(files, "templates/base.html", "templates/"+name+".html"))
	}
}

// page is what every template gets.
type page struct {
	Title     string
	Operator  string
	CSRF      string
	Flash     string
	Error     string
	LoginName string
	// list
	Filter    dlq.Filter
	OlderThan string
	NewerThan string
	Reasons   []broker.DLQReason
	Listing   dlq.Listing
	Audit     []dlq.AuditEntry
	// message and confirmation
	Message dlq.Message
	Action  string
	// event lookup
	LookupID string
	Event    *lookup.Event
	Object   *lookup.Object
}

func (s *Server) render(w http.ResponseWriter, code int, name string, p page) {
	var buf bytes.Buffer
	if err := pages[name].ExecuteTemplate(&buf, "base", p); err != nil {
		s.log.Error("render admin page", zap.String("page", name), zap.Error(err))
		http.Error(w, "internal error", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(code)
	_, _ = w.Write(buf.Bytes())
}

func serveCSS(w http.ResponseWriter, _ *http.Request) {
	css, _ := files.ReadFile("templates/style.css")
	w.Header().Set("Content-Type", "text/css; charset=utf-8")
	_, _ = w.Write(css)
}

type uiHandler func(w http.ResponseWriter, r *http.Request, p principal)

// ui authenticates a page request by its session cookie (or a bearer
// token). Without either it answers 401 with the sign-in form. Every POST
// must carry the session's CSRF token.
func (s *Server) ui(h uiHandler) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		p, ok := s.session(r)
		if !ok {
			bp, present, bok := s.bearer(r)
			if !bok {
				kind := "missing"
				if present {
					kind = "token"
				}
				s.opts.Metrics.authFailure(kind)
				w.Header().Set("WWW-Authenticate", `Bearer realm="idempotent-events admin"`)
				s.render(w, http.StatusUnauthorized, "login", page{Title: "Sign in"})
				return
			}
			p = bp
		}
		if r.Method == http.MethodPost {
			r.Body = http.MaxBytesReader(w, r.Body, 16<<10)
			if !s.csrfValid(p, r.PostFormValue("csrf")) {
				s.opts.Metrics.authFailure("csrf")
				s.render(w, http.StatusForbidden, "login", page{Title: "Sign in", Error: "The form has expired or did not come from this page. Sign in and try again."})
				return
			}
		}
		h(w, r, p)
	}
}

func (s *Server) base(p principal, title string) page {
	pg := page{Title: title, Operator: p.operator}
	if p.via == "web" {
		pg.CSRF = s.csrfToken(p.session)
	}
	return pg
}

func (s *Server) uiLoginForm(w http.ResponseWriter, r *http.Request) {
	if _, ok := s.session(r); ok {
		http.Redirect(w, r, "/ui/dlq", http.StatusSeeOther)
		return
	}
	s.render(w, http.StatusOK, "login", page{Title: "Sign in"})
}

func (s *Server) uiLogin(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, 16<<10)
	name := r.PostFormValue("operator")
	if !s.tokenMatches(r.PostFormValue("token")) {
		s.opts.Metrics.authFailure("token")
		s.log.Warn("admin sign-in refused: wrong token", zap.String("client", clientOf(r)))
		s.render(w, http.StatusUnauthorized, "login", page{Title: "Sign in", Error: "Wrong token.", LoginName: name})
		return
	}
	op, err := cleanOperator(name)
	if err != nil {
		s.render(w, http.StatusBadRequest, "login", page{Title: "Sign in", Error: "Your name: " + err.Error(), LoginName: name})
		return
	}
	s.setSessionCookie(w, r, s.newSession(op, time.Now()), int(s.opts.SessionTTL.Seconds()))
	s.log.Info("admin sign-in", zap.String("operator", op), zap.String("client", clientOf(r)))
	http.Redirect(w, r, "/ui/dlq", http.StatusSeeOther)
}

func (s *Server) uiLogout(w http.ResponseWriter, r *http.Request, _ principal) {
	s.setSessionCookie(w, r, "", -1)
	http.Redirect(w, r, "/ui/login", http.StatusSeeOther)
}

func (s *Server) uiList(w http.ResponseWriter, r *http.Request, p principal) {
	s.renderList(w, r, p, http.StatusOK, flash(r.URL.Query()), "")
}

func (s *Server) renderList(w http.ResponseWriter, r *http.Request, p principal, code int, flashText, errText string) {
	pg := s.base(p, "DLQ")
	pg.Flash, pg.Error, pg.Reasons = flashText, errText, broker.DLQReasons()
	q := r.URL.Query()
	if r.Method != http.MethodGet {
		q = url.Values{}
	}
	pg.OlderThan, pg.NewerThan = q.Get("older_than"), q.Get("newer_than")
	f, err := filterFromQuery(q)
	if err != nil {
		pg.Error = err.Error()
		s.render(w, http.StatusBadRequest, "list", pg)
		return
	}
	pg.Filter = f
	if pg.Listing, err = s.opts.DLQ.List(r.Context(), f, s.opts.PageSize); err != nil {
		pg.Error = strings.TrimSpace(pg.Error + " Could not read the DLQ: " + err.Error())
		code = http.StatusServiceUnavailable
	}
	if pg.Audit, err = s.opts.Audit.Recent(r.Context(), 20, ""); err != nil {
		pg.Error = strings.TrimSpace(pg.Error + " Could not read the audit trail: " + err.Error())
		code = http.StatusServiceUnavailable
	}
	s.render(w, code, "list", pg)
}

// flash describes the result of the action a redirect came from. Only
// known words and an id-shaped value are shown.
func flash(q url.Values) string {
	action, id, outcome := q.Get("done"), q.Get("done_id"), q.Get("outcome")
	if (action != dlq.ActionReplay && action != dlq.ActionDiscard) || !idShaped(id) {
		return ""
	}
	switch outcome {
	case dlq.OutcomeReplayed:
		return "Replayed " + id + ": a copy is in events.replay and the message left the DLQ."
	case dlq.OutcomeDiscarded:
		return "Discarded " + id + ": it left the DLQ and is kept in the audit trail."
	case "not_found":
		return "Message " + id + " is no longer in the DLQ (another operator may have acted on it)."
	}
	return ""
}

func idShaped(s string) bool {
	if s == "" || len(s) > 64 {
		return false
	}
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_') {
			return false
		}
	}
	return true
}

func (s *Server) uiShow(w http.ResponseWriter, r *http.Request, p principal) {
	s.renderMessage(w, r, p, "")
}

func (s *Server) uiConfirm(w http.ResponseWriter, r *http.Request, p principal) {
	action := r.PathValue("action")
	if action != dlq.ActionReplay && action != dlq.ActionDiscard {
		http.NotFound(w, r)
		return
	}
	s.renderMessage(w, r, p, action)
}

func (s *Server) renderMessage(w http.ResponseWriter, r *http.Request, p principal, action string) {
	id := r.PathValue("id")
	m, err := s.opts.DLQ.Show(r.Context(), id)
	switch {
	case errors.Is(err, dlq.ErrNotFound):
		s.renderList(w, r, p, http.StatusNotFound, "", "Message "+id+" is not in the DLQ (any more).")
		return
	case err != nil:
		s.renderList(w, r, p, http.StatusServiceUnavailable, "", "Could not read the DLQ: "+err.Error())
		return
	}
	pg := s.base(p, "Message "+m.ID)
	pg.Message, pg.Action = m, action
	s.render(w, http.StatusOK, "message", pg)
}

func (s *Server) uiAct(w http.ResponseWriter, r *http.Request, p principal) {
	action, id := r.PathValue("action"), r.PathValue("id")
	run := s.opts.DLQ.Replay
	switch action {
	case dlq.ActionReplay:
	case dlq.ActionDiscard:
		run = s.opts.DLQ.Discard
	default:
		http.NotFound(w, r)
		return
	}
	rep, err := run(r.Context(), dlq.Request{Filter: dlq.Filter{IDs: []string{id}}, Max: 1,
		Actor: dlq.Actor{Operator: p.operator, Via: p.via, Client: p.client}})
	if err != nil {
		s.log.Warn("dlq operation from the page failed", zap.String("action", action), zap.String("dlq_id", id), zap.Error(err))
		msg := action + " of " + id + " failed: " + err.Error()
		if len(rep.Items) > 0 && rep.Items[0].Detail != "" {
			msg += " (" + rep.Items[0].Detail + ")"
		}
		s.renderList(w, r, p, http.StatusServiceUnavailable, "", msg)
		return
	}
	outcome := "not_found"
	if len(rep.Items) > 0 {
		outcome = rep.Items[0].Outcome
	}
	// Not "id": that is the list's filter parameter.
	v := url.Values{"done": {action}, "done_id": {id}, "outcome": {outcome}}
	http.Redirect(w, r, "/ui/dlq?"+v.Encode(), http.StatusSeeOther)
}
