// Package stripe is the Stripe provider: Stripe-Signature
// ("t=<unix>,v1=<hex HMAC-SHA256 of "t.body">") verified by
// webhook.StripeVerifier, and the event's id, type and object in its body
// (event.Decode). Stripe sends no delivery id and no batches.
package stripe

import (
	"net/http"
	"time"

	"github.com/idempotent-events/idempotent-events/pkg/internal/event"
	"github.com/idempotent-events/idempotent-events/pkg/internal/webhook"
)

// Name is the provider's name in WEBHOOK_SOURCES; it is also the scheme of
// the default route /webhooks/payment.
const Name = webhook.SchemeStripe

// Provider verifies and decodes Stripe deliveries.
type Provider struct {
	v *webhook.StripeVerifier
}

// New returns a provider that accepts signatures made with any of secrets
// (several during a rotation) and timestamps within tolerance of now.
func New(secrets []string, tolerance time.Duration) *Provider {
	return &Provider{v: webhook.NewStripeVerifier(secrets, tolerance)}
}

// Scheme is the provider's name.
func (*Provider) Scheme() string { return Name }

// Verify checks Stripe-Signature and returns the index of the secret that
// matched, or a *webhook.Error.
func (p *Provider) Verify(h http.Header, body []byte) (int, error) { return p.v.Verify(h, body) }

// Identify returns nothing: a Stripe event names itself in its body.
func (*Provider) Identify(http.Header) webhook.Delivery { return webhook.Delivery{} }

// Decode validates the body as a Stripe event (or the seed's short form),
// as the worker will when it reads the published message.
func (*Provider) Decode(d webhook.Delivery, body []byte) (event.Event, error) {
	return event.Parse(Name, d.EventID, d.Type, body)
}

// Sign returns the headers of body signed with secret at time at, as
// Stripe sends them.
func Sign(secret string, at time.Time, body []byte) http.Header {
	h := http.Header{}
	h.Set(webhook.StripeHeader, webhook.SignStripe(secret, at, body))
	return h
}
