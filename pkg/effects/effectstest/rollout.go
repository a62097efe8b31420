package effectstest

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/idempotent-events/idempotent-events/pkg/effects"
	"github.com/idempotent-events/idempotent-events/pkg/internal/backfill"
	"github.com/idempotent-events/idempotent-events/pkg/internal/broker"
	"github.com/idempotent-events/idempotent-events/pkg/internal/servicetest"
	"github.com/idempotent-events/idempotent-events/pkg/internal/store"
	"github.com/idempotent-events/idempotent-events/pkg/internal/worker"
)

// RolloutOptions says what AssertRollout runs: a team's handler set before
// and after a change, and the events of the rollout.
type RolloutOptions struct {
	// Old and New are the handler sets before and after the change (New
	// with a handler added, removed or rerouted; an identical set is a
	// rollout that changed nothing the ledger tracks).
	Old, New *effects.Registry
	// Before are events the old workers commit alone; During are sent once
	// the new release has been announced, while old and new workers consume
	// the same queue. Stripe event bodies with distinct ids.
	Before, During [][]byte
	// Setup creates the handlers' own tables (both versions').
	Setup func(ctx context.Context, db *pgxpool.Pool) error
	// Backfill, when set, names an event handler of New that Old lacks:
	// the old workers archive what they commit (EVENT_ARCHIVE), and after
	// the rollout the handler is backfilled over Before by the new worker
	// (queued twice, as an operator running eventsctl effects backfill
	// twice would); every event of Before its routes take must then have
	// run it once, none failed. Check sees the tables after it.
	Backfill string
	// Check, when set, looks at the tables after the rollout: before and
	// during are the events' ledger ids.
	Check func(t *testing.T, db *pgxpool.Pool, before, during []string)
}

// AssertRollout runs a rollout from opts.Old to opts.New on the real worker,
// RabbitMQ, Redis and PostgreSQL, as a rolling deploy does: two workers of
// the old set commit opts.Before; the new release is announced (the chart's
// migration hook) and a worker of the new set starts beside the old ones;
// opts.During is sent while all three consume. It asserts that every event
// of opts.Before was committed by the old set, every event of opts.During
// by the new one (none by the old after the announcement, none skipped),
// that the old workers are fenced when the sets differ, and that nothing
// went to the DLQ; then it runs opts.Check.
func AssertRollout(t *testing.T, opts RolloutOptions) {
	t.Helper()
	require.NotNil(t, opts.Old, "RolloutOptions.Old is required")
	require.NotNil(t, opts.New, "RolloutOptions.New is required")
	require.NotEmpty(t, opts.During, "RolloutOptions.During is required")
	ctx := context.Background()
	dbURL := servicetest.Schema(t)
	pool, err := pgxpool.New(ctx, dbURL)
	require.NoError(t, err)
	defer pool.Close()
	if opts.Setup != nil {
		require.NoError(t, opts.Setup(ctx, pool), "setup")
	}
	amqpURL := servicetest.VHost(t)
	topo := broker.Topology{QueueType: broker.QueueClassic, RetryDelays: []time.Duration{200 * time.Millisecond, 400 * time.Millisecond}, DeliveryLimit: 100}
	b := servicetest.NewBroker(t, amqpURL, topo)
	prefix := servicetest.RedisPrefix(t)

	start := func(release string, fx *effects.Registry) *worker.Worker {
		w, stop := startWorker(t, workerSpec{dbURL: dbURL, amqpURL: amqpURL, redisPrefix: prefix, topo: topo,
			fx: fx, release: release, prefetch: 16, batchSize: 4, archive: opts.Backfill != ""})
		t.Cleanup(stop)
		return w
	}
	publish := func(bodies [][]byte) []string {
		keys := make([]string, len(bodies))
		for i, body := range bodies {
			var id struct{ ID string }
			require.NoError(t, json.Unmarshal(body, &id))
			keys[i] = id.ID
			b.PublishEventWithID(body, id.ID, amqp.Table{})
		}
		return keys
	}
	committedBy := func(keys []string, set string) int {
		var n int
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM processed_events e JOIN handler_generations g USING (generation)
			WHERE e.event_id = ANY($1) AND ($2 = '' OR g.set_id = $2)`, keys, set).Scan(&n))
		return n
	}

	oldSet, newSet := opts.Old.Set(), opts.New.Set()
	olds := []*worker.Worker{start("old", opts.Old), start("old", opts.Old)}
	before := publish(opts.Before)
	waitFor(t, 60*time.Second, func() bool { return committedBy(before, "") == len(before) || b.Depth(broker.DLQ) > 0 },
		"the old set committed every event sent before the rollout")

	st, err := store.Open(ctx, dbURL, 1)
	require.NoError(t, err)
	defer st.Close()
	_, err = st.Announce(ctx, "new")
	require.NoError(t, err)
	start("new", opts.New)
	during := publish(opts.During)
	waitFor(t, 60*time.Second, func() bool { return committedBy(during, "") == len(during) || b.Depth(broker.DLQ) > 0 },
		"every event sent during the rollout committed")
	require.Zero(t, b.Depth(broker.DLQ), "an event went to the DLQ: a handler failed")

	require.Equal(t, len(before), committedBy(before, oldSet.ID), "events sent before the rollout, committed by the old set")
	require.Equal(t, len(during), committedBy(during, newSet.ID),
		"events sent after the new release was announced must be committed by the new set %v", newSet.Handlers)
	var late int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM processed_events e JOIN handler_generations g USING (generation)
		WHERE g.release = 'old' AND e.processed_at > (SELECT announced_at FROM handler_generations WHERE release = 'new')`).Scan(&late))
	require.Zero(t, late, "events committed by the old set after the announcement")
	if oldSet.ID != newSet.ID {
		for _, w := range olds {
			// Each old worker is fenced by its next commit; one that took
			// no event since the announcement has had nothing to refuse.
			if err := w.Ready(); err == nil {
				continue
			}
			require.ErrorContains(t, w.Ready(), "fenced: handler set "+oldSet.ID)
		}
	}
	if opts.Backfill != "" {
		assertBackfill(t, pool, opts.Backfill, before)
	}
	if opts.Check != nil {
		opts.Check(t, pool, before, during)
	}
}

// assertBackfill backfills handler over the events committed before the
// rollout, queued twice, and waits for the new worker to run it: each
// event the handler's routes take exactly once, none failed.
func assertBackfill(t *testing.T, pool *pgxpool.Pool, handler string, before []string) {
	t.Helper()
	ctx := context.Background()
	req := backfill.Request{Handler: handler, Since: time.Now().Add(-time.Hour)}
	plan, err := backfill.MakePlan(ctx, pool, req)
	require.NoError(t, err, "plan the backfill of %s", handler)
	require.Equal(t, plan.Missed, plan.Archived, "events committed by the old set without an archived body")
	var ids []int64
	var queued int64
	for range 2 {
		id, n, err := backfill.Queue(ctx, pool, req, 1000, "effectstest")
		require.NoError(t, err)
		ids, queued = append(ids, id), queued+n
	}
	require.Equal(t, plan.ToQueue(), queued, "queued twice: each event once")
	var progress backfill.Progress
	waitFor(t, 60*time.Second, func() bool {
		progress, err = backfill.ProgressOf(ctx, pool, ids[0])
		require.NoError(t, err)
		return progress.Finished
	}, "the new worker ran the backfill of %s", handler)
	require.Zero(t, progress.Failed, "backfill of %s: failed events, the last error: %s", handler, progress.LastError)
	var ran int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM backfill_items WHERE handler = $1 AND event_id = ANY($2) AND outcome IN ('applied', 'skipped')`,
		handler, before).Scan(&ran))
	require.Equal(t, int(plan.Missed), ran, "events sent before the rollout that ran %s by the backfill", handler)
}
