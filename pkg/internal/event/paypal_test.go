package event_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotent-events/idempotent-events/pkg/internal/event"
)

const paypalCapture = `{"id":"WH-58D329510W468432D-8HN650336L201105X","event_version":"1.0",` +
	`"create_time":"2026-12-07T10:00:05.511Z","resource_type":"capture","resource_version":"2.0",` +
	`"event_type":"PAYMENT.CAPTURE.COMPLETED","summary":"Payment completed for $ 10.0 USD",` +
	`"resource":{"id":"42311647XV020574X","status":"COMPLETED","amount":{"currency_code":"USD","value":"10.00"},` +
	`"create_time":"2026-12-07T09:59:58Z","update_time":"2026-12-07T09:59:59.123Z"},"links":[]}`

func TestPayPalEventsNameTheirResourceAndItsTime(t *testing.T) {
	ev, err := event.Parse("paypal", "", "", []byte(paypalCapture))
	require.NoError(t, err)
	assert.Equal(t, "WH-58D329510W468432D-8HN650336L201105X", ev.ID)
	assert.Equal(t, "PAYMENT.CAPTURE.COMPLETED", ev.Type)
	assert.Equal(t, event.Object{Type: "capture", ID: "42311647XV020574X"}, ev.Object)
	assert.Equal(t, time.Date(2026, 12, 7, 9, 59, 59, 123_000_000, time.UTC), ev.Created, "the resource's update_time orders it")
	assert.Nil(t, ev.Payment, "PayPal's payment state is not built yet")

	noUpdate := strings.Replace(paypalCapture, `,"update_time":"2026-12-07T09:59:59.123Z"`, "", 1)
	ev, err = event.Parse("paypal", "", "", []byte(noUpdate))
	require.NoError(t, err)
	assert.Equal(t, time.Date(2026, 12, 7, 9, 59, 58, 0, time.UTC), ev.Created, "else its create_time")
}

// PayPal's envelope may change between deliveries of one event (summary,
// links, create_time of a resend); the type and the resource may not.
func TestPayPalContentIsTheTypeAndTheResource(t *testing.T) {
	a, err := event.DecodePayPal([]byte(paypalCapture))
	require.NoError(t, err)
	b, err := event.DecodePayPal([]byte(strings.Replace(paypalCapture, `"summary":"Payment completed for $ 10.0 USD"`, `"summary":"other"`, 1)))
	require.NoError(t, err)
	assert.Equal(t, a.Digest, b.Digest, "the envelope is not content")
	c, err := event.DecodePayPal([]byte(strings.Replace(paypalCapture, `"value":"10.00"`, `"value":"11.00"`, 1)))
	require.NoError(t, err)
	assert.NotEqual(t, a.Digest, c.Digest, "the resource is")
}

func TestPayPalProblemsNameTheField(t *testing.T) {
	for field, body := range map[string]string{
		"body":                 `[1]`,
		"id":                   strings.Replace(paypalCapture, `"id":"WH-58D329510W468432D-8HN650336L201105X",`, "", 1),
		"event_type":           strings.Replace(paypalCapture, `"PAYMENT.CAPTURE.COMPLETED"`, `"PAYMENT CAPTURE"`, 1),
		"resource":             strings.Replace(paypalCapture, `"resource":{`, `"resourc":{`, 1),
		"resource.id":          strings.Replace(paypalCapture, `"42311647XV020574X"`, `"4231 1647"`, 1),
		"resource_type":        strings.Replace(paypalCapture, `"resource_type":"capture"`, `"resource_type":"cap ture"`, 1),
		"resource.update_time": strings.Replace(paypalCapture, `"2026-12-07T09:59:59.123Z"`, `"yesterday"`, 1),
		"create_time":          strings.Replace(paypalCapture, `"2026-12-07T10:00:05.511Z"`, `"12/07/2026"`, 1),
	} {
		_, err := event.DecodePayPal([]byte(body))
		var fe *event.FieldError
		if assert.ErrorAs(t, err, &fe, field) {
			assert.Equal(t, field, fe.Field)
		}
	}
}

// DecodePayPal never panics; what it accepts has a valid identity, and
// what it refuses names a field.
func FuzzDecodePayPal(f *testing.F) {
	f.Add([]byte(paypalCapture))
	f.Add([]byte(`{"id":"WH-1","event_type":"X","resource":{}}`))
	f.Add([]byte(`{"id":"WH-1","event_type":"X","resource_type":"a","resource":{"id":"b","update_time":"2026-01-02T03:04:05+01:00"}}`))
	f.Add([]byte(`{"id":1,"resource":null}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		ev, err := event.DecodePayPal(body)
		if err != nil {
			var fe *event.FieldError
			if !errors.As(err, &fe) || fe.Field == "" || fe.Problem == "" {
				t.Fatalf("error without a field: %v", err)
			}
			return
		}
		if ev.ID == "" || ev.Type == "" || len(ev.ID) > event.MaxIDLength || strings.ContainsAny(ev.ID+ev.Type+ev.Object.ID+ev.Object.Type, " \n\t\x00") {
			t.Fatalf("accepted an invalid identity: %+v", ev)
		}
		if (ev.Object.Type == "") != (ev.Object.ID == "") {
			t.Fatalf("half an object: %+v", ev.Object)
		}
	})
}
