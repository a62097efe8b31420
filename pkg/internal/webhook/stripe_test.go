package webhook_test

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	stripewebhook "github.com/stripe/stripe-go/v82/webhook"

	"github.com/idempotent-events/idempotent-events/pkg/internal/webhook"
)

var body = []byte(`{"id":"evt_1","type":"payment_intent.succeeded","data":{"object":{"object":"payment_intent","id":"pi_1","amount":100,"currency":"usd","status":"succeeded"}}}`)

func TestStripeLibrarySignaturesAreAccepted(t *testing.T) {
	now := time.Now()
	signed := stripewebhook.GenerateTestSignedPayload(&stripewebhook.UnsignedPayload{Payload: body, Secret: "whsec_live", Timestamp: now})
	v := webhook.NewStripeVerifier([]string{"whsec_live"}, 5*time.Minute)
	idx, err := v.VerifyHeader(signed.Header, body)
	require.NoError(t, err)
	assert.Equal(t, 0, idx)

	// And ours is accepted by Stripe's own verifier.
	require.NoError(t, stripewebhook.ValidatePayload(body, webhook.SignStripe("whsec_live", now, body), "whsec_live"))
}

func TestRotationReportsWhichSecretMatched(t *testing.T) {
	v := webhook.NewStripeVerifier([]string{"whsec_new", "whsec_old"}, 5*time.Minute)
	idx, err := v.VerifyHeader(webhook.SignStripe("whsec_old", time.Now(), body), body)
	require.NoError(t, err)
	assert.Equal(t, 1, idx)
}

func TestAnyOfSeveralV1SignaturesMatches(t *testing.T) {
	now := time.Now()
	good := webhook.SignStripe("whsec_a", now, body)
	_, goodSig, _ := strings.Cut(good, ",v1=")
	header := "t=" + strings.TrimPrefix(strings.Split(good, ",")[0], "t=") +
		",v1=" + strings.Repeat("ab", 32) + ",v0=deadbeef,v1=" + goodSig
	v := webhook.NewStripeVerifier([]string{"whsec_a"}, 5*time.Minute)
	_, err := v.VerifyHeader(header, body)
	require.NoError(t, err)
}

func TestRejections(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	v := webhook.NewStripeVerifier([]string{"whsec_a"}, 5*time.Minute).WithClock(func() time.Time { return now })
	tampered := append([]byte{}, body...)
	tampered[10] ^= 1
	cases := []struct {
		name   string
		header string
		body   []byte
		want   webhook.Reason
	}{
		{"no header", "", body, webhook.ReasonMissing},
		{"garbage", "garbage", body, webhook.ReasonMalformed},
		{"no timestamp", "v1=" + strings.Repeat("00", 32), body, webhook.ReasonMalformed},
		{"bad timestamp", "t=abc,v1=" + strings.Repeat("00", 32), body, webhook.ReasonMalformed},
		{"no v1", "t=1700000000,v0=abc", body, webhook.ReasonMalformed},
		{"wrong secret", webhook.SignStripe("whsec_b", now, body), body, webhook.ReasonMismatch},
		{"tampered body", webhook.SignStripe("whsec_a", now, body), tampered, webhook.ReasonMismatch},
		{"replayed old timestamp", webhook.SignStripe("whsec_a", now.Add(-6*time.Minute), body), body, webhook.ReasonStale},
		{"future timestamp", webhook.SignStripe("whsec_a", now.Add(6*time.Minute), body), body, webhook.ReasonFuture},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := v.VerifyHeader(c.header, c.body)
			require.Error(t, err)
			assert.Equal(t, c.want, webhook.ReasonOf(err))
		})
	}
}

func TestToleranceEdgesAreInclusive(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	v := webhook.NewStripeVerifier([]string{"whsec_a"}, 5*time.Minute).WithClock(func() time.Time { return now })
	for _, at := range []time.Time{now.Add(-5 * time.Minute), now.Add(5 * time.Minute)} {
		_, err := v.VerifyHeader(webhook.SignStripe("whsec_a", at, body), body)
		assert.NoError(t, err, "timestamp %v", at)
	}
}
