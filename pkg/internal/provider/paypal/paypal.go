// Package paypal is the PayPal provider.
//
// PayPal signs each delivery with a private key and names, in
// PAYPAL-CERT-URL, where the certificate of that key is. The signature
// (PAYPAL-TRANSMISSION-SIG, base64; PAYPAL-AUTH-ALGO SHA256withRSA) is
// RSA-SHA256 over
//
//	<PAYPAL-TRANSMISSION-ID>|<PAYPAL-TRANSMISSION-TIME>|<webhook id>|<crc32 of the raw body, decimal>
//
// where the webhook id is the id PayPal's dashboard gave the subscription
// that points at us: it is this provider's "secret" (WEBHOOK_SECRETS_<NAME>),
// several during a move from one subscription to another, and the index of
// the one that matched is reported as for the HMAC providers. This is
// PayPal's offline ("self-verify") scheme; nothing is posted back to PayPal.
//
// What is trusted, and why:
//   - the certificate is fetched only over HTTPS, only from an allow-listed
//     host (api.paypal.com and api.sandbox.paypal.com by default), with no
//     redirects: a sender cannot make the receiver trust a key it serves
//     from its own host;
//   - its chain is verified against the system roots (or a configured CA
//     bundle) and its subject must be PayPal's message-verification
//     certificate (CN messageverificationcerts.*.paypal.com, as PayPal's own
//     SDKs check);
//   - PAYPAL-TRANSMISSION-TIME must be within the tolerance of now, both
//     ways, and is checked before anything is fetched, so a replay costs no
//     download.
//
// Certificates are cached by URL (at most maxCachedCerts, each until it
// expires or for a day), so a download is rare; concurrent requests for one
// URL share one download. A refused certificate is remembered for a minute.
// A download that fails for a reason of the network or of PayPal's host
// (timeout, 5xx) is ReasonUnavailable: the receiver answers 503 and PayPal
// retries, instead of the event being refused for an outage.
//
// The event id (the body's "id", the same on every retry and resend)
// dedupes; the resource the event is about is its object, ordered by its
// update or create time (event.DecodePayPal). PayPal does not batch.
package paypal

import (
	"crypto"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"hash/crc32"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/idempotent-events/idempotent-events/pkg/internal/event"
	"github.com/idempotent-events/idempotent-events/pkg/internal/webhook"
)

// Name is the provider's name in WEBHOOK_SOURCES.
const Name = "paypal"

// Headers of a PayPal delivery.
const (
	TransmissionIDHeader   = "PAYPAL-TRANSMISSION-ID"
	TransmissionTimeHeader = "PAYPAL-TRANSMISSION-TIME"
	TransmissionSigHeader  = "PAYPAL-TRANSMISSION-SIG"
	CertURLHeader          = "PAYPAL-CERT-URL"
	AuthAlgoHeader         = "PAYPAL-AUTH-ALGO"
)

// AuthAlgo is the one signature algorithm PayPal uses, and the only one
// accepted.
const AuthAlgo = "SHA256withRSA"

// DefaultCertHosts are the hosts PAYPAL-CERT-URL may name by default:
// PayPal's live and sandbox APIs.
var DefaultCertHosts = []string{"api.paypal.com", "api.sandbox.paypal.com"}

// DefaultFetchTimeout bounds one certificate download.
const DefaultFetchTimeout = 5 * time.Second

// Bounds of the headers, beyond what PayPal sends (transmission ids are
// UUIDs, signatures of a 2048- or 4096-bit key are 344 or 684 base64
// characters): they keep a forged request from costing anything.
const (
	maxTransmissionID = 128
	maxSignature      = 1024
	maxCertURL        = 500
)

// webhookID is the form of a PayPal webhook id (PayPal's API documents
// ^[a-zA-Z0-9]+$, at most 50 characters).
var webhookID = regexp.MustCompile(`^[A-Za-z0-9]{1,50}$`)

// Options configures a Provider.
type Options struct {
	// WebhookIDs are the ids of the PayPal webhook subscriptions whose
	// deliveries are accepted; several while moving from one to another.
	WebhookIDs []string
	// Tolerance bounds PAYPAL-TRANSMISSION-TIME against now, both ways.
	Tolerance time.Duration
	// CertHosts are the hosts ("host" or "host:port") PAYPAL-CERT-URL may
	// name; nil means DefaultCertHosts.
	CertHosts []string
	// Roots verify the TLS connection to the certificate host and the chain
	// of the certificate it serves; nil means the system roots.
	Roots *x509.CertPool
	// FetchTimeout bounds one certificate download; 0 means
	// DefaultFetchTimeout.
	FetchTimeout time.Duration
	// Now is the clock; nil means time.Now. For tests.
	Now func() time.Time
}

// Provider verifies and decodes PayPal deliveries. It is safe for
// concurrent use, and starts no goroutine.
type Provider struct {
	webhookIDs []string
	tolerance  time.Duration
	now        func() time.Time
	certs      *certSource
}

// New returns a provider for o. A webhook id that is not letters and digits
// is a *webhook.SecretError naming its position, never its value.
func New(o Options) (*Provider, error) {
	for i, id := range o.WebhookIDs {
		if !webhookID.MatchString(id) {
			return nil, &webhook.SecretError{Index: i + 1, Form: "a PayPal webhook id (1-50 letters and digits)"}
		}
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.CertHosts == nil {
		o.CertHosts = DefaultCertHosts
	}
	if o.FetchTimeout <= 0 {
		o.FetchTimeout = DefaultFetchTimeout
	}
	return &Provider{
		webhookIDs: append([]string(nil), o.WebhookIDs...),
		tolerance:  o.Tolerance,
		now:        o.Now,
		certs:      newCertSource(o.CertHosts, o.Roots, o.FetchTimeout, o.Now),
	}, nil
}

// Scheme is the provider's name.
func (*Provider) Scheme() string { return Name }

// Verify checks a delivery's signature and returns the index of the
// webhook id it was made for, or a *webhook.Error. The cheap checks (every
// header present and well formed, the time within the tolerance) come
// before the certificate is fetched.
func (p *Provider) Verify(h http.Header, body []byte) (int, error) {
	id, ts, sig64 := h.Get(TransmissionIDHeader), h.Get(TransmissionTimeHeader), h.Get(TransmissionSigHeader)
	certURL, algo := h.Get(CertURLHeader), h.Get(AuthAlgoHeader)
	var missing []string
	for _, hv := range [][2]string{{TransmissionIDHeader, id}, {TransmissionTimeHeader, ts},
		{TransmissionSigHeader, sig64}, {CertURLHeader, certURL}, {AuthAlgoHeader, algo}} {
		if hv[1] == "" {
			missing = append(missing, hv[0])
		}
	}
	if len(missing) > 0 {
		return -1, &webhook.Error{Reason: webhook.ReasonMissing, Detail: "no " + strings.Join(missing, ", ") + " header"}
	}
	if len(id) > maxTransmissionID || strings.ContainsAny(id, "| \t") {
		return -1, &webhook.Error{Reason: webhook.ReasonMalformed, Detail: TransmissionIDHeader + " is longer than 128 characters or holds '|' or spaces"}
	}
	at, err := time.Parse(time.RFC3339Nano, ts)
	if err != nil {
		return -1, &webhook.Error{Reason: webhook.ReasonMalformed, Detail: TransmissionTimeHeader + " is not an RFC 3339 date-time"}
	}
	if !strings.EqualFold(algo, AuthAlgo) {
		return -1, &webhook.Error{Reason: webhook.ReasonMalformed, Detail: AuthAlgoHeader + " must be " + AuthAlgo}
	}
	if len(sig64) > maxSignature {
		return -1, &webhook.Error{Reason: webhook.ReasonMalformed, Detail: TransmissionSigHeader + " is longer than 1024 characters"}
	}
	sig, err := base64.StdEncoding.DecodeString(sig64)
	if err != nil || len(sig) == 0 {
		return -1, &webhook.Error{Reason: webhook.ReasonMalformed, Detail: TransmissionSigHeader + " is not base64"}
	}
	if err := webhook.CheckAge(p.now(), at, p.tolerance); err != nil {
		return -1, err
	}
	key, err := p.certs.key(certURL)
	if err != nil {
		return -1, err
	}
	crc := strconv.FormatUint(uint64(crc32.ChecksumIEEE(body)), 10)
	for i, wid := range p.webhookIDs {
		sum := sha256.Sum256([]byte(id + "|" + ts + "|" + wid + "|" + crc))
		if rsa.VerifyPKCS1v15(key, crypto.SHA256, sum[:], sig) == nil {
			return i, nil
		}
	}
	return -1, &webhook.Error{Reason: webhook.ReasonMismatch, Detail: "the signature does not match the body under any configured webhook id"}
}

// Identify returns PAYPAL-TRANSMISSION-ID as the delivery id; the event's
// id and type are in its body.
func (*Provider) Identify(h http.Header) webhook.Delivery {
	return webhook.Delivery{DeliveryID: h.Get(TransmissionIDHeader)}
}

// Decode validates the body as a PayPal event, as the worker will when it
// reads the published message.
func (*Provider) Decode(d webhook.Delivery, body []byte) (event.Event, error) {
	return event.Parse(Name, d.EventID, d.Type, body)
}

// Signer signs deliveries as PayPal does, with the private key of the
// certificate served at CertURL: for tests and hand-made deliveries.
type Signer struct {
	Key     *rsa.PrivateKey
	CertURL string
}

// Sign returns the headers of a delivery of body for the webhook
// webhookID, as transmission transmissionID sent at time at.
func (s Signer) Sign(webhookID, transmissionID string, at time.Time, body []byte) (http.Header, error) {
	ts := at.UTC().Format(time.RFC3339)
	crc := strconv.FormatUint(uint64(crc32.ChecksumIEEE(body)), 10)
	sum := sha256.Sum256([]byte(transmissionID + "|" + ts + "|" + webhookID + "|" + crc))
	sig, err := rsa.SignPKCS1v15(nil, s.Key, crypto.SHA256, sum[:])
	if err != nil {
		return nil, err
	}
	h := http.Header{}
	h.Set(TransmissionIDHeader, transmissionID)
	h.Set(TransmissionTimeHeader, ts)
	h.Set(TransmissionSigHeader, base64.StdEncoding.EncodeToString(sig))
	h.Set(CertURLHeader, s.CertURL)
	h.Set(AuthAlgoHeader, AuthAlgo)
	return h, nil
}
