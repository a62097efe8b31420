package webhook

// Delivery is what a request's headers say about the event it carries,
// before the body is decoded. Providers that put the event's identity in
// the body (Stripe, PayPal) leave EventID and Type empty; the decoder finds
// them there.
type Delivery struct {
	// EventID is the provider's event id when a header carries it
	// (webhook-id, X-GitHub-Delivery): the dedupe id, the same on every
	// retry of the event.
	EventID string
	// Type is the event type when a header carries it (X-GitHub-Event).
	Type string
	// DeliveryID names this one attempt when the provider sends such a
	// header (PayPal's PAYPAL-TRANSMISSION-ID differs on every retry). It
	// is for logs only: it never dedupes, since a retry has another one.
	DeliveryID string
}
