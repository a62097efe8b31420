package payments_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"sort"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotent-events/idempotent-events/pkg/internal/config"
	"github.com/idempotent-events/idempotent-events/pkg/internal/pipelinetest"
	"github.com/idempotent-events/idempotent-events/pkg/payments"
)

// step is one event of a payment's life as Stripe sends it: its type, the
// object it carries, and its created time in seconds from the start.
type step struct {
	typ string
	obj map[string]any
	at  int64
}

func pi(status string, received int64) map[string]any {
	return map[string]any{"object": "payment_intent", "status": status, "amount": 2000, "amount_received": received, "currency": "usd"}
}

func charge(status string, captured bool, refunded int64) map[string]any {
	c := map[string]any{"object": "charge", "status": status, "amount": 2000, "captured": captured, "amount_refunded": refunded, "currency": "usd"}
	if captured {
		c["amount_captured"] = int64(2000)
	}
	return c
}

// lifecycles are the payments of the ordering tests, each in the order
// Stripe creates its events (created times in seconds; several share one).
var lifecycles = map[string][]step{
	"card": {
		{"payment_intent.created", pi("requires_payment_method", 0), 0},
		{"charge.succeeded", charge("succeeded", true, 0), 1},
		{"payment_intent.succeeded", pi("succeeded", 2000), 1},
	},
	"3ds": {
		{"payment_intent.created", pi("requires_payment_method", 0), 0},
		{"payment_intent.requires_action", pi("requires_action", 0), 1},
		{"payment_intent.succeeded", pi("succeeded", 2000), 4},
		{"charge.succeeded", charge("succeeded", true, 0), 4},
	},
	"async-debit": {
		{"payment_intent.created", pi("requires_payment_method", 0), 0},
		{"payment_intent.processing", pi("processing", 0), 1},
		{"payment_intent.succeeded", pi("succeeded", 2000), 30},
	},
	"failed-debit-then-retry": {
		{"payment_intent.created", pi("requires_payment_method", 0), 0},
		{"payment_intent.processing", pi("processing", 0), 1},
		{"payment_intent.payment_failed", pi("requires_payment_method", 0), 20},
		{"payment_intent.processing", pi("processing", 0), 40},
		{"payment_intent.succeeded", pi("succeeded", 2000), 70},
	},
	"canceled": {
		{"payment_intent.created", pi("requires_payment_method", 0), 0},
		{"payment_intent.canceled", pi("canceled", 0), 5},
	},
	"two-partial-refunds": {
		{"payment_intent.created", pi("requires_payment_method", 0), 0},
		{"payment_intent.succeeded", pi("succeeded", 2000), 1},
		{"charge.succeeded", charge("succeeded", true, 0), 1},
		{"charge.refunded", charge("succeeded", true, 500), 50},
		{"charge.refunded", charge("succeeded", true, 1200), 90},
	},
}

const epoch = 1_760_000_000

// events returns the bodies of lifecycle name for one payment (ids carry
// tag), created times as given, or all equal with sameSecond.
func events(t *testing.T, name, tag string, sameSecond bool) [][]byte {
	t.Helper()
	piID, chID := "pi_"+tag, "ch_"+tag
	var out [][]byte
	for i, s := range lifecycles[name] {
		obj := map[string]any{}
		for k, v := range s.obj {
			obj[k] = v
		}
		if obj["object"] == "charge" {
			obj["id"], obj["payment_intent"] = chID, piID
		} else {
			obj["id"] = piID
		}
		at := epoch + s.at
		if sameSecond {
			at = epoch
		}
		b, err := json.Marshal(map[string]any{"id": fmt.Sprintf("evt_%s_%d", tag, i), "object": "event", "type": s.typ,
			"created": at, "livemode": false, "data": map[string]any{"object": obj}})
		require.NoError(t, err)
		out = append(out, b)
	}
	return out
}

// objectRow is the state payments keeps of one object.
type objectRow struct {
	Status             string
	Received, Refunded int64
	NeedsRefresh       bool
	Succeeded          int
	Recorded           int
}

// transition is one run of the transition handlers: an object's state
// from, and to.
type transition struct{ From, To string }

// The built-in payment state under reordering, on the real worker and
// Postgres. Every lifecycle is run once in order (each event committed
// before the next is sent), then many times shuffled, with random
// duplicate deliveries, all at once through a concurrent worker:
//   - every shuffled payment ends in the in-order payment's state
//     (status, cumulative amounts as snapshots, no needs_refresh);
//   - its terminal transition (succeeded, canceled) fired exactly once;
//   - every transition of its PaymentIntent and its Charge fired at most
//     once, in the in-order run's order (a shuffle that brings a later
//     event first skips the states between: they are superseded, and
//     their transitions never fire);
//   - every event is recorded with its outcome, once.
//
// Then the same with every created time equal: a pair of states that
// cannot be ordered is recorded as needs_refresh, no payment ends in a
// wrong state without being marked needs_refresh, and no transition fires
// twice.
func TestOrderSafeStateUnderShuffles(t *testing.T) {
	shuffles := 1000
	if testing.Short() {
		shuffles = 40
	}
	p := statePipeline(t, func(c *config.Worker) { c.Prefetch, c.BatchSize, c.Concurrency = 256, 64, 4 })
	ctx := context.Background()

	// In order: one event at a time, each committed before the next.
	for name := range lifecycles {
		for _, b := range events(t, name, "inorder_"+name, false) {
			var ev struct{ ID string }
			require.NoError(t, json.Unmarshal(b, &ev))
			p.PublishAll([][]byte{b})
			p.Eventually(func() bool { _, l := p.Rows(ev.ID); return l == 1 }, "in-order event %s committed", ev.ID)
		}
	}

	// Shuffled, with duplicates, all lifecycles interleaved.
	rng := rand.New(rand.NewPCG(20261206, 1))
	var all [][]byte
	unique := 0
	for _, same := range []bool{false, true} {
		for name := range lifecycles {
			for k := 0; k < shuffles; k++ {
				evs := events(t, name, tag(name, k, same), same)
				unique += len(evs)
				for _, b := range evs {
					all = append(all, b)
					if rng.IntN(4) == 0 {
						all = append(all, b) // a duplicate delivery
					}
				}
			}
		}
	}
	rng.Shuffle(len(all), func(i, j int) { all[i], all[j] = all[j], all[i] })
	start := time.Now()
	p.PublishAll(all)
	require.Eventually(t, func() bool { return p.LedgerRows() == unique+inOrderCount() }, 5*time.Minute, 100*time.Millisecond,
		"every shuffled event committed once")
	t.Logf("%d deliveries of %d events in %s", len(all), unique, time.Since(start).Round(time.Millisecond))
	p.Invariant()

	byTag := states(t, p)
	state := func(tag string) objectRow {
		r, ok := byTag[tag]
		require.True(t, ok, "no PaymentIntent pi_%s", tag)
		return r
	}
	logged, chargeStatus := transitionLog(t, p), chargeStates(t, p)
	skipped := 0
	for name, steps := range lifecycles {
		inOrder := state("inorder_" + name)
		require.Equal(t, len(steps), inOrder.Recorded, "%s in order: every event recorded", name)
		require.False(t, inOrder.NeedsRefresh, "%s in order", name)
		require.Equal(t, 1, inOrder.Succeeded, "%s in order: one terminal transition", name)
		inOrderPaths := map[string][]transition{}
		for _, kind := range []string{payments.PaymentIntent, payments.Charge} {
			inOrderPaths[kind] = path(steps, kind)
			require.Equal(t, inOrderPaths[kind], logged[kind]["inorder_"+name], "%s in order: the %s transitions", name, kind)
		}
		// transitionsOnce checks the transitions of both objects of the
		// payment tagged tg, whose PaymentIntent ended in status.
		transitionsOnce := func(tg, status string, repeats bool) {
			for _, kind := range []string{payments.PaymentIntent, payments.Charge} {
				final := status
				if kind == payments.Charge {
					final = chargeStatus[tg]
				}
				walksThePath(t, tg+" "+kind, logged[kind][tg], inOrderPaths[kind], final, repeats)
			}
		}
		for k := 0; k < shuffles; k++ {
			got := state(tag(name, k, false))
			transitionsOnce(tag(name, k, false), got.Status, true)
			if len(logged[payments.PaymentIntent][tag(name, k, false)]) < len(inOrderPaths[payments.PaymentIntent]) {
				skipped++
			}
			assert.Equal(t, inOrder.Status, got.Status, "%s shuffle %d", name, k)
			assert.Equal(t, inOrder.Received, got.Received, "%s shuffle %d: amount_received", name, k)
			assert.Equal(t, inOrder.Refunded, got.Refunded, "%s shuffle %d: amount_refunded", name, k)
			assert.False(t, got.NeedsRefresh, "%s shuffle %d", name, k)
			assert.Equal(t, 1, got.Succeeded, "%s shuffle %d: the terminal transition fires once", name, k)
			assert.Equal(t, len(steps), got.Recorded, "%s shuffle %d: every event recorded once", name, k)

			same := state(tag(name, k, true))
			transitionsOnce(tag(name, k, true), same.Status, false)
			if same.Status != inOrder.Status {
				assert.True(t, same.NeedsRefresh, "%s same-second shuffle %d ended %s (inOrder %s) without needs_refresh", name, k, same.Status, inOrder.Status)
			} else {
				assert.Equal(t, 1, same.Succeeded, "%s same-second shuffle %d: the terminal transition fires once", name, k)
			}
			assert.Equal(t, inOrder.Received, same.Received, "%s same-second shuffle %d: amount_received", name, k)
			assert.Equal(t, inOrder.Refunded, same.Refunded, "%s same-second shuffle %d: amount_refunded", name, k)
			assert.Equal(t, len(steps), same.Recorded, "%s same-second shuffle %d: every event recorded once", name, k)
			assert.LessOrEqual(t, same.Succeeded, 1, "%s same-second shuffle %d: never two terminal transitions", name, k)
		}
	}
	t.Logf("%d of %d shuffled payments skipped some of the in-order run's PaymentIntent states", skipped, shuffles*len(lifecycles))
	outcomes := map[string]int{}
	rows, err := p.DB.Query(ctx, `SELECT outcome, count(*) FROM payment_events GROUP BY 1`)
	require.NoError(t, err)
	for rows.Next() {
		var o string
		var n int
		require.NoError(t, rows.Scan(&o, &n))
		outcomes[o] = n
	}
	require.NoError(t, rows.Err())
	keys := make([]string, 0, len(outcomes))
	for k := range outcomes {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		t.Logf("payment_events %-18s %d", k, outcomes[k])
	}
	assert.Positive(t, outcomes[payments.Superseded], "shuffles supersede older events")
	assert.Positive(t, outcomes[payments.NeedsRefresh], "same-second shuffles meet incomparable states")
	assert.Zero(t, outcomes[payments.IllegalTransition], "no lifecycle here leaves a terminal state")
}

func tag(name string, k int, same bool) string {
	if same {
		return fmt.Sprintf("same_%s_%d", name, k)
	}
	return fmt.Sprintf("shuf_%s_%d", name, k)
}

func inOrderCount() int {
	n := 0
	for _, steps := range lifecycles {
		n += len(steps)
	}
	return n
}

// states reads every PaymentIntent with its terminal transitions and its
// events, by the tag in its id.
func states(t *testing.T, p *pipelinetest.Pipeline) map[string]objectRow {
	t.Helper()
	rows, err := p.DB.Query(context.Background(), `
		WITH tr AS (
			SELECT object_id, count(*) FILTER (WHERE to_status IN ('succeeded', 'canceled')) AS terminal
			FROM transition_log WHERE object_type = 'payment_intent' GROUP BY 1
		), ev AS (
			SELECT substr(object_id, 4) AS tag, count(*) AS n FROM payment_events GROUP BY 1
		)
		SELECT substr(pi.id, 4), pi.status, pi.amount_received, pi.amount_refunded, pi.needs_refresh,
			coalesce(tr.terminal, 0), coalesce(ev.n, 0)
		FROM payment_intents pi LEFT JOIN tr ON tr.object_id = pi.id LEFT JOIN ev ON ev.tag = substr(pi.id, 4)`)
	require.NoError(t, err)
	out := map[string]objectRow{}
	for rows.Next() {
		var tag string
		var r objectRow
		require.NoError(t, rows.Scan(&tag, &r.Status, &r.Received, &r.Refunded, &r.NeedsRefresh, &r.Succeeded, &r.Recorded))
		out[tag] = r
	}
	require.NoError(t, rows.Err())
	return out
}

// chargeStates reads every Charge's status, by the tag in its id.
func chargeStates(t *testing.T, p *pipelinetest.Pipeline) map[string]string {
	t.Helper()
	rows, err := p.DB.Query(context.Background(), `SELECT substr(id, 4), status FROM charges`)
	require.NoError(t, err)
	out := map[string]string{}
	for rows.Next() {
		var tag, status string
		require.NoError(t, rows.Scan(&tag, &status))
		out[tag] = status
	}
	require.NoError(t, rows.Err())
	return out
}

// transitionLog reads the logged transitions by object type and the tag in
// the object's id, each object's in the order they committed.
func transitionLog(t *testing.T, p *pipelinetest.Pipeline) map[string]map[string][]transition {
	t.Helper()
	rows, err := p.DB.Query(context.Background(),
		`SELECT object_type, substr(object_id, 4), from_status, to_status FROM transition_log ORDER BY seq`)
	require.NoError(t, err)
	out := map[string]map[string][]transition{}
	for rows.Next() {
		var kind, tag string
		var tr transition
		require.NoError(t, rows.Scan(&kind, &tag, &tr.From, &tr.To))
		if out[kind] == nil {
			out[kind] = map[string][]transition{}
		}
		out[kind][tag] = append(out[kind][tag], tr)
	}
	require.NoError(t, rows.Err())
	return out
}

// path is the transitions of the kind object of a lifecycle run in order:
// a change of its state per event, where a captured, succeeded charge
// says its PaymentIntent succeeded.
func path(steps []step, kind string) []transition {
	var out []transition
	cur := ""
	for _, s := range steps {
		status := ""
		switch obj := s.obj["object"]; {
		case obj == kind:
			status = s.obj["status"].(string)
		case kind == payments.PaymentIntent && s.obj["status"] == "succeeded" && s.obj["captured"] == true:
			status = "succeeded"
		}
		if status != "" && status != cur {
			out = append(out, transition{cur, status})
			cur = status
		}
	}
	return out
}

// walksThePath asserts that got, the transitions of object in the order
// they committed, is a walk along inOrder, the in-order run's: from no
// state to final, each leaving the state the one before reached, the
// states in inOrder's order (some may be skipped), and no transition fired
// twice — or, with repeats, more often than in inOrder (a retried debit
// goes requires_payment_method -> processing twice).
func walksThePath(t *testing.T, object string, got, inOrder []transition, final string, repeats bool) {
	t.Helper()
	cur := ""
	for _, tr := range got {
		assert.Equal(t, cur, tr.From, "%s: a transition that does not leave the current state, in %v", object, got)
		cur = tr.To
	}
	assert.Equal(t, final, cur, "%s: the transitions do not end in the object's state, in %v", object, got)
	allowed, fired := map[transition]int{}, map[transition]int{}
	for _, tr := range inOrder {
		allowed[tr]++
	}
	for _, tr := range got {
		fired[tr]++
		limit := 1
		if repeats {
			limit = max(1, allowed[tr])
		}
		if fired[tr] == limit+1 {
			assert.Fail(t, "a transition fired more than once", "%s: %s -> %s, in %v", object, tr.From, tr.To, got)
		}
	}
	i := 0
	for _, tr := range got {
		for i < len(inOrder) && inOrder[i].To != tr.To {
			i++
		}
		if i == len(inOrder) {
			assert.Fail(t, "states out of the in-order run's order", "%s: %v is not a walk along %v", object, got, inOrder)
			return
		}
		i++
	}
}
