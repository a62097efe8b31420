// Package payments is the built-in payment effect of idempotent-events,
// written on the public effects API: what the stock worker runs, and the
// example of a handler.
//
// For every event that describes a payment (a Stripe event about a
// PaymentIntent, or a delivery in the seed's short form) it writes one row
// of the payments table, in the event's transaction.
package payments

import (
	"context"

	"github.com/idempotent-events/idempotent-events/pkg/effects"
)

// Effects returns a Registry with the built-in payment effect registered,
// for every source and event type; a worker binary adds its own handlers
// to it.
func Effects() *effects.Registry {
	reg := effects.NewRegistry()
	Register(reg)
	return reg
}

// Register adds the built-in payment effect to reg.
func Register(reg *effects.Registry) {
	reg.Handle("*", "*", &handler{reg: reg})
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

// HandleBatch implements effects.BatchHandler: the payments rows of the
// whole batch in one statement.
func (h *handler) HandleBatch(ctx context.Context, evs []effects.Event, tx effects.Tx, _ effects.Outbox) ([]bool, error) {
	var rows []paymentRow
	skipped := make([]bool, len(evs))
	for i, ev := range evs {
		r, ok, err := paymentOf(ev)
		if err != nil {
			return nil, err
		}
		if ok {
			rows = append(rows, r)
		} else {
			skipped[i] = true
		}
	}
	return skipped, writePayments(ctx, tx, rows)
}
