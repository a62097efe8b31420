package event

import (
	"encoding/json"
	"strings"
	"time"
)

// Example describes a sample payment event: what `eventsctl send` posts,
// and what tests and harnesses feed the pipeline (through eventtest).
type Example struct {
	ID, Type    string
	AmountCents int64
	Currency    string
	Status      string
	// Short selects the seed's short form instead of a Stripe event.
	Short bool
}

// JSON returns the event as Stripe sends it, a PaymentIntent in
// data.object with the id pi_<ID without evt_>, or in the seed's short form.
func (e Example) JSON() []byte {
	intent := "pi_" + strings.TrimPrefix(e.ID, "evt_")
	var v any
	if e.Short {
		v = map[string]any{
			"id": e.ID, "type": e.Type,
			"data": map[string]any{"payment_intent": intent, "amount_cents": e.AmountCents, "currency": e.Currency, "status": e.Status},
		}
	} else {
		v = map[string]any{
			"id": e.ID, "object": "event", "api_version": "2024-06-20", "created": time.Now().Unix(),
			"livemode": false, "pending_webhooks": 1, "type": e.Type,
			"data": map[string]any{"object": map[string]any{
				"id": intent, "object": "payment_intent",
				"amount": e.AmountCents, "amount_received": e.AmountCents, "currency": e.Currency, "status": e.Status,
			}},
		}
	}
	b, err := json.Marshal(v)
	if err != nil {
		panic(err) // maps of strings and numbers always marshal
	}
	return b
}
