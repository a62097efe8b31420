// Package github is the GitHub provider: X-Hub-Signature-256 ("sha256=" +
// hex HMAC-SHA256 of the body) verified by webhook.GitHubVerifier. The
// event id is X-GitHub-Delivery (the same on a redelivery) and the type
// X-GitHub-Event; the body is any JSON object (event.DecodeGitHub). GitHub
// signs no timestamp: a replay is a duplicate of its delivery id. No
// batches.
package github

import (
	"net/http"

	"github.com/idempotent-events/idempotent-events/pkg/internal/event"
	"github.com/idempotent-events/idempotent-events/pkg/internal/webhook"
)

// Name is the provider's name in WEBHOOK_SOURCES.
const Name = webhook.SchemeGitHub

// Provider verifies and decodes GitHub deliveries.
type Provider struct {
	v *webhook.GitHubVerifier
}

// New returns a provider that accepts signatures made with any of secrets.
func New(secrets []string) *Provider {
	return &Provider{v: webhook.NewGitHubVerifier(secrets)}
}

// Scheme is the provider's name.
func (*Provider) Scheme() string { return Name }

// Verify checks X-Hub-Signature-256 and returns the index of the secret
// that matched, or a *webhook.Error.
func (p *Provider) Verify(h http.Header, body []byte) (int, error) { return p.v.Verify(h, body) }

// Identify returns X-GitHub-Delivery as the event id and delivery id, and
// X-GitHub-Event as the type.
func (*Provider) Identify(h http.Header) webhook.Delivery {
	id := h.Get(webhook.GitHubDeliveryHeader)
	return webhook.Delivery{EventID: id, Type: h.Get(webhook.GitHubEventHeader), DeliveryID: id}
}

// Decode validates the body under the identity the headers gave.
func (*Provider) Decode(d webhook.Delivery, body []byte) (event.Event, error) {
	return event.Parse(Name, d.EventID, d.Type, body)
}

// Sign returns the headers of a delivery of body as GitHub sends it: its
// signature under secret, delivery id and event type.
func Sign(secret, delivery, typ string, body []byte) http.Header {
	h := http.Header{}
	h.Set(webhook.GitHubSignatureHeader, webhook.SignGitHub(secret, body))
	h.Set(webhook.GitHubDeliveryHeader, delivery)
	h.Set(webhook.GitHubEventHeader, typ)
	return h
}
