package eventsctl

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/idempotent-events/idempotent-events/pkg/internal/event"
	"github.com/idempotent-events/idempotent-events/pkg/payments"
)

// lifecycleType is what an event of one Stripe type says about the object
// it is about: which object, and the status Stripe reports in it.
type lifecycleType struct {
	object, status string
}

// lifecycleTypes are the event types send -types can make, with the
// status each carries. They are the PaymentIntent and Charge events the
// built-in payment effect keeps state from (pkg/payments); a type whose
// body send cannot make faithfully is not here, rather than sent wrong.
var lifecycleTypes = map[string]lifecycleType{
	"payment_intent.created":                   {payments.PaymentIntent, "requires_payment_method"},
	"payment_intent.requires_action":           {payments.PaymentIntent, "requires_action"},
	"payment_intent.processing":                {payments.PaymentIntent, "processing"},
	"payment_intent.amount_capturable_updated": {payments.PaymentIntent, "requires_capture"},
	"payment_intent.payment_failed":            {payments.PaymentIntent, "requires_payment_method"},
	"payment_intent.succeeded":                 {payments.PaymentIntent, "succeeded"},
	"payment_intent.canceled":                  {payments.PaymentIntent, "canceled"},
	"charge.pending":                           {payments.Charge, "pending"},
	"charge.succeeded":                         {payments.Charge, "succeeded"},
	"charge.captured":                          {payments.Charge, "succeeded"},
	"charge.failed":                            {payments.Charge, "failed"},
	"charge.refunded":                          {payments.Charge, "succeeded"},
}

// knownTypes lists lifecycleTypes, sorted.
func knownTypes() []string {
	var ts []string
	for t := range lifecycleTypes {
		ts = append(ts, t)
	}
	slices.Sort(ts)
	return ts
}

// lifecycleFlags are send's flags for the events of one object.
type lifecycleFlags struct {
	object, types, created string
	step                   time.Duration
	shuffle                bool
}

func (f *lifecycleFlags) register(fs *flag.FlagSet) {
	known := knownTypes()
	var lines []string
	for len(known) > 0 {
		n := min(3, len(known))
		lines, known = append(lines, strings.Join(known[:n], ", ")), known[n:]
	}
	fs.StringVar(&f.types, "types", "", "send one Stripe event per type, in this order, all about one PaymentIntent, comma-separated\n"+
		"(e.g. payment_intent.created,payment_intent.processing,payment_intent.succeeded); the types:\n"+strings.Join(lines, ",\n")+
		"\nfor a PayPal source, one event per type about one capture (each PAYMENT.CAPTURE.REFUNDED refunds an equal share,\n"+
		"the last the rest): "+strings.Join(paypalKnownTypes(), ", "))
	fs.StringVar(&f.object, "object", "", "with -types: the PaymentIntent's id (default: a new random pi_…); charge.* events are about its charge, ch_ and the same suffix;\n"+
		"for a PayPal source: the capture's id (default: a new random one), also for one event")
	fs.StringVar(&f.created, "created", "", "with -types: the created time of the first event, RFC 3339 (default: now; Stripe's resolution is one second)")
	fs.DurationVar(&f.step, "step", time.Second, "with -types: the created time between one event and the next, whole seconds (0: all in one second)")
	fs.BoolVar(&f.shuffle, "shuffle", false, "with -types: post the events (and their -times copies) in a random order; their created times stay those of the list")
}

// start is the time of the first event of the lifecycle, checking -step
// too: whole seconds, as Stripe's created and PayPal's times are.
func (f *lifecycleFlags) start() (time.Time, error) {
	start := time.Now()
	if f.created != "" {
		var err error
		if start, err = time.Parse(time.RFC3339, f.created); err != nil {
			return time.Time{}, fmt.Errorf("-created: want an RFC 3339 time such as 2026-12-07T10:00:00Z, got %q", f.created)
		}
	}
	if f.step < 0 || f.step%time.Second != 0 {
		return time.Time{}, fmt.Errorf("-step: want whole seconds, 0 or more (Stripe's created has one-second resolution), got %s", f.step)
	}
	return start.Truncate(time.Second).UTC(), nil
}

// lifecycleEvent is one event of a lifecycle, ready to sign.
type lifecycleEvent struct {
	id, typ, objectID string
	created           time.Time
	body              []byte
}

// events makes the events the flags describe: one per type, in the order
// given, created step apart from the first, each a Stripe event whose
// data.object is the PaymentIntent (or its charge) as Stripe would show it
// at that point of the list, with amount of currency. Every body is one
// the receiver accepts.
func (f *lifecycleFlags) events(amount int64, currency string, newID func() string) ([]lifecycleEvent, error) {
	var types []string
	for _, t := range strings.Split(f.types, ",") {
		t = strings.TrimSpace(t)
		if _, ok := lifecycleTypes[t]; !ok {
			return nil, fmt.Errorf("-types: unknown event type %q; send makes %s", t, strings.Join(knownTypes(), ", "))
		}
		types = append(types, t)
	}
	start, err := f.start()
	if err != nil {
		return nil, err
	}
	intent := f.object
	if intent == "" {
		intent = newObjectID("pi_")
	}
	if strings.HasPrefix(intent, "ch_") {
		return nil, fmt.Errorf("-object names the PaymentIntent (pi_…), got %q; charge.* types are sent about its charge", intent)
	}
	l := lifecycle{intent: intent, charge: "ch_" + strings.TrimPrefix(intent, "pi_"), start: start, amount: amount,
		currency: currency, manual: slices.Contains(types, "payment_intent.amount_capturable_updated") || slices.Contains(types, "charge.captured")}
	var evs []lifecycleEvent
	for i, typ := range types {
		created := start.Add(time.Duration(i) * f.step)
		object := l.object(typ, created)
		id := newID()
		body, err := json.Marshal(map[string]any{
			"id": id, "object": "event", "api_version": "2024-06-20", "created": created.Unix(),
			"livemode": false, "pending_webhooks": 1, "request": map[string]any{"id": nil, "idempotency_key": nil},
			"type": typ, "data": map[string]any{"object": object},
		})
		if err != nil {
			return nil, fmt.Errorf("encode the %s event: %w", typ, err)
		}
		if _, err := event.Decode(body); err != nil {
			return nil, fmt.Errorf("the %s event would be refused by the receiver (check -object, -amount, -currency): %w", typ, err)
		}
		evs = append(evs, lifecycleEvent{id: id, typ: typ, objectID: object["id"].(string), created: created, body: body})
	}
	return evs, nil
}

// lifecycle is the state of one PaymentIntent and its charge as the
// events of a -types list go by.
type lifecycle struct {
	intent, charge   string
	start            time.Time
	amount           int64
	currency         string
	manual           bool // captured later: amount_capturable_updated or charge.captured in the list
	chargeCreated    time.Time
	captured, refund bool
}

// object is data.object of the event of type typ created at created: the
// PaymentIntent, or its charge for a charge.* type. The fields are those
// Stripe sends that the payment effect reads (status, amounts, captured,
// payment_intent), plus a few that make the body recognisable.
func (l *lifecycle) object(typ string, created time.Time) map[string]any {
	t := lifecycleTypes[typ]
	if t.object == payments.Charge {
		return l.chargeObject(typ, t.status, created)
	}
	var received, capturable int64
	switch t.status {
	case "succeeded":
		received = l.amount
	case "requires_capture":
		capturable = l.amount
	}
	captureMethod := "automatic"
	if l.manual {
		captureMethod = "manual"
	}
	o := map[string]any{
		"id": l.intent, "object": payments.PaymentIntent, "status": t.status, "amount": l.amount,
		"amount_capturable": capturable, "amount_received": received, "currency": l.currency,
		"capture_method": captureMethod, "created": l.start.Unix(), "livemode": false,
	}
	switch typ {
	case "payment_intent.payment_failed":
		o["last_payment_error"] = map[string]any{"type": "card_error", "code": "card_declined", "message": "Your card was declined."}
	case "payment_intent.canceled":
		o["canceled_at"], o["cancellation_reason"] = created.Unix(), "requested_by_customer"
	}
	return o
}

// chargeObject is the charge as a charge.* event shows it. With manual
// capture a charge.succeeded before charge.captured is an authorisation
// (captured false); otherwise a succeeded charge is captured.
func (l *lifecycle) chargeObject(typ, status string, created time.Time) map[string]any {
	if l.chargeCreated.IsZero() {
		l.chargeCreated = created
	}
	switch typ {
	case "charge.succeeded":
		l.captured = l.captured || !l.manual
	case "charge.captured":
		l.captured = true
	case "charge.refunded":
		l.captured, l.refund = true, true
	}
	captured := l.captured && status == "succeeded"
	var amountCaptured, amountRefunded int64
	if captured {
		amountCaptured = l.amount
	}
	if l.refund {
		amountRefunded = l.amount
	}
	o := map[string]any{
		"id": l.charge, "object": payments.Charge, "status": status, "amount": l.amount,
		"amount_captured": amountCaptured, "amount_refunded": amountRefunded, "captured": captured,
		"refunded": l.refund, "paid": status == "succeeded", "currency": l.currency,
		"payment_intent": l.intent, "created": l.chargeCreated.Unix(), "livemode": false,
	}
	if status == "failed" {
		o["failure_code"], o["failure_message"] = "card_declined", "Your card was declined."
	}
	return o
}

// newObjectID returns a random Stripe-like object id with prefix.
func newObjectID(prefix string) string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}
