package worker

import (
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/assert"

	"github.com/idempotent-events/idempotent-events/pkg/internal/broker"
	"github.com/idempotent-events/idempotent-events/pkg/internal/event"
)

// Every fate a processing error can have comes out of decide.
func TestDecideMapsEveryErrorToOneFate(t *testing.T) {
	tiers := []time.Duration{time.Second, time.Minute}
	pause, retry := policy{delays: tiers}, policy{delays: tiers, retryOnOutage: true}
	transient := &pgconn.PgError{Code: "40001"} // serialization_failure
	down := errors.New("dial tcp 127.0.0.1:5432: connect: connection refused")
	cases := []struct {
		name    string
		err     error
		attempt int
		p       policy
		want    Result
	}{
		{"invalid payload", &event.FieldError{Field: "id", Problem: "missing"}, 1, pause, Result{Outcome: DeadLetter, Reason: broker.ReasonInvalidPayload}},
		{"panic", &panicked{v: "bug"}, 1, pause, Result{Outcome: DeadLetter, Reason: broker.ReasonPanic}},
		{"rejected by the database", permanent(broker.ReasonRejectedByDatabase, &pgconn.PgError{Code: "23514"}), 1, pause,
			Result{Outcome: DeadLetter, Reason: broker.ReasonRejectedByDatabase}},
		{"outage, pause mode", down, 1, pause, Result{Outcome: Requeue}},
		{"outage, retry mode, first attempt", down, 1, retry, Result{Outcome: Retry, Delay: time.Second}},
		{"transient, second attempt", transient, 2, pause, Result{Outcome: Retry, Delay: time.Minute}},
		{"transient, tiers used up", transient, 3, pause, Result{Outcome: DeadLetter, Reason: broker.ReasonRetriesExhausted}},
	}
	for _, c := range cases {
		got := decide(c.err, c.attempt, c.p)
		assert.Equal(t, c.want.Outcome, got.Outcome, c.name)
		assert.Equal(t, c.want.Reason, got.Reason, c.name)
		assert.Equal(t, c.want.Delay, got.Delay, c.name)
		assert.Equal(t, c.err, got.Err, c.name)
	}
}

// New names every option that would make a worker that silently does
// nothing, or panics at the first message.
func TestNewRefusesOptionsThatCannotWork(t *testing.T) {
	_, err := New(Options{})
	for _, field := range []string{"Dialer.URL is required", "Prefetch must be at least 1", "ReplayPrefetch must be at least 1",
		"Concurrency must be at least 1", "BatchSize must be at least 1", "ProcessTimeout must be positive",
		"PublishTimeout must be positive", "ShutdownTimeout must be positive", "Ledger is required", "Cache is required",
		"Metrics is required"} {
		assert.ErrorContains(t, err, field)
	}
}
