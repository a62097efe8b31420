// Package standard is the Standard Webhooks provider
// (https://www.standardwebhooks.com): webhook-signature ("v1,<base64
// HMAC-SHA256>" over "<webhook-id>.<webhook-timestamp>.<body>", keyed by a
// whsec_<base64> secret) verified by webhook.StandardVerifier. The event id
// is the webhook-id header, the same on every retry; the type is the
// body's "type", and a "data" holding the seed's payment fields is a
// payment (event.DecodeStandard). No batches.
package standard

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/idempotent-events/idempotent-events/pkg/internal/event"
	"github.com/idempotent-events/idempotent-events/pkg/internal/webhook"
)

// Name is the provider's name in WEBHOOK_SOURCES.
const Name = webhook.SchemeStandard

// Provider verifies and decodes Standard Webhooks deliveries.
type Provider struct {
	v *webhook.StandardVerifier
}

// New returns a provider for secrets ("whsec_<base64>", the prefix
// optional) and timestamps within tolerance of now. A secret that is not
// base64 is a *webhook.SecretError.
func New(secrets []string, tolerance time.Duration) (*Provider, error) {
	v, err := webhook.NewStandardVerifier(secrets, tolerance)
	if err != nil {
		return nil, err
	}
	return &Provider{v: v}, nil
}

// Scheme is the provider's name.
func (*Provider) Scheme() string { return Name }

// Verify checks webhook-signature and returns the index of the secret that
// matched, or a *webhook.Error.
func (p *Provider) Verify(h http.Header, body []byte) (int, error) { return p.v.Verify(h, body) }

// Identify returns the webhook-id header: the event id, and this
// delivery's too (Standard Webhooks keeps it across retries).
func (*Provider) Identify(h http.Header) webhook.Delivery {
	id := h.Get(webhook.StandardIDHeader)
	return webhook.Delivery{EventID: id, DeliveryID: id}
}

// Decode validates the body under the identity the headers gave.
func (*Provider) Decode(d webhook.Delivery, body []byte) (event.Event, error) {
	return event.Parse(Name, d.EventID, d.Type, body)
}

// Sign returns the headers of body sent as message id at time at, signed
// with secret as a Standard Webhooks sender does. A secret that is not
// whsec_<base64> signs with no key, which no receiver accepts.
func Sign(secret, id string, at time.Time, body []byte) http.Header {
	key, _ := base64.StdEncoding.DecodeString(strings.TrimPrefix(secret, "whsec_"))
	ts := strconv.FormatInt(at.Unix(), 10)
	m := hmac.New(sha256.New, key)
	m.Write([]byte(id + "." + ts + "."))
	m.Write(body)
	h := http.Header{}
	h.Set(webhook.StandardIDHeader, id)
	h.Set(webhook.StandardTimestampHeader, ts)
	h.Set(webhook.StandardSignatureHeader, "v1,"+base64.StdEncoding.EncodeToString(m.Sum(nil)))
	return h
}
