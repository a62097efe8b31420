package worker

import (
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/idempotent-events/idempotent-events/pkg/internal/store"
)

// Why the worker is not consuming, for /readyz and its logs: the
// dependency that is down, named as its variable is, with a hint where
// there is one (a missing database: run migrate). Set at each step of
// serve; read by Ready.
const (
	waitBroker      = "RabbitMQ (AMQP_URL): not connected yet"
	waitBrokerLost  = "RabbitMQ (AMQP_URL): connection lost, reconnecting"
	waitPostgres    = "connected to RabbitMQ; checking PostgreSQL (DATABASE_URL)"
	waitRegistering = "registering the handler set in PostgreSQL (DATABASE_URL)"
)

// postgresReason is the reason for a PostgreSQL error during what.
func postgresReason(what string, err error) string {
	reason := "PostgreSQL (DATABASE_URL): " + what + ": " + err.Error()
	if hint := store.Hint(err); hint != "" {
		reason += " (" + hint + ")"
	}
	return reason
}

func (w *Worker) setWaiting(reason string) { w.waiting.Store(&reason) }

func (w *Worker) waitingReason() string {
	if r := w.waiting.Load(); r != nil {
		return *r
	}
	return waitBroker
}

// redisReportEvery is how often a Redis that keeps failing is logged again.
const redisReportEvery = 30 * time.Second

// redisFaults logs Redis failures without flooding the log: the first
// after a success is a warning that names Redis and what it costs; while
// it keeps failing, one line per redisReportEvery with how many failed;
// the first success after failures says it answers again. The counters
// (redis_lookups_total, redis_writes_total) count every one.
type redisFaults struct {
	mu       sync.Mutex
	failing  bool
	failures int
	reported time.Time
	now      func() time.Time
}

func (f *redisFaults) failed(log *zap.Logger, op string, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	now := f.clock()
	f.failures++
	switch {
	case !f.failing:
		f.failing, f.reported, f.failures = true, now, 0
		log.Warn("redis (REDIS_URL) failing: the fast path is off, every event is checked in PostgreSQL (slower, still exactly once)",
			zap.String("op", op), zap.Error(err))
	case now.Sub(f.reported) >= redisReportEvery:
		log.Warn("redis (REDIS_URL) still failing", zap.Int("failures", f.failures), zap.Duration("in", now.Sub(f.reported)),
			zap.String("op", op), zap.Error(err))
		f.reported, f.failures = now, 0
	}
}

func (f *redisFaults) ok(log *zap.Logger) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.failing {
		f.failing = false
		log.Info("redis (REDIS_URL) answers again: fast path on", zap.Int("failures_since_last_report", f.failures))
	}
}

func (f *redisFaults) clock() time.Time {
	if f.now != nil {
		return f.now()
	}
	return time.Now()
}
