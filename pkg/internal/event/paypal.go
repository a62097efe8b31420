package event

import (
	"bytes"
	"encoding/json"
	"errors"
	"time"
)

// wirePayPal is the envelope of a PayPal webhook event
// (https://developer.paypal.com/api/rest/webhooks/event-names/).
type wirePayPal struct {
	ID           *string         `json:"id"`
	EventType    *string         `json:"event_type"`
	CreateTime   *string         `json:"create_time"`
	ResourceType *string         `json:"resource_type"`
	Resource     json.RawMessage `json:"resource"`
}

type wirePayPalResource struct {
	ID         *string `json:"id"`
	CreateTime *string `json:"create_time"`
	UpdateTime *string `json:"update_time"`
}

// DecodePayPal validates a PayPal webhook event: {"id":"WH-…",
// "event_type":"PAYMENT.CAPTURE.COMPLETED","resource_type":"capture",
// "resource":{"id":…,"create_time":…,"update_time":…},…}.
//
// The event id dedupes (PayPal sends the same id on every retry and
// resend; PAYPAL-TRANSMISSION-ID changes). The object is the resource
// (resource_type, resource.id), and Created is the resource's update_time,
// else its create_time, else the event's create_time: the time of the state
// the event reports, which is what orders the events of one object (PayPal,
// like Stripe, does not deliver in order). The content digest covers the
// event type and the resource, not the envelope's other fields.
func DecodePayPal(body []byte) (Event, error) {
	var w wirePayPal
	if err := unmarshalBody(body, &w); err != nil {
		return Event{}, err
	}
	var ev Event
	var err error
	if ev.ID, err = requireID("id", w.ID); err != nil {
		return Event{}, err
	}
	if ev.Type, err = requireType(w.EventType); err != nil {
		return Event{}, renamed(err, "event_type")
	}
	if len(w.Resource) == 0 || bytes.Equal(w.Resource, []byte("null")) {
		return Event{}, &FieldError{Field: "resource", Problem: "required object is missing"}
	}
	var res wirePayPalResource
	if err := json.Unmarshal(w.Resource, &res); err != nil {
		return Event{}, jsonProblem("resource", err)
	}
	if w.ResourceType != nil && *w.ResourceType != "" && res.ID != nil && *res.ID != "" {
		if ev.Object.Type, err = requireType(w.ResourceType); err != nil {
			return Event{}, renamed(err, "resource_type")
		}
		if ev.Object.ID, err = requireID("resource.id", res.ID); err != nil {
			return Event{}, err
		}
	}
	for _, t := range []struct {
		field string
		value *string
	}{{"resource.update_time", res.UpdateTime}, {"resource.create_time", res.CreateTime}, {"create_time", w.CreateTime}} {
		if t.value == nil || *t.value == "" {
			continue
		}
		at, err := time.Parse(time.RFC3339Nano, *t.value)
		if err != nil {
			return Event{}, &FieldError{Field: t.field, Problem: "must be an RFC 3339 date-time"}
		}
		if ev.Created.IsZero() {
			ev.Created = at.UTC()
		}
	}
	ev.Digest = digest(ev.Type, w.Resource)
	return ev, nil
}

// renamed returns err, a *FieldError of requireType's, on field instead.
func renamed(err error, field string) error {
	var fe *FieldError
	if errors.As(err, &fe) {
		return &FieldError{Field: field, Problem: fe.Problem}
	}
	return err
}
