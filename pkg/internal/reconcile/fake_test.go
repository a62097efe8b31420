package reconcile_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotent-events/idempotent-events/pkg/internal/event/eventtest"
)

// fakeStripe is an in-process GET /v1/events with Stripe's semantics as far
// as the reconciler uses them: newest first (created, then the order events
// were added), created[gte]/[lte], starting_after, limit, types[],
// delivery_success, has_more; and a 429 on every throttleEvery-th request.
type fakeStripe struct {
	t   testing.TB
	srv *httptest.Server

	mu            sync.Mutex
	events        []fakeEvent // in the order they were created
	requests      []string    // raw query strings
	throttleEvery int
	throttled     int
	// objects are served on /v1/payment_intents/{id} and /v1/charges/{id}.
	objects map[string][]byte
}

type fakeEvent struct {
	id, typ   string
	created   int64
	delivered bool
	body      []byte
}

func newFakeStripe(t testing.TB) *fakeStripe {
	f := &fakeStripe{t: t}
	f.srv = httptest.NewServer(http.HandlerFunc(f.serve))
	t.Cleanup(f.srv.Close)
	return f
}

// add appends an event created at created, as the API renders it
// (indented JSON, as Stripe's API answers), and returns the body.
func (f *fakeStripe) add(id string, created time.Time, delivered bool) []byte {
	var v map[string]any
	require.NoError(f.t, json.Unmarshal(eventtest.Payment(id), &v))
	v["created"] = created.Unix()
	body, err := json.MarshalIndent(v, "", "  ")
	require.NoError(f.t, err)
	f.mu.Lock()
	defer f.mu.Unlock()
	f.events = append(f.events, fakeEvent{id: id, typ: v["type"].(string), created: created.Unix(), delivered: delivered, body: body})
	return body
}

// set changes the fake's behaviour under its lock.
func (f *fakeStripe) set(change func(f *fakeStripe)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	change(f)
}

func (f *fakeStripe) calls() (requests, throttled int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.requests), f.throttled
}

func (f *fakeStripe) serve(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if r.Header.Get("Authorization") != "Bearer rk_test_reconcile" {
		w.WriteHeader(http.StatusUnauthorized)
		_, _ = w.Write([]byte(`{"error":{"type":"invalid_request_error","message":"Invalid API Key provided"}}`))
		return
	}
	if body, ok := f.objects[r.URL.Path]; ok && r.Method == http.MethodGet {
		f.requests = append(f.requests, r.URL.Path)
		_, _ = w.Write(body)
		return
	}
	if r.Method != http.MethodGet || r.URL.Path != "/v1/events" {
		w.WriteHeader(http.StatusNotFound)
		_, _ = w.Write([]byte(`{"error":{"type":"invalid_request_error","message":"No such object"}}`))
		return
	}
	f.requests = append(f.requests, r.URL.RawQuery)
	if f.throttleEvery > 0 && len(f.requests)%f.throttleEvery == 0 {
		f.throttled++
		w.WriteHeader(http.StatusTooManyRequests)
		_, _ = w.Write([]byte(`{"error":{"type":"invalid_request_error","code":"rate_limit","message":"Too many requests hit the API too quickly."}}`))
		return
	}
	q := r.URL.Query()
	num := func(k string, def int64) int64 {
		if s := q.Get(k); s != "" {
			n, err := strconv.ParseInt(s, 10, 64)
			assert.NoError(f.t, err, "%s=%s", k, s)
			return n
		}
		return def
	}
	gte, lte, limit := num("created[gte]", 0), num("created[lte]", 1<<62), num("limit", 10)
	types := q["types[0]"]
	for i := 1; q.Has("types[" + strconv.Itoa(i) + "]"); i++ {
		types = append(types, q.Get("types["+strconv.Itoa(i)+"]"))
	}
	// Newest first: by created, then the later-added first.
	order := make([]int, 0, len(f.events))
	for i := len(f.events) - 1; i >= 0; i-- {
		e := f.events[i]
		if e.created < gte || e.created > lte || (len(types) > 0 && !slices.Contains(types, e.typ)) {
			continue
		}
		if q.Get("delivery_success") == "false" && e.delivered {
			continue
		}
		order = append(order, i)
	}
	slices.SortStableFunc(order, func(a, b int) int { return int(f.events[b].created - f.events[a].created) })
	start := 0
	if after := q.Get("starting_after"); after != "" {
		start = -1
		for k, i := range order {
			if f.events[i].id == after {
				start = k + 1
			}
		}
		if start < 0 {
			w.WriteHeader(http.StatusBadRequest)
			_, _ = w.Write([]byte(`{"error":{"type":"invalid_request_error","message":"No such event"}}`))
			return
		}
	}
	end := min(len(order), start+int(limit))
	data := make([]json.RawMessage, 0, end-start)
	for _, i := range order[start:end] {
		data = append(data, f.events[i].body)
	}
	out, err := json.Marshal(map[string]any{"object": "list", "url": "/v1/events", "has_more": end < len(order), "data": data})
	assert.NoError(f.t, err)
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(out)
}
