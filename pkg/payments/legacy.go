package payments

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/idempotent-events/idempotent-events/pkg/effects"
)

// paymentRow is one row of the payments table: the business content of an
// event that describes a payment, one row per event (unique on event_id).
type paymentRow struct {
	eventID, intentID, eventType, currency, status string
	amount                                         int64
	livemode                                       bool
	created                                        *time.Time
}

// wireEvent is what the built-in effect reads of an event's body, decoded
// once for the payments row and the object's state.
type wireEvent struct {
	Livemode bool `json:"livemode"`
	Data     struct {
		Object *wireObject `json:"object"`
		// The seed's short form.
		PaymentIntent *string `json:"payment_intent"`
		AmountCents   *int64  `json:"amount_cents"`
		Currency      *string `json:"currency"`
		Status        *string `json:"status"`
	} `json:"data"`
}

type wireObject struct {
	Object         string  `json:"object"`
	ID             string  `json:"id"`
	Status         *string `json:"status"`
	Amount         *int64  `json:"amount"`
	AmountReceived int64   `json:"amount_received"`
	AmountCaptured int64   `json:"amount_captured"`
	AmountRefunded int64   `json:"amount_refunded"`
	Captured       bool    `json:"captured"`
	Currency       *string `json:"currency"`
	PaymentIntent  *string `json:"payment_intent"`
}

// decode reads the body of ev (the i-th of its batch) once: its payments
// row (ok false when it describes no payment: a Stripe event about a
// PaymentIntent, or a delivery in the seed's short form, from any source)
// and what it says about the objects whose state is kept.
func decode(i int, ev effects.Event) (row paymentRow, ok bool, obs []observation, err error) {
	var w wireEvent
	if err := json.Unmarshal(ev.Raw, &w); err != nil {
		return paymentRow{}, false, nil, effects.Permanent(fmt.Errorf("decode payment of %s: %w", ev.Key, err))
	}
	if ev.Type == RefreshType {
		// The object as the provider has it now, not a payment event: no
		// payments row.
		return paymentRow{}, false, observe(i, ev, &w), nil
	}
	row, ok = paymentOf(ev, &w)
	return row, ok, observe(i, ev, &w), nil
}

// paymentOf is the payments row of ev; the worker validated the shape
// before.
func paymentOf(ev effects.Event, w *wireEvent) (paymentRow, bool) {
	r := paymentRow{eventID: ev.Key, eventType: ev.Type, livemode: w.Livemode}
	if !ev.Created.IsZero() {
		c := ev.Created
		r.created = &c
	}
	d := w.Data
	switch {
	case d.Object != nil:
		o := d.Object
		if o.Object != PaymentIntent || o.Amount == nil || o.Currency == nil || o.Status == nil {
			return paymentRow{}, false
		}
		r.intentID, r.amount, r.currency, r.status = o.ID, *o.Amount, *o.Currency, *o.Status
	case d.PaymentIntent != nil && d.AmountCents != nil && d.Currency != nil && d.Status != nil:
		r.intentID, r.amount, r.currency, r.status = *d.PaymentIntent, *d.AmountCents, *d.Currency, *d.Status
	default:
		return paymentRow{}, false
	}
	r.currency = strings.ToLower(r.currency)
	return r, true
}

// insertPayments writes the payments rows of rows in one statement, in
// event_id order (two transactions that share events lock them in the same
// order).
const insertPayments = `
INSERT INTO payments (event_id, payment_intent_id, event_type, amount_cents, currency, status, livemode, event_created_at)
SELECT p.* FROM unnest($1::text[], $2::text[], $3::text[], $4::bigint[], $5::text[], $6::text[], $7::bool[], $8::timestamptz[])
	AS p(event_id, payment_intent_id, event_type, amount_cents, currency, status, livemode, event_created_at)
ORDER BY 1`

func writePayments(ctx context.Context, tx effects.Tx, rows []paymentRow) error {
	if len(rows) == 0 {
		return nil
	}
	if _, err := tx.Exec(ctx, insertPayments, paymentColumns(rows)...); err != nil {
		return fmt.Errorf("insert %d payments rows: %w", len(rows), err)
	}
	return nil
}

// paymentColumns are the arguments of insertPayments for rows.
func paymentColumns(rows []paymentRow) []any {
	n := len(rows)
	ids, intents, types, currencies, statuses := make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n)
	amounts, livemodes, created := make([]int64, n), make([]bool, n), make([]*time.Time, n)
	for i, r := range rows {
		ids[i], intents[i], types[i], currencies[i], statuses[i] = r.eventID, r.intentID, r.eventType, r.currency, r.status
		amounts[i], livemodes[i], created[i] = r.amount, r.livemode, r.created
	}
	return []any{ids, intents, types, amounts, currencies, statuses, livemodes, created}
}
