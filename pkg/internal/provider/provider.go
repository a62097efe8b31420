// Package provider is the contract every webhook provider implements and
// the registry of the built-in ones.
//
// A provider is one package (stripe, standard, github, paypal below this
// one) behind one interface, Provider: it verifies a request's signature
// on the raw body (reporting which of several secrets matched, so secrets
// rotate without downtime), identifies the delivery from its headers, and
// decodes the body into an event.Event (dedupe id, type, the object it is
// about and the time that orders it). A provider that delivers several
// events in one request also implements Splitter. Reconciliation (asking
// the provider for its own record of events) is not part of the interface
// yet: it lives in pkg/internal/reconcile for Stripe and GitHub.
//
// The registry (Kinds, New) is the one place a provider's name is mapped to
// its code: WEBHOOK_SOURCES items name a kind, the chart's schema lists the
// same names (a test holds them equal), and docs/providers.md has a section
// per kind. Every kind passes the conformance suite in
// pkg/internal/provider/providertest.
//
// Decoding is the one part of a provider that is not in its package: the
// worker reads a published message with event.Parse, below this floor, so
// each provider's body decoder is in pkg/internal/event and the provider's
// Decode calls it. A test fails when the registry and event.Schemes
// disagree.
package provider

import (
	"crypto/x509"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/idempotent-events/idempotent-events/pkg/internal/event"
	"github.com/idempotent-events/idempotent-events/pkg/internal/provider/github"
	"github.com/idempotent-events/idempotent-events/pkg/internal/provider/paypal"
	"github.com/idempotent-events/idempotent-events/pkg/internal/provider/standard"
	"github.com/idempotent-events/idempotent-events/pkg/internal/provider/stripe"
	"github.com/idempotent-events/idempotent-events/pkg/internal/webhook"
)

// Provider is one webhook provider, configured with its secrets.
//
// Verify (webhook.Verifier) runs first, on the raw bytes, and returns the
// index of the matching secret or a *webhook.Error; a request it refuses is
// never identified, decoded or published. Scheme is the provider's name.
// Identify reads the headers; it cannot fail (a missing identity header is
// Decode's to report, naming the header). Decode validates the body under
// that identity and returns an *event.FieldError naming the offending field
// or header; it must decode exactly as event.Parse does for the worker.
type Provider interface {
	webhook.Verifier
	Identify(h http.Header) webhook.Delivery
	Decode(d webhook.Delivery, body []byte) (event.Event, error)
}

// Item is one event of a batched delivery: its body, as it is published
// and decoded, the identity of it, and its JSON path in the delivery (for
// the error that names a bad field, e.g. "notificationItems[2]").
type Item struct {
	Delivery webhook.Delivery
	Body     []byte
	Path     string
}

// Splitter is implemented by a provider that delivers several events in
// one request. Split runs after Verify, which has checked every item's
// signature; a delivery that cannot be split is an *event.FieldError. The
// receiver decodes every item before it publishes any, so a delivery with
// one bad item publishes nothing, and answers 2xx only once every item is
// confirmed.
type Splitter interface {
	Split(h http.Header, body []byte) ([]Item, error)
}

// Settings configure a provider for one source. Each field says which
// variable it comes from; a provider ignores those it has no use for.
type Settings struct {
	// Secrets are the source's secrets (WEBHOOK_SECRETS_<NAME>): signing
	// secrets, or PayPal's webhook ids. Several during a rotation.
	Secrets []string
	// Tolerance bounds signed timestamps against now, both ways
	// (WEBHOOK_TOLERANCE).
	Tolerance time.Duration
	// CertHosts are the hosts a provider that signs with certificates may
	// fetch them from (PAYPAL_CERT_HOSTS); nil means the provider's default.
	CertHosts []string
	// CAFile is a PEM bundle that replaces the system roots for those
	// certificates and their hosts (PAYPAL_CA_FILE); "" means the system
	// roots.
	CAFile string
}

// SettingError is a setting a provider cannot use, other than a secret
// (those are *webhook.SecretError): Var names the variable. It never
// quotes the value.
type SettingError struct {
	Var, Problem string
}

func (e *SettingError) Error() string { return e.Var + ": " + e.Problem }

// Kind is a provider in the registry: its name, and how to build it for a
// source from the source's Settings.
type Kind struct {
	// Name is what WEBHOOK_SOURCES items and the chart's sources[].scheme
	// say: "name:<Kind.Name>".
	Name string
	// New builds the provider. A secret it cannot use is a
	// *webhook.SecretError, another setting a *SettingError.
	New func(Settings) (Provider, error)
}

// kinds are the built-in providers, in the order the docs list them.
var kinds = []Kind{
	{Name: stripe.Name, New: func(s Settings) (Provider, error) { return stripe.New(s.Secrets, s.Tolerance), nil }},
	{Name: standard.Name, New: func(s Settings) (Provider, error) { return standard.New(s.Secrets, s.Tolerance) }},
	{Name: github.Name, New: func(s Settings) (Provider, error) { return github.New(s.Secrets), nil }},
	{Name: paypal.Name, New: newPayPal},
}

// Kinds returns the built-in providers.
func Kinds() []Kind { return append([]Kind(nil), kinds...) }

// Names returns the built-in providers' names, in registry order.
func Names() []string {
	names := make([]string, len(kinds))
	for i, k := range kinds {
		names[i] = k.Name
	}
	return names
}

// New builds the provider named name for s. An unknown name is an error
// listing the known ones.
func New(name string, s Settings) (Provider, error) {
	for _, k := range kinds {
		if k.Name == name {
			return k.New(s)
		}
	}
	return nil, fmt.Errorf("scheme must be one of %s, got %q", strings.Join(Names(), ", "), name)
}

func newPayPal(s Settings) (Provider, error) {
	o := paypal.Options{WebhookIDs: s.Secrets, Tolerance: s.Tolerance, CertHosts: s.CertHosts}
	if s.CAFile != "" {
		pem, err := os.ReadFile(s.CAFile)
		if err != nil {
			return nil, &SettingError{Var: "PAYPAL_CA_FILE", Problem: "cannot be read: " + errorText(err)}
		}
		o.Roots = x509.NewCertPool()
		if !o.Roots.AppendCertsFromPEM(pem) {
			return nil, &SettingError{Var: "PAYPAL_CA_FILE", Problem: "holds no PEM certificate"}
		}
	}
	return paypal.New(o)
}

// errorText is err's text without the path, which os errors repeat.
func errorText(err error) string {
	var pe *os.PathError
	if errors.As(err, &pe) {
		return pe.Err.Error()
	}
	return err.Error()
}
