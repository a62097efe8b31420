package worker_test

import (
	"context"
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/idempotent-events/idempotent-events/pkg/internal/broker"
	"github.com/idempotent-events/idempotent-events/pkg/internal/servicetest"
	"github.com/idempotent-events/idempotent-events/pkg/internal/worker"
)

// A worker pointed at a database that does not exist, or at one without
// the schema, is not ready and says which dependency and what to do:
// PostgreSQL, run migrate — not "broker not connected" while the broker
// is connected.
func TestReadinessNamesTheDependencyThatIsDown(t *testing.T) {
	t.Parallel()
	empty := servicetest.Name("ie_empty")
	conn := servicetest.Conn(t, servicetest.DatabaseURL)
	_, err := conn.Exec(context.Background(), "CREATE SCHEMA "+empty)
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = conn.Exec(context.Background(), "DROP SCHEMA "+empty+" CASCADE") })
	cases := []struct{ name, url, want string }{
		{"missing database", otherDatabase(t, servicetest.Name("ie_missing")), "the database does not exist: run migrate"},
		{"missing schema", servicetest.WithSearchPath(servicetest.DatabaseURL, empty), "the schema is missing or older than this binary: run migrate"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, broker.QueueClassic)
			w := e.startNoWait(databaseURL(c.url))
			var last error
			require.Eventually(t, func() bool {
				last = w.w.Ready()
				return last != nil && strings.Contains(last.Error(), c.want)
			}, 15*time.Second, 20*time.Millisecond, "readiness: %v", func() any { return last })
			assert.Contains(t, last.Error(), "not consuming: PostgreSQL (DATABASE_URL)")
			assert.NotContains(t, last.Error(), "broker not connected")
		})
	}
}

// A Redis that refuses connections is not silent: the worker warns once
// that the fast path is off (and why it is still exactly once), not once
// per event, and the events are processed through PostgreSQL.
func TestARedisThatFailsIsLoggedOnceNotPerEvent(t *testing.T) {
	t.Parallel()
	e := newEnv(t, broker.QueueClassic)
	core, logs := observer.New(zap.InfoLevel)
	const n = 40
	for i := range n {
		e.publish(e.event(fmt.Sprintf("evt_redis_down_%d", i)))
	}
	w := e.start(redisURL("redis://127.0.0.1:1/0"), batched(4, time.Millisecond), func(o *worker.Options, _ *env) { o.Logger = zap.New(core) })
	eventually(t, func() bool { return w.outcomes("processed") == n }, "every event processed without Redis")
	w.stop(t)
	failing := logs.FilterMessageSnippet("redis (REDIS_URL) failing").All()
	require.Len(t, failing, 1, "one warning, not one per event or batch")
	assert.Equal(t, zap.WarnLevel, failing[0].Level)
	assert.Contains(t, failing[0].Message, "every event is checked in PostgreSQL")
	assert.Positive(t, w.count("idempotent_events_worker_redis_lookups_total", "result", "error"))
}

// otherDatabase is the test database's URL naming database name instead.
func otherDatabase(t *testing.T, name string) string {
	t.Helper()
	u, err := url.Parse(servicetest.DatabaseURL)
	require.NoError(t, err)
	u.Path = "/" + name
	return u.String()
}
