package event_test

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotent-events/idempotent-events/pkg/internal/event"
)

func TestDecodeStripeEvent(t *testing.T) {
	ev, err := event.Decode([]byte(`{"id":"evt_1NG8Du2eZvKYlo2CUI79vXWy","object":"event","created":1686089970,"livemode":true,
		"type":"payment_intent.succeeded","data":{"object":{"id":"pi_3","object":"payment_intent","amount":2000,
		"currency":"USD","status":"succeeded","metadata":{}}},"request":{"id":null}}`))
	require.NoError(t, err)
	assert.Equal(t, "evt_1NG8Du2eZvKYlo2CUI79vXWy", ev.ID)
	assert.Equal(t, "payment_intent.succeeded", ev.Type)
	assert.Equal(t, time.Unix(1686089970, 0).UTC(), ev.Created)
	assert.True(t, ev.Livemode)
	require.NotNil(t, ev.Payment)
	assert.Equal(t, event.Payment{IntentID: "pi_3", AmountCents: 2000, Currency: "usd", Status: "succeeded"}, *ev.Payment)
}

func TestDecodeShortForm(t *testing.T) {
	ev, err := event.Decode([]byte(`{"id":"evt_9","type":"payment_intent.succeeded","data":{"payment_intent":"pi_9","amount_cents":150,"currency":"eur","status":"succeeded"}}`))
	require.NoError(t, err)
	assert.Equal(t, event.Payment{IntentID: "pi_9", AmountCents: 150, Currency: "eur", Status: "succeeded"}, *ev.Payment)
	assert.True(t, ev.Created.IsZero())
}

// The chart's helm test sends evt_helmtest_<release>_<pod UID>: a UID has
// dashes, and a release name may be 53 characters.
func TestDecodeHelmTestEventID(t *testing.T) {
	id := "evt_helmtest_" + strings.Repeat("r", 53) + "_3f1c2b7e-9a4d-4e8b-b6a1-0c5d2e7f9a13"
	body := event.Example{ID: id, Type: "payment_intent.succeeded", AmountCents: 2000, Currency: "usd", Status: "succeeded"}.JSON()
	ev, err := event.Decode(body)
	require.NoError(t, err)
	assert.Equal(t, id, ev.ID)
	require.NotNil(t, ev.Payment)
	assert.Equal(t, "pi_"+strings.TrimPrefix(id, "evt_"), ev.Payment.IntentID)
}

func TestDecodeNonPaymentStripeEventHasNoPayment(t *testing.T) {
	ev, err := event.Decode([]byte(`{"id":"evt_c","type":"customer.created","data":{"object":{"id":"cus_1","object":"customer","email":"a@b.c"}}}`))
	require.NoError(t, err)
	assert.Nil(t, ev.Payment)
}

func TestDecodeNamesTheBadField(t *testing.T) {
	cases := []struct {
		name, body, field string
	}{
		{"empty", ``, "body"},
		{"whitespace", "  \n", "body"},
		{"not json", `{"id":`, "body"},
		{"trailing garbage", `{"id":"evt_1"} x`, "body"},
		{"array", `[1,2]`, "body"},
		{"missing id", `{"type":"t","data":{}}`, "id"},
		{"id not a string", `{"id":5,"type":"t","data":{}}`, "id"},
		{"id with spaces", `{"id":"evt 1","type":"t","data":{}}`, "id"},
		{"missing type", `{"id":"evt_1","data":{}}`, "type"},
		{"missing data", `{"id":"evt_1","type":"t"}`, "data"},
		{"data not an object", `{"id":"evt_1","type":"t","data":"x"}`, "data"},
		{"short: missing amount", `{"id":"evt_1","type":"t","data":{"payment_intent":"pi","currency":"usd","status":"s"}}`, "data.amount_cents"},
		{"short: amount is a string", `{"id":"evt_1","type":"t","data":{"payment_intent":"pi","amount_cents":"10","currency":"usd","status":"s"}}`, "data.amount_cents"},
		{"short: amount is fractional", `{"id":"evt_1","type":"t","data":{"payment_intent":"pi","amount_cents":1.5,"currency":"usd","status":"s"}}`, "data.amount_cents"},
		{"short: negative amount", `{"id":"evt_1","type":"t","data":{"payment_intent":"pi","amount_cents":-1,"currency":"usd","status":"s"}}`, "data.amount_cents"},
		{"short: bad currency", `{"id":"evt_1","type":"t","data":{"payment_intent":"pi","amount_cents":1,"currency":"dollars","status":"s"}}`, "data.currency"},
		{"short: missing status", `{"id":"evt_1","type":"t","data":{"payment_intent":"pi","amount_cents":1,"currency":"usd"}}`, "data.status"},
		{"short: missing payment_intent", `{"id":"evt_1","type":"t","data":{"amount_cents":1,"currency":"usd","status":"s"}}`, "data.payment_intent"},
		{"stripe: object not an object", `{"id":"evt_1","type":"t","data":{"object":7}}`, "data.object"},
		{"stripe: amount missing", `{"id":"evt_1","type":"t","data":{"object":{"object":"payment_intent","id":"pi","currency":"usd","status":"s"}}}`, "data.object.amount"},
		{"stripe: amount ill-typed", `{"id":"evt_1","type":"t","data":{"object":{"object":"payment_intent","id":"pi","amount":true,"currency":"usd","status":"s"}}}`, "data.object.amount"},
		{"stripe: intent id missing", `{"id":"evt_1","type":"t","data":{"object":{"object":"payment_intent","amount":1,"currency":"usd","status":"s"}}}`, "data.object.id"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := event.Decode([]byte(c.body))
			var fe *event.FieldError
			require.ErrorAs(t, err, &fe)
			assert.Equal(t, c.field, fe.Field, "problem: %s", fe.Problem)
			assert.NotEmpty(t, fe.Problem)
		})
	}
}

func TestSameContentAcceptsAnyDigest(t *testing.T) {
	a, b := strings.Repeat("a", event.DigestHexLen), strings.Repeat("b", event.DigestHexLen)
	assert.True(t, event.SameContent(a, a))
	assert.False(t, event.SameContent(a, b))
	assert.True(t, event.SameContent(a, event.AnyDigestHex))
	assert.True(t, event.SameContent(event.AnyDigestHex, b))
	assert.Len(t, event.AnyDigestHex, event.DigestHexLen)
}
