package receiver_test

import (
	"net/http"
	"strconv"
	"testing"
	"time"

	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotent-events/idempotent-events/pkg/internal/broker"
	"github.com/idempotent-events/idempotent-events/pkg/internal/receiver"
	"github.com/idempotent-events/idempotent-events/pkg/internal/webhook"
)

// A base64 Standard Webhooks secret, as providers hand them out.
const standardSecret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"

func sourcesFixture(t *testing.T) *fixture {
	t.Helper()
	std, err := webhook.NewStandardVerifier([]string{standardSecret}, 5*time.Minute)
	require.NoError(t, err)
	return start(t, setup{dupCheck: true, sources: []receiver.Source{
		{Name: "acme", Route: "/webhooks/acme", Scheme: webhook.SchemeStandard, Verifier: std},
		{Name: "gh", Route: "/webhooks/gh", Scheme: webhook.SchemeGitHub, Verifier: webhook.NewGitHubVerifier([]string{"gh_secret"})},
	}})
}

func standardHeaders(t *testing.T, id string, at time.Time, body []byte, secret string) map[string]string {
	t.Helper()
	wh, err := standardwebhooks.NewWebhook(secret)
	require.NoError(t, err)
	sig, err := wh.Sign(id, at, body)
	require.NoError(t, err)
	return map[string]string{"Content-Type": "application/json", webhook.StandardIDHeader: id,
		webhook.StandardTimestampHeader: strconv.FormatInt(at.Unix(), 10), webhook.StandardSignatureHeader: sig}
}

// Deliveries signed by the Standard Webhooks reference library are
// accepted, keyed by (source, webhook-id), and carry what the worker needs.
func TestStandardWebhooksSignedByTheReferenceLibrary(t *testing.T) {
	t.Parallel()
	f := sourcesFixture(t)
	body := []byte(`{"type":"invoice.paid","timestamp":"2026-12-03T08:00:00Z","data":{"payment_intent":"pi_9","amount_cents":500,"currency":"eur","status":"paid"}}`)
	r := f.postTo(t, "/webhooks/acme", body, standardHeaders(t, "msg_2KWPBgLlAfxdpx2AI54pPJ85f4W", time.Now(), body, standardSecret))
	require.Equal(t, http.StatusAccepted, r.code, "%v", r.body)
	assert.Equal(t, "msg_2KWPBgLlAfxdpx2AI54pPJ85f4W", r.body["event_id"])

	d, ok := f.broker.Get(broker.MainQueue)
	require.True(t, ok)
	assert.Equal(t, "acme:msg_2KWPBgLlAfxdpx2AI54pPJ85f4W", d.MessageId, "the dedupe key is (source, provider id)")
	assert.Equal(t, "acme", d.Headers[broker.HeaderSource])
	assert.Equal(t, webhook.SchemeStandard, d.Headers[broker.HeaderScheme])
	assert.Equal(t, "msg_2KWPBgLlAfxdpx2AI54pPJ85f4W", d.Headers[broker.HeaderEventID])

	// The reference library's own verifier accepts what a provider signs
	// for us the same way: both sides agree on the scheme.
	wh, err := standardwebhooks.NewWebhook(standardSecret)
	require.NoError(t, err)
	h := http.Header{}
	for k, v := range standardHeaders(t, "msg_x", time.Now(), body, standardSecret) {
		h.Set(k, v)
	}
	require.NoError(t, wh.Verify(body, h))
}

func TestGitHubDeliveriesAreVerifiedAndKeyedByDeliveryID(t *testing.T) {
	t.Parallel()
	f := sourcesFixture(t)
	body := []byte(`{"action":"opened","number":1}`)
	hdr := map[string]string{"Content-Type": "application/json", webhook.GitHubSignatureHeader: webhook.SignGitHub("gh_secret", body),
		webhook.GitHubDeliveryHeader: "72d3162e-cc78-11e3-81ab-4c9367dc0958", webhook.GitHubEventHeader: "pull_request"}
	r := f.postTo(t, "/webhooks/gh", body, hdr)
	require.Equal(t, http.StatusAccepted, r.code, "%v", r.body)
	d, ok := f.broker.Get(broker.MainQueue)
	require.True(t, ok)
	assert.Equal(t, "gh:72d3162e-cc78-11e3-81ab-4c9367dc0958", d.MessageId)
	assert.Equal(t, "pull_request", d.Headers[broker.HeaderEventType])

	delete(hdr, webhook.GitHubDeliveryHeader)
	r = f.postTo(t, "/webhooks/gh", body, hdr)
	assert.Equal(t, http.StatusBadRequest, r.code)
	assert.Equal(t, "X-GitHub-Delivery", r.body["field"])
}

// Every bad input to the other schemes gets 401 and publishes nothing.
func TestOtherSchemesRejectBadSignatures(t *testing.T) {
	t.Parallel()
	f := sourcesFixture(t)
	body := []byte(`{"type":"x.y","data":{}}`)
	now := time.Now()
	good := standardHeaders(t, "msg_1", now, body, standardSecret)
	without := func(h map[string]string, k string) map[string]string {
		c := map[string]string{}
		for kk, v := range h {
			if kk != k {
				c[kk] = v
			}
		}
		return c
	}
	with := func(h map[string]string, k, v string) map[string]string {
		c := without(h, k)
		c[k] = v
		return c
	}
	ghBody := []byte(`{"zen":"hi"}`)
	gh := map[string]string{"Content-Type": "application/json", webhook.GitHubSignatureHeader: webhook.SignGitHub("gh_secret", ghBody),
		webhook.GitHubDeliveryHeader: "d-1", webhook.GitHubEventHeader: "ping"}
	cases := []struct {
		name, route string
		body        []byte
		header      map[string]string
		reason      string
	}{
		{"standard: no webhook-signature", "/webhooks/acme", body, without(good, webhook.StandardSignatureHeader), "missing_signature"},
		{"standard: no webhook-id", "/webhooks/acme", body, without(good, webhook.StandardIDHeader), "missing_signature"},
		{"standard: bad timestamp", "/webhooks/acme", body, with(good, webhook.StandardTimestampHeader, "yesterday"), "malformed_signature"},
		{"standard: garbage signature", "/webhooks/acme", body, with(good, webhook.StandardSignatureHeader, "v1,!!!"), "malformed_signature"},
		{"standard: wrong secret", "/webhooks/acme", body, standardHeaders(t, "msg_1", now, body, "whsec_QUJDREVGR0hJSktMTU5PUA=="), "signature_mismatch"},
		{"standard: id swapped", "/webhooks/acme", body, with(good, webhook.StandardIDHeader, "msg_2"), "signature_mismatch"},
		{"standard: replayed old", "/webhooks/acme", body, standardHeaders(t, "msg_1", now.Add(-time.Hour), body, standardSecret), "timestamp_too_old"},
		{"standard: future", "/webhooks/acme", body, standardHeaders(t, "msg_1", now.Add(time.Hour), body, standardSecret), "timestamp_in_future"},
		{"github: no signature", "/webhooks/gh", ghBody, without(gh, webhook.GitHubSignatureHeader), "missing_signature"},
		{"github: sha1 only", "/webhooks/gh", ghBody, with(gh, webhook.GitHubSignatureHeader, "sha1=abcd"), "malformed_signature"},
		{"github: wrong secret", "/webhooks/gh", ghBody, with(gh, webhook.GitHubSignatureHeader, webhook.SignGitHub("other", ghBody)), "signature_mismatch"},
		{"github: tampered body", "/webhooks/gh", []byte(`{"zen":"ho"}`), gh, "signature_mismatch"},
	}
	for _, c := range cases {
		r := f.postTo(t, c.route, c.body, c.header)
		assert.Equal(t, http.StatusUnauthorized, r.code, c.name)
		assert.Equal(t, c.reason, r.body["error"], c.name)
	}
	assert.Equal(t, 0, f.broker.Depth(broker.MainQueue), "nothing published")
}
