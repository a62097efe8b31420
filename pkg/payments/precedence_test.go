package payments_test

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotent-events/idempotent-events/pkg/effects"
	"github.com/idempotent-events/idempotent-events/pkg/internal/config"
	"github.com/idempotent-events/idempotent-events/pkg/internal/pipelinetest"
	"github.com/idempotent-events/idempotent-events/pkg/payments"
)

// statePipeline starts a worker running the built-in payment effect, every
// transition of a PaymentIntent or a Charge logged in transition_log (seq
// is the order they committed in: an object's transitions run under its
// lock, so its rows take seq in order). tune, when set, changes the
// worker's configuration.
func statePipeline(t *testing.T, tune func(*config.Worker)) *pipelinetest.Pipeline {
	t.Helper()
	p := pipelinetest.New(t)
	_, err := p.DB.Exec(context.Background(), `CREATE TABLE transition_log (seq bigserial, object_type text, object_id text,
		from_status text, to_status text, event_id text)`)
	require.NoError(t, err)
	fx := payments.Effects()
	logTransition := func(ctx context.Context, tr effects.Transition, tx effects.Tx, _ effects.Outbox) error {
		_, err := tx.Exec(ctx, `INSERT INTO transition_log (object_type, object_id, from_status, to_status, event_id)
			VALUES ($1, $2, $3, $4, $5)`, tr.Object.Type, tr.Object.ID, tr.From, tr.To, tr.Event.Key)
		return err
	}
	fx.OnTransitionFunc("log.payment_intent", payments.PaymentIntent, "*", logTransition)
	fx.OnTransitionFunc("log.charge", payments.Charge, "*", logTransition)
	p.Effects = fx
	p.Tune = tune
	p.StartWorker("")
	return p
}

// stripeEvent is the body of a Stripe event id of type typ, created at
// epoch+at, carrying obj (copied, with the given object id and, for a
// charge, its PaymentIntent).
func stripeEvent(t *testing.T, id, typ string, at int64, obj map[string]any, objectID, paymentIntent string) []byte {
	t.Helper()
	o := maps.Clone(obj)
	o["id"] = objectID
	if paymentIntent != "" {
		o["payment_intent"] = paymentIntent
	}
	b, err := json.Marshal(map[string]any{"id": id, "object": "event", "type": typ, "created": epoch + at, "livemode": false,
		"data": map[string]any{"object": o}})
	require.NoError(t, err)
	return b
}

// refreshEvent is the event the reconciler makes of an object marked
// needs_refresh: obj as Stripe returned it, created at the fetch (epoch+at).
func refreshEvent(t *testing.T, obj map[string]any, objectID string, at int64) []byte {
	t.Helper()
	return stripeEvent(t, fmt.Sprintf("refresh_%s_%d", objectID, at), payments.RefreshType, at, obj, objectID, "")
}

// processInTurn publishes each round of events at once and waits until
// every event of it is committed before the next round: events of one
// object in successive rounds are processed in that order.
func processInTurn(t *testing.T, p *pipelinetest.Pipeline, rounds ...[][]byte) {
	t.Helper()
	for _, round := range rounds {
		ids := make([]string, 0, len(round))
		for _, b := range round {
			var ev struct{ ID string }
			require.NoError(t, json.Unmarshal(b, &ev))
			ids = append(ids, ev.ID)
		}
		p.PublishAll(round)
		p.Eventually(func() bool {
			var n int
			require.NoError(t, p.DB.QueryRow(context.Background(),
				`SELECT count(*) FROM processed_events WHERE event_id = ANY($1)`, ids).Scan(&n))
			return n == len(ids)
		}, "%d events committed", len(ids))
	}
}

// intentState is a PaymentIntent's row in payment_intents.
type intentState struct {
	Status, StatusEvent        string
	StatusCreated              int64 // seconds from epoch
	Amount, Received, Refunded int64
	NeedsRefresh               bool
}

// intentOf reads PaymentIntent id; ok is false when it has no row.
func intentOf(t *testing.T, p *pipelinetest.Pipeline, id string) (s intentState, ok bool) {
	t.Helper()
	rows, err := p.DB.Query(context.Background(), `SELECT status, status_event_id, extract(epoch FROM status_created)::bigint - $2,
		amount, amount_received, amount_refunded, needs_refresh FROM payment_intents WHERE id = $1`, id, epoch)
	require.NoError(t, err)
	defer rows.Close()
	for rows.Next() {
		require.NoError(t, rows.Scan(&s.Status, &s.StatusEvent, &s.StatusCreated, &s.Amount, &s.Received, &s.Refunded, &s.NeedsRefresh))
		ok = true
	}
	require.NoError(t, rows.Err())
	return s, ok
}

// recorded is one payment_events row: how an event was taken for an
// object.
type recorded struct{ Event, Status, Outcome, From string }

// recordsOf reads the payment_events rows of an object, by event id.
func recordsOf(t *testing.T, p *pipelinetest.Pipeline, kind, id string) map[string]recorded {
	t.Helper()
	rows, err := p.DB.Query(context.Background(), `SELECT event_id, status, outcome, from_status FROM payment_events
		WHERE object_type = $1 AND object_id = $2`, kind, id)
	require.NoError(t, err)
	defer rows.Close()
	out := map[string]recorded{}
	for rows.Next() {
		var r recorded
		require.NoError(t, rows.Scan(&r.Event, &r.Status, &r.Outcome, &r.From))
		out[r.Event] = r
	}
	require.NoError(t, rows.Err())
	return out
}

// transitionsOf reads the logged transitions of an object, in the order
// they committed, with the event that made each.
func transitionsOf(t *testing.T, p *pipelinetest.Pipeline, kind, id string) (trs []transition, events []string) {
	t.Helper()
	rows, err := p.DB.Query(context.Background(), `SELECT from_status, to_status, event_id FROM transition_log
		WHERE object_type = $1 AND object_id = $2 ORDER BY seq`, kind, id)
	require.NoError(t, err)
	defer rows.Close()
	for rows.Next() {
		var tr transition
		var ev string
		require.NoError(t, rows.Scan(&tr.From, &tr.To, &ev))
		trs, events = append(trs, tr), append(events, ev)
	}
	require.NoError(t, rows.Err())
	return trs, events
}

// permutations returns every order of 0..n-1.
func permutations(n int) [][]int {
	if n == 0 {
		return [][]int{{}}
	}
	var out [][]int
	for _, p := range permutations(n - 1) {
		for i := 0; i <= len(p); i++ {
			q := append(append(append([]int{}, p[:i]...), n-1), p[i:]...)
			out = append(out, q)
		}
	}
	return out
}

// Contradictory terminal evidence. Stripe never moves a PaymentIntent out
// of succeeded or canceled, so events saying both are about one
// PaymentIntent cannot both be right, whatever their created times: a
// succeeded, captured payment followed by a newer payment_intent.canceled
// (the shape a black-box run found), or a canceled one followed by a newer
// success. Neither the created times nor the order of processing can tell
// which is true, so in every order the events can be processed in (among
// them in order, and the canceled event first):
//   - the object is marked needs_refresh, to be fetched from Stripe;
//   - the terminal state taken first stays: no event moves an object out
//     of a terminal state, so no transition fires twice or leaves one;
//   - the events of the other terminal state are recorded needs_refresh,
//     never superseded nor illegal_transition (a proven success is never
//     silently dropped);
//   - the cumulative amounts are the snapshots, as always.
//
// Then the refresh (Stripe's answer: succeeded, the charge was captured)
// is applied, the mark cleared, and in every order "payment succeeded" has
// run exactly once for the PaymentIntent.
func TestContradictoryTerminalEvidenceIsMarkedForRefreshInEveryOrder(t *testing.T) {
	t.Parallel()
	p := statePipeline(t, func(c *config.Worker) { c.Prefetch, c.BatchSize, c.Concurrency = 128, 32, 2 })
	shapes := map[string][]step{
		"canceled_after_success": {
			{"payment_intent.created", pi("requires_payment_method", 0), 0},
			{"charge.succeeded", charge("succeeded", true, 0), 1},
			{"payment_intent.succeeded", pi("succeeded", 2000), 1},
			{"payment_intent.canceled", pi("canceled", 2000), 5},
		},
		"success_after_cancel": {
			{"payment_intent.created", pi("requires_payment_method", 0), 0},
			{"payment_intent.canceled", pi("canceled", 0), 1},
			{"charge.succeeded", charge("succeeded", true, 0), 5},
			{"payment_intent.succeeded", pi("succeeded", 2000), 5},
		},
	}
	type run struct {
		shape, tag string
		order      []int
	}
	// terminal is the PaymentIntent state step s says it reached, when
	// it is a terminal one.
	terminal := func(s step) string {
		if s.obj["object"] == "charge" {
			return "succeeded" // captured and succeeded
		}
		if st := s.obj["status"].(string); st == "succeeded" || st == "canceled" {
			return st
		}
		return ""
	}
	var runs []run
	firstTerminal := map[string]string{} // by tag
	rounds := make([][][]byte, 4)
	for name, steps := range shapes {
		require.Len(t, steps, len(rounds))
		for k, order := range permutations(len(steps)) {
			r := run{shape: name, tag: fmt.Sprintf("contra_%s_%d", name, k), order: order}
			runs = append(runs, r)
			for round, i := range order {
				s := steps[i]
				objID, owner := "pi_"+r.tag, ""
				if s.obj["object"] == "charge" {
					objID, owner = "ch_"+r.tag, "pi_"+r.tag
				}
				rounds[round] = append(rounds[round], stripeEvent(t, fmt.Sprintf("evt_%s_%d", r.tag, i), s.typ, s.at, s.obj, objID, owner))
			}
		}
	}
	processInTurn(t, p, rounds...)

	describe := func(r run) string {
		var b strings.Builder
		for _, i := range r.order {
			s := shapes[r.shape][i]
			fmt.Fprintf(&b, " %s@%d", s.typ, s.at)
		}
		return r.shape + " processed" + b.String()
	}
	seenOrders := map[string]bool{}
	for _, r := range runs {
		steps := shapes[r.shape]
		first := ""
		for _, i := range r.order {
			if first = terminal(steps[i]); first != "" {
				break
			}
		}
		seenOrders[fmt.Sprint(r.shape, r.order)] = true
		firstTerminal[r.tag] = first
		what := describe(r)
		s, ok := intentOf(t, p, "pi_"+r.tag)
		require.True(t, ok, "%s: no PaymentIntent", what)
		assert.True(t, s.NeedsRefresh, "%s: contradictory terminal evidence, not marked needs_refresh", what)
		assert.Equal(t, first, s.Status, "%s: the terminal state taken first is left", what)
		assert.Equal(t, int64(2000), s.Received, "%s: amount_received", what)
		recs := recordsOf(t, p, payments.PaymentIntent, "pi_"+r.tag)
		for i, st := range steps {
			if st.obj["object"] != "payment_intent" || terminal(st) == "" {
				continue
			}
			rec := recs[fmt.Sprintf("evt_%s_%d", r.tag, i)]
			want := payments.NeedsRefresh
			if terminal(st) == first {
				want = payments.Applied
			}
			assert.Equal(t, want, rec.Outcome, "%s: %s@%d recorded %+v", what, st.typ, st.at, rec)
		}
		trs, _ := transitionsOf(t, p, payments.PaymentIntent, "pi_"+r.tag)
		walksThePath(t, what, trs, []transition{{"", "requires_payment_method"}, {"requires_payment_method", first}}, first, false)
		terminals := 0
		for _, tr := range trs {
			if tr.To == "succeeded" || tr.To == "canceled" {
				terminals++
			}
		}
		assert.Equal(t, 1, terminals, "%s: one terminal transition before the refresh, in %v", what, trs)
		var chStatus string
		var chMarked bool
		require.NoError(t, p.DB.QueryRow(context.Background(), `SELECT status, needs_refresh FROM charges WHERE id = $1`,
			"ch_"+r.tag).Scan(&chStatus, &chMarked))
		assert.Equal(t, "succeeded", chStatus, "%s: the charge", what)
		assert.False(t, chMarked, "%s: the charge has no contradiction", what)
	}
	require.True(t, seenOrders[fmt.Sprint("canceled_after_success", []int{0, 1, 2, 3})], "the in-order run is among the orders")
	require.True(t, seenOrders[fmt.Sprint("canceled_after_success", []int{3, 0, 1, 2})], "the canceled-first run is among the orders")

	// The reconciler fetches every marked PaymentIntent: Stripe has it
	// succeeded.
	var refreshes [][]byte
	for _, r := range runs {
		refreshes = append(refreshes, refreshEvent(t, pi("succeeded", 2000), "pi_"+r.tag, 100))
	}
	processInTurn(t, p, refreshes)
	for _, r := range runs {
		what := describe(r) + ", then refreshed"
		s, _ := intentOf(t, p, "pi_"+r.tag)
		assert.Equal(t, "succeeded", s.Status, what)
		assert.False(t, s.NeedsRefresh, "%s: the mark is cleared", what)
		trs, _ := transitionsOf(t, p, payments.PaymentIntent, "pi_"+r.tag)
		succeeded := 0
		for _, tr := range trs {
			if tr.To == "succeeded" {
				succeeded++
			}
		}
		assert.Equal(t, 1, succeeded, "%s: payment succeeded runs once per PaymentIntent, in %v", what, trs)
		if firstTerminal[r.tag] == "canceled" && len(trs) > 0 {
			assert.Equal(t, transition{"canceled", "succeeded"}, trs[len(trs)-1], "%s: the refresh runs it, from canceled", what)
		}
	}

	// A late cancellation, older than the fetch, contradicts the refreshed
	// state: marked once more (one more fetch), the state unchanged.
	var late [][]byte
	for _, r := range runs {
		late = append(late, stripeEvent(t, "evt_late_"+r.tag, "payment_intent.canceled", 6, pi("canceled", 0), "pi_"+r.tag, ""))
	}
	processInTurn(t, p, late)
	for _, r := range runs {
		what := describe(r) + ", refreshed, then a late cancellation"
		s, _ := intentOf(t, p, "pi_"+r.tag)
		assert.Equal(t, "succeeded", s.Status, what)
		assert.True(t, s.NeedsRefresh, "%s: marked again", what)
		assert.Equal(t, payments.NeedsRefresh, recordsOf(t, p, payments.PaymentIntent, "pi_"+r.tag)["evt_late_"+r.tag].Outcome, what)
	}
}

// An event restating the object's current status: older than the state,
// it is superseded (age decides before the status is looked at, so the
// state's event and time stay); of the same second or newer, it is applied
// and becomes the state's event, without a transition.
func TestAnEventRestatingTheStateIsSupersededOnlyWhenOlder(t *testing.T) {
	t.Parallel()
	p := statePipeline(t, nil)
	const id = "pi_restate"
	ev := func(n, at int64) []byte {
		return stripeEvent(t, fmt.Sprintf("evt_restate_%d", n), "payment_intent.processing", at, pi("processing", 0), id, "")
	}
	processInTurn(t, p, [][]byte{ev(0, 5)})
	processInTurn(t, p, [][]byte{ev(1, 3)})
	s, _ := intentOf(t, p, id)
	recs := recordsOf(t, p, payments.PaymentIntent, id)
	assert.Equal(t, payments.Superseded, recs["evt_restate_1"].Outcome, "an older event restating the status")
	assert.Equal(t, intentState{Status: "processing", StatusEvent: "evt_restate_0", StatusCreated: 5, Amount: 2000}, s)

	processInTurn(t, p, [][]byte{ev(2, 5)})
	s, _ = intentOf(t, p, id)
	assert.Equal(t, payments.Applied, recordsOf(t, p, payments.PaymentIntent, id)["evt_restate_2"].Outcome, "the same second")
	assert.Equal(t, "evt_restate_2", s.StatusEvent, "a restatement of the same second becomes the state's event")

	processInTurn(t, p, [][]byte{ev(3, 9)})
	s, _ = intentOf(t, p, id)
	assert.Equal(t, payments.Applied, recordsOf(t, p, payments.PaymentIntent, id)["evt_restate_3"].Outcome, "a newer event")
	assert.Equal(t, "evt_restate_3", s.StatusEvent)
	assert.Equal(t, int64(9), s.StatusCreated, "a newer restatement moves the state's time forward")
	trs, _ := transitionsOf(t, p, payments.PaymentIntent, id)
	assert.Equal(t, []transition{{"", "processing"}}, trs, "a restatement runs no transition")
}

// A charge's success counts for its PaymentIntent when the charge is
// succeeded and captured and names the PaymentIntent: it is that
// PaymentIntent's succeeded state at the charge event's created time (the
// charge event is the state's event and the transition's), the charge's
// amount_captured is a snapshot of the PaymentIntent's amount_received,
// and it is recorded once, for the charge: the PaymentIntent gets no
// payment_events row of it. An authorized, uncaptured charge says nothing
// about its PaymentIntent.
func TestACapturedChargeSucceedsItsPaymentIntent(t *testing.T) {
	t.Parallel()
	p := statePipeline(t, nil)
	partial := charge("succeeded", true, 0)
	partial["amount_captured"] = int64(1500) // a partial capture
	uncaptured := charge("succeeded", false, 0)
	processInTurn(t, p,
		[][]byte{
			stripeEvent(t, "evt_cap_alone", "charge.succeeded", 7, partial, "ch_cap_alone", "pi_cap_alone"),
			stripeEvent(t, "evt_cap_auth_0", "payment_intent.amount_capturable_updated", 2, pi("requires_capture", 0), "pi_cap_auth", ""),
		},
		[][]byte{
			// Older than the charge's success: superseded by it.
			stripeEvent(t, "evt_cap_alone_old", "payment_intent.processing", 6, pi("processing", 0), "pi_cap_alone", ""),
			stripeEvent(t, "evt_cap_auth_1", "charge.succeeded", 3, uncaptured, "ch_cap_auth", "pi_cap_auth"),
		},
	)
	s, ok := intentOf(t, p, "pi_cap_alone")
	require.True(t, ok, "a captured charge alone makes its PaymentIntent known")
	assert.Equal(t, intentState{Status: "succeeded", StatusEvent: "evt_cap_alone", StatusCreated: 7, Amount: 2000, Received: 1500}, s,
		"succeeded at the charge event's time, amount_received from amount_captured")
	recs := recordsOf(t, p, payments.PaymentIntent, "pi_cap_alone")
	assert.Equal(t, map[string]recorded{
		"evt_cap_alone_old": {Event: "evt_cap_alone_old", Status: "processing", Outcome: payments.Superseded, From: "succeeded"},
	}, recs, "the charge event is no record of the PaymentIntent; an older PaymentIntent event is superseded by it")
	assert.Equal(t, payments.Applied, recordsOf(t, p, payments.Charge, "ch_cap_alone")["evt_cap_alone"].Outcome, "recorded for the charge")
	trs, evs := transitionsOf(t, p, payments.PaymentIntent, "pi_cap_alone")
	assert.Equal(t, []transition{{"", "succeeded"}}, trs)
	assert.Equal(t, []string{"evt_cap_alone"}, evs, "the charge event made the PaymentIntent's transition")

	s, _ = intentOf(t, p, "pi_cap_auth")
	assert.Equal(t, "requires_capture", s.Status, "an uncaptured charge says nothing of its PaymentIntent")
	assert.Zero(t, s.Received)

	// The capture: charge.captured, succeeded and captured.
	processInTurn(t, p, [][]byte{stripeEvent(t, "evt_cap_auth_2", "charge.captured", 9, charge("succeeded", true, 0), "ch_cap_auth", "pi_cap_auth")})
	s, _ = intentOf(t, p, "pi_cap_auth")
	assert.Equal(t, intentState{Status: "succeeded", StatusEvent: "evt_cap_auth_2", StatusCreated: 9, Amount: 2000, Received: 2000}, s)
	trs, _ = transitionsOf(t, p, payments.PaymentIntent, "pi_cap_auth")
	assert.Equal(t, []transition{{"", "requires_capture"}, {"requires_capture", "succeeded"}}, trs)
}

// A status the graph does not know (Stripe added one) is no state: on an
// object never seen before the event is recorded illegal_transition from
// no state and no row is made, so the first known status that comes is
// applied as the first state whatever its time; and its amounts are not
// taken, so the object ends the same in both orders.
func TestAnUnknownStatusIsNeverAState(t *testing.T) {
	t.Parallel()
	p := statePipeline(t, nil)
	unknown := func(id string) []byte {
		return stripeEvent(t, "evt_"+id+"_unknown", "payment_intent.teleported", 5, pi("teleported", 2000), "pi_"+id, "")
	}
	known := func(id string) []byte {
		return stripeEvent(t, "evt_"+id+"_known", "payment_intent.processing", 3, pi("processing", 0), "pi_"+id, "")
	}
	processInTurn(t, p, [][]byte{unknown("unknown_first"), known("unknown_last")})
	_, ok := intentOf(t, p, "pi_unknown_first")
	assert.False(t, ok, "an unknown status on an object never seen makes no state")
	assert.Equal(t, recorded{Event: "evt_unknown_first_unknown", Status: "teleported", Outcome: payments.IllegalTransition},
		recordsOf(t, p, payments.PaymentIntent, "pi_unknown_first")["evt_unknown_first_unknown"])

	processInTurn(t, p, [][]byte{known("unknown_first"), unknown("unknown_last")})
	for _, id := range []string{"unknown_first", "unknown_last"} {
		s, ok := intentOf(t, p, "pi_"+id)
		require.True(t, ok, id)
		assert.Equal(t, intentState{Status: "processing", StatusEvent: "evt_" + id + "_known", StatusCreated: 3, Amount: 2000}, s,
			"%s: the known status is the state, the unknown event's amounts are not taken", id)
		assert.Equal(t, payments.IllegalTransition, recordsOf(t, p, payments.PaymentIntent, "pi_"+id)["evt_"+id+"_unknown"].Outcome, id)
	}
}
