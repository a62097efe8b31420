package paypal_test

import (
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotent-events/idempotent-events/pkg/internal/provider"
	"github.com/idempotent-events/idempotent-events/pkg/internal/provider/paypal"
	"github.com/idempotent-events/idempotent-events/pkg/internal/provider/paypal/paypaltest"
	"github.com/idempotent-events/idempotent-events/pkg/internal/provider/providertest"
	"github.com/idempotent-events/idempotent-events/pkg/internal/webhook"
)

// Webhook ids, as PayPal's dashboard shows them.
var webhookIDs = [3]string{"8PT597110X687430LKGECATA", "1JE4291016473214C", "4UC0000000000000WRONG"}

// body is a PayPal capture event, as PayPal sends PAYMENT.CAPTURE.COMPLETED.
func body(n int) ([]byte, string) {
	id := fmt.Sprintf("WH-58D329510W468432D-%dE3728395G", n)
	return []byte(fmt.Sprintf(`{"id":%q,"event_version":"1.0","create_time":"2026-12-07T10:00:0%dZ",`+
		`"resource_type":"capture","resource_version":"2.0","event_type":"PAYMENT.CAPTURE.COMPLETED",`+
		`"summary":"Payment completed for $ 10.0 USD","resource":{"id":"42311647XV020574X","status":"COMPLETED",`+
		`"amount":{"currency_code":"USD","value":"10.%02d"},"create_time":"2026-12-07T09:59:58Z",`+
		`"update_time":"2026-12-07T09:59:59.123Z"},"links":[]}`, id, n%10, n%100)), id
}

func newProvider(t testing.TB, s *paypaltest.CertServer, ids []string, now func() time.Time) *paypal.Provider {
	t.Helper()
	p, err := paypal.New(paypal.Options{WebhookIDs: ids, Tolerance: 5 * time.Minute, CertHosts: []string{s.Host}, Roots: s.Roots, Now: now})
	require.NoError(t, err)
	return p
}

func sign(t testing.TB, s paypal.Signer, webhookID string, at time.Time, b []byte) http.Header {
	t.Helper()
	h, err := s.Sign(webhookID, "b9a7c6e0-94d1-11f0-8e6b-"+fmt.Sprintf("%012d", at.UnixNano()%1e12), at, b)
	require.NoError(t, err)
	return h
}

// The conformance suite, against a loopback certificate host whose CA is
// made for the test (see paypaltest for what that proves and what not).
func TestConformance(t *testing.T) {
	t.Parallel()
	srv := paypaltest.NewCertServer(t)
	providertest.Run(t, providertest.Fixture{
		New:     func(t testing.TB, ids []string) provider.Provider { return newProvider(t, srv, ids, nil) },
		Secrets: webhookIDs,
		Event:   body,
		Sign: func(t testing.TB, webhookID string, at time.Time, _ string, b []byte) http.Header {
			return sign(t, srv.Signer, webhookID, at, b)
		},
		Tolerance: 5 * time.Minute,
		SignedHeaders: []string{paypal.TransmissionIDHeader, paypal.TransmissionTimeHeader, paypal.TransmissionSigHeader,
			paypal.CertURLHeader, paypal.AuthAlgoHeader},
	})
}

// What the certificate must be, each refusal its own case: only the
// served certificate changes, so each is refused for its own reason.
func TestOnlyAnAllowListedPayPalCertificateThatVerifiesIsTrusted(t *testing.T) {
	t.Parallel()
	srv := paypaltest.NewCertServer(t)
	other := paypaltest.NewCertServer(t) // another host, with a CA of its own
	b, _ := body(1)
	now := time.Now()
	for _, c := range []struct {
		name   string
		signer func(t *testing.T) paypal.Signer
		reason webhook.Reason
	}{
		{"genuine", func(*testing.T) paypal.Signer { return srv.Signer }, ""},
		{"host not allow-listed", func(*testing.T) paypal.Signer { return other.Signer }, webhook.ReasonUntrusted},
		{"plain http", func(*testing.T) paypal.Signer {
			return paypal.Signer{Key: srv.Signer.Key, CertURL: "http://" + srv.Host + paypaltest.CertPath}
		}, webhook.ReasonUntrusted},
		{"user info in the URL", func(*testing.T) paypal.Signer {
			return paypal.Signer{Key: srv.Signer.Key, CertURL: "https://x@" + srv.Host + paypaltest.CertPath}
		}, webhook.ReasonUntrusted},
		{"chain to another CA", func(t *testing.T) paypal.Signer {
			return srv.Issue(t, "/v1/notifications/certs/untrusted", paypaltest.Cert{Untrusted: true})
		}, webhook.ReasonUntrusted},
		{"not PayPal's subject", func(t *testing.T) paypal.Signer {
			return srv.Issue(t, "/v1/notifications/certs/other-cn", paypaltest.Cert{CommonName: "api.example.com"})
		}, webhook.ReasonUntrusted},
		{"PayPal's prefix on another domain", func(t *testing.T) paypal.Signer {
			return srv.Issue(t, "/v1/notifications/certs/other-domain", paypaltest.Cert{CommonName: "messageverificationcerts.example.com"})
		}, webhook.ReasonUntrusted},
		{"expired", func(t *testing.T) paypal.Signer {
			return srv.Issue(t, "/v1/notifications/certs/expired", paypaltest.Cert{Expired: true})
		}, webhook.ReasonUntrusted},
		{"1024-bit key", func(t *testing.T) paypal.Signer {
			return srv.Issue(t, "/v1/notifications/certs/small", paypaltest.Cert{KeyBits: 1024})
		}, webhook.ReasonUntrusted},
		{"no certificate there (404)", func(*testing.T) paypal.Signer {
			return paypal.Signer{Key: srv.Signer.Key, CertURL: srv.URL("/v1/notifications/certs/none")}
		}, webhook.ReasonUntrusted},
		{"not PEM", func(*testing.T) paypal.Signer {
			srv.Answer("/v1/notifications/certs/html", http.StatusOK, []byte("<html>hello</html>"))
			return paypal.Signer{Key: srv.Signer.Key, CertURL: srv.URL("/v1/notifications/certs/html")}
		}, webhook.ReasonUntrusted},
		{"a redirect, even to the genuine certificate", func(*testing.T) paypal.Signer {
			srv.Redirect("/v1/notifications/certs/moved", srv.URL(paypaltest.CertPath))
			return paypal.Signer{Key: srv.Signer.Key, CertURL: srv.URL("/v1/notifications/certs/moved")}
		}, webhook.ReasonUntrusted},
		{"host down (503)", func(*testing.T) paypal.Signer {
			srv.Answer("/v1/notifications/certs/down", http.StatusServiceUnavailable, nil)
			return paypal.Signer{Key: srv.Signer.Key, CertURL: srv.URL("/v1/notifications/certs/down")}
		}, webhook.ReasonUnavailable},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := newProvider(t, srv, webhookIDs[:1], nil)
			idx, err := p.Verify(sign(t, c.signer(t), webhookIDs[0], now, b), b)
			if c.reason == "" {
				require.NoError(t, err)
				assert.Equal(t, 0, idx)
				return
			}
			require.Error(t, err)
			assert.Equal(t, c.reason, webhook.ReasonOf(err), "%v", err)
		})
	}
}

// A certificate is downloaded once and then served from the cache, also
// to concurrent requests; a refused one is not downloaded again for a
// while; a failed download is retried by the next request; a cached one is
// fetched again once its day is over.
func TestCertificatesAreCachedAndFetchedOnce(t *testing.T) {
	t.Parallel()
	srv := paypaltest.NewCertServer(t)
	var mu sync.Mutex
	now := time.Now()
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	p := newProvider(t, srv, webhookIDs[:1], clock)
	b, _ := body(2)

	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			_, err := p.Verify(sign(t, srv.Signer, webhookIDs[0], clock(), b), b)
			assert.NoError(t, err)
		})
	}
	wg.Wait()
	assert.Equal(t, 1, srv.Fetches(paypaltest.CertPath), "one download for concurrent requests")

	refused := srv.Issue(t, "/v1/notifications/certs/refused", paypaltest.Cert{CommonName: "evil.example.com"})
	for range 3 {
		_, err := p.Verify(sign(t, refused, webhookIDs[0], clock(), b), b)
		assert.Equal(t, webhook.ReasonUntrusted, webhook.ReasonOf(err))
	}
	assert.Equal(t, 1, srv.Fetches("/v1/notifications/certs/refused"), "a refusal is remembered")

	srv.Answer("/v1/notifications/certs/flaky", http.StatusServiceUnavailable, nil)
	flaky := paypal.Signer{Key: srv.Signer.Key, CertURL: srv.URL("/v1/notifications/certs/flaky")}
	_, err := p.Verify(sign(t, flaky, webhookIDs[0], clock(), b), b)
	assert.Equal(t, webhook.ReasonUnavailable, webhook.ReasonOf(err))
	fixed := srv.Issue(t, "/v1/notifications/certs/flaky", paypaltest.Cert{})
	_, err = p.Verify(sign(t, fixed, webhookIDs[0], clock(), b), b)
	require.NoError(t, err, "an outage is not remembered")
	assert.Equal(t, 2, srv.Fetches("/v1/notifications/certs/flaky"))

	mu.Lock()
	now = now.Add(12 * time.Hour)
	mu.Unlock()
	_, err = p.Verify(sign(t, srv.Signer, webhookIDs[0], clock(), b), b)
	require.NoError(t, err)
	assert.Equal(t, 1, srv.Fetches(paypaltest.CertPath), "still cached after 12 hours")
	mu.Lock()
	now = now.Add(13 * time.Hour)
	mu.Unlock()
	_, err = p.Verify(sign(t, srv.Signer, webhookIDs[0], clock(), b), b)
	// The test certificate expired after a day: fetched again, and refused.
	assert.Equal(t, webhook.ReasonUntrusted, webhook.ReasonOf(err), "%v", err)
	assert.Equal(t, 2, srv.Fetches(paypaltest.CertPath), "fetched again after a day")
}

// A stale or malformed request is refused before anything is downloaded.
func TestCheapChecksComeBeforeTheDownload(t *testing.T) {
	t.Parallel()
	srv := paypaltest.NewCertServer(t)
	p := newProvider(t, srv, webhookIDs[:1], nil)
	b, _ := body(3)
	for name, h := range map[string]http.Header{
		"stale":  sign(t, srv.Signer, webhookIDs[0], time.Now().Add(-time.Hour), b),
		"future": sign(t, srv.Signer, webhookIDs[0], time.Now().Add(time.Hour), b),
		"other algo": func() http.Header {
			h := sign(t, srv.Signer, webhookIDs[0], time.Now(), b)
			h.Set(paypal.AuthAlgoHeader, "SHA1withRSA")
			return h
		}(),
		"sig not b64": func() http.Header {
			h := sign(t, srv.Signer, webhookIDs[0], time.Now(), b)
			h.Set(paypal.TransmissionSigHeader, "!!")
			return h
		}(),
		"pipe in id": func() http.Header {
			h := sign(t, srv.Signer, webhookIDs[0], time.Now(), b)
			h.Set(paypal.TransmissionIDHeader, "a|b")
			return h
		}(),
	} {
		_, err := p.Verify(h, b)
		require.Error(t, err, name)
	}
	assert.Equal(t, 0, srv.Fetches(paypaltest.CertPath))
}

// A webhook id that is not PayPal's form is a secret error that names its
// position, never its value.
func TestWebhookIDsAreCheckedWithoutBeingQuoted(t *testing.T) {
	t.Parallel()
	_, err := paypal.New(paypal.Options{WebhookIDs: []string{"8PT597110X687430LKGECATA", "not-an-id secret"}})
	var serr *webhook.SecretError
	require.ErrorAs(t, err, &serr)
	assert.Equal(t, 2, serr.Index)
	assert.NotContains(t, err.Error(), "not-an-id")
}
