package payments

import (
	"context"
	"encoding/json"
	"fmt"
	"math/big"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idempotent-events/idempotent-events/pkg/effects"
)

// PayPalCapture is the object type of a PayPal capture's state: its
// transitions (effects.Registry.OnTransition(name, PayPalCapture, to, h))
// and its payment_events rows. It is not PayPal's resource_type
// ("capture"): a refund's events change the capture's state too, and an
// object type of its own keeps PayPal's captures apart from any other
// provider's.
const PayPalCapture = "paypal_capture"

// captureGraph is a PayPal capture's legal-transition graph, over the
// statuses of PayPal's Payments v2 capture resource. PENDING is a capture
// under review; a refund moves a completed capture to PARTIALLY_REFUNDED
// or REFUNDED (by the refunded total against the captured amount), a
// reversal (a chargeback PayPal decided for the buyer) to REVERSED. It has
// no cycle, so two events of the same time are always ordered by it,
// unless they contradict (completed and declined: neither follows the
// other).
var captureGraph = graph{
	"PENDING":            {"COMPLETED", "DECLINED", "FAILED"},
	"COMPLETED":          {"PARTIALLY_REFUNDED", "REFUNDED", "REVERSED"},
	"PARTIALLY_REFUNDED": {"REFUNDED", "REVERSED"},
	"REFUNDED":           nil,
	"REVERSED":           nil,
	"DECLINED":           nil,
	"FAILED":             nil,
}

// captureStatus is the graph's name for a capture resource's status:
// PayPal's, upper-cased; DENIED (the status of the v1 API, named by the
// PAYMENT.CAPTURE.DENIED event) is DECLINED.
func captureStatus(s string) string {
	s = strings.ToUpper(strings.TrimSpace(s))
	if s == "DENIED" {
		return "DECLINED"
	}
	return s
}

// wirePayPal is what the built-in effect reads of a PayPal event: a
// capture resource (PAYMENT.CAPTURE.COMPLETED, PENDING, DENIED, DECLINED),
// or a refund resource (PAYMENT.CAPTURE.REFUNDED and REVERSED carry the
// refund, which names its capture in its "up" link).
type wirePayPal struct {
	ResourceType string `json:"resource_type"`
	Resource     struct {
		ID                        string     `json:"id"`
		Status                    string     `json:"status"`
		Amount                    *wireMoney `json:"amount"`
		CustomID                  string     `json:"custom_id"`
		SellerReceivableBreakdown *struct {
			PayPalFee *wireMoney `json:"paypal_fee"`
			NetAmount *wireMoney `json:"net_amount"`
		} `json:"seller_receivable_breakdown"`
		SellerPayableBreakdown *struct {
			TotalRefundedAmount *wireMoney `json:"total_refunded_amount"`
		} `json:"seller_payable_breakdown"`
		SupplementaryData *struct {
			RelatedIDs struct {
				OrderID   string `json:"order_id"`
				CaptureID string `json:"capture_id"`
			} `json:"related_ids"`
		} `json:"supplementary_data"`
		Links []struct {
			Href string `json:"href"`
			Rel  string `json:"rel"`
		} `json:"links"`
	} `json:"resource"`
}

// wireMoney is PayPal's money: a currency and a decimal string in its
// unit ("10.00", "1000" for JPY).
type wireMoney struct {
	CurrencyCode string `json:"currency_code"`
	Value        string `json:"value"`
}

// decimalValue matches PayPal's money values (its API's pattern, without
// the sign: no amount kept here is negative).
var decimalValue = regexp.MustCompile(`^[0-9]{1,32}(\.[0-9]{1,16})?$`)

// value is m's value when it is a decimal PayPal would send, else "".
func (m *wireMoney) value() string {
	if m == nil || !decimalValue.MatchString(m.Value) {
		return ""
	}
	return m.Value
}

// cmpDecimal compares two values value returned.
func cmpDecimal(a, b string) int {
	x, _ := new(big.Rat).SetString(a)
	y, _ := new(big.Rat).SetString(b)
	return x.Cmp(y)
}

// captureObservation is what one PayPal event says about one capture.
type captureObservation struct {
	ev int // index of the event in its batch
	id string
	at time.Time
	// status is a capture resource's own status; refund is set instead for
	// a refund resource (reversal when it is PAYMENT.CAPTURE.REVERSED),
	// whose status for the capture depends on the capture's amount.
	status           string
	refund, reversal bool

	amount, currency, fee, net, refunded string
	orderID, customID                    string
}

// isPayPalCapture reports whether ev is a PayPal capture event the
// built-in effect keeps state from: PAYMENT.CAPTURE.* about a capture or a
// refund, with a time to order it by. The provider's decoder
// (event.DecodePayPal) named the resource its object.
func isPayPalCapture(ev effects.Event) bool {
	return strings.HasPrefix(ev.Type, "PAYMENT.CAPTURE.") && (ev.Object.Type == "capture" || ev.Object.Type == "refund") &&
		ev.Object.ID != "" && !ev.Created.IsZero()
}

// observeCapture returns what the PayPal event ev (the i-th of its batch)
// says about a capture; ok is false when it says nothing a state can be
// kept from (no status, a refund that names no capture or has not
// completed).
func observeCapture(i int, ev effects.Event) (o captureObservation, ok bool, err error) {
	var w wirePayPal
	if err := json.Unmarshal(ev.Raw, &w); err != nil {
		return o, false, effects.Permanent(fmt.Errorf("decode PayPal capture of %s: %w", ev.Key, err))
	}
	r := &w.Resource
	o = captureObservation{ev: i, at: ev.Created}
	if r.SupplementaryData != nil {
		o.orderID = r.SupplementaryData.RelatedIDs.OrderID
	}
	if ev.Object.Type == "capture" {
		o.id, o.status, o.customID = ev.Object.ID, captureStatus(r.Status), r.CustomID
		if r.Amount != nil {
			o.amount, o.currency = r.Amount.value(), strings.ToUpper(r.Amount.CurrencyCode)
		}
		if b := r.SellerReceivableBreakdown; b != nil {
			o.fee, o.net = b.PayPalFee.value(), b.NetAmount.value()
		}
		return o, o.status != "", nil
	}
	// A refund: PAYMENT.CAPTURE.REFUNDED or REVERSED, sent once it is
	// completed.
	if st := strings.ToUpper(r.Status); st != "" && st != "COMPLETED" {
		return o, false, nil
	}
	o.id, o.refund, o.reversal = refundedCapture(&w), true, ev.Type == "PAYMENT.CAPTURE.REVERSED"
	// total_refunded_amount is the capture's refunded total after this
	// refund; without it the refund's own amount is a lower bound of it.
	if b := r.SellerPayableBreakdown; b != nil && b.TotalRefundedAmount.value() != "" {
		o.refunded, o.currency = b.TotalRefundedAmount.value(), strings.ToUpper(b.TotalRefundedAmount.CurrencyCode)
	} else if r.Amount != nil {
		o.refunded, o.currency = r.Amount.value(), strings.ToUpper(r.Amount.CurrencyCode)
	}
	return o, o.id != "", nil
}

// refundedCapture is the id of the capture a refund resource refunds: the
// last segment of its "up" link (…/v2/payments/captures/<id>), else
// supplementary_data.related_ids.capture_id.
func refundedCapture(w *wirePayPal) string {
	for _, l := range w.Resource.Links {
		if !strings.EqualFold(l.Rel, "up") {
			continue
		}
		u, err := url.Parse(l.Href)
		if err != nil {
			continue
		}
		const dir = "/captures/"
		if i := strings.LastIndex(u.Path, dir); i >= 0 {
			if id := u.Path[i+len(dir):]; id != "" && !strings.Contains(id, "/") {
				return id
			}
		}
	}
	if sd := w.Resource.SupplementaryData; sd != nil {
		return sd.RelatedIDs.CaptureID
	}
	return ""
}

// captureState is a capture's row in paypal_captures.
type captureState struct {
	status, eventKey string
	at               time.Time
	needsRefresh     bool

	amount, currency, fee, net string // "" is NULL (unknown)
	refunded                   string
	reversed                   bool
	refundEvent                string
	refundAt                   time.Time
	orderID, customID          string
	dirty                      bool
}

// known reports whether the capture has a state: some event of the capture
// itself has come (refunds alone keep evidence, not a state).
func (s *captureState) known() bool { return s.status != "" }

// decide applies the outcome of an observation of status at at, made by
// event key.
func (s *captureState) decide(outcome, status, key string, at time.Time) {
	switch outcome {
	case Applied:
		s.status, s.eventKey, s.at, s.dirty = status, key, at, true
	case NeedsRefresh:
		s.needsRefresh, s.dirty = true, true
	}
}

// takeCapture takes the amounts and links of a capture resource: those of
// the state's event, or any while the capture's are unknown (they do not
// change over its life, and a refund needs the amount).
func (s *captureState) takeCapture(o captureObservation, applied bool) {
	take := func(dst *string, v string) {
		if v != "" && (applied || *dst == "") {
			*dst = v
		}
	}
	take(&s.amount, o.amount)
	take(&s.currency, o.currency)
	take(&s.fee, o.fee)
	take(&s.net, o.net)
	take(&s.orderID, o.orderID)
	take(&s.customID, o.customID)
	s.dirty = true
}

// takeRefund keeps a refund's evidence: the largest refunded total wins,
// in any order; a reversal stays; the refund event reporting the most
// (the newest, as totals only grow) is the evidence's event.
func (s *captureState) takeRefund(o captureObservation, key string) {
	larger := o.refunded != "" && cmpDecimal(o.refunded, s.refunded) > 0
	if s.refundEvent == "" || o.at.After(s.refundAt) || o.at.Equal(s.refundAt) && larger {
		s.refundEvent, s.refundAt = key, o.at
	}
	if larger {
		s.refunded = o.refunded
	}
	if s.currency == "" {
		s.currency = o.currency
	}
	s.reversed = s.reversed || o.reversal
	s.dirty = true
}

// refundStatus is the capture's status after a refund that brought its
// refunded total to total: REVERSED for a reversal, REFUNDED once the
// total reaches the captured amount, else PARTIALLY_REFUNDED (also while
// the amount is unknown: a capture event without one).
func (s *captureState) refundStatus(reversal bool, total string) string {
	switch {
	case reversal:
		return "REVERSED"
	case s.amount != "" && total != "" && cmpDecimal(total, s.amount) >= 0:
		return "REFUNDED"
	}
	return "PARTIALLY_REFUNDED"
}

// keepCaptures applies the observations of evs to their captures' states,
// in order, writes the states and one payment_events row per observation,
// runs the transition handlers of every change of state, and marks the
// events that described a capture in described. The rules are Stripe's
// (guard), with one addition: a refund of a capture whose state is not
// known yet is evidence, kept on the capture's row and applied under the
// same rules when the capture's first state comes.
func (h *handler) keepCaptures(ctx context.Context, evs []effects.Event, obs []captureObservation, described []bool, tx effects.Tx, out effects.Outbox) error {
	states, err := readCaptures(ctx, tx, obs)
	if err != nil {
		return err
	}
	var records []eventRecord
	var transitions []effects.Transition
	for _, o := range obs {
		s := states[o.id]
		if s == nil {
			s = &captureState{refunded: "0"}
			states[o.id] = s
		}
		key := evs[o.ev].Key
		from := s.status
		var status, outcome string
		switch {
		case o.refund && s.known():
			s.takeRefund(o, key)
			status = s.refundStatus(o.reversal, o.refunded)
			outcome = captureGraph.guard(true, s.status, s.at, status, o.at)
			s.decide(outcome, status, key, o.at)
		case o.refund:
			// Whether this is a partial or a full refund depends on the
			// captured amount, which only the capture's events carry.
			s.takeRefund(o, key)
			outcome = Applied
			if o.reversal {
				status = "REVERSED"
			}
		default:
			status = o.status
			outcome = captureGraph.guard(s.known(), s.status, s.at, status, o.at)
			if captureGraph.knows(status) {
				s.takeCapture(o, outcome == Applied)
			}
			s.decide(outcome, status, key, o.at)
			if outcome == Applied && from == "" && s.refundEvent != "" {
				r := s.refundStatus(s.reversed, s.refunded)
				s.decide(captureGraph.guard(true, s.status, s.at, r, s.refundAt), r, s.refundEvent, s.refundAt)
			}
		}
		if s.status != from {
			transitions = append(transitions, effects.Transition{Object: effects.Object{Type: PayPalCapture, ID: o.id},
				From: from, To: s.status, Event: evs[o.ev]})
		}
		described[o.ev] = true
		records = append(records, eventRecord{key: key, kind: PayPalCapture, id: o.id, eventType: evs[o.ev].Type,
			status: status, outcome: outcome, from: from, at: o.at})
	}
	if err := writeCaptures(ctx, tx, states, records); err != nil {
		return err
	}
	for _, t := range transitions {
		if err := h.reg.Transition(ctx, t, tx, out); err != nil {
			return err
		}
	}
	return nil
}

// readCapturesSQL reads the captures asked for; planned for its values
// every time, as readStates is (a generic plan made on a nearly empty
// table stays a sequential scan).
const readCapturesSQL = `
SELECT id, status, status_event_id, status_created, needs_refresh, amount::text, currency, paypal_fee::text,
	net_amount::text, amount_refunded::text, reversed, refund_event_id, refund_created, order_id, custom_id
FROM paypal_captures WHERE id = ANY($1)`

// readCaptures locks the captures obs name, in the order every
// transaction takes them (after any Stripe object of the same
// transaction, so the two never wait on each other in a cycle), and reads
// their states.
func readCaptures(ctx context.Context, tx effects.Tx, obs []captureObservation) (map[string]*captureState, error) {
	kinds, ids := make([]string, len(obs)), make([]string, len(obs))
	for i, o := range obs {
		kinds[i], ids[i] = PayPalCapture, o.id
	}
	b := &pgx.Batch{}
	b.Queue(lockObjects, kinds, ids)
	b.Queue("SET LOCAL plan_cache_mode = force_custom_plan")
	b.Queue(readCapturesSQL, ids)
	b.Queue("SET LOCAL plan_cache_mode TO DEFAULT")
	br := tx.SendBatch(ctx, b)
	states, err := readCapturesOf(br)
	if cerr := br.Close(); err == nil && cerr != nil {
		err = fmt.Errorf("read PayPal captures: %w", cerr)
	}
	return states, err
}

func readCapturesOf(br pgx.BatchResults) (map[string]*captureState, error) {
	if _, err := br.Exec(); err != nil {
		return nil, fmt.Errorf("lock PayPal captures: %w", err)
	}
	if _, err := br.Exec(); err != nil {
		return nil, fmt.Errorf("read PayPal captures: %w", err)
	}
	rows, err := br.Query()
	if err != nil {
		return nil, fmt.Errorf("read PayPal captures: %w", err)
	}
	states := map[string]*captureState{}
	var id string
	var at, refundAt *time.Time
	var amount, fee, net *string
	var s captureState
	_, err = pgx.ForEachRow(rows, []any{&id, &s.status, &s.eventKey, &at, &s.needsRefresh, &amount, &s.currency, &fee,
		&net, &s.refunded, &s.reversed, &s.refundEvent, &refundAt, &s.orderID, &s.customID}, func() error {
		st := s
		st.at, st.refundAt = deref(at), deref(refundAt)
		st.amount, st.fee, st.net = deref(amount), deref(fee), deref(net)
		states[id] = &st
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("read PayPal captures: %w", err)
	}
	if _, err := br.Exec(); err != nil {
		return nil, fmt.Errorf("read PayPal captures: %w", err)
	}
	return states, nil
}

func deref[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}

// nullable is v, or NULL for its zero value.
func nullable[T comparable](v T) *T {
	var zero T
	if v == zero {
		return nil
	}
	return &v
}

// writeCapturesSQL writes the changed captures and the event records in
// one statement.
const writeCapturesSQL = `
WITH c AS (
	INSERT INTO paypal_captures AS c (id, status, status_event_id, status_created, needs_refresh, amount, currency,
		paypal_fee, net_amount, amount_refunded, reversed, refund_event_id, refund_created, order_id, custom_id)
	SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::timestamptz[], $5::bool[], $6::numeric[], $7::text[],
		$8::numeric[], $9::numeric[], $10::numeric[], $11::bool[], $12::text[], $13::timestamptz[], $14::text[], $15::text[])
	ON CONFLICT (id) DO UPDATE SET status = excluded.status, status_event_id = excluded.status_event_id,
		status_created = excluded.status_created, needs_refresh = excluded.needs_refresh, amount = excluded.amount,
		currency = excluded.currency, paypal_fee = excluded.paypal_fee, net_amount = excluded.net_amount,
		amount_refunded = excluded.amount_refunded, reversed = excluded.reversed, refund_event_id = excluded.refund_event_id,
		refund_created = excluded.refund_created, order_id = excluded.order_id, custom_id = excluded.custom_id, updated_at = now()
)
INSERT INTO payment_events (event_id, object_type, object_id, event_type, event_created, status, outcome, from_status)
SELECT * FROM unnest($16::text[], $17::text[], $18::text[], $19::text[], $20::timestamptz[], $21::text[], $22::text[], $23::text[])`

func writeCaptures(ctx context.Context, tx effects.Tx, states map[string]*captureState, records []eventRecord) error {
	var ids []string
	for id, s := range states {
		if s.dirty {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	n := len(ids)
	statuses, events, currencies, refundEvents, orders, customs := make([]string, n), make([]string, n), make([]string, n),
		make([]string, n), make([]string, n), make([]string, n)
	at, refundAt := make([]*time.Time, n), make([]*time.Time, n)
	amounts, fees, nets, refunded := make([]*string, n), make([]*string, n), make([]*string, n), make([]string, n)
	refresh, reversed := make([]bool, n), make([]bool, n)
	for i, id := range ids {
		s := states[id]
		statuses[i], events[i], currencies[i], refundEvents[i], orders[i], customs[i] = s.status, s.eventKey, s.currency, s.refundEvent, s.orderID, s.customID
		at[i], refundAt[i] = nullable(s.at), nullable(s.refundAt)
		amounts[i], fees[i], nets[i], refunded[i] = nullable(s.amount), nullable(s.fee), nullable(s.net), s.refunded
		refresh[i], reversed[i] = s.needsRefresh, s.reversed
	}
	m := len(records)
	ek, kinds, oids, types, rstatuses, outcomes, froms := make([]string, m), make([]string, m), make([]string, m),
		make([]string, m), make([]string, m), make([]string, m), make([]string, m)
	created := make([]time.Time, m)
	for i, r := range records {
		ek[i], kinds[i], oids[i], types[i], rstatuses[i], outcomes[i], froms[i], created[i] = r.key, r.kind, r.id, r.eventType, r.status, r.outcome, r.from, r.at
	}
	if _, err := tx.Exec(ctx, writeCapturesSQL, ids, statuses, events, at, refresh, amounts, currencies, fees, nets, refunded,
		reversed, refundEvents, refundAt, orders, customs, ek, kinds, oids, types, created, rstatuses, outcomes, froms); err != nil {
		return fmt.Errorf("write PayPal captures: %w", err)
	}
	return nil
}
