package broker

import "strings"

// DLQReason says why a message is in events.dlq; it is the value of
// HeaderDLQReason, a filter of the DLQ tools and a metric label. Every
// reason is one of the constants below: the worker stamps the first five;
// the next four are RabbitMQ's own dead-letter reasons (x-death), for a
// copy the broker dead-lettered itself; the DLQ tools read the last when a
// copy carries neither.
type DLQReason string

// DLQ reasons.
const (
	// ReasonInvalidPayload: the body is not an event the worker can decode.
	ReasonInvalidPayload DLQReason = "invalid_payload"
	// ReasonRejectedByDatabase: Postgres refused the event's rows for good
	// (a constraint, a type); retrying cannot help.
	ReasonRejectedByDatabase DLQReason = "rejected_by_database"
	// ReasonRetriesExhausted: every retry tier was tried and failed.
	ReasonRetriesExhausted DLQReason = "retries_exhausted"
	// ReasonPanic: processing the event panicked.
	ReasonPanic DLQReason = "panic"
	// ReasonRejectedByHandler: an effects handler said no retry can help
	// (effects.Permanent).
	ReasonRejectedByHandler DLQReason = "rejected_by_handler"
	// ReasonDeliveryLimit: RabbitMQ dead-lettered the message itself,
	// because a quorum queue's x-delivery-limit was exceeded.
	ReasonDeliveryLimit DLQReason = "delivery_limit"
	// ReasonRejected, ReasonExpired and ReasonMaxLen: RabbitMQ dead-lettered
	// the message after a reject without requeue, a TTL or a length limit.
	// The pipeline's topology does not route these to events.dlq; they are
	// named so that a copy that got there anyway is shown for what it is.
	ReasonRejected DLQReason = "rejected"
	ReasonExpired  DLQReason = "expired"
	ReasonMaxLen   DLQReason = "maxlen"
	// ReasonUnknown: neither our header nor x-death says why.
	ReasonUnknown DLQReason = "unknown"
)

// DLQReasons lists every reason, in the order the DLQ tools offer them.
func DLQReasons() []DLQReason {
	return []DLQReason{ReasonInvalidPayload, ReasonRejectedByDatabase, ReasonRejectedByHandler, ReasonRetriesExhausted, ReasonPanic,
		ReasonDeliveryLimit, ReasonRejected, ReasonExpired, ReasonMaxLen, ReasonUnknown}
}

// DLQReasonNames is every reason, comma-separated, for help texts and
// error messages.
func DLQReasonNames() string {
	names := make([]string, 0, len(DLQReasons()))
	for _, r := range DLQReasons() {
		names = append(names, string(r))
	}
	return strings.Join(names, ", ")
}

// ParseDLQReason returns the reason named s, and false when s names none
// (a header written by something else).
func ParseDLQReason(s string) (DLQReason, bool) {
	for _, r := range DLQReasons() {
		if string(r) == s {
			return r, true
		}
	}
	return "", false
}
