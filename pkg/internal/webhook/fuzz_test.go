package webhook_test

import (
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/idempotent-events/idempotent-events/pkg/internal/webhook"
)

// The Stripe header parser never panics on any input, and whatever it is
// fed, a signature made with the secret over the body still verifies.
func FuzzStripeVerify(f *testing.F) {
	f.Add("t=1700000000,v1=5257a869e7ecebeda32affa62cdca3fa51cad7e77a0e56ff536d0ce8e108d8bd", []byte(`{"id":"evt_1"}`))
	f.Add("t=,v1=", []byte{})
	f.Add("v1=zz,t=-1,,,=", []byte("x"))
	f.Add("t=1700000000,v1=00,v1=,v0=ab", []byte(`{}`))
	now := time.Unix(1_700_000_000, 0)
	v := webhook.NewStripeVerifier([]string{"whsec_fuzz"}, 5*time.Minute).WithClock(func() time.Time { return now })
	f.Fuzz(func(t *testing.T, header string, body []byte) {
		_, _ = v.VerifyHeader(header, body)
		if _, err := v.VerifyHeader(webhook.SignStripe("whsec_fuzz", now, body), body); err != nil {
			t.Fatalf("own signature rejected: %v", err)
		}
	})
}

// The Standard Webhooks verifier never panics on any header values.
func FuzzStandardVerify(f *testing.F) {
	f.Add("msg_1", "1700000000", "v1,K5oZfzN95Z9UVu1EsfQmfVNQhnkZ2pj9o9NDN/H/pI4=", []byte(`{"type":"a"}`))
	f.Add("", "", "", []byte{})
	f.Add("id", "-5", "v1, v2,abc v1,====", []byte("{"))
	v, err := webhook.NewStandardVerifier([]string{"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"}, 5*time.Minute)
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, id, ts, sig string, body []byte) {
		h := http.Header{}
		h.Set(webhook.StandardIDHeader, id)
		h.Set(webhook.StandardTimestampHeader, ts)
		h.Set(webhook.StandardSignatureHeader, sig)
		if _, err := v.Verify(h, body); err == nil {
			if _, perr := strconv.ParseInt(ts, 10, 64); perr != nil {
				t.Fatalf("accepted a non-numeric timestamp %q", ts)
			}
		}
	})
}

// The GitHub verifier never panics, and accepts exactly its own signatures.
func FuzzGitHubVerify(f *testing.F) {
	f.Add("sha256=0000000000000000000000000000000000000000000000000000000000000000", []byte(`{}`))
	f.Add("sha256=", []byte{})
	f.Add("sha1=abc", []byte("x"))
	v := webhook.NewGitHubVerifier([]string{"gh"})
	f.Fuzz(func(t *testing.T, sig string, body []byte) {
		h := http.Header{}
		h.Set(webhook.GitHubSignatureHeader, sig)
		_, err := v.Verify(h, body)
		if err == nil && sig != webhook.SignGitHub("gh", body) {
			t.Fatalf("accepted a signature that is not ours: %q", sig)
		}
		h.Set(webhook.GitHubSignatureHeader, webhook.SignGitHub("gh", body))
		if _, err := v.Verify(h, body); err != nil {
			t.Fatalf("own signature rejected: %v", err)
		}
	})
}
