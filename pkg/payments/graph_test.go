package payments

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

func TestTheGuardOrdersByCreatedThenByTheGraph(t *testing.T) {
	g := paymentIntentGraph
	t0 := time.Unix(1_700_000_000, 0)
	t1 := t0.Add(time.Second)
	cases := []struct {
		name      string
		known     bool
		cur, to   string
		curAt, at time.Time
		want      string
	}{
		{"first state of an object", false, "", "processing", time.Time{}, t0, Applied},
		{"a later legal state", true, "requires_payment_method", "succeeded", t0, t1, Applied},
		{"a failed async debit goes back", true, "processing", "requires_payment_method", t0, t1, Applied},
		{"the same state again (a snapshot)", true, "succeeded", "succeeded", t1, t1, Applied},
		{"an older event", true, "succeeded", "processing", t1, t0, Superseded},
		{"a terminal state is never left", true, "succeeded", "processing", t0, t1, IllegalTransition},
		{"canceled is terminal too", true, "canceled", "processing", t0, t1, IllegalTransition},
		{"an unknown state", true, "processing", "teleported", t0, t1, IllegalTransition},
		{"an unknown state on an object never seen", false, "", "teleported", time.Time{}, t0, IllegalTransition},
		{"an older event restating the state", true, "processing", "processing", t1, t0, Superseded},
		{"a newer canceled contradicts succeeded", true, "succeeded", "canceled", t0, t1, NeedsRefresh},
		{"an older succeeded contradicts canceled", true, "canceled", "succeeded", t1, t0, NeedsRefresh},
		{"a newer succeeded contradicts canceled", true, "canceled", "succeeded", t0, t1, NeedsRefresh},
		{"an older canceled contradicts succeeded", true, "succeeded", "canceled", t1, t0, NeedsRefresh},
		{"same second, downstream", true, "requires_payment_method", "succeeded", t0, t0, Applied},
		{"same second, upstream", true, "succeeded", "requires_payment_method", t0, t0, Superseded},
		{"same second, capture after processing", true, "processing", "requires_capture", t0, t0, Applied},
		{"same second, incomparable", true, "processing", "requires_payment_method", t0, t0, NeedsRefresh},
	}
	for _, c := range cases {
		assert.Equal(t, c.want, g.guard(c.known, c.cur, c.curAt, c.to, c.at), c.name)
	}
	assert.Equal(t, Applied, chargeGraph.guard(true, "pending", t0, "succeeded", t0))
	assert.Equal(t, Superseded, chargeGraph.guard(true, "succeeded", t0, "pending", t0))
	assert.Equal(t, NeedsRefresh, chargeGraph.guard(true, "succeeded", t1, "failed", t0), "a charge's terminal states contradict")
}

// Only two different terminal states contradict: every other pair of
// states can follow each other one way or the other.
func TestOnlyTerminalStatesContradict(t *testing.T) {
	for _, g := range []graph{paymentIntentGraph, chargeGraph} {
		for a, next := range g {
			for b := range g {
				want := a != b && len(next) == 0 && len(g[b]) == 0
				assert.Equal(t, want, g.contradicts(a, b), "%s, %s", a, b)
			}
		}
		assert.False(t, g.contradicts("succeeded", "teleported"), "an unknown state contradicts nothing")
	}
}
