package payments_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotent-events/idempotent-events/pkg/effects"
	"github.com/idempotent-events/idempotent-events/pkg/internal/broker"
	"github.com/idempotent-events/idempotent-events/pkg/internal/config"
	"github.com/idempotent-events/idempotent-events/pkg/internal/event"
	"github.com/idempotent-events/idempotent-events/pkg/internal/pipelinetest"
	"github.com/idempotent-events/idempotent-events/pkg/internal/servicetest"
	"github.com/idempotent-events/idempotent-events/pkg/payments"
)

// captureStep is one event of a PayPal capture's life as PayPal sends it:
// its event type, the capture resource's status (or, for a refund
// resource, "" and the capture's refunded total after it), and its
// resource's update_time in seconds from epoch.
type captureStep struct {
	typ, status, refunded string
	at                    int64
}

// capturedAmount is what every capture of these tests captured.
const capturedAmount = "20.00"

// captureLifecycles are the captures of the PayPal ordering tests, each in
// the order PayPal sends its events, with the state it ends in.
var captureLifecycles = map[string]struct {
	steps            []captureStep
	final, refunded  string
	statusEventIndex int
}{
	"instant": {steps: []captureStep{{"PAYMENT.CAPTURE.COMPLETED", "COMPLETED", "", 0}}, final: "COMPLETED", refunded: "0"},
	"pending-review": {steps: []captureStep{
		{"PAYMENT.CAPTURE.PENDING", "PENDING", "", 0},
		{"PAYMENT.CAPTURE.COMPLETED", "COMPLETED", "", 30},
	}, final: "COMPLETED", refunded: "0", statusEventIndex: 1},
	"declined": {steps: []captureStep{
		{"PAYMENT.CAPTURE.PENDING", "PENDING", "", 0},
		{"PAYMENT.CAPTURE.DENIED", "DECLINED", "", 20},
	}, final: "DECLINED", refunded: "0", statusEventIndex: 1},
	"full-refund": {steps: []captureStep{
		{"PAYMENT.CAPTURE.COMPLETED", "COMPLETED", "", 0},
		{"PAYMENT.CAPTURE.REFUNDED", "", "20.00", 60},
	}, final: "REFUNDED", refunded: "20.00", statusEventIndex: 1},
	"review-then-two-partial-refunds": {steps: []captureStep{
		{"PAYMENT.CAPTURE.PENDING", "PENDING", "", 0},
		{"PAYMENT.CAPTURE.COMPLETED", "COMPLETED", "", 10},
		{"PAYMENT.CAPTURE.REFUNDED", "", "5.00", 50},
		{"PAYMENT.CAPTURE.REFUNDED", "", "20.00", 90},
	}, final: "REFUNDED", refunded: "20.00", statusEventIndex: 3},
	"partial-refund-then-reversal": {steps: []captureStep{
		{"PAYMENT.CAPTURE.COMPLETED", "COMPLETED", "", 0},
		{"PAYMENT.CAPTURE.REFUNDED", "", "5.00", 50},
		{"PAYMENT.CAPTURE.REVERSED", "", "20.00", 80},
	}, final: "REVERSED", refunded: "20.00", statusEventIndex: 2},
	// Refunds reported on the capture resource itself, as a fetch of the
	// capture shows them.
	"capture-resource-refunds": {steps: []captureStep{
		{"PAYMENT.CAPTURE.COMPLETED", "COMPLETED", "", 0},
		{"PAYMENT.CAPTURE.REFUNDED", "PARTIALLY_REFUNDED", "", 40},
		{"PAYMENT.CAPTURE.REFUNDED", "REFUNDED", "", 70},
	}, final: "REFUNDED", refunded: "0", statusEventIndex: 2},
}

func paypalTime(at int64) string { return time.Unix(epoch+at, 0).UTC().Format(time.RFC3339) }

// captureEvent is the body of PayPal event evID of step s about capture
// capID, shaped as PayPal's Payments v2 webhooks are: a capture resource,
// or a refund resource naming the capture in its "up" link. With
// sameTime every update_time is epoch's.
func captureEvent(t *testing.T, evID, capID string, s captureStep, sameTime bool) []byte {
	t.Helper()
	at := s.at
	if sameTime {
		at = 0
	}
	money := func(v string) map[string]any { return map[string]any{"currency_code": "USD", "value": v} }
	ev := map[string]any{"id": evID, "event_version": "1.0", "create_time": paypalTime(at + 1), "resource_version": "2.0",
		"event_type": s.typ, "summary": "a test capture", "links": []any{}}
	if s.status != "" {
		ev["resource_type"] = "capture"
		ev["resource"] = map[string]any{"id": capID, "status": s.status, "amount": money(capturedAmount), "final_capture": true,
			"seller_receivable_breakdown": map[string]any{"gross_amount": money(capturedAmount), "paypal_fee": money("0.88"), "net_amount": money("19.12")},
			"supplementary_data":          map[string]any{"related_ids": map[string]any{"order_id": "ORDER-" + capID}},
			"create_time":                 paypalTime(0), "update_time": paypalTime(at)}
	} else {
		refundID := "RF-" + evID
		ev["resource_type"] = "refund"
		ev["resource"] = map[string]any{"id": refundID, "status": "COMPLETED", "amount": money(s.refunded),
			"seller_payable_breakdown": map[string]any{"total_refunded_amount": money(s.refunded)},
			"create_time":              paypalTime(at), "update_time": paypalTime(at),
			"links": []any{
				map[string]any{"href": "https://api.sandbox.paypal.com/v2/payments/refunds/" + refundID, "rel": "self", "method": "GET"},
				map[string]any{"href": "https://api.sandbox.paypal.com/v2/payments/captures/" + capID, "rel": "up", "method": "GET"},
			}}
	}
	b, err := json.Marshal(ev)
	require.NoError(t, err)
	return b
}

// paypalSource is the source the tests' PayPal events come from.
const paypalSource = "paypal"

// publishPayPal publishes every body as the receiver publishes a PayPal
// delivery of source paypalSource (the ledger key, the scheme and the
// event's identity in headers), many at a time on one confirm channel, and
// waits for every confirm.
func publishPayPal(t *testing.T, p *pipelinetest.Pipeline, bodies [][]byte) {
	t.Helper()
	conn, err := amqp.Dial(p.AMQPURL)
	require.NoError(t, err)
	defer conn.Close()
	ch, err := broker.OpenConfirmChannel(conn)
	require.NoError(t, err)
	defer ch.Close()
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, 32)
	for range 32 {
		wg.Go(func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= len(bodies) {
					return
				}
				ev, err := event.DecodePayPal(bodies[i])
				if err == nil {
					ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
					err = ch.Publish(ctx, broker.Exchange, broker.RoutingKey, amqp.Publishing{
						ContentType: "application/json", MessageId: event.Key(paypalSource, ev.ID), Type: ev.Type, Timestamp: time.Now(), Body: bodies[i],
						Headers: amqp.Table{broker.HeaderSource: paypalSource, broker.HeaderScheme: "paypal", broker.HeaderEventID: ev.ID,
							broker.HeaderEventType: ev.Type, broker.HeaderDigest: ev.DigestHex(), broker.HeaderReceivedAt: time.Now().UnixMilli()},
					})
					cancel()
				}
				if err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	require.NoError(t, <-errs)
}

// capturePipeline starts a worker running the built-in payment effect,
// every transition of a PayPal capture logged in transition_log in the
// order they committed.
func capturePipeline(t *testing.T, tune func(*config.Worker)) *pipelinetest.Pipeline {
	t.Helper()
	p := pipelinetest.New(t)
	_, err := p.DB.Exec(context.Background(), `CREATE TABLE transition_log (seq bigserial, object_type text, object_id text,
		from_status text, to_status text, event_id text)`)
	require.NoError(t, err)
	fx := payments.Effects()
	fx.OnTransitionFunc("log.paypal_capture", payments.PayPalCapture, "*", func(ctx context.Context, tr effects.Transition, tx effects.Tx, _ effects.Outbox) error {
		_, err := tx.Exec(ctx, `INSERT INTO transition_log (object_type, object_id, from_status, to_status, event_id)
			VALUES ($1, $2, $3, $4, $5)`, tr.Object.Type, tr.Object.ID, tr.From, tr.To, tr.Event.Key)
		return err
	})
	fx.OnTransitionFunc("log.payment_intent", payments.PaymentIntent, "*", func(ctx context.Context, tr effects.Transition, tx effects.Tx, _ effects.Outbox) error {
		_, err := tx.Exec(ctx, `INSERT INTO transition_log (object_type, object_id, from_status, to_status, event_id)
			VALUES ($1, $2, $3, $4, $5)`, tr.Object.Type, tr.Object.ID, tr.From, tr.To, tr.Event.Key)
		return err
	})
	p.Effects = fx
	p.Tune = tune
	p.StartWorker("")
	return p
}

// awaitCommitted waits until every event of bodies (PayPal's or Stripe's)
// has its ledger row.
func awaitCommitted(t *testing.T, p *pipelinetest.Pipeline, keys []string, timeout time.Duration) {
	t.Helper()
	require.Eventually(t, func() bool {
		var n int
		require.NoError(t, p.DB.QueryRow(context.Background(), `SELECT count(*) FROM processed_events WHERE event_id = ANY($1)`, keys).Scan(&n))
		return n == len(keys)
	}, timeout, 50*time.Millisecond, "%d events committed", len(keys))
}

// paypalKey is the ledger key of the PayPal event in body.
func paypalKey(t *testing.T, body []byte) string {
	t.Helper()
	ev, err := event.DecodePayPal(body)
	require.NoError(t, err)
	return event.Key(paypalSource, ev.ID)
}

// captureRow is a capture's row, with its records and what ran.
type captureRow struct {
	Status, Refunded, StatusEvent string
	StatusAt                      int64 // seconds from epoch
	NeedsRefresh                  bool
	Recorded                      int
}

// captureRows reads every capture by id.
func captureRows(t *testing.T, p *pipelinetest.Pipeline) map[string]captureRow {
	t.Helper()
	rows, err := p.DB.Query(context.Background(), `
		SELECT c.id, c.status, c.amount_refunded::text, c.status_event_id, coalesce(extract(epoch FROM c.status_created)::bigint - $1, -1),
			c.needs_refresh, (SELECT count(*) FROM payment_events e WHERE e.object_type = $2 AND e.object_id = c.id)
		FROM paypal_captures c`, epoch, payments.PayPalCapture)
	require.NoError(t, err)
	out := map[string]captureRow{}
	for rows.Next() {
		var id string
		var r captureRow
		require.NoError(t, rows.Scan(&id, &r.Status, &r.Refunded, &r.StatusEvent, &r.StatusAt, &r.NeedsRefresh, &r.Recorded))
		out[id] = r
	}
	require.NoError(t, rows.Err())
	return out
}

// captureTransitions reads the logged transitions of every capture, each
// capture's in the order they committed.
func captureTransitions(t *testing.T, p *pipelinetest.Pipeline) map[string][]transition {
	t.Helper()
	rows, err := p.DB.Query(context.Background(), `SELECT object_id, from_status, to_status FROM transition_log
		WHERE object_type = $1 ORDER BY seq`, payments.PayPalCapture)
	require.NoError(t, err)
	out := map[string][]transition{}
	for rows.Next() {
		var id string
		var tr transition
		require.NoError(t, rows.Scan(&id, &tr.From, &tr.To))
		out[id] = append(out[id], tr)
	}
	require.NoError(t, rows.Err())
	return out
}

// capturePath is the transitions of a lifecycle run in order: a change of
// the capture's status per event, where a refund is PARTIALLY_REFUNDED
// until its total reaches the captured amount, REFUNDED then, and a
// reversal REVERSED.
func capturePath(steps []captureStep) []transition {
	var out []transition
	cur := ""
	for _, s := range steps {
		status := s.status
		switch {
		case s.typ == "PAYMENT.CAPTURE.REVERSED" && s.status == "":
			status = "REVERSED"
		case s.status == "" && s.refunded == capturedAmount:
			status = "REFUNDED"
		case s.status == "":
			status = "PARTIALLY_REFUNDED"
		}
		if status != cur {
			out = append(out, transition{cur, status})
			cur = status
		}
	}
	return out
}

// checkCapture asserts that capture id, a run of lifecycle name, ended as
// the lifecycle does: its status, refunded total, the state's event (the
// lifecycle's, evID(i) names the run's i-th event) and time, not marked,
// every event recorded once, and its transitions a walk along the in-order
// path in which the final status was reached once.
func checkCapture(t *testing.T, what, name, id string, got captureRow, trs []transition, evID func(int) string, sameTime bool) {
	t.Helper()
	lc := captureLifecycles[name]
	wantAt := lc.steps[lc.statusEventIndex].at
	if sameTime {
		wantAt = 0
	}
	assert.Equal(t, captureRow{Status: lc.final, Refunded: lc.refunded, StatusEvent: event.Key(paypalSource, evID(lc.statusEventIndex)),
		StatusAt: wantAt, Recorded: len(lc.steps)}, got, "%s: the capture's row", what)
	walksThePath(t, what, trs, capturePath(lc.steps), lc.final, false)
	reached := 0
	for _, tr := range trs {
		if tr.To == lc.final {
			reached++
		}
	}
	assert.Equal(t, 1, reached, "%s: the transition to %s fires once, in %v", what, lc.final, trs)
}

// PayPal captures in every order their events can be processed in: each
// lifecycle's events are permuted every way, and the i-th event of every
// permutation is committed before the (i+1)-th is published, with the
// (i-1)-th delivered again beside it (a duplicate after its commit). Every
// run ends in the lifecycle's state (status, refunded total, the state's
// event and time), not marked needs_refresh, every event recorded once,
// its transitions a walk along the in-order path reaching the final status
// once. A refund processed before any event of its capture is among the
// orders (the refund-first permutations).
func TestCaptureStateInEveryProcessingOrder(t *testing.T) {
	t.Parallel()
	p := capturePipeline(t, func(c *config.Worker) { c.Prefetch, c.BatchSize, c.Concurrency = 128, 32, 2 })
	type run struct {
		name, id string
		order    []int
	}
	var runs []run
	var rounds [][][]byte
	evID := func(id string, i int) string { return fmt.Sprintf("WH-%s-%d", id, i) }
	refundFirst := 0
	for name, lc := range captureLifecycles {
		for k, order := range permutations(len(lc.steps)) {
			r := run{name: name, id: fmt.Sprintf("ORD-%s-%d", name, k), order: order}
			runs = append(runs, r)
			if lc.steps[order[0]].status == "" {
				refundFirst++
			}
			for round, i := range order {
				for len(rounds) <= round+1 {
					rounds = append(rounds, nil)
				}
				body := captureEvent(t, evID(r.id, i), r.id, lc.steps[i], false)
				rounds[round] = append(rounds[round], body)
				rounds[round+1] = append(rounds[round+1], body) // delivered again after its commit
			}
		}
	}
	require.Positive(t, refundFirst, "some orders process a refund before any event of its capture")
	for _, round := range rounds {
		keys := make([]string, len(round))
		for i, b := range round {
			keys[i] = paypalKey(t, b)
		}
		publishPayPal(t, p, round)
		awaitCommitted(t, p, keys, time.Minute)
	}
	p.Invariant()
	rows, trs := captureRows(t, p), captureTransitions(t, p)
	for _, r := range runs {
		what := fmt.Sprintf("%s processed in order %v", r.name, r.order)
		checkCapture(t, what, r.name, r.id, rows[r.id], trs[r.id], func(i int) string { return evID(r.id, i) }, false)
	}
	rs, err := p.DB.Query(context.Background(), `SELECT DISTINCT outcome FROM payment_events ORDER BY 1`)
	require.NoError(t, err)
	outcomes, err := pgx.CollectRows(rs, pgx.RowTo[string])
	require.NoError(t, err)
	assert.Equal(t, []string{payments.Applied, payments.Superseded}, outcomes, "nothing here is contradictory or illegal")
}

// PayPal captures under concurrency: every lifecycle many times, its
// events shuffled with random duplicates and all lifecycles interleaved,
// published at once to a worker with several concurrent batches, Stripe
// payments among them (so batches hold both). Every capture ends in its
// lifecycle's state as in TestCaptureStateInEveryProcessingOrder. Then the
// same with every update_time equal: the capture graph has no cycle, so
// even then every capture ends in its lifecycle's state, unmarked.
func TestCaptureStateUnderConcurrentShuffles(t *testing.T) {
	t.Parallel()
	shuffles := 300
	if testing.Short() {
		shuffles = 30
	}
	p := capturePipeline(t, func(c *config.Worker) { c.Prefetch, c.BatchSize, c.Concurrency = 256, 64, 4 })
	rng := rand.New(rand.NewPCG(20261207, 2))
	var paypalBodies, stripeBodies [][]byte
	var keys []string
	evID := func(id string, i int) string { return fmt.Sprintf("WH-%s-%d", id, i) }
	type run struct {
		name, id string
		same     bool
	}
	var runs []run
	for _, same := range []bool{false, true} {
		for name, lc := range captureLifecycles {
			for k := range shuffles {
				r := run{name: name, id: fmt.Sprintf("SHUF-%t-%s-%d", same, name, k), same: same}
				runs = append(runs, r)
				for i, s := range lc.steps {
					b := captureEvent(t, evID(r.id, i), r.id, s, same)
					keys = append(keys, paypalKey(t, b))
					paypalBodies = append(paypalBodies, b)
					if rng.IntN(4) == 0 {
						paypalBodies = append(paypalBodies, b)
					}
				}
			}
		}
	}
	stripePayments := shuffles / 3
	for k := range stripePayments {
		for _, b := range events(t, "card", fmt.Sprintf("mixed_%d", k), false) {
			var ev struct{ ID string }
			require.NoError(t, json.Unmarshal(b, &ev))
			stripeBodies, keys = append(stripeBodies, b), append(keys, ev.ID)
		}
	}
	rng.Shuffle(len(paypalBodies), func(i, j int) { paypalBodies[i], paypalBodies[j] = paypalBodies[j], paypalBodies[i] })
	start := time.Now()
	half := len(stripeBodies) / 2
	p.PublishAll(stripeBodies[:half])
	publishPayPal(t, p, paypalBodies)
	p.PublishAll(stripeBodies[half:])
	awaitCommitted(t, p, keys, 5*time.Minute)
	require.Equal(t, len(keys), p.LedgerRows(), "no other ledger row")
	t.Logf("%d PayPal deliveries and %d Stripe events committed in %s", len(paypalBodies), len(stripeBodies), time.Since(start).Round(time.Millisecond))
	p.Invariant()

	rows, trs := captureRows(t, p), captureTransitions(t, p)
	for _, r := range runs {
		what := fmt.Sprintf("%s run %s", r.name, r.id)
		checkCapture(t, what, r.name, r.id, rows[r.id], trs[r.id], func(i int) string { return evID(r.id, i) }, r.same)
	}
	var succeeded int
	require.NoError(t, p.DB.QueryRow(context.Background(), `SELECT count(*) FROM payment_intents
		WHERE id LIKE 'pi_mixed_%' AND status = 'succeeded' AND NOT needs_refresh`).Scan(&succeeded))
	assert.Equal(t, stripePayments, succeeded, "the Stripe payments of the same batches")
	var marked int
	require.NoError(t, p.DB.QueryRow(context.Background(), `SELECT count(*) FROM payment_events WHERE outcome IN ($1, $2)`,
		payments.NeedsRefresh, payments.IllegalTransition).Scan(&marked))
	assert.Zero(t, marked, "no same-time pair of capture events is unordered")
}

// Contradictory evidence about a capture, in every order: a capture that
// completed and was declined, or that was declined and refunded, cannot be
// both. Whatever the order, the capture is marked needs_refresh, no
// transition leaves a state for a contradicting one, and the transitions
// stay a walk from no state.
func TestContradictoryCaptureEvidenceIsMarkedInEveryOrder(t *testing.T) {
	t.Parallel()
	p := capturePipeline(t, nil)
	shapes := map[string][]captureStep{
		"completed-and-declined": {
			{"PAYMENT.CAPTURE.PENDING", "PENDING", "", 0},
			{"PAYMENT.CAPTURE.COMPLETED", "COMPLETED", "", 10},
			{"PAYMENT.CAPTURE.DECLINED", "DECLINED", "", 20},
		},
		"declined-then-refunded": {
			{"PAYMENT.CAPTURE.DENIED", "DECLINED", "", 0},
			{"PAYMENT.CAPTURE.REFUNDED", "", "20.00", 30},
		},
	}
	contradicting := map[transition]bool{}
	for _, st := range []string{"COMPLETED", "PARTIALLY_REFUNDED", "REFUNDED"} {
		contradicting[transition{st, "DECLINED"}], contradicting[transition{"DECLINED", st}] = true, true
	}
	type run struct {
		shape, id string
		order     []int
	}
	var runs []run
	rounds := make([][][]byte, 3)
	for shape, steps := range shapes {
		for k, order := range permutations(len(steps)) {
			r := run{shape: shape, id: fmt.Sprintf("CONTRA-%s-%d", shape, k), order: order}
			runs = append(runs, r)
			for round, i := range order {
				rounds[round] = append(rounds[round], captureEvent(t, fmt.Sprintf("WH-%s-%d", r.id, i), r.id, steps[i], false))
			}
		}
	}
	for _, round := range rounds {
		keys := make([]string, len(round))
		for i, b := range round {
			keys[i] = paypalKey(t, b)
		}
		publishPayPal(t, p, round)
		awaitCommitted(t, p, keys, time.Minute)
	}
	rows, trs := captureRows(t, p), captureTransitions(t, p)
	for _, r := range runs {
		what := fmt.Sprintf("%s processed in order %v", r.shape, r.order)
		got := rows[r.id]
		assert.True(t, got.NeedsRefresh, "%s: not marked needs_refresh", what)
		assert.Equal(t, len(shapes[r.shape]), got.Recorded, "%s: every event recorded once", what)
		cur := ""
		for _, tr := range trs[r.id] {
			assert.Equal(t, cur, tr.From, "%s: %v", what, trs[r.id])
			assert.False(t, contradicting[tr], "%s: a transition between contradicting states, in %v", what, trs[r.id])
			cur = tr.To
		}
		assert.Equal(t, got.Status, cur, "%s: the transitions end in the state", what)
	}
}

// A refund that comes before any event of its capture: the capture's
// status cannot be told without the captured amount, so the refund is kept
// as evidence (recorded applied, no status, no transition), and applied
// when the capture's first event comes: the capture's first transition
// goes straight to the refund's status, made by the capture's event, while
// the state's event is the refund's.
func TestARefundBeforeItsCaptureIsAppliedWhenTheCaptureComes(t *testing.T) {
	t.Parallel()
	p := capturePipeline(t, nil)
	const id = "EARLY-REFUND"
	refund := captureEvent(t, "WH-early-refund", id, captureStep{"PAYMENT.CAPTURE.REFUNDED", "", "5.00", 50}, false)
	completed := captureEvent(t, "WH-early-completed", id, captureStep{"PAYMENT.CAPTURE.COMPLETED", "COMPLETED", "", 0}, false)
	publishPayPal(t, p, [][]byte{refund})
	awaitCommitted(t, p, []string{paypalKey(t, refund)}, time.Minute)
	assert.Equal(t, captureRow{Refunded: "5.00", StatusAt: -1, Recorded: 1}, captureRows(t, p)[id], "evidence only")
	assert.Empty(t, captureTransitions(t, p)[id])
	var status, outcome string
	require.NoError(t, p.DB.QueryRow(context.Background(), `SELECT status, outcome FROM payment_events WHERE event_id = $1`,
		paypalKey(t, refund)).Scan(&status, &outcome))
	assert.Equal(t, []string{"", payments.Applied}, []string{status, outcome})

	publishPayPal(t, p, [][]byte{completed})
	awaitCommitted(t, p, []string{paypalKey(t, completed)}, time.Minute)
	assert.Equal(t, captureRow{Status: "PARTIALLY_REFUNDED", Refunded: "5.00", StatusEvent: paypalKey(t, refund), StatusAt: 50, Recorded: 2},
		captureRows(t, p)[id])
	var amount, order string
	require.NoError(t, p.DB.QueryRow(context.Background(), `SELECT amount::text, order_id FROM paypal_captures WHERE id = $1`, id).Scan(&amount, &order))
	assert.Equal(t, []string{capturedAmount, "ORDER-" + id}, []string{amount, order}, "the capture's event brought its amount")
	var by string
	require.NoError(t, p.DB.QueryRow(context.Background(), `SELECT event_id FROM transition_log WHERE object_id = $1`, id).Scan(&by))
	assert.Equal(t, []transition{{"", "PARTIALLY_REFUNDED"}}, captureTransitions(t, p)[id])
	assert.Equal(t, paypalKey(t, completed), by, "the capture's event made the transition")
}

// A batch holding Stripe events and PayPal events keeps both states in one
// transaction, and the captures' read, like the Stripe objects', is never
// run from a generic plan (a connection runs more batches than the five
// after which a prepared statement may get one).
func TestABatchOfBothProvidersKeepsBothStates(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	conn := servicetest.Conn(t, servicetest.Schema(t))
	fx := payments.Effects()
	var ran []string
	fx.OnTransitionFunc("record", payments.PayPalCapture, "*", func(_ context.Context, tr effects.Transition, _ effects.Tx, _ effects.Outbox) error {
		ran = append(ran, tr.Object.ID+":"+tr.To)
		return nil
	})
	for b := range 8 {
		capID, pi := fmt.Sprintf("MIX-%d", b), fmt.Sprintf("pi_mix_%d", b)
		completed := captureEvent(t, "WH-mix-c-"+capID, capID, captureStep{"PAYMENT.CAPTURE.COMPLETED", "COMPLETED", "", 0}, false)
		refunded := captureEvent(t, "WH-mix-r-"+capID, capID, captureStep{"PAYMENT.CAPTURE.REFUNDED", "", "20.00", 9}, false)
		stripe := stripeEvent(t, "evt_mix_"+pi, "payment_intent.succeeded", 3, map[string]any{"object": "payment_intent", "status": "succeeded",
			"amount": 2000, "amount_received": 2000, "currency": "usd"}, pi, "")
		var evs []effects.Event
		for _, d := range []struct {
			source string
			body   []byte
		}{{paypalSource, refunded}, {event.DefaultSource, stripe}, {paypalSource, completed}} {
			scheme := "paypal"
			if d.source == event.DefaultSource {
				scheme = event.DefaultScheme
			}
			ev, err := event.Parse(scheme, "", "", d.body)
			require.NoError(t, err)
			evs = append(evs, effects.Event{Source: d.source, ID: ev.ID, Key: event.Key(d.source, ev.ID), Type: ev.Type, Created: ev.Created,
				Object: effects.Object{Type: ev.Object.Type, ID: ev.Object.ID}, Raw: d.body, Attempt: 1, Origin: effects.OriginWebhook})
		}
		require.NoError(t, pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			applied, err := fx.Apply(ctx, evs, tx, effects.NoOutbox{})
			assert.Equal(t, []bool{true, true, true}, applied)
			return err
		}))
		var capStatus, piStatus string
		require.NoError(t, conn.QueryRow(ctx, `SELECT (SELECT status FROM paypal_captures WHERE id = $1), (SELECT status FROM payment_intents WHERE id = $2)`,
			capID, pi).Scan(&capStatus, &piStatus))
		assert.Equal(t, []string{"REFUNDED", "succeeded"}, []string{capStatus, piStatus}, "batch %d", b)
	}
	assert.Len(t, ran, 8, "one transition per capture: the refund came first, its capture's event applied it")
	var reads, generic int
	require.NoError(t, conn.QueryRow(ctx, `SELECT count(*), coalesce(sum(generic_plans), 0) FROM pg_prepared_statements
		WHERE statement LIKE '%FROM paypal_captures WHERE id = ANY%' AND statement NOT LIKE '%pg_prepared_statements%'`).Scan(&reads, &generic))
	require.Equal(t, 1, reads, "the captures' read is not a prepared statement of the connection: the check would see nothing")
	assert.Zero(t, generic, "the captures' read ran from a generic plan")
}
