package harness

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
)

// StripeEvents is an in-process Stripe API that serves GET /v1/events over
// the events added to it: the provider's own record of events, for the
// chaos suite's reconcile scenario, which runs the real eventsctl
// reconcile against it.
//
// It follows Stripe's list semantics as far as the reconciler uses them:
// newest first (by created, then the later-created first within a second),
// created[gte|gt|lte|lt], limit (10 by default, at most 100),
// starting_after (the page after that event, in the full order),
// types[N] (at most 20), delivery_success, has_more; a Bearer key. A
// parameter it does not know is refused with a 400, as Stripe refuses
// one, so a reconciler that starts asking for more than this serves fails
// loudly instead of reading a wrong answer.
type StripeEvents struct {
	key string
	srv *httptest.Server

	mu       sync.Mutex
	events   []stripeEvent // in the order they were added
	order    []int         // newest first, rebuilt after an Add
	pos      map[string]int
	requests int
}

type stripeEvent struct {
	id, typ   string
	created   int64
	delivered bool
	body      []byte
}

// NewStripeEvents starts the API; requests must carry key as their Bearer
// token.
func NewStripeEvents(key string) *StripeEvents {
	s := &StripeEvents{key: key, pos: map[string]int{}}
	s.srv = httptest.NewServer(http.HandlerFunc(s.serve))
	return s
}

// URL is the API's address, for STRIPE_API_URL.
func (s *StripeEvents) URL() string { return s.srv.URL }

// Close stops the server and waits for the requests in flight.
func (s *StripeEvents) Close() { s.srv.Close() }

// Add records a Stripe event (its JSON, with id, type and created), as
// Stripe records an event when it creates it, before any delivery. Of two
// events created in the same second, the one added later was created
// later.
func (s *StripeEvents) Add(body []byte) error {
	var head struct {
		ID      string `json:"id"`
		Type    string `json:"type"`
		Created int64  `json:"created"`
	}
	if err := json.Unmarshal(body, &head); err != nil {
		return fmt.Errorf("stripe events: add: %w", err)
	}
	if head.ID == "" || head.Type == "" || head.Created == 0 {
		return fmt.Errorf("stripe events: add: an event needs an id, a type and a created time: %.80s", body)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, dup := s.pos[head.ID]; dup {
		return fmt.Errorf("stripe events: add: %s twice", head.ID)
	}
	s.pos[head.ID] = -1
	s.events = append(s.events, stripeEvent{id: head.ID, typ: head.Type, created: head.Created, body: body})
	s.order = nil
	return nil
}

// Delivered marks the event as delivered to every endpoint (what
// delivery_success filters on).
func (s *StripeEvents) Delivered(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if i, ok := s.index(id); ok {
		s.events[i].delivered = true
	}
}

// Requests is how many requests the API answered, refused ones included.
func (s *StripeEvents) Requests() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.requests
}

// index returns the event's index in s.events.
func (s *StripeEvents) index(id string) (int, bool) {
	s.sort()
	p, ok := s.pos[id]
	if !ok {
		return 0, false
	}
	return s.order[p], true
}

// sort builds the newest-first order and each event's position in it.
func (s *StripeEvents) sort() {
	if s.order != nil {
		return
	}
	s.order = make([]int, len(s.events))
	for i := range s.order {
		s.order[i] = len(s.events) - 1 - i
	}
	sort.SliceStable(s.order, func(a, b int) bool { return s.events[s.order[a]].created > s.events[s.order[b]].created })
	for p, i := range s.order {
		s.pos[s.events[i].id] = p
	}
}

// listParams are the parameters GET /v1/events takes here.
var listParams = map[string]bool{"created[gte]": true, "created[gt]": true, "created[lte]": true, "created[lt]": true,
	"limit": true, "starting_after": true, "delivery_success": true}

func (s *StripeEvents) serve(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.requests++
	if r.Header.Get("Authorization") != "Bearer "+s.key {
		stripeError(w, http.StatusUnauthorized, "", "Invalid API Key provided")
		return
	}
	if r.Method != http.MethodGet || r.URL.Path != "/v1/events" {
		stripeError(w, http.StatusNotFound, "", "Unrecognized request URL ("+r.Method+": "+r.URL.Path+")")
		return
	}
	q := r.URL.Query()
	from, to := int64(0), int64(1<<62)
	limit := 10
	var types []string
	for k, v := range q {
		switch {
		case strings.HasPrefix(k, "types[") && strings.HasSuffix(k, "]"):
			types = append(types, v...)
			continue
		case !listParams[k]:
			stripeError(w, http.StatusBadRequest, k, "Received unknown parameter: "+k)
			return
		case k == "starting_after" || k == "delivery_success":
			continue
		}
		n, err := strconv.ParseInt(v[0], 10, 64)
		if err != nil {
			stripeError(w, http.StatusBadRequest, k, "Invalid integer: "+v[0])
			return
		}
		switch k {
		case "created[gte]":
			from = max(from, n)
		case "created[gt]":
			from = max(from, n+1)
		case "created[lte]":
			to = min(to, n)
		case "created[lt]":
			to = min(to, n-1)
		case "limit":
			if n < 1 || n > 100 {
				stripeError(w, http.StatusBadRequest, k, "This value must be greater than or equal to 1 and less than or equal to 100.")
				return
			}
			limit = int(n)
		}
	}
	if len(types) > 20 {
		stripeError(w, http.StatusBadRequest, "types", "An array of at most 20 event types may be given.")
		return
	}
	var delivered *bool
	if v := q.Get("delivery_success"); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			stripeError(w, http.StatusBadRequest, "delivery_success", "Invalid boolean: "+v)
			return
		}
		delivered = &b
	}
	s.sort()
	// The newest-first order is by created: the window starts at the
	// first event created at or before to.
	start := sort.Search(len(s.order), func(p int) bool { return s.events[s.order[p]].created <= to })
	if after := q.Get("starting_after"); after != "" {
		p, ok := s.pos[after]
		if !ok {
			stripeError(w, http.StatusBadRequest, "starting_after", "No such event: '"+after+"'")
			return
		}
		start = max(start, p+1)
	}
	data := make([]json.RawMessage, 0, limit)
	more := false
	for p := start; p < len(s.order); p++ {
		e := s.events[s.order[p]]
		if e.created < from {
			break
		}
		if (len(types) > 0 && !slices.Contains(types, e.typ)) || (delivered != nil && e.delivered != *delivered) {
			continue
		}
		if len(data) == limit {
			more = true
			break
		}
		data = append(data, e.body)
	}
	// Indented, as Stripe's API answers: the listed copy of an event
	// differs in bytes from its webhook's, as Stripe's can
	// (event.AnyDigest).
	out, err := json.MarshalIndent(map[string]any{"object": "list", "url": "/v1/events", "has_more": more, "data": data}, "", "  ")
	if err != nil {
		stripeError(w, http.StatusInternalServerError, "", err.Error())
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(out)
}

func stripeError(w http.ResponseWriter, code int, param, msg string) {
	body, _ := json.Marshal(map[string]any{"error": map[string]any{"type": "invalid_request_error", "param": param, "message": msg}})
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_, _ = w.Write(body)
}
