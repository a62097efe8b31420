package reconcile_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/idempotent-events/idempotent-events/pkg/internal/reconcile"
)

const (
	fakeGitHubToken = "github_pat_test_reconcile"
	fakeHookPath    = "/repos/acme/shop/hooks/42"
)

// fakeGitHub is an in-process GitHub REST API for one repository hook, as
// far as the reconciler uses it: GET .../deliveries newest first with
// per_page and an opaque cursor carried by Link headers (rel="prev" before
// rel="next", as GitHub writes them), and POST .../deliveries/{id}/attempts
// answering 202 and adding the redelivery as a new attempt of the same
// guid. A primary rate limit (403, x-ratelimit-remaining: 0 and a reset
// time) or a 429 with retry-after can be set off on the n-th request; it
// lasts limitFor, during which every request is refused the same way.
type fakeGitHub struct {
	t   testing.TB
	srv *httptest.Server

	mu         sync.Mutex
	deliveries []reconcile.Delivery
	nextID     int64
	requests   int
	lists      int
	// redelivered holds the delivery ids POSTed to .../attempts, in order.
	redelivered []int64
	// refuse answers a redelivery of the delivery id with the status.
	refuse map[int64]int
	// redeliveryStatus is the status_code of the attempts redeliveries add.
	redeliveryStatus int

	limitOn      int
	limitFor     time.Duration
	limit429     bool
	limitedUntil time.Time
	throttled    int

	// onRedeliver runs, outside the lock, for each accepted redelivery:
	// what the receiver and the worker would do with GitHub's new attempt.
	onRedeliver func(guid string)
}

func newFakeGitHub(t testing.TB) *fakeGitHub {
	f := &fakeGitHub{t: t, nextID: 1000, refuse: map[int64]int{}, redeliveryStatus: 200}
	f.srv = httptest.NewServer(http.HandlerFunc(f.serve))
	t.Cleanup(f.srv.Close)
	return f
}

// add records an attempt of guid at at, answered code (0: no answer), and
// returns its id. Ids grow with each attempt added, as GitHub's do.
func (f *fakeGitHub) add(guid string, at time.Time, code int, redelivery bool) int64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.addLocked(guid, at, code, redelivery)
}

func (f *fakeGitHub) addLocked(guid string, at time.Time, code int, redelivery bool) int64 {
	f.nextID++
	status := "OK"
	switch {
	case code == 0:
		status = "timed out"
	case code >= 300:
		status = "Invalid HTTP Response: " + strconv.Itoa(code)
	}
	f.deliveries = append(f.deliveries, reconcile.Delivery{ID: f.nextID, GUID: guid, DeliveredAt: at.UTC().Truncate(time.Second),
		Redelivery: redelivery, Status: status, StatusCode: code, Event: "push"})
	return f.nextID
}

func (f *fakeGitHub) calls() (requests, lists int, redelivered []int64, throttled int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.requests, f.lists, slices.Clone(f.redelivered), f.throttled
}

func (f *fakeGitHub) answer(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.WriteHeader(status)
	assert.NoError(f.t, json.NewEncoder(w).Encode(v))
}

func (f *fakeGitHub) serve(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	var guid string
	defer func() {
		f.mu.Unlock()
		if guid != "" && f.onRedeliver != nil {
			f.onRedeliver(guid)
		}
	}()
	if r.Header.Get("Authorization") != "Bearer "+fakeGitHubToken {
		f.answer(w, http.StatusUnauthorized, map[string]string{"message": "Bad credentials"})
		return
	}
	assert.Equal(f.t, "application/vnd.github+json", r.Header.Get("Accept"))
	assert.NotEmpty(f.t, r.Header.Get("User-Agent"), "GitHub refuses requests without a User-Agent")
	f.requests++
	now := time.Now()
	if f.limitOn > 0 && f.requests == f.limitOn {
		f.limitedUntil = now.Add(f.limitFor)
	}
	if now.Before(f.limitedUntil) {
		f.throttled++
		if f.limit429 {
			w.Header().Set("Retry-After", strconv.Itoa(int(time.Until(f.limitedUntil).Seconds())+1))
			f.answer(w, http.StatusTooManyRequests, map[string]string{"message": "You have exceeded a secondary rate limit."})
			return
		}
		reset := f.limitedUntil.Unix()
		if time.Unix(reset, 0).Before(f.limitedUntil) {
			reset++
		}
		w.Header().Set("X-RateLimit-Limit", "5000")
		w.Header().Set("X-RateLimit-Remaining", "0")
		w.Header().Set("X-RateLimit-Reset", strconv.FormatInt(reset, 10))
		f.answer(w, http.StatusForbidden, map[string]string{"message": "API rate limit exceeded for user ID 1."})
		return
	}
	rest, ok := strings.CutPrefix(r.URL.Path, fakeHookPath+"/deliveries")
	switch {
	case ok && rest == "" && r.Method == http.MethodGet:
		f.list(w, r)
	case ok && r.Method == http.MethodPost && strings.HasSuffix(rest, "/attempts"):
		guid = f.redeliver(w, strings.TrimSuffix(strings.TrimPrefix(rest, "/"), "/attempts"))
	default:
		f.answer(w, http.StatusNotFound, map[string]string{"message": "Not Found"})
	}
}

// list serves a page, newest first (by delivered_at, then id).
func (f *fakeGitHub) list(w http.ResponseWriter, r *http.Request) {
	f.lists++
	all := slices.Clone(f.deliveries)
	slices.SortFunc(all, func(a, b reconcile.Delivery) int {
		if c := b.DeliveredAt.Compare(a.DeliveredAt); c != 0 {
			return c
		}
		return int(b.ID - a.ID)
	})
	perPage := 30
	if s := r.URL.Query().Get("per_page"); s != "" {
		n, err := strconv.Atoi(s)
		assert.NoError(f.t, err)
		perPage = min(n, 100)
	}
	start := 0
	cursor := r.URL.Query().Get("cursor")
	if cursor != "" {
		id, err := strconv.ParseInt(strings.TrimPrefix(cursor, "v1_"), 10, 64)
		i := slices.IndexFunc(all, func(d reconcile.Delivery) bool { return d.ID == id })
		if err != nil || i < 0 {
			f.answer(w, http.StatusBadRequest, map[string]string{"message": "bad cursor"})
			return
		}
		start = i + 1
	}
	end := min(len(all), start+perPage)
	page := all[start:end]
	link := func(cursor, rel string) string {
		return fmt.Sprintf(`<%s%s/deliveries?per_page=%d&cursor=%s>; rel="%s"`, f.srv.URL, fakeHookPath, perPage, cursor, rel)
	}
	var links []string
	if start > 0 {
		links = append(links, link(fmt.Sprintf("v1_%d", all[start-1].ID), "prev"))
	}
	if end < len(all) {
		links = append(links, link(fmt.Sprintf("v1_%d", page[len(page)-1].ID), "next"))
	}
	if len(links) > 0 {
		w.Header().Set("Link", strings.Join(links, ", "))
	}
	out := make([]map[string]any, 0, len(page))
	for _, d := range page {
		out = append(out, map[string]any{"id": d.ID, "guid": d.GUID, "delivered_at": d.DeliveredAt.Format(time.RFC3339),
			"redelivery": d.Redelivery, "duration": 0.27, "status": d.Status, "status_code": d.StatusCode, "event": d.Event,
			"action": nil, "installation_id": nil, "repository_id": 7, "throttled_at": nil})
	}
	f.answer(w, http.StatusOK, out)
}

// redeliver answers a POST .../attempts and returns the guid redelivered.
func (f *fakeGitHub) redeliver(w http.ResponseWriter, idText string) string {
	id, err := strconv.ParseInt(idText, 10, 64)
	i := slices.IndexFunc(f.deliveries, func(d reconcile.Delivery) bool { return d.ID == id })
	if err != nil || i < 0 {
		f.answer(w, http.StatusNotFound, map[string]string{"message": "Not Found"})
		return ""
	}
	if status, ok := f.refuse[id]; ok {
		f.answer(w, status, map[string]string{"message": http.StatusText(status)})
		return ""
	}
	f.redelivered = append(f.redelivered, id)
	guid := f.deliveries[i].GUID
	f.addLocked(guid, time.Now(), f.redeliveryStatus, true)
	f.answer(w, http.StatusAccepted, map[string]any{})
	return guid
}

// newRecordingServer answers every GET with no deliveries and every POST
// with 202, appending "METHOD path?query" to paths; it returns its URL.
func newRecordingServer(t testing.TB, paths *[]string) string {
	var mu sync.Mutex
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		*paths = append(*paths, r.Method+" "+r.URL.RequestURI())
		mu.Unlock()
		if r.Method == http.MethodPost {
			w.WriteHeader(http.StatusAccepted)
			return
		}
		_, _ = w.Write([]byte("[]"))
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}
