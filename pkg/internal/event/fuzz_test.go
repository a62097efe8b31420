package event_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/idempotent-events/idempotent-events/pkg/internal/event"
)

// Decode never panics; what it accepts is a valid event and what it
// rejects comes with a field name.
func FuzzDecode(f *testing.F) {
	f.Add([]byte(`{"id":"evt_1","type":"payment_intent.succeeded","data":{"object":{"id":"pi_1","object":"payment_intent","amount":100,"currency":"usd","status":"succeeded"}}}`))
	f.Add([]byte(`{"id":"evt_2","type":"t","data":{"payment_intent":"pi","amount_cents":1,"currency":"EUR","status":"ok"}}`))
	f.Add([]byte(`{"id":"evt_3","type":"customer.created","data":{"object":{"object":"customer"}}}`))
	f.Add([]byte(`{"id":1e400,"data":[]}`))
	f.Add([]byte(`{"id":"evt\u0000","type":"\ud800","data":{"object":null}}`))
	f.Add([]byte(`[]`))
	f.Fuzz(func(t *testing.T, body []byte) {
		ev, err := event.Decode(body)
		if err != nil {
			var fe *event.FieldError
			if !errors.As(err, &fe) || fe.Field == "" || fe.Problem == "" {
				t.Fatalf("error without a field: %v", err)
			}
			return
		}
		if ev.ID == "" || ev.Type == "" || len(ev.ID) > event.MaxIDLength || strings.ContainsAny(ev.ID, " \n\t\x00") {
			t.Fatalf("accepted an invalid identity: %q %q", ev.ID, ev.Type)
		}
		if p := ev.Payment; p != nil {
			if p.AmountCents < 0 || len(p.Currency) != 3 || p.Currency != strings.ToLower(p.Currency) || p.IntentID == "" || p.Status == "" {
				t.Fatalf("accepted an invalid payment: %+v", *p)
			}
		}
	})
}

// The other schemes' decoders never panic either.
func FuzzDecodeOtherSchemes(f *testing.F) {
	f.Add("msg_1", "push", []byte(`{"type":"a.b","data":{"payment_intent":"pi","amount_cents":5,"currency":"usd","status":"s"}}`))
	f.Add("", "", []byte(`{"type":7}`))
	f.Fuzz(func(t *testing.T, id, typ string, body []byte) {
		for _, scheme := range []string{"standard", "github"} {
			ev, err := event.Parse(scheme, id, typ, body)
			if err == nil && (ev.ID != id || ev.Type == "") {
				t.Fatalf("%s: identity %q/%q from %q", scheme, ev.ID, ev.Type, id)
			}
		}
	})
}
