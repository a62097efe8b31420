package stripe_test

import (
	"fmt"
	"net/http"
	"testing"
	"time"

	stripewebhook "github.com/stripe/stripe-go/v82/webhook"

	"github.com/idempotent-events/idempotent-events/pkg/internal/event/eventtest"
	"github.com/idempotent-events/idempotent-events/pkg/internal/provider"
	"github.com/idempotent-events/idempotent-events/pkg/internal/provider/providertest"
	"github.com/idempotent-events/idempotent-events/pkg/internal/provider/stripe"
	"github.com/idempotent-events/idempotent-events/pkg/internal/webhook"
)

// Fixture describes the Stripe provider to the conformance suite. It signs
// with stripe-go's own test helper, so the suite also shows that what
// Stripe's library signs is accepted.
func Fixture() providertest.Fixture {
	return providertest.Fixture{
		New:     func(_ testing.TB, secrets []string) provider.Provider { return stripe.New(secrets, 5*time.Minute) },
		Secrets: [3]string{"whsec_conformance_current", "whsec_conformance_retiring", "whsec_conformance_wrong"},
		Event: func(n int) ([]byte, string) {
			id := fmt.Sprintf("evt_conformance_%d", n)
			return eventtest.Payment(id, eventtest.Amount(int64(100+n))), id
		},
		Sign: func(_ testing.TB, secret string, at time.Time, _ string, body []byte) http.Header {
			signed := stripewebhook.GenerateTestSignedPayload(&stripewebhook.UnsignedPayload{Payload: body, Secret: secret, Timestamp: at})
			h := http.Header{}
			h.Set(webhook.StripeHeader, signed.Header)
			return h
		},
		Tolerance:     5 * time.Minute,
		SignedHeaders: []string{webhook.StripeHeader},
	}
}

func TestConformance(t *testing.T) {
	t.Parallel()
	providertest.Run(t, Fixture())
}

// The provider's own signer and Stripe's library agree.
func TestSignIsStripes(t *testing.T) {
	t.Parallel()
	body := eventtest.Payment("evt_sign", eventtest.Amount(5))
	h := stripe.Sign("whsec_x", time.Now(), body)
	if err := stripewebhook.ValidatePayload(body, h.Get(webhook.StripeHeader), "whsec_x"); err != nil {
		t.Fatalf("stripe-go refuses our signature: %v", err)
	}
}
