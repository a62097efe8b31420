package payments

import "time"

// graph is the legal-transition graph of one object type: which states an
// object may move to from each state. A state with no way out is terminal.
type graph map[string][]string

// PaymentIntent states and the moves Stripe makes between them. Status is
// not a monotonic rank: processing -> requires_payment_method is a failed
// asynchronous debit, after which the customer may try again.
var paymentIntentGraph = graph{
	"requires_payment_method": {"requires_confirmation", "requires_action", "processing", "requires_capture", "succeeded", "canceled"},
	"requires_confirmation":   {"requires_payment_method", "requires_action", "processing", "requires_capture", "succeeded", "canceled"},
	"requires_action":         {"requires_payment_method", "processing", "requires_capture", "succeeded", "canceled"},
	"processing":              {"requires_payment_method", "requires_action", "requires_capture", "succeeded", "canceled"},
	"requires_capture":        {"succeeded", "canceled"},
	"succeeded":               nil,
	"canceled":                nil,
}

// Charge states. A refund does not change a charge's status; its
// amount_refunded grows.
var chargeGraph = graph{
	"pending":   {"succeeded", "failed"},
	"succeeded": nil,
	"failed":    nil,
}

// reaches reports whether to can be reached from from in one move or more.
func (g graph) reaches(from, to string) bool {
	seen := map[string]bool{}
	next := []string{from}
	for len(next) > 0 {
		s := next[0]
		next = next[1:]
		for _, t := range g[s] {
			if t == to {
				return true
			}
			if !seen[t] {
				seen[t] = true
				next = append(next, t)
			}
		}
	}
	return false
}

// knows reports whether s is a state of the graph.
func (g graph) knows(s string) bool {
	_, ok := g[s]
	return ok
}

// Outcomes of an event for its object's state, one row each in
// payment_events.
const (
	// Applied: the event's state became the object's current state (or
	// was it already).
	Applied = "applied"
	// Superseded: the object's state is newer than the event's.
	Superseded = "superseded"
	// IllegalTransition: the event's state cannot follow the object's
	// current state (a terminal state left, an unknown state).
	IllegalTransition = "illegal_transition"
	// NeedsRefresh: the event is as new as the object's state (the same
	// second) and neither state can be told to come after the other; the
	// object's state stays, and is marked to be fetched from the provider.
	NeedsRefresh = "needs_refresh"
)

// guard decides what an event that saw the object in state to at time at
// does to an object now in state cur since curAt (known: whether the
// object has a state yet). Order is by the event's created time; within
// one second (Stripe's resolution, and one operation emits several events
// in the same second) a state applies only if it comes after the current
// one in the graph. Event ids are not ordered and are never used.
func (g graph) guard(known bool, cur string, curAt time.Time, to string, at time.Time) string {
	switch {
	case !g.knows(to):
		return IllegalTransition
	case !known:
		return Applied
	case at.Before(curAt):
		return Superseded
	case to == cur:
		return Applied
	case at.After(curAt):
		if g.reaches(cur, to) {
			return Applied
		}
		return IllegalTransition
	}
	// The same second: only an order in the graph can tell.
	fwd, back := g.reaches(cur, to), g.reaches(to, cur)
	switch {
	case fwd && !back:
		return Applied
	case back && !fwd:
		return Superseded
	}
	return NeedsRefresh
}
