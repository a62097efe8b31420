package worker

import (
	"errors"
	"fmt"
	"time"

	"github.com/idempotent-events/idempotent-events/pkg/effects"
	"github.com/idempotent-events/idempotent-events/pkg/internal/broker"
	"github.com/idempotent-events/idempotent-events/pkg/internal/dedupe"
	"github.com/idempotent-events/idempotent-events/pkg/internal/event"
	"github.com/idempotent-events/idempotent-events/pkg/internal/store"
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
	// Requeue: nothing is wrong with the delivery, Postgres is unreachable
	// (WORKER_OUTAGE_MODE=pause): it goes back to the queue unacked and the
	// worker pauses until Postgres answers. It is never settled.
	Requeue
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
	case Requeue:
		return "requeued"
	}
	return "unknown"
}

// Result is the decided fate of one delivery.
type Result struct {
	Outcome Outcome
	// Layer is where a duplicate was recognised.
	Layer dedupe.Layer
	// Delay is the retry tier of a Retry.
	Delay time.Duration
	// Reason is the DLQ reason of a DeadLetter.
	Reason broker.DLQReason
	// Err is the processing error behind a Retry or DeadLetter.
	Err error
}

// permanentError marks an error no retry can fix.
type permanentError struct {
	reason broker.DLQReason
	err    error
}

func (e *permanentError) Error() string { return e.err.Error() }
func (e *permanentError) Unwrap() error { return e.err }

func permanent(reason broker.DLQReason, err error) error {
	return &permanentError{reason: reason, err: err}
}

// handlerError is what an effects handler returned: it may lie with one
// event of a batch, so the batch is committed again one event at a time;
// it is never taken for a Postgres outage.
type handlerError struct{ err error }

func (e *handlerError) Error() string { return "effect: " + e.err.Error() }
func (e *handlerError) Unwrap() error { return e.err }

// panicked is a panic recovered while processing: permanent, dead-lettered
// with reason panic. Its stack is logged where it is recovered.
type panicked struct {
	v     any
	stack []byte
}

func (p *panicked) Error() string { return fmt.Sprintf("panic: %v", p.v) }

// policy is what decide weighs besides the error.
type policy struct {
	// delays are the retry tiers, one per attempt.
	delays []time.Duration
	// retryOnOutage sends messages through the tiers while Postgres is
	// unreachable instead of giving them back (WORKER_OUTAGE_MODE=retry).
	retryOnOutage bool
}

// decide maps a processing error on the given attempt (1 = first) to the
// delivery's fate. It is the only place that chooses between requeue, retry
// and DLQ: invalid input, a panic, a handler's Permanent and a permanent
// database error go to the DLQ at once; a handler's RetryAfter takes the
// retry tier of at least its delay; an unreachable Postgres gives the
// message back (unless the policy retries on outage, and never for a
// handler's own error); anything else takes the next retry tier, and the
// DLQ once the tiers are used up.
func decide(err error, attempt int, p policy) Result {
	var fe *event.FieldError
	var pn *panicked
	var hp *effects.PermanentError
	var pe *permanentError
	var ra *effects.RetryAfterError
	switch {
	case errors.As(err, &fe):
		return Result{Outcome: DeadLetter, Reason: broker.ReasonInvalidPayload, Err: err}
	case errors.As(err, &pn):
		return Result{Outcome: DeadLetter, Reason: broker.ReasonPanic, Err: err}
	case errors.As(err, &hp):
		return Result{Outcome: DeadLetter, Reason: broker.ReasonRejectedByHandler, Err: err}
	case errors.As(err, &pe):
		return Result{Outcome: DeadLetter, Reason: pe.reason, Err: err}
	case !p.retryOnOutage && !errors.As(err, new(*handlerError)) && store.IsOutage(err):
		return Result{Outcome: Requeue, Err: err}
	case attempt < 1 || attempt > len(p.delays):
		return Result{Outcome: DeadLetter, Reason: broker.ReasonRetriesExhausted, Err: err}
	case errors.As(err, &ra):
		return Result{Outcome: Retry, Delay: atLeast(p.delays, attempt, ra.Delay), Err: err}
	}
	return Result{Outcome: Retry, Delay: p.delays[attempt-1], Err: err}
}

// atLeast is the retry tier of attempt, or a later one if it is shorter
// than d (the longest tier when none is that long).
func atLeast(delays []time.Duration, attempt int, d time.Duration) time.Duration {
	tier := delays[attempt-1]
	for _, t := range delays {
		if tier >= d {
			break
		}
		tier = max(tier, t)
	}
	return tier
}
