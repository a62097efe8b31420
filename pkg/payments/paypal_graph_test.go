package payments

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotent-events/idempotent-events/pkg/effects"
)

func TestTheCaptureGuardOrdersByTimeThenByTheGraph(t *testing.T) {
	g := captureGraph
	t0 := time.Unix(1_700_000_000, 0)
	t1 := t0.Add(time.Millisecond)
	cases := []struct {
		name      string
		known     bool
		cur, to   string
		curAt, at time.Time
		want      string
	}{
		{"first state of a capture", false, "", "PENDING", time.Time{}, t0, Applied},
		{"pending completes", true, "PENDING", "COMPLETED", t0, t1, Applied},
		{"a refund after completion", true, "COMPLETED", "PARTIALLY_REFUNDED", t0, t1, Applied},
		{"a partial refund, then the rest", true, "PARTIALLY_REFUNDED", "REFUNDED", t0, t1, Applied},
		{"a reversal after a partial refund", true, "PARTIALLY_REFUNDED", "REVERSED", t0, t1, Applied},
		{"an older pending", true, "COMPLETED", "PENDING", t1, t0, Superseded},
		{"a refunded capture is not completed again", true, "REFUNDED", "COMPLETED", t0, t1, IllegalTransition},
		{"completed and declined contradict, newer", true, "COMPLETED", "DECLINED", t0, t1, NeedsRefresh},
		{"completed and declined contradict, older", true, "DECLINED", "COMPLETED", t1, t0, NeedsRefresh},
		{"a refund of a declined capture contradicts it", true, "DECLINED", "PARTIALLY_REFUNDED", t0, t1, NeedsRefresh},
		{"refunded and reversed contradict", true, "REFUNDED", "REVERSED", t0, t1, NeedsRefresh},
		{"an unknown status", true, "COMPLETED", "TELEPORTED", t0, t1, IllegalTransition},
		// The graph has no cycle: the same time is always ordered by it.
		{"same time, downstream", true, "PENDING", "REFUNDED", t0, t0, Applied},
		{"same time, upstream", true, "REFUNDED", "COMPLETED", t0, t0, Superseded},
		{"same time, the same status", true, "COMPLETED", "COMPLETED", t0, t0, Applied},
	}
	for _, c := range cases {
		assert.Equal(t, c.want, g.guard(c.known, c.cur, c.curAt, c.to, c.at), c.name)
	}
}

// Two capture statuses contradict exactly when neither can follow the
// other; in this graph, without cycles, every other pair is ordered.
func TestCaptureStatusesContradictOnlyWhenNeitherFollows(t *testing.T) {
	contradictory := map[[2]string]bool{}
	for _, p := range [][2]string{
		{"COMPLETED", "DECLINED"}, {"COMPLETED", "FAILED"}, {"PARTIALLY_REFUNDED", "DECLINED"}, {"PARTIALLY_REFUNDED", "FAILED"},
		{"REFUNDED", "DECLINED"}, {"REFUNDED", "FAILED"}, {"REFUNDED", "REVERSED"}, {"REVERSED", "DECLINED"},
		{"REVERSED", "FAILED"}, {"DECLINED", "FAILED"},
	} {
		contradictory[p], contradictory[[2]string{p[1], p[0]}] = true, true
	}
	for a := range captureGraph {
		for b := range captureGraph {
			assert.Equal(t, contradictory[[2]string{a, b}], captureGraph.contradicts(a, b), "%s, %s", a, b)
		}
		assert.False(t, captureGraph.reaches(a, a), "%s reaches itself: the graph has a cycle", a)
	}
}

// PayPal's own sample of PAYMENT.CAPTURE.REVERSED (developer.paypal.com,
// webhook event names): a refund resource whose "up" link names the
// capture, with the capture's refunded total.
const paypalReversedSample = `{"id":"WH-6F207351SC284371F-0KX52201050121307","event_version":"1.0","create_time":"2018-08-15T21:30:35.780Z",` +
	`"resource_type":"refund","resource_version":"2.0","event_type":"PAYMENT.CAPTURE.REVERSED","summary":"A $ 2.51 USD capture payment was reversed",` +
	`"resource":{"id":"09E71677NS257044M","amount":{"currency_code":"USD","value":"2.51"},"note_to_payer":"Payment reversed",` +
	`"seller_payable_breakdown":{"gross_amount":{"currency_code":"USD","value":"2.51"},"paypal_fee":{"currency_code":"USD","value":"0.00"},` +
	`"net_amount":{"currency_code":"USD","value":"2.51"},"total_refunded_amount":{"currency_code":"USD","value":"2.51"}},"status":"COMPLETED",` +
	`"create_time":"2018-08-15T14:30:10-07:00","update_time":"2018-08-15T14:30:10-07:00","links":[` +
	`{"href":"https://api.paypal.com/v2/payments/refunds/09E71677NS257044M","rel":"self","method":"GET"},` +
	`{"href":"https://api.paypal.com/v2/payments/captures/4L335234718889942","rel":"up","method":"GET"}]}}`

const paypalCompletedSample = `{"id":"WH-58D329510W468432D-8HN650336L201105X","resource_type":"capture","event_type":"PAYMENT.CAPTURE.COMPLETED",` +
	`"resource":{"id":"42311647XV020574X","status":"COMPLETED","amount":{"currency_code":"usd","value":"10.00"},` +
	`"seller_receivable_breakdown":{"gross_amount":{"currency_code":"USD","value":"10.00"},"paypal_fee":{"currency_code":"USD","value":"0.59"},` +
	`"net_amount":{"currency_code":"USD","value":"9.41"}},"custom_id":"order-77",` +
	`"supplementary_data":{"related_ids":{"order_id":"5O190127TN364715T"}},"update_time":"2026-12-07T09:59:59Z"}}`

func TestAPayPalEventIsObservedAsItsCapture(t *testing.T) {
	at := time.Date(2018, 8, 15, 21, 30, 10, 0, time.UTC)
	rev := effects.Event{Source: "paypal", ID: "WH-6F207351SC284371F-0KX52201050121307", Key: "paypal:WH-6F207351SC284371F-0KX52201050121307",
		Type: "PAYMENT.CAPTURE.REVERSED", Created: at, Object: effects.Object{Type: "refund", ID: "09E71677NS257044M"}, Raw: []byte(paypalReversedSample)}
	require.True(t, isPayPalCapture(rev))
	o, ok, err := observeCapture(3, rev)
	require.NoError(t, err)
	require.True(t, ok)
	assert.Equal(t, captureObservation{ev: 3, id: "4L335234718889942", at: at, refund: true, reversal: true, refunded: "2.51", currency: "USD"}, o,
		"the capture of the refund's up link, the refunded total")

	done := effects.Event{Source: "paypal", Type: "PAYMENT.CAPTURE.COMPLETED", Created: at, Raw: []byte(paypalCompletedSample),
		Object: effects.Object{Type: "capture", ID: "42311647XV020574X"}}
	o, ok, err = observeCapture(0, done)
	require.NoError(t, err)
	require.True(t, ok)
	assert.Equal(t, captureObservation{id: "42311647XV020574X", at: at, status: "COMPLETED", amount: "10.00", currency: "USD",
		fee: "0.59", net: "9.41", orderID: "5O190127TN364715T", customID: "order-77"}, o)

	denied := done
	denied.Raw = []byte(`{"resource_type":"capture","resource":{"id":"42311647XV020574X","status":"denied"}}`)
	o, _, _ = observeCapture(0, denied)
	assert.Equal(t, "DECLINED", o.status, "DENIED is DECLINED")

	// What is not a capture event, or says nothing of one.
	other := done
	other.Type = "CHECKOUT.ORDER.APPROVED"
	assert.False(t, isPayPalCapture(other))
	noTime := done
	noTime.Created = time.Time{}
	assert.False(t, isPayPalCapture(noTime), "no time orders it")
	pending := rev
	pending.Raw = []byte(`{"resource_type":"refund","resource":{"id":"R1","status":"PENDING","links":[{"rel":"up","href":"https://api.paypal.com/v2/payments/captures/C1"}]}}`)
	_, ok, _ = observeCapture(0, pending)
	assert.False(t, ok, "a refund not completed refunds nothing yet")
	orphan := rev
	orphan.Raw = []byte(`{"resource_type":"refund","resource":{"id":"R1","status":"COMPLETED","links":[{"rel":"self","href":"https://api.paypal.com/v2/payments/refunds/R1"}]}}`)
	_, ok, _ = observeCapture(0, orphan)
	assert.False(t, ok, "a refund naming no capture")
	_, _, err = observeCapture(0, effects.Event{Key: "paypal:WH-x", Raw: []byte(`{"resource":[]}`), Object: effects.Object{Type: "capture", ID: "C"}})
	var perm *effects.PermanentError
	assert.ErrorAs(t, err, &perm, "a body that does not decode is permanent")
}

func TestARefundIsFullOnceItsTotalReachesTheCapturedAmount(t *testing.T) {
	s := &captureState{amount: "10.00"}
	assert.Equal(t, "PARTIALLY_REFUNDED", s.refundStatus(false, "9.99"))
	assert.Equal(t, "REFUNDED", s.refundStatus(false, "10"), "decimals compare as numbers")
	assert.Equal(t, "REVERSED", s.refundStatus(true, "1.00"))
	assert.Equal(t, "PARTIALLY_REFUNDED", (&captureState{}).refundStatus(false, "10.00"), "the captured amount unknown")
	assert.Empty(t, (&wireMoney{Value: "1e3"}).value(), "not a PayPal value")
	assert.Empty(t, (&wireMoney{Value: "-1.00"}).value(), "no negative amount is kept")
}
