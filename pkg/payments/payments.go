// Package payments is the built-in payment effect of idempotent-events,
// written on the public effects API: what the stock worker runs, and the
// example of a handler. Everything it writes is in the event's transaction.
//
// For every event that describes a payment (a Stripe event about a
// PaymentIntent, or a delivery in the seed's short form) it writes one row
// of the payments table, as it always has.
//
// It also keeps the current state of every PaymentIntent and Charge it
// hears of (tables payment_intents and charges), correct whatever order
// Stripe's events arrive in, and records how it took each event in
// payment_events:
//
//   - An event older than the object's state is superseded, even when it
//     restates the current status: age is looked at first. Age is the
//     event's created time, which has one-second resolution. An event of
//     the same second or newer restating the status is applied: it
//     becomes the state's event, and no transition runs.
//   - Within the same second (one operation emits several events in it) an
//     event's state applies only if it comes after the current one in the
//     object's legal-transition graph; two states of the same second that
//     cannot be ordered (processing and requires_payment_method follow each
//     other both ways) leave the state as it is and mark the object
//     needs_refresh, to be fetched from Stripe. Event ids are never used to
//     order events: they are not ordered.
//   - Two different terminal states of one object (a PaymentIntent's
//     succeeded and canceled, a Charge's succeeded and failed) contradict
//     each other at any age: Stripe leaves neither, so one of them is
//     wrong. The state taken first stays, the other's events are recorded
//     needs_refresh and the object is marked, never superseded or refused
//     silently. No event moves an object out of a terminal state; only
//     the refresh, Stripe's own answer, does.
//   - A newer event whose state cannot follow the current one (a terminal
//     state left for an earlier one) is an illegal_transition, recorded and
//     not applied.
//   - A status the graph does not know is an illegal_transition, even on
//     an object never seen (which then gets no row: the first known status
//     that comes is its first state, whatever its time), and its amounts
//     are not taken.
//   - Cumulative amounts (amount_received, amount_captured,
//     amount_refunded) are snapshots: the largest reported wins, in any
//     order; a PaymentIntent's amount_refunded is the sum of its charges'.
//   - A succeeded, captured charge that names its PaymentIntent is that
//     PaymentIntent's succeeded state at the charge event's created time,
//     under the rules above, and its amount_captured a snapshot of the
//     PaymentIntent's amount_received. The charge event is recorded once,
//     for the charge. An uncaptured charge says nothing of its
//     PaymentIntent.
//
// Every change of an object's state runs the transition handlers of the
// Registry (effects.Registry.OnTransition) once: "payment succeeded" runs
// once per PaymentIntent even when payment_intent.succeeded and
// charge.succeeded both say so. A success contradicting a cancellation
// taken first runs it when the refresh confirms the success (from
// canceled): with no reconciliation running, the object stays marked.
//
// PayPal captures (PAYMENT.CAPTURE.* events, object type PayPalCapture)
// are kept in paypal_captures under the same rules, ordered by the
// resource's update time over their own graph (captureGraph): PENDING,
// COMPLETED, DECLINED, PARTIALLY_REFUNDED, REFUNDED, REVERSED. PayPal
// sends a refund (and a reversal) as a refund resource naming its capture
// in its "up" link; its total_refunded_amount against the captured amount
// says partially refunded or refunded. A refund that comes before any
// event of its capture is kept as evidence on the capture's row (its
// status cannot be told without the captured amount) and applied, under
// the same rules, when the capture's first state comes. PayPal events
// write no payments row.
package payments

import (
	"context"

	"github.com/idempotent-events/idempotent-events/pkg/effects"
)

// RefreshType is the type of the event the reconciler makes of an object
// marked needs_refresh, after fetching it from Stripe: data.object is the
// object as Stripe returned it, created the time it was fetched. Its state
// is applied as the object's latest (unless an event created after the
// fetch is already applied), the mark is cleared, and a changed state runs
// the transition handlers as any other change does. It writes no payments
// row, and handlers registered for Stripe's own event types never see it.
const RefreshType = "idempotent_events.object_refreshed"

// Effects returns a Registry with the built-in payment effect registered,
// for every source and event type; a worker binary adds its own handlers
// to it.
func Effects() *effects.Registry {
	reg := effects.NewRegistry()
	Register(reg)
	return reg
}

// HandlerName is the name of the built-in payment effect in a Registry.
const HandlerName = "payments"

// Register adds the built-in payment effect to reg, named HandlerName.
func Register(reg *effects.Registry) {
	reg.Handle(HandlerName, "*", "*", &handler{reg: reg})
}

type handler struct {
	reg *effects.Registry
}

// Handle implements effects.Handler.
func (h *handler) Handle(ctx context.Context, ev effects.Event, tx effects.Tx, out effects.Outbox) error {
	skipped, err := h.HandleBatch(ctx, []effects.Event{ev}, tx, out)
	if err == nil && skipped[0] {
		return effects.Skip("no payment in the event")
	}
	return err
}

// HandleBatch implements effects.BatchHandler. Each body is decoded once;
// a batch without objects to keep is one statement (the payments rows),
// any other three whatever its size (lock, read, write), and three more
// when it has both Stripe objects and PayPal captures.
func (h *handler) HandleBatch(ctx context.Context, evs []effects.Event, tx effects.Tx, out effects.Outbox) ([]bool, error) {
	var rows []paymentRow
	var obs []observation
	var captures []captureObservation
	paid := make([]bool, len(evs))
	for i, ev := range evs {
		if isPayPalCapture(ev) {
			o, ok, err := observeCapture(i, ev)
			if err != nil {
				return nil, err
			}
			if ok {
				captures = append(captures, o)
			}
			continue
		}
		r, ok, o, err := decode(i, ev)
		if err != nil {
			return nil, err
		}
		if ok {
			rows, paid[i] = append(rows, r), true
		}
		obs = append(obs, o...)
	}
	skipped := make([]bool, len(evs))
	if len(obs) == 0 && len(captures) == 0 {
		for i := range skipped {
			skipped[i] = !paid[i]
		}
		return skipped, writePayments(ctx, tx, rows)
	}
	described := make([]bool, len(evs))
	if len(obs) > 0 {
		var err error
		if described, err = h.keep(ctx, evs, obs, rows, tx, out); err != nil {
			return nil, err
		}
	} else if err := writePayments(ctx, tx, rows); err != nil {
		return nil, err
	}
	// PayPal's captures after Stripe's objects, in every transaction: two
	// transactions never wait for each other's object locks in a cycle.
	if len(captures) > 0 {
		if err := h.keepCaptures(ctx, evs, captures, described, tx, out); err != nil {
			return nil, err
		}
	}
	for i := range skipped {
		skipped[i] = !paid[i] && !described[i]
	}
	return skipped, nil
}
