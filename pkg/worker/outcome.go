package worker

import (
	"errors"
	"time"

	"github.com/idempotent-events/idempotent-events/pkg/dedupe"
	"github.com/idempotent-events/idempotent-events/pkg/event"
)

// Outcome is what happens to a delivery.
type Outcome int

// Outcomes. Every delivery ends in exactly one.
const (
	// Processed: this delivery committed the event's effect; ack.
	Processed Outcome = iota + 1
	// Duplicate: the effect was committed before; ack.
	Duplicate
	// Retry: publish a copy to a retry tier, then ack.
	Retry
	// DeadLetter: publish a copy to events.dlq, then ack.
	DeadLetter
	// Conflict: the id was committed with other content; the delivery is
	// recorded in event_conflicts (never processed), then acked.
	Conflict
)

func (o Outcome) String() string {
	switch o {
	case Processed:
		return "processed"
	case Duplicate:
		return "duplicate"
	case Retry:
		return "retried"
	case DeadLetter:
		return "dead_lettered"
	case Conflict:
		return "conflict"
	}
	return "unknown"
}

// DLQ reasons, stamped on the message in x-ie-dlq-reason.
const (
	ReasonInvalidPayload     = "invalid_payload"
	ReasonRejectedByDatabase = "rejected_by_database"
	ReasonRetriesExhausted   = "retries_exhausted"
	ReasonPanic              = "panic"
)

// Result is the decided fate of one delivery.
type Result struct {
	Outcome Outcome
	// Layer is where a duplicate was recognised.
	Layer dedupe.Layer
	// Delay is the retry tier of a Retry.
	Delay time.Duration
	// Reason is the DLQ reason of a DeadLetter.
	Reason string
	// Err is the processing error behind a Retry or DeadLetter.
	Err error
}

// permanentError marks an error no retry can fix.
type permanentError struct {
	reason string
	err    error
}

func (e *permanentError) Error() string { return e.err.Error() }
func (e *permanentError) Unwrap() error { return e.err }

func permanent(reason string, err error) error { return &permanentError{reason: reason, err: err} }

// decide maps a processing error on the given attempt (1 = first) to the
// delivery's fate. It is the only place that chooses between retry and DLQ.
func decide(err error, attempt int, delays []time.Duration) Result {
	var fe *event.FieldError
	if errors.As(err, &fe) {
		return Result{Outcome: DeadLetter, Reason: ReasonInvalidPayload, Err: err}
	}
	var pe *permanentError
	if errors.As(err, &pe) {
		return Result{Outcome: DeadLetter, Reason: pe.reason, Err: err}
	}
	if attempt >= 1 && attempt <= len(delays) {
		return Result{Outcome: Retry, Delay: delays[attempt-1], Err: err}
	}
	return Result{Outcome: DeadLetter, Reason: ReasonRetriesExhausted, Err: err}
}
