package effects

import (
	"errors"
	"fmt"
	"time"
)

// PermanentError is a handler's error no retry can fix: the event goes to
// the DLQ at once.
type PermanentError struct{ Err error }

func (e *PermanentError) Error() string { return "permanent: " + e.Err.Error() }
func (e *PermanentError) Unwrap() error { return e.Err }

// Permanent marks err as permanent.
func Permanent(err error) error {
	if err == nil {
		err = errors.New("permanent failure")
	}
	return &PermanentError{Err: err}
}

// RetryAfterError asks for the event to be tried again after at least
// Delay, through the retry tiers.
type RetryAfterError struct {
	Delay time.Duration
	Err   error
}

func (e *RetryAfterError) Error() string {
	return fmt.Sprintf("retry after %s: %v", e.Delay, e.Err)
}
func (e *RetryAfterError) Unwrap() error { return e.Err }

// RetryAfter asks for the event to be tried again after at least d.
func RetryAfter(d time.Duration, err error) error {
	if err == nil {
		err = errors.New("retry requested")
	}
	return &RetryAfterError{Delay: d, Err: err}
}

// SkipError says the handler has nothing to do for the event.
type SkipError struct{ Reason string }

func (e *SkipError) Error() string { return "skipped: " + e.Reason }

// Skip says the handler has nothing to do for the event: the ledger row
// commits with outcome skipped.
func Skip(reason string) error { return &SkipError{Reason: reason} }
