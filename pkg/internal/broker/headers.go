package broker

import (
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Message headers of the pipeline. The receiver sets the first ones; the
// worker maintains the rest on retry and DLQ copies. They are documented in
// README, since operators read them on messages in the DLQ.
const (
	// HeaderSource names the webhook source ("stripe" for /webhooks/payment,
	// the configured name for /webhooks/{source}).
	HeaderSource = "x-ie-source"
	// HeaderScheme is the source's signature scheme (stripe, standard,
	// github), which says how to read the body.
	HeaderScheme = "x-ie-scheme"
	// HeaderEventID and HeaderEventType carry the provider's event id and
	// type for schemes that send them in headers (Standard Webhooks, GitHub).
	HeaderEventID   = "x-ie-event-id"
	HeaderEventType = "x-ie-event-type"
	// HeaderDigest is the event's content digest (hex SHA-256, as the
	// ledger and Redis hold it), set by the receiver beside MessageId, the
	// dedupe key. With the two the worker recognises a duplicate in Redis
	// without decoding the body; every other message is decoded first.
	HeaderDigest = "x-ie-digest"
	// HeaderReceivedAt is when the receiver accepted the event, in unix
	// milliseconds; end-to-end latency is measured from it.
	HeaderReceivedAt = "x-ie-received-at"
	// HeaderAttempt is the number of the processing attempt the message
	// represents, 1 when absent. It is ours, not x-death, which counts per
	// queue and reason and is not an attempt counter.
	HeaderAttempt = "x-ie-attempt"
	// HeaderFirstError and HeaderLastError hold the first and the latest
	// processing error; HeaderFirstFailedAt and HeaderLastFailedAt their times.
	HeaderFirstError    = "x-ie-first-error"
	HeaderLastError     = "x-ie-last-error"
	HeaderFirstFailedAt = "x-ie-first-failed-at"
	HeaderLastFailedAt  = "x-ie-last-failed-at"
	// HeaderDLQReason says why a message is in the DLQ.
	HeaderDLQReason = "x-ie-dlq-reason"
	// HeaderDLQID identifies one DLQ copy, for operators to show, replay or
	// discard exactly that message.
	HeaderDLQID = "x-ie-dlq-id"
	// HeaderDeadLetteredAt is when the worker moved it there.
	HeaderDeadLetteredAt = "x-ie-dead-lettered-at"
	// HeaderOriginalExchange and HeaderOriginalRoutingKey record where the
	// message was first published, so a replay can send it back there.
	HeaderOriginalExchange   = "x-ie-original-exchange"
	HeaderOriginalRoutingKey = "x-ie-original-routing-key"
	// HeaderReplayedAt, HeaderReplayedBy, HeaderReplayOf and
	// HeaderReplayCount are set on a copy an operator replayed from the DLQ:
	// when (RFC3339Nano), by whom, the DLQ id of the replayed copy, and how
	// many replays of the event's message there were so far.
	HeaderReplayedAt  = "x-ie-replayed-at"
	HeaderReplayedBy  = "x-ie-replayed-by"
	HeaderReplayOf    = "x-ie-replay-of"
	HeaderReplayCount = "x-ie-replay-count"
	// HeaderOrigin is "reconcile" on an event the reconciler found missing
	// in the provider's event log and fed into the pipeline; absent on a
	// delivery.
	HeaderOrigin = "x-ie-origin"
	// HeaderPublishID was the publisher's internal return-matching header;
	// the publisher now uses CorrelationId. Copies made by tools drop it.
	HeaderPublishID = "x-ie-publish-id"
)

// Int reads an integer header of any AMQP integer type.
func Int(h amqp.Table, key string) (int64, bool) {
	switch v := h[key].(type) {
	case int64:
		return v, true
	case int32:
		return int64(v), true
	case int16:
		return int64(v), true
	case int8:
		return int64(v), true
	case int:
		return int64(v), true
	case uint8:
		return int64(v), true
	case uint16:
		return int64(v), true
	case uint32:
		return int64(v), true
	}
	return 0, false
}

// String reads a string header.
func String(h amqp.Table, key string) string {
	s, _ := h[key].(string)
	return s
}

// Attempt returns the attempt number of a delivery, at least 1.
func Attempt(h amqp.Table) int {
	if n, ok := Int(h, HeaderAttempt); ok && n >= 1 && n < 1<<20 {
		return int(n)
	}
	return 1
}

// ReceivedAt returns when the receiver accepted the message, or the zero
// time when the header is missing.
func ReceivedAt(h amqp.Table) time.Time {
	if ms, ok := Int(h, HeaderReceivedAt); ok && ms > 0 {
		return time.UnixMilli(ms)
	}
	return time.Time{}
}
