package paypal_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/idempotent-events/idempotent-events/pkg/internal/provider/paypal"
	"github.com/idempotent-events/idempotent-events/pkg/internal/webhook"
)

// The header checks never panic, never accept without a certificate (the
// only allowed host is a closed port), and refuse with a known reason.
func FuzzPayPalVerify(f *testing.F) {
	f.Add("b9a7c6e0-94d1-11f0-8e6b-0242ac120002", "2026-12-07T10:00:00Z", "bm90IGEgc2lnbmF0dXJl",
		"https://127.0.0.1:1/v1/notifications/certs/CERT-1", "SHA256withRSA", []byte(`{"id":"WH-1"}`))
	f.Add("", "", "", "", "", []byte{})
	f.Add("a|b", "2026-12-07T10:00:00.123456789+02:00", "====", "https://api.paypal.com@127.0.0.1:1/", "sha256withrsa", []byte("x"))
	f.Add("id", "2026-12-07T10:00:00Z", "AAAA", "https://127.0.0.1:1:2/x", "SHA256withRSA", []byte("{}"))
	now, _ := time.Parse(time.RFC3339, "2026-12-07T10:00:00Z")
	p, err := paypal.New(paypal.Options{WebhookIDs: []string{"8PT597110X687430LKGECATA"}, Tolerance: 5 * time.Minute,
		CertHosts: []string{"127.0.0.1:1"}, FetchTimeout: time.Second, Now: func() time.Time { return now }})
	if err != nil {
		f.Fatal(err)
	}
	known := map[webhook.Reason]bool{webhook.ReasonMissing: true, webhook.ReasonMalformed: true, webhook.ReasonMismatch: true,
		webhook.ReasonStale: true, webhook.ReasonFuture: true, webhook.ReasonUntrusted: true, webhook.ReasonUnavailable: true}
	f.Fuzz(func(t *testing.T, id, ts, sig, certURL, algo string, body []byte) {
		h := http.Header{}
		h.Set(paypal.TransmissionIDHeader, id)
		h.Set(paypal.TransmissionTimeHeader, ts)
		h.Set(paypal.TransmissionSigHeader, sig)
		h.Set(paypal.CertURLHeader, certURL)
		h.Set(paypal.AuthAlgoHeader, algo)
		_, err := p.Verify(h, body)
		if err == nil {
			t.Fatal("accepted a delivery without a certificate")
		}
		if !known[webhook.ReasonOf(err)] {
			t.Fatalf("refused without a known reason: %v", err)
		}
	})
}

// ParseChain never panics, and what it accepts is one to eight
// certificates.
func FuzzParseChain(f *testing.F) {
	f.Add([]byte("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"))
	f.Add([]byte("-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n"))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, raw []byte) {
		chain, err := paypal.ParseChain(raw)
		if err == nil && (len(chain) == 0 || len(chain) > 8) {
			t.Fatalf("accepted %d certificates", len(chain))
		}
	})
}
