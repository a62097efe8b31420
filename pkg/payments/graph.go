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

// contradicts reports whether a and b are known states of which neither
// can ever follow the other: two different terminal states (a
// PaymentIntent's succeeded and canceled, a Charge's succeeded and
// failed). Evidence of both says the object ended two ways, so one of the
// two is wrong, and no created time can tell which: no order of them is
// legal.
func (g graph) contradicts(a, b string) bool {
	return a != b && g.knows(a) && g.knows(b) && !g.reaches(a, b) && !g.reaches(b, a)
}

// Outcomes of an event for its object's state, one row each in
// payment_events.
const (
	// Applied: the event's state became the object's current state (or
	// was it already).
	Applied = "applied"
	// Superseded: the object's state is newer than the event's.
	Superseded = "superseded"
	// IllegalTransition: the event is newer than the object's state but
	// its state cannot follow it (a terminal state left for an earlier
	// one), or its state is unknown (on any object, even one never seen).
	IllegalTransition = "illegal_transition"
	// NeedsRefresh: neither the event's state nor the object's can be
	// told to come after the other: of the same second and not ordered by
	// the graph, or, at any age, contradictory (see graph.contradicts).
	// The object's state stays, and is marked to be fetched from the
	// provider.
	NeedsRefresh = "needs_refresh"
)

// guard decides what an event that saw the object in state to at time at
// does to an object now in state cur since curAt (known: whether the
// object has a state yet). Order is by the event's created time; within
// one second (Stripe's resolution, and one operation emits several events
// in the same second) a state applies only if it comes after the current
// one in the graph. Event ids are not ordered and are never used.
//
// Contradictory states are decided before age: were an older success
// superseded by a newer cancellation (or a newer success refused after a
// cancellation), the object would keep the state taken first with nothing
// saying it may be wrong, and "payment succeeded" would never run for a
// payment whose charge was captured. Marked, it is fetched from the
// provider, whose answer is applied as any refresh is.
func (g graph) guard(known bool, cur string, curAt time.Time, to string, at time.Time) string {
	switch {
	case !g.knows(to):
		return IllegalTransition
	case !known:
		return Applied
	case g.contradicts(cur, to):
		return NeedsRefresh
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
