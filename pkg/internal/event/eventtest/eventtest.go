// Package eventtest builds the events tests and harnesses feed the
// pipeline. It is for tests only: no product package imports it.
package eventtest

import "github.com/idempotent-events/idempotent-events/pkg/internal/event"

// Option changes the event Payment builds.
type Option func(*event.Example)

// Amount sets the amount in cents.
func Amount(cents int64) Option { return func(e *event.Example) { e.AmountCents = cents } }

// Payment returns a payment_intent.succeeded event with id as Stripe sends
// it: 2500 usd, status succeeded, unless opts say otherwise.
func Payment(id string, opts ...Option) []byte {
	e := event.Example{ID: id, Type: "payment_intent.succeeded", AmountCents: 2500, Currency: "usd", Status: "succeeded"}
	for _, o := range opts {
		o(&e)
	}
	return e.JSON()
}
