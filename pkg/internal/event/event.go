// Package event decodes and validates the payment events idempotent-events
// processes.
//
// Two JSON shapes are accepted:
//
//   - a real Stripe event: {"id":"evt_…","type":"payment_intent.succeeded",
//     "created":…,"data":{"object":{PaymentIntent}}}. Events whose data.object
//     is not a PaymentIntent are valid too (Stripe sends every type an
//     endpoint subscribes to); they are recorded as processed and carry no
//     Payment.
//   - the seed's short form: {"id","type","data":{"payment_intent",
//     "amount_cents","currency","status"}}.
//
// A problem with the input is a *FieldError naming the JSON path of the
// offending field, so a sender can fix its request. The receiver answers it
// with 400; the worker sends such a message to the DLQ at once.
package event

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
)

// Limits on identifiers; they keep keys and rows small and printable.
const (
	MaxIDLength   = 255
	MaxTypeLength = 128
)

// Event is a validated provider event.
type Event struct {
	// ID is the provider's event id (evt_… for Stripe): the dedupe key.
	ID string
	// Type is the provider's event type, e.g. payment_intent.succeeded.
	Type string
	// Created is the time that orders the events of one object: Stripe's
	// event creation time, PayPal's resource update (else create) time;
	// zero when the input has none.
	Created  time.Time
	Livemode bool
	// Object is the provider object the event is about: a Stripe event's
	// data.object ("object" and "id"), a PayPal event's resource
	// (resource_type, resource.id); zero for the short form and the other
	// schemes.
	Object Object
	// Payment is set for events that describe a payment.
	Payment *Payment
	// Digest identifies the event's content, to tell a redelivery of the
	// same event from different content sent under the same id. It covers
	// what a provider never changes between deliveries: for Stripe the type
	// and data (not envelope fields like pending_webhooks, which change on
	// every retry), for the other schemes the whole body.
	Digest [32]byte
}

// Object names a provider object: its type ("payment_intent", "charge")
// and id ("pi_…").
type Object struct {
	Type, ID string
}

// Payment is the business content of a payment event: one payments row.
type Payment struct {
	IntentID    string
	AmountCents int64
	// Currency is a lower-case ISO 4217 code.
	Currency string
	Status   string
}

// FieldError says which field of the input is wrong and how.
type FieldError struct {
	// Field is a JSON path such as "data.object.amount"; "body" for the
	// document as a whole.
	Field   string
	Problem string
}

func (e *FieldError) Error() string { return e.Field + ": " + e.Problem }

type wireEvent struct {
	ID       *string         `json:"id"`
	Type     *string         `json:"type"`
	Created  *int64          `json:"created"`
	Livemode bool            `json:"livemode"`
	Data     json.RawMessage `json:"data"`
}

type wireData struct {
	Object json.RawMessage `json:"object"`

	// The seed's short form.
	PaymentIntent *string `json:"payment_intent"`
	AmountCents   *int64  `json:"amount_cents"`
	Currency      *string `json:"currency"`
	Status        *string `json:"status"`
}

type wireObject struct {
	Object string `json:"object"`
	ID     string `json:"id"`
}

type wirePaymentIntent struct {
	ID       *string `json:"id"`
	Amount   *int64  `json:"amount"`
	Currency *string `json:"currency"`
	Status   *string `json:"status"`
}

// Decode parses and validates body.
func Decode(body []byte) (Event, error) {
	var w wireEvent
	if err := unmarshalBody(body, &w); err != nil {
		return Event{}, err
	}
	var ev Event
	var err error
	if ev.ID, err = requireID("id", w.ID); err != nil {
		return Event{}, err
	}
	if ev.Type, err = requireType(w.Type); err != nil {
		return Event{}, err
	}
	if w.Created != nil {
		if *w.Created < 0 {
			return Event{}, &FieldError{Field: "created", Problem: "must be a non-negative unix time"}
		}
		ev.Created = time.Unix(*w.Created, 0).UTC()
	}
	ev.Livemode = w.Livemode
	if len(w.Data) == 0 || bytes.Equal(w.Data, []byte("null")) {
		return Event{}, &FieldError{Field: "data", Problem: "required object is missing"}
	}
	var data wireData
	if err := json.Unmarshal(w.Data, &data); err != nil {
		return Event{}, jsonProblem("data", err)
	}
	if len(data.Object) > 0 && !bytes.Equal(data.Object, []byte("null")) {
		ev.Object, ev.Payment, err = decodeObject(data.Object)
	} else {
		ev.Payment, err = decodeShort(&data)
	}
	if err != nil {
		return Event{}, err
	}
	ev.Digest = digest(ev.Type, w.Data)
	return ev, nil
}

// digest hashes an event's type and its content.
func digest(typ string, content []byte) [32]byte {
	h := sha256.New()
	h.Write([]byte(typ))
	h.Write([]byte{0})
	h.Write(content)
	var out [32]byte
	h.Sum(out[:0])
	return out
}

func decodeObject(raw json.RawMessage) (Object, *Payment, error) {
	var kind wireObject
	if err := json.Unmarshal(raw, &kind); err != nil {
		return Object{}, nil, jsonProblem("data.object", err)
	}
	obj := Object{Type: kind.Object, ID: kind.ID}
	if len(obj.Type) > MaxTypeLength || !isToken(obj.Type) {
		return Object{}, nil, &FieldError{Field: "data.object.object", Problem: "must contain only letters, digits and _ - . :"}
	}
	if len(obj.ID) > MaxIDLength || !isToken(obj.ID) {
		return Object{}, nil, &FieldError{Field: "data.object.id", Problem: "must contain only letters, digits and _ - . :"}
	}
	if kind.Object != "payment_intent" {
		return obj, nil, nil
	}
	var pi wirePaymentIntent
	if err := json.Unmarshal(raw, &pi); err != nil {
		return Object{}, nil, jsonProblem("data.object", err)
	}
	p, err := newPayment("data.object.", pi.ID, "id", pi.Amount, "amount", pi.Currency, pi.Status)
	return obj, p, err
}

func decodeShort(d *wireData) (*Payment, error) {
	return newPayment("data.", d.PaymentIntent, "payment_intent", d.AmountCents, "amount_cents", d.Currency, d.Status)
}

func newPayment(prefix string, id *string, idField string, amount *int64, amountField string, currency, status *string) (*Payment, error) {
	var p Payment
	var err error
	if p.IntentID, err = requireID(prefix+idField, id); err != nil {
		return nil, err
	}
	if amount == nil {
		return nil, &FieldError{Field: prefix + amountField, Problem: "required integer is missing"}
	}
	if *amount < 0 {
		return nil, &FieldError{Field: prefix + amountField, Problem: "must not be negative"}
	}
	p.AmountCents = *amount
	if currency == nil {
		return nil, &FieldError{Field: prefix + "currency", Problem: "required string is missing"}
	}
	if !isCurrency(*currency) {
		return nil, &FieldError{Field: prefix + "currency", Problem: "must be a three-letter ISO 4217 code"}
	}
	p.Currency = strings.ToLower(*currency)
	if status == nil || *status == "" {
		return nil, &FieldError{Field: prefix + "status", Problem: "required string is missing"}
	}
	if len(*status) > 64 || !isToken(*status) {
		return nil, &FieldError{Field: prefix + "status", Problem: "must be at most 64 characters of letters, digits and _"}
	}
	p.Status = *status
	return &p, nil
}

func requireID(field string, v *string) (string, error) {
	switch {
	case v == nil || *v == "":
		return "", &FieldError{Field: field, Problem: "required string is missing"}
	case len(*v) > MaxIDLength:
		return "", &FieldError{Field: field, Problem: fmt.Sprintf("longer than %d characters", MaxIDLength)}
	case !isToken(*v):
		return "", &FieldError{Field: field, Problem: "must contain only letters, digits and _ - . :"}
	}
	return *v, nil
}

func requireType(v *string) (string, error) {
	switch {
	case v == nil || *v == "":
		return "", &FieldError{Field: "type", Problem: "required string is missing"}
	case len(*v) > MaxTypeLength:
		return "", &FieldError{Field: "type", Problem: fmt.Sprintf("longer than %d characters", MaxTypeLength)}
	case !isToken(*v):
		return "", &FieldError{Field: "type", Problem: "must contain only letters, digits and _ - . :"}
	}
	return *v, nil
}

// isToken reports whether s holds only characters that are safe in a key,
// a log line and a header: ASCII letters, digits and _ - . :
func isToken(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		case c == '_' || c == '-' || c == '.' || c == ':':
		default:
			return false
		}
	}
	return true
}

func isCurrency(s string) bool {
	if len(s) != 3 {
		return false
	}
	for i := 0; i < 3; i++ {
		c := s[i] | 0x20 // fold to lower case
		if c < 'a' || c > 'z' {
			return false
		}
	}
	return true
}

// jsonProblem turns an encoding/json error into a FieldError whose path is
// relative to the document root.
// unmarshalBody decodes a delivery's body into v: an empty body, and JSON
// that does not parse into v, are FieldErrors naming what is wrong.
func unmarshalBody(body []byte, v any) error {
	if len(bytes.TrimSpace(body)) == 0 {
		return &FieldError{Field: "body", Problem: "empty body"}
	}
	if err := json.Unmarshal(body, v); err != nil {
		return jsonProblem("", err)
	}
	return nil
}

func jsonProblem(prefix string, err error) error {
	var typeErr *json.UnmarshalTypeError
	var syntaxErr *json.SyntaxError
	switch {
	case errors.As(err, &typeErr):
		field := typeErr.Field
		if prefix != "" {
			field = strings.TrimSuffix(prefix+"."+field, ".")
		}
		if field == "" {
			field = "body"
			if prefix != "" {
				field = prefix
			}
			return &FieldError{Field: field, Problem: "must be a JSON object"}
		}
		return &FieldError{Field: field, Problem: fmt.Sprintf("must be %s, got %s", jsonKind(typeErr.Type.String()), typeErr.Value)}
	case errors.As(err, &syntaxErr):
		return &FieldError{Field: "body", Problem: fmt.Sprintf("malformed JSON at byte %d: %s", syntaxErr.Offset, syntaxErr.Error())}
	}
	return &FieldError{Field: "body", Problem: "malformed JSON: " + err.Error()}
}

func jsonKind(goType string) string {
	switch strings.TrimPrefix(goType, "*") {
	case "string":
		return "a string"
	case "int64":
		return "an integer"
	case "bool":
		return "a boolean"
	}
	return "an object"
}
