package effectstest

import (
	"context"
	"encoding/json"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/idempotent-events/idempotent-events/pkg/effects"
	"github.com/idempotent-events/idempotent-events/pkg/internal/broker"
	"github.com/idempotent-events/idempotent-events/pkg/internal/servicetest"
	"github.com/idempotent-events/idempotent-events/pkg/internal/worker"
)

// Options says what AssertExactlyOnce runs.
type Options struct {
	// Effects are the handlers under test.
	Effects *effects.Registry
	// Fixtures are event bodies as the provider sends them (Stripe events),
	// with distinct ids.
	Fixtures [][]byte
	// Setup creates the handlers' own tables in a fresh schema (the
	// project's migrations are applied before it).
	Setup func(ctx context.Context, db *pgxpool.Pool) error
	// Tables are the tables whose rows must end the same in both runs: the
	// handlers' own, and any of the project's they write ("outbox" for the
	// messages they enqueue; they are not published here).
	Tables []string
	// Ignore names columns whose values differ between any two runs by
	// nature (a generated id, a now() timestamp); they are not compared.
	Ignore []string
}

// AssertExactlyOnce runs the real worker on opts.Fixtures twice, each time
// on a fresh schema, vhost and key prefix:
//
//  1. cleanly: each fixture delivered once;
//  2. under faults: each fixture delivered twice at the same time, every
//     batch's processing killed once after the handlers ran but before
//     COMMIT (everything rolled back, the deliveries redelivered) and once
//     after COMMIT but before the ack (redelivered, found a duplicate).
//
// It then asserts that every table in opts.Tables holds the same rows
// after both runs, and that nothing went to the DLQ. A handler that writes
// through its own connection instead of the transaction it is given keeps
// the writes of the attempt that was rolled back, and fails here.
func AssertExactlyOnce(t *testing.T, opts Options) {
	t.Helper()
	require.NotNil(t, opts.Effects, "Options.Effects is required")
	require.NotEmpty(t, opts.Fixtures, "Options.Fixtures is required")
	require.NotEmpty(t, opts.Tables, "Options.Tables is required")
	clean := runWorker(t, opts, false)
	faulty := runWorker(t, opts, true)
	for _, table := range opts.Tables {
		require.Equal(t, clean[table], faulty[table],
			"table %s differs between one clean run and the run with duplicates and crashes: the effect is not exactly once "+
				"(does the handler write through something other than the Tx it is given?)", table)
	}
}

// runWorker runs the fixtures through an in-process worker and returns the
// rows of opts.Tables.
func runWorker(t *testing.T, opts Options, faults bool) map[string][]string {
	t.Helper()
	ctx := context.Background()
	dbURL := servicetest.Schema(t)
	pool, err := pgxpool.New(ctx, dbURL)
	require.NoError(t, err)
	defer pool.Close()
	if opts.Setup != nil {
		require.NoError(t, opts.Setup(ctx, pool), "setup")
	}
	amqpURL := servicetest.VHost(t)
	topo := broker.Topology{QueueType: broker.QueueClassic, RetryDelays: []time.Duration{200 * time.Millisecond, 400 * time.Millisecond, 800 * time.Millisecond}, DeliveryLimit: 100}
	b := servicetest.NewBroker(t, amqpURL, topo)
	var hooks worker.Hooks
	if faults {
		hooks = worker.Hooks{BeforeCommit: crashOncePer(), AfterCommit: crashOncePer()}
	}
	reg := prometheus.NewRegistry()
	_, stop := startWorker(t, workerSpec{dbURL: dbURL, amqpURL: amqpURL, redisPrefix: servicetest.RedisPrefix(t), topo: topo,
		fx: opts.Effects, hooks: hooks, prefetch: 64, batchSize: 8, metrics: reg})
	defer stop()

	copies := 1
	if faults {
		copies = 2
	}
	var wg sync.WaitGroup
	var keys []string
	for _, body := range opts.Fixtures {
		var id struct{ ID string }
		require.NoError(t, json.Unmarshal(body, &id))
		keys = append(keys, id.ID)
		for range copies {
			wg.Go(func() { b.PublishEventWithID(body, id.ID, amqp.Table{}) })
		}
	}
	wg.Wait()
	// Every fixture's effects are in once its ledger row is (one
	// transaction); what is still in flight after that can only be a
	// duplicate. (The worker's settled count is no measure: a delivery
	// settled on a session a crash then tore down is settled again.)
	committed := func() int {
		var n int
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM processed_events WHERE event_id = ANY($1)`, keys).Scan(&n))
		return n
	}
	waitFor(t, 60*time.Second, func() bool { return committed() == len(keys) || b.Depth(broker.DLQ) > 0 },
		"every fixture committed (%d of %d; settled deliveries: %v)", committed(), len(keys), settled(reg))
	require.Zero(t, b.Depth(broker.DLQ), "a fixture went to the DLQ: its handler failed")

	rows := map[string][]string{}
	ignore := append([]string{}, opts.Ignore...) // never NULL: jsonb - NULL is NULL
	for _, table := range opts.Tables {
		q := "SELECT (to_jsonb(t) - $1::text[])::text FROM " + pgx.Identifier{table}.Sanitize() + " t ORDER BY 1"
		r, err := pool.Query(ctx, q, ignore)
		require.NoError(t, err, "read %s", table)
		rows[table], err = pgx.CollectRows(r, pgx.RowTo[string])
		require.NoError(t, err, "read %s", table)
	}
	return rows
}

// crashOncePer returns a hook that simulates a crash the first time it
// sees each event.
func crashOncePer() worker.Hook {
	var mu sync.Mutex
	seen := map[string]bool{}
	return func(ids []string) error {
		mu.Lock()
		defer mu.Unlock()
		crash := false
		for _, id := range ids {
			if !seen[id] {
				seen[id], crash = true, true
			}
		}
		if crash {
			return errCrash
		}
		return nil
	}
}

// settled is the number of deliveries the worker has settled.
func settled(reg *prometheus.Registry) float64 {
	mfs, err := reg.Gather()
	if err != nil {
		return 0
	}
	var n float64
	for _, mf := range mfs {
		if mf.GetName() != "idempotent_events_worker_events_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			n += m.GetCounter().GetValue()
		}
	}
	return n
}
