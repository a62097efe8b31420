package admin_test

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotent-events/idempotent-events/pkg/internal/broker"
	"github.com/idempotent-events/idempotent-events/pkg/internal/dlq"
	"github.com/idempotent-events/idempotent-events/pkg/internal/pipelinetest"
	"github.com/idempotent-events/idempotent-events/pkg/internal/servicetest"
)

var httpClient = &http.Client{Timeout: time.Minute, Transport: &http.Transport{DisableKeepAlives: true}}

// call sends a request to the admin API with the pipeline's token and
// decodes the JSON answer into out (when not nil).
func call(t *testing.T, p *pipelinetest.Pipeline, method, path, operator string, body any, out any) int {
	t.Helper()
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		require.NoError(t, err)
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, "http://"+p.AdminAddr+path, rd)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+pipelinetest.Token)
	if operator != "" {
		req.Header.Set("X-Operator", operator)
	}
	resp, err := httpClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	if out != nil {
		require.NoError(t, json.Unmarshal(raw, out), "%s %s: %s", method, path, raw)
	}
	return resp.StatusCode
}

// The scenario through the admin API of a worker started with
// app.RunWorker: poisoned events in the DLQ, the cause fixed, replayed by id
// and by filter, each processed exactly once; the replay of a processed
// event is a duplicate; a discard is audited.
func TestAdminAPIReplaysAndDiscardsThroughTheWorker(t *testing.T) {
	t.Parallel()
	p := pipelinetest.New(t)
	p.StartWorker(pipelinetest.Token)

	// Without the token: 401.
	resp, err := httpClient.Get("http://" + p.AdminAddr + "/api/dlq")
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusUnauthorized, resp.StatusCode)

	p.Block("evt_api1", "evt_api2", "evt_api3")
	for _, id := range []string{"evt_api1", "evt_api2", "evt_api3"} {
		p.PublishEvent(id)
	}
	p.Publish("", "", []byte(`{"id":"evt_api_poison","type":"payment_intent.succeeded"}`))
	p.Eventually(func() bool { return p.Depth(broker.DLQ) == 4 }, "three rejected events and one poison in the DLQ")

	var l dlq.Listing
	require.Equal(t, http.StatusOK, call(t, p, http.MethodGet, "/api/dlq", "", nil, &l))
	assert.Equal(t, 4, l.Matched)
	byEvent := map[string]dlq.Message{}
	for _, m := range l.Messages {
		byEvent[m.EventID] = m
	}
	require.Len(t, byEvent, 4)
	assert.Equal(t, broker.ReasonRejectedByDatabase, byEvent["evt_api1"].Reason)
	assert.Equal(t, broker.ReasonInvalidPayload, byEvent["evt_api_poison"].Reason)
	require.Equal(t, http.StatusOK, call(t, p, http.MethodGet, "/api/dlq?reason=rejected_by_database&type=payment_intent.*", "", nil, &l))
	assert.Equal(t, 3, l.Matched)
	assert.Equal(t, http.StatusBadRequest, call(t, p, http.MethodGet, "/api/dlq?older_than=soon", "", nil, nil))

	var shown struct {
		dlq.Message
		Body string `json:"body"`
	}
	require.Equal(t, http.StatusOK, call(t, p, http.MethodGet, "/api/dlq/"+byEvent["evt_api1"].ID, "", nil, &shown))
	assert.Contains(t, shown.Body, `"evt_api1"`)
	assert.Contains(t, shown.Headers, broker.HeaderFirstError)
	assert.Equal(t, http.StatusNotFound, call(t, p, http.MethodGet, "/api/dlq/ffffffffffffffff", "", nil, nil))

	// Dry run first: nothing moves.
	var rep dlq.Report
	require.Equal(t, http.StatusOK, call(t, p, http.MethodPost, "/api/dlq/replay", "bob",
		map[string]any{"reason": "rejected_by_database", "dry_run": true}, &rep))
	assert.True(t, rep.DryRun)
	assert.Equal(t, 3, rep.Count(dlq.OutcomeWouldReplay))
	assert.Equal(t, 4, p.Depth(broker.DLQ))
	assert.Equal(t, http.StatusBadRequest, call(t, p, http.MethodPost, "/api/dlq/replay", "bob", map[string]any{}, nil), "no selection")
	assert.Equal(t, http.StatusBadRequest, call(t, p, http.MethodPost, "/api/dlq/replay", "bob", map[string]any{"everything": true}, nil), "unknown field")

	// Fix the cause, replay one by id and the rest by filter.
	p.Unblock()
	require.Equal(t, http.StatusOK, call(t, p, http.MethodPost, "/api/dlq/"+byEvent["evt_api1"].ID+"/replay", "bob", nil, &rep))
	require.Len(t, rep.Items, 1)
	assert.Equal(t, dlq.OutcomeReplayed, rep.Items[0].Outcome)
	require.Equal(t, http.StatusOK, call(t, p, http.MethodPost, "/api/dlq/replay", "",
		map[string]any{"reason": "rejected_by_database", "max": 10}, &rep))
	assert.Equal(t, 2, rep.Count(dlq.OutcomeReplayed))
	p.Eventually(func() bool { return p.Outcomes("processed") == 3 }, "all three processed")
	for _, id := range []string{"evt_api1", "evt_api2", "evt_api3"} {
		payments, ledger := p.Rows(id)
		assert.Equal(t, 1, payments, id)
		assert.Equal(t, 1, ledger, id)
	}
	assert.Equal(t, http.StatusNotFound, call(t, p, http.MethodPost, "/api/dlq/"+byEvent["evt_api1"].ID+"/replay", "bob", nil, nil),
		"it left the DLQ")

	// A processed event's stale DLQ copy: the replay is a duplicate.
	stale := p.PutInDLQ("evt_api2", "rejected_by_database", p.Event("evt_api2"), time.Now())
	require.Equal(t, http.StatusOK, call(t, p, http.MethodPost, "/api/dlq/"+stale+"/replay", "bob", nil, &rep))
	p.Eventually(func() bool { return p.Outcomes("duplicate") == 1 }, "a duplicate, not a second effect")
	payments, _ := p.Rows("evt_api2")
	assert.Equal(t, 1, payments)

	// Discard the poison; the audit trail says who did what.
	require.Equal(t, http.StatusOK, call(t, p, http.MethodPost, "/api/dlq/discard", "carol",
		map[string]any{"event_id": "evt_api_poison"}, &rep))
	require.Len(t, rep.Items, 1)
	assert.Equal(t, dlq.OutcomeDiscarded, rep.Items[0].Outcome)
	assert.Equal(t, 0, p.Depth(broker.DLQ))

	var audit struct {
		Entries []dlq.AuditEntry `json:"entries"`
	}
	require.Equal(t, http.StatusOK, call(t, p, http.MethodGet, "/api/audit?limit=50", "", nil, &audit))
	byOutcome, byOperator := map[string]int{}, map[string]int{}
	for _, e := range audit.Entries {
		byOutcome[e.Outcome]++
		byOperator[e.Operator]++
		assert.Equal(t, "api", e.Via)
		assert.Equal(t, "127.0.0.1", e.Client)
	}
	assert.Equal(t, map[string]int{"would_replay": 3, "replayed": 4, "discarded": 1}, byOutcome)
	last := audit.Entries[0]
	assert.Equal(t, "carol", last.Operator)
	assert.Equal(t, "discard", last.Action)
	assert.Equal(t, byEvent["evt_api_poison"].ID, last.DLQID)
	assert.Equal(t, map[string]int{"bob": 5, "test-api": 2, "carol": 1}, byOperator, "ADMIN_OPERATOR when no X-Operator is sent")

	assert.Equal(t, http.StatusBadRequest, call(t, p, http.MethodGet, "/api/dlq", "<eve>", nil, nil), "operator names are checked")
	assert.Equal(t, 4.0, servicetest.Metric(p.Reg, "idempotent_events_dlq_operations_total", "action", "replay", "outcome", "replayed"))
	assert.Equal(t, 1.0, servicetest.Metric(p.Reg, "idempotent_events_dlq_operations_total", "action", "discard", "outcome", "discarded"))
	assert.Positive(t, servicetest.Metric(p.Reg, "idempotent_events_admin_requests_total", "route", "POST /api/dlq/replay"))
	p.Invariant()
}
