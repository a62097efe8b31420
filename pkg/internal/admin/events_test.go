package admin_test

import (
	"io"
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotent-events/idempotent-events/pkg/internal/broker"
	"github.com/idempotent-events/idempotent-events/pkg/internal/lookup"
	"github.com/idempotent-events/idempotent-events/pkg/internal/pipelinetest"
)

// The admin API and page answer "where is event X?" as eventsctl events
// show does: a committed event, one in the DLQ, one nowhere (404), a
// PaymentIntent's events; the page behind the same authentication.
func TestAdminEventLookup(t *testing.T) {
	t.Parallel()
	p := pipelinetest.New(t)
	p.StartWorker(pipelinetest.Token)
	p.Block("evt_adm_dlq")
	p.PublishEvent("evt_adm_ok")
	p.PublishEvent("evt_adm_dlq")
	p.Eventually(func() bool { return p.Depth(broker.DLQ) == 1 && p.Outcomes("processed") == 1 }, "one committed, one in the DLQ")

	var rep lookup.Event
	require.Equal(t, http.StatusOK, call(t, p, "GET", "/api/events/evt_adm_ok", "", nil, &rep))
	require.NotNil(t, rep.Ledger)
	assert.Equal(t, "applied", rep.Ledger.Outcome)
	require.Len(t, rep.Payment, 1)
	assert.Equal(t, "pi_adm_ok", rep.Payment[0].ObjectID)

	rep = lookup.Event{}
	require.Equal(t, http.StatusOK, call(t, p, "GET", "/api/events/evt_adm_dlq", "", nil, &rep))
	assert.Nil(t, rep.Ledger)
	require.NotNil(t, rep.Queues)
	require.Len(t, rep.Queues.Hits, 1)
	assert.Equal(t, broker.DLQ, rep.Queues.Hits[0].Queue)
	assert.Equal(t, "rejected_by_database", rep.Queues.Hits[0].Reason)
	assert.Len(t, rep.Queues.Scanned, 2, "events.dlq and the pipeline's retry tier")

	assert.Equal(t, http.StatusNotFound, call(t, p, "GET", "/api/events/evt_adm_nobody", "", nil, nil))
	var o lookup.Object
	require.Equal(t, http.StatusOK, call(t, p, "GET", "/api/objects/pi_adm_ok", "", nil, &o))
	assert.Equal(t, "succeeded", o.Status)
	assert.Equal(t, []string{"evt_adm_ok"}, o.EventIDs)
	assert.Equal(t, http.StatusNotFound, call(t, p, "GET", "/api/objects/pi_nobody", "", nil, nil))

	page := func(auth bool, query string) (int, string) {
		req, err := http.NewRequest("GET", "http://"+p.AdminAddr+"/ui/events"+query, nil)
		require.NoError(t, err)
		if auth {
			req.Header.Set("Authorization", "Bearer "+pipelinetest.Token)
		}
		resp, err := httpClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return resp.StatusCode, string(b)
	}
	code, body := page(true, "?id=evt_adm_ok")
	require.Equal(t, http.StatusOK, code, body)
	assert.Contains(t, body, "outcome <b>applied</b>")
	assert.Contains(t, body, `href="/ui/events?id=pi_adm_ok"`)
	code, body = page(true, "?id=evt_adm_dlq")
	require.Equal(t, http.StatusOK, code, body)
	assert.Contains(t, body, `id="not-committed"`)
	assert.Contains(t, body, "In events.dlq")
	code, body = page(true, "?id=pi_adm_ok")
	require.Equal(t, http.StatusOK, code, body)
	assert.Contains(t, body, `id="object-events"`)
	code, _ = page(true, "?id=evt_adm_nobody")
	assert.Equal(t, http.StatusNotFound, code)
	code, _ = page(false, "?id=evt_adm_ok")
	assert.NotEqual(t, http.StatusOK, code, "the page needs a sign-in")
}
