package dlq

import (
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotent-events/idempotent-events/pkg/internal/broker"
)

func workerCopy() amqp.Delivery {
	return amqp.Delivery{
		MessageId: "evt_1", Type: "payment_intent.succeeded", ContentType: "application/json",
		Body: []byte(`{"id":"evt_1","type":"payment_intent.succeeded"}`),
		Headers: amqp.Table{
			broker.HeaderSource: "stripe", broker.HeaderReceivedAt: int64(1700000000000),
			broker.HeaderAttempt: int32(3), broker.HeaderDLQID: "0123456789abcdef",
			broker.HeaderDLQReason: "retries_exhausted", broker.HeaderFirstError: "boom 1", broker.HeaderLastError: "boom 3",
			broker.HeaderFirstFailedAt: "2026-01-02T03:04:05.000000001Z", broker.HeaderLastFailedAt: "2026-01-02T03:05:05Z",
			broker.HeaderDeadLetteredAt: "2026-01-02T03:05:06Z", broker.HeaderOriginalExchange: broker.Exchange,
			broker.HeaderOriginalRoutingKey: broker.RoutingKey, broker.HeaderPublishID: int64(7),
			"x-death": []any{amqp.Table{"queue": "events.retry.5s", "reason": "expired", "count": int64(2), "time": time.Unix(1700000100, 0)}},
		},
	}
}

func TestAWorkerCopyIsReadFromItsHeaders(t *testing.T) {
	m := fromDelivery(workerCopy())
	assert.Equal(t, "0123456789abcdef", m.ID)
	assert.False(t, m.DerivedID)
	assert.Equal(t, "evt_1", m.EventID)
	assert.Equal(t, "payment_intent.succeeded", m.EventType)
	assert.Equal(t, "stripe", m.Source)
	assert.Equal(t, broker.ReasonRetriesExhausted, m.Reason, "our reason wins over x-death's")
	assert.Equal(t, 3, m.Attempts)
	assert.Equal(t, "boom 3", m.LastError)
	assert.Equal(t, time.Date(2026, 1, 2, 3, 5, 6, 0, time.UTC), m.DeadLetteredAt)
	assert.Equal(t, time.UnixMilli(1700000000000), m.ReceivedAt)
}

// A message RabbitMQ dead-lettered itself (quorum delivery limit) has no
// x-ie-dlq-id: its id is derived from content that does not change, its
// reason and time come from x-death, and the event id from the body.
func TestABrokerDeadLetteredMessageGetsAStableDerivedID(t *testing.T) {
	d := amqp.Delivery{
		Body: []byte(`{"id":"evt_2","type":"charge.refunded"}`),
		Headers: amqp.Table{
			"x-first-death-queue": "events.main", "x-first-death-reason": "delivery_limit",
			"x-death": []any{amqp.Table{"queue": "events.main", "reason": "delivery_limit", "count": int64(1), "time": time.Unix(1700000200, 0)}},
		},
	}
	m := fromDelivery(d)
	assert.True(t, m.DerivedID)
	assert.Len(t, m.ID, 16)
	assert.Equal(t, broker.ReasonDeliveryLimit, m.Reason)
	assert.Equal(t, "evt_2", m.EventID)
	assert.Equal(t, "charge.refunded", m.EventType)
	assert.Equal(t, time.Unix(1700000200, 0), m.DeadLetteredAt)

	d.Redelivered, d.DeliveryTag = true, 42 // a later browse of the same message
	assert.Equal(t, m.ID, fromDelivery(d).ID)
	d.Body = []byte(`{"id":"evt_3"}`)
	assert.NotEqual(t, m.ID, fromDelivery(d).ID)
}

func TestPoisonWithoutAnyIdentityStillLists(t *testing.T) {
	m := fromDelivery(amqp.Delivery{Body: []byte{0xff, 0x00}})
	assert.Len(t, m.ID, 16)
	assert.Equal(t, broker.ReasonUnknown, m.Reason)
	assert.Empty(t, m.EventID)
	assert.Equal(t, "base64:/wA=", m.BodyText())
}

// The replayed copy starts a fresh set of retries, keeps what the pipeline
// needs, and drops the DLQ's and RabbitMQ's bookkeeping.
func TestTheReplayedCopy(t *testing.T) {
	d := workerCopy()
	m := fromDelivery(d)
	now := time.Date(2026, 2, 1, 0, 0, 0, 0, time.UTC)
	p := replayCopy(d, m, "alice", now)
	assert.Equal(t, d.Body, p.Body)
	assert.Equal(t, "evt_1", p.MessageId)
	assert.Equal(t, "payment_intent.succeeded", p.Type)
	h := p.Headers
	assert.Equal(t, int64(1), h[broker.HeaderAttempt])
	assert.Equal(t, "stripe", h[broker.HeaderSource])
	assert.Equal(t, int64(1700000000000), h[broker.HeaderReceivedAt])
	assert.Equal(t, "boom 1", h[broker.HeaderFirstError], "the error history stays")
	assert.Equal(t, broker.Exchange, h[broker.HeaderOriginalExchange])
	for _, gone := range []string{broker.HeaderDLQID, broker.HeaderDLQReason, broker.HeaderDeadLetteredAt, "x-death", broker.HeaderPublishID} {
		assert.NotContains(t, h, gone)
	}
	assert.Equal(t, "alice", h[broker.HeaderReplayedBy])
	assert.Equal(t, "2026-02-01T00:00:00Z", h[broker.HeaderReplayedAt])
	assert.Equal(t, "0123456789abcdef", h[broker.HeaderReplayOf])
	assert.Equal(t, int64(1), h[broker.HeaderReplayCount])
	assert.Equal(t, "evt_1", d.MessageId, "the delivery itself is not changed")
	require.Contains(t, d.Headers, broker.HeaderDLQID)
}

func TestFilterMatch(t *testing.T) {
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	m := Message{ID: "aaaa", EventID: "evt_9", EventType: "payment_intent.payment_failed", Source: "stripe",
		Reason: "rejected_by_database", DeadLetteredAt: now.Add(-2 * time.Hour)}
	cases := map[string]struct {
		f    Filter
		want bool
	}{
		"empty":             {Filter{}, true},
		"id":                {Filter{IDs: []string{"bbbb", "aaaa"}}, true},
		"other id":          {Filter{IDs: []string{"bbbb"}}, false},
		"event id":          {Filter{EventID: "evt_9"}, true},
		"type exact":        {Filter{EventType: "payment_intent.payment_failed"}, true},
		"type prefix":       {Filter{EventType: "payment_intent.*"}, true},
		"type other prefix": {Filter{EventType: "charge.*"}, false},
		"source":            {Filter{Source: "paypal"}, false},
		"reason":            {Filter{Reason: "rejected_by_database"}, true},
		"older than 1h":     {Filter{OlderThan: time.Hour}, true},
		"older than 3h":     {Filter{OlderThan: 3 * time.Hour}, false},
		"newer than 1h":     {Filter{NewerThan: time.Hour}, false},
		"between 1h and 3h": {Filter{OlderThan: time.Hour, NewerThan: 3 * time.Hour}, true},
		"all criteria":      {Filter{IDs: []string{"aaaa"}, Source: "stripe", Reason: "rejected_by_database", OlderThan: time.Minute}, true},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			assert.Equal(t, c.want, c.f.Match(m, now))
		})
	}
	unknownAge := m
	unknownAge.DeadLetteredAt = time.Time{}
	assert.False(t, Filter{OlderThan: time.Hour}.Match(unknownAge, now), "an unknown age matches no age filter")
}

func TestFilterValidation(t *testing.T) {
	require.ErrorIs(t, Filter{OlderThan: 2 * time.Hour, NewerThan: time.Hour}.Validate(), ErrInvalidFilter)
	require.ErrorIs(t, Filter{OlderThan: -time.Second}.Validate(), ErrInvalidFilter)
	require.ErrorIs(t, Filter{IDs: []string{""}}.Validate(), ErrInvalidFilter)
	require.NoError(t, Filter{OlderThan: time.Hour, NewerThan: 2 * time.Hour}.Validate())
	assert.False(t, Filter{All: true}.Selective())
	assert.True(t, Filter{Reason: "panic"}.Selective())
}
