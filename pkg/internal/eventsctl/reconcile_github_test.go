package eventsctl_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotent-events/idempotent-events/pkg/internal/eventsctl"
	"github.com/idempotent-events/idempotent-events/pkg/internal/servicetest"
)

// eventsctl reconcile for a GitHub source, on the command line: a
// repository hook's deliveries on two pages linked by a Link header; of
// the events in the window one is in the ledger, one was answered 200 and
// is not yet, one only failed, and is the one redelivered.
func TestReconcileGitHubCommand(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := servicetest.Schema(t)
	db, err := pgxpool.New(ctx, dbURL)
	require.NoError(t, err)
	defer db.Close()
	_, err = db.Exec(ctx, `INSERT INTO processed_events (event_id, source, event_type, payload_sha256) VALUES ('gh:guid-there', 'gh', 'push', '\x00')`)
	require.NoError(t, err)

	at := func(h int) string { return time.Now().Add(-time.Duration(h) * time.Hour).UTC().Format(time.RFC3339) }
	pages := [][]map[string]any{{
		{"id": 14, "guid": "guid-coming", "delivered_at": at(1), "redelivery": false, "status": "OK", "status_code": 200, "event": "push", "action": nil},
		{"id": 13, "guid": "guid-gone", "delivered_at": at(2), "redelivery": false, "status": "Invalid HTTP Response: 503", "status_code": 503, "event": "push", "action": nil},
	}, {
		{"id": 12, "guid": "guid-there", "delivered_at": at(3), "redelivery": false, "status": "Invalid HTTP Response: 500", "status_code": 500, "event": "issues", "action": "opened"},
		{"id": 11, "guid": "guid-old", "delivered_at": at(30), "redelivery": false, "status": "timed out", "status_code": 0, "event": "push", "action": nil},
	}}
	var mu sync.Mutex
	var requests []string
	refuse := map[string]int{}
	gh := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		if r.Header.Get("Authorization") != "Bearer ghp_cmd" {
			w.WriteHeader(http.StatusUnauthorized)
			_, _ = w.Write([]byte(`{"message":"Bad credentials"}`))
			return
		}
		requests = append(requests, r.Method+" "+r.URL.RequestURI())
		if r.Method == http.MethodPost {
			if code, ok := refuse[r.URL.Path]; ok {
				w.WriteHeader(code)
				_, _ = w.Write([]byte(`{"message":"Validation Failed"}`))
				return
			}
			w.WriteHeader(http.StatusAccepted)
			_, _ = w.Write([]byte(`{}`))
			return
		}
		page := 0
		if r.URL.Query().Get("cursor") == "v1_13" {
			page = 1
		} else {
			w.Header().Set("Link", fmt.Sprintf(`<http://%s%s?per_page=100&cursor=v1_13>; rel="next"`, r.Host, r.URL.Path))
		}
		out, _ := json.Marshal(pages[page])
		_, _ = w.Write(out)
	}))
	defer gh.Close()
	taken := func() []string {
		mu.Lock()
		defer mu.Unlock()
		out := requests
		requests = nil
		return out
	}

	env := map[string]string{"DATABASE_URL": dbURL, "GITHUB_API_URL": gh.URL, "GITHUB_TOKEN": "ghp_cmd", "LOG_LEVEL": "error"}
	run := func(args ...string) (int, string, string) {
		var stdout, stderr bytes.Buffer
		code := eventsctl.Main(ctx, append([]string{"reconcile"}, args...), func(k string) string { return env[k] }, strings.NewReader(""), &stdout, &stderr)
		return code, stdout.String(), stderr.String()
	}
	hook := []string{"-source", "gh", "-repo", "acme/shop", "-hook-id", "42", "-since", "24h", "-rate", "100"}

	code, out, errOut := run(append(hook, "-dry-run")...)
	require.Equal(t, 0, code, errOut)
	assert.Contains(t, out, "listed 4 deliveries in 2 pages (1 before the window): 3 events")
	assert.Contains(t, out, "1 in the ledger, 1 succeeded but not yet in the ledger, 1 failed")
	assert.Contains(t, out, "would redeliver guid-gone")
	assert.Equal(t, []string{"GET /repos/acme/shop/hooks/42/deliveries?per_page=100", "GET /repos/acme/shop/hooks/42/deliveries?cursor=v1_13&per_page=100"}, taken())

	code, out, errOut = run(append(hook, "-json")...)
	require.Equal(t, 0, code, errOut)
	var rep struct {
		RunID       int64    `json:"run_id"`
		Present     int      `json:"in_ledger"`
		Accepted    []string `json:"succeeded_not_in_ledger_guids"`
		Redelivered int      `json:"redelivered"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &rep))
	assert.Positive(t, rep.RunID)
	assert.Equal(t, 1, rep.Present)
	assert.Equal(t, []string{"guid-coming"}, rep.Accepted)
	assert.Equal(t, 1, rep.Redelivered)
	assert.Contains(t, taken(), "POST /repos/acme/shop/hooks/42/deliveries/13/attempts")

	// An organization hook, whose redelivery GitHub refuses: reported,
	// and the exit status says so.
	refuse["/orgs/acme/hooks/7/deliveries/13/attempts"] = http.StatusUnprocessableEntity
	code, out, errOut = run("-source", "gh", "-provider", "github", "-org", "acme", "-hook-id", "7", "-since", "24h", "-rate", "100")
	assert.Equal(t, 1, code, errOut)
	assert.Contains(t, out, "refused guid-gone (delivery 13)")
	assert.Contains(t, errOut, "GitHub refused 1 of 1 redeliveries")
	assert.Contains(t, taken(), "POST /orgs/acme/hooks/7/deliveries/13/attempts")

	env["GITHUB_TOKEN"] = "ghp_wrong"
	code, _, errOut = run(hook...)
	assert.Equal(t, 1, code, "a refused token fails the run: %s", errOut)
	assert.Contains(t, errOut, "Bad credentials")

	for _, bad := range []struct {
		args []string
		want string
	}{
		{[]string{"-repo", "acme/shop", "-hook-id", "42"}, "-source"},
		{[]string{"-source", "gh", "-provider", "github", "-hook-id", "42"}, "-repo"},
		{[]string{"-source", "gh", "-repo", "acme/shop", "-org", "acme", "-hook-id", "42"}, "-repo"},
		{[]string{"-source", "gh", "-repo", "acme/shop"}, "-hook-id"},
		{[]string{"-source", "gh", "-repo", "acme/shop", "-hook-id", "42", "-since", "96h"}, "72h"},
		{[]string{"-source", "gh", "-repo", "acme/shop", "-hook-id", "42", "-types", "push"}, "-types does not apply"},
		{[]string{"-hook-id", "42"}, "-hook-id does not apply to -provider stripe"},
		{[]string{"-source", "gh", "-repo", "acme", "-hook-id", "42"}, "owner/name"},
		{[]string{"-provider", "gitlab"}, "-provider"},
	} {
		code, _, errOut := run(bad.args...)
		assert.Equal(t, 2, code, "%v: %s", bad.args, errOut)
		assert.Contains(t, errOut, bad.want, "%v", bad.args)
	}
	delete(env, "GITHUB_TOKEN")
	code, _, errOut = run(hook...)
	assert.Equal(t, 2, code)
	assert.Contains(t, errOut, "GITHUB_TOKEN")
	assert.Empty(t, taken(), "no request without a token")

	var stdout, stderr bytes.Buffer
	require.Equal(t, 0, eventsctl.Main(ctx, []string{"reconcile", "-h"}, func(string) string { return "" }, strings.NewReader(""), &stdout, &stderr))
	assert.Contains(t, stderr.String(), "GITHUB_TOKEN")
	assert.Contains(t, stderr.String(), "-hook-id")
}
