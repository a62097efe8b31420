package eventsctl

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/idempotent-events/idempotent-events/pkg/internal/config"
	"github.com/idempotent-events/idempotent-events/pkg/internal/event"
	"github.com/idempotent-events/idempotent-events/pkg/internal/provider"
	"github.com/idempotent-events/idempotent-events/pkg/internal/provider/github"
	"github.com/idempotent-events/idempotent-events/pkg/internal/provider/paypal"
	"github.com/idempotent-events/idempotent-events/pkg/internal/provider/standard"
	"github.com/idempotent-events/idempotent-events/pkg/internal/provider/stripe"
	"github.com/idempotent-events/idempotent-events/pkg/internal/webhook"
)

// sourceName is the form of a WEBHOOK_SOURCES name, as the receiver
// checks it: it is a path segment of the route.
var sourceName = regexp.MustCompile(`^[a-z0-9-]{1,32}$`)

// sourceRoute is the receiver's route of source.
func sourceRoute(source string) string {
	if source == event.DefaultSource {
		return "/webhooks/payment"
	}
	return "/webhooks/" + source
}

// sourceScheme is the provider source signs as: -scheme when given,
// Stripe's for the default source, the source's scheme in
// $WEBHOOK_SOURCES (the receiver's own setting), else the source's name
// when it names a provider (a source named paypal is usually paypal:paypal).
func sourceScheme(env Env, source, scheme string) (string, error) {
	known := provider.Names()
	if !sourceName.MatchString(source) {
		return "", fmt.Errorf("-source must be 1-32 of a-z, 0-9 and -, got %q", source)
	}
	if scheme != "" {
		if !slices.Contains(known, scheme) {
			return "", fmt.Errorf("-scheme must be one of %s, got %q", strings.Join(known, ", "), scheme)
		}
		return scheme, nil
	}
	if source == event.DefaultSource {
		return stripe.Name, nil
	}
	for _, item := range strings.Split(env("WEBHOOK_SOURCES"), ",") {
		if name, sc, _ := strings.Cut(strings.TrimSpace(item), ":"); name == source {
			if !slices.Contains(known, sc) {
				return "", fmt.Errorf("WEBHOOK_SOURCES: source %s has scheme %q, not one of %s (or pass -scheme)", source, sc, strings.Join(known, ", "))
			}
			return sc, nil
		}
	}
	if slices.Contains(known, source) {
		return source, nil
	}
	return "", fmt.Errorf("-source %s is not in $WEBHOOK_SOURCES: pass -scheme (%s)", source, strings.Join(known, ", "))
}

// secretsVar is the variable the receiver reads source's secrets from.
func secretsVar(source string) string {
	if source == event.DefaultSource {
		return "WEBHOOK_SECRETS"
	}
	return config.SecretsVar(source)
}

// sourceSecret is the secret send signs with by default: the first of the
// receiver's own setting for source, the variable or the file its _FILE
// variable names. An unreadable file is an error naming the variable,
// never the content.
func sourceSecret(env Env, source string) (string, error) {
	v := secretsVar(source)
	s, _, _ := strings.Cut(env(v), ",")
	if s = strings.TrimSpace(s); s != "" {
		return s, nil
	}
	fileVar := config.SecretsFileVar(v)
	path := env(fileVar)
	if path == "" {
		return "", nil
	}
	secrets, err := config.ReadSecretsFile(path)
	if err != nil {
		return "", fmt.Errorf("%s: %w", fileVar, err)
	}
	return secrets[0], nil
}

// signer signs deliveries as the provider scheme does.
type signer struct {
	scheme, secret string
	// unsigned leaves the signature header out (the identity headers
	// stay), to see a refusal.
	unsigned bool
	// paypal signs for a PayPal source, with the key of the certificate
	// send serves.
	paypal *paypal.Signer
}

// headers returns the headers of d signed now, without Content-Type.
func (s signer) headers(d delivery) (http.Header, error) {
	now := time.Now()
	var h http.Header
	var sig string
	switch s.scheme {
	case stripe.Name:
		h, sig = stripe.Sign(s.secret, now, d.body), webhook.StripeHeader
	case standard.Name:
		h, sig = standard.Sign(s.secret, d.id, now, d.body), webhook.StandardSignatureHeader
	case github.Name:
		h, sig = github.Sign(s.secret, d.id, d.typ, d.body), webhook.GitHubSignatureHeader
	case paypal.Name:
		// A new transmission per POST, as PayPal's retries are; the
		// event's id is in the body.
		var err error
		if h, err = s.paypal.Sign(s.secret, newUUID(), now, d.body); err != nil {
			return nil, fmt.Errorf("sign as PayPal: %w", err)
		}
		sig = paypal.TransmissionSigHeader
	default:
		return nil, fmt.Errorf("send cannot sign as %s", s.scheme)
	}
	if s.unsigned {
		h.Del(sig)
	}
	return h, nil
}

// githubPing is the body send posts to a GitHub source by default: the
// ping GitHub sends when a hook is made.
const githubPing = `{"zen":"Design for failure.","hook_id":1,"hook":{"type":"Repository","id":1,"active":true,"events":["*"]}}`

// delivery builds the one event the flags describe, as the provider scheme
// sends it: Stripe's event (or the seed's short form), a Standard
// Webhooks message with the seed's payment fields in data (its id in
// webhook-id), a GitHub delivery (ping unless -type, a new delivery id
// unless -id), or a PayPal capture event (about capture object). -file
// replaces the body.
func (f *eventFlags) delivery(scheme, object string, set map[string]bool, stdin io.Reader) (delivery, error) {
	if set["short"] && scheme != stripe.Name {
		return delivery{}, fmt.Errorf("-short is the seed's form of a Stripe event; a %s source does not take it", scheme)
	}
	var d delivery
	if f.file != "" {
		body, err := f.body(stdin)
		if err != nil {
			return delivery{}, err
		}
		d.body = body
	}
	switch scheme {
	case stripe.Name:
		if d.body == nil {
			d.body, _ = f.body(stdin)
		}
	case standard.Name:
		if d.id = f.id; d.id == "" {
			d.id = "msg_" + randomHex(12)
		}
		if d.body == nil {
			d.body = event.Example{ID: d.id, Type: f.typ, AmountCents: f.amount, Currency: f.currency, Status: f.status, Short: true}.JSON()
		}
	case github.Name:
		if d.id = f.id; d.id == "" {
			d.id = newUUID()
		}
		if d.typ = f.typ; !set["type"] {
			d.typ = "ping"
		}
		if d.body == nil {
			d.body = []byte(githubPing)
		}
	case paypal.Name:
		if d.body == nil {
			return f.paypalDelivery(set, object)
		}
	}
	return d, nil
}

// randomHex returns n random bytes in hex.
func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// newUUID returns a random (version 4) UUID: GitHub's delivery ids and
// PayPal's transmission ids are UUIDs.
func newUUID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6], b[8] = b[6]&0x0f|0x40, b[8]&0x3f|0x80
	h := hex.EncodeToString(b[:])
	return h[:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}
