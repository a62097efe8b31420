package event

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"errors"
	"slices"
)

// DefaultSource is the source of the /webhooks/payment route. Its events
// keep their provider ids as ledger keys; every other source's ids are
// qualified by the source name.
const DefaultSource = "stripe"

// Key is the dedupe key of an event: (source, provider event id), written
// as the provider id for the default source and "<source>:<id>" otherwise.
// It is what processed_events.event_id, payments.event_id and the Redis
// keys hold, never a broker message id.
func Key(source, id string) string {
	if source == DefaultSource || source == "" {
		return id
	}
	return source + ":" + id
}

type wireStandard struct {
	Type *string         `json:"type"`
	Data json.RawMessage `json:"data"`
}

// DecodeStandard validates a Standard Webhooks delivery: id is the
// webhook-id header, the body a JSON object with a "type". When "data"
// carries the seed's payment fields (payment_intent, amount_cents, currency,
// status) the event is a payment.
func DecodeStandard(id string, body []byte) (Event, error) {
	var ev Event
	var err error
	if ev.ID, err = requireID("webhook-id", &id); err != nil {
		return Event{}, err
	}
	var w wireStandard
	if err := unmarshalBody(body, &w); err != nil {
		return Event{}, err
	}
	if ev.Type, err = requireType(w.Type); err != nil {
		return Event{}, err
	}
	if len(w.Data) > 0 && !bytes.Equal(w.Data, []byte("null")) {
		var data wireData
		if err := json.Unmarshal(w.Data, &data); err == nil && data.PaymentIntent != nil {
			if ev.Payment, err = decodeShort(&data); err != nil {
				return Event{}, err
			}
		}
	}
	ev.Digest = digest("", body)
	return ev, nil
}

// DecodeGitHub validates a GitHub delivery: id is X-GitHub-Delivery, typ
// X-GitHub-Event, the body a JSON object. GitHub events carry no payment.
func DecodeGitHub(id, typ string, body []byte) (Event, error) {
	var ev Event
	var err error
	if ev.ID, err = requireID("X-GitHub-Delivery", &id); err != nil {
		return Event{}, err
	}
	if typ == "" {
		return Event{}, &FieldError{Field: "X-GitHub-Event", Problem: "required header is missing"}
	}
	if ev.Type, err = requireType(&typ); err != nil {
		fe := &FieldError{Field: "X-GitHub-Event", Problem: err.Error()}
		if inner := (*FieldError)(nil); errors.As(err, &inner) {
			fe.Problem = inner.Problem
		}
		return Event{}, fe
	}
	var obj map[string]json.RawMessage
	if err := unmarshalBody(body, &obj); err != nil {
		return Event{}, err
	}
	ev.Digest = digest("", body)
	return ev, nil
}

// DefaultScheme is how a message without a scheme is read: the receiver
// publishes no scheme for Stripe deliveries (they were the only ones before
// sources existed), and messages from older receivers and other tools have
// none either.
const DefaultScheme = "stripe"

// Decoder validates a delivery's body. id and typ are what the delivery's
// headers said (webhook.Delivery's EventID and Type), empty for providers
// that put them in the body. A problem with the input is a *FieldError.
type Decoder func(id, typ string, body []byte) (Event, error)

// decoders are the body formats of the providers, by scheme name. The
// worker reads a published message with Parse, so every provider's decoder
// is here, one floor below the provider packages (pkg/internal/provider
// fails a test when a provider and this table disagree).
var decoders = map[string]Decoder{
	DefaultScheme: func(_, _ string, body []byte) (Event, error) { return Decode(body) },
	"standard":    func(id, _ string, body []byte) (Event, error) { return DecodeStandard(id, body) },
	"github":      DecodeGitHub,
	"paypal":      func(_, _ string, body []byte) (Event, error) { return DecodePayPal(body) },
}

// Schemes returns the scheme names Parse reads, sorted.
func Schemes() []string {
	names := make([]string, 0, len(decoders))
	for name := range decoders {
		names = append(names, name)
	}
	slices.Sort(names)
	return names
}

// Parse decodes a delivery by its scheme: "stripe" (or "") takes
// everything from the body; "standard" and "github" take the event id (and
// for GitHub the type) from the headers the receiver recorded; "paypal"
// reads its envelope. An unknown scheme is a *FieldError on "scheme".
func Parse(scheme, id, typ string, body []byte) (Event, error) {
	if scheme == "" {
		scheme = DefaultScheme
	}
	decode, ok := decoders[scheme]
	if !ok {
		return Event{}, &FieldError{Field: "scheme", Problem: "unknown signature scheme " + scheme}
	}
	return decode(id, typ, body)
}

// DigestHexLen is the length of DigestHex's answer.
const DigestHexLen = 2 * len(Event{}.Digest)

// DigestHex is the event's content digest in hex, as Redis and the ledger
// hold it.
func (e Event) DigestHex() string { return hex.EncodeToString(e.Digest[:]) }

// AnyDigest is the content digest given to an event the reconciler fetched
// from the provider's API instead of receiving it signed: Stripe renders an
// event in its list at the API version of the event's creation, and a webhook
// endpoint at its own, so the two can differ in bytes while they are the
// same event. Its content is the same as any other's (SameContent), so a late
// webhook of a reconciled event is a duplicate, never a conflict. No SHA-256
// is all zeros in practice.
var AnyDigest [32]byte

// AnyDigestHex is AnyDigest in hex.
var AnyDigestHex = hex.EncodeToString(AnyDigest[:])

// SameContent reports whether two hex content digests name the same
// content: equal, or either is AnyDigestHex.
func SameContent(a, b string) bool {
	return a == b || a == AnyDigestHex || b == AnyDigestHex
}
