package retention_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotent-events/idempotent-events/pkg/internal/broker"
	"github.com/idempotent-events/idempotent-events/pkg/internal/pipelinetest"
	"github.com/idempotent-events/idempotent-events/pkg/internal/reconcile"
	"github.com/idempotent-events/idempotent-events/pkg/internal/retention"
	"github.com/idempotent-events/idempotent-events/pkg/internal/servicetest"
)

func pool(t *testing.T) *pgxpool.Pool {
	t.Helper()
	db, err := pgxpool.New(context.Background(), servicetest.Schema(t))
	require.NoError(t, err)
	t.Cleanup(db.Close)
	return db
}

func exec(t *testing.T, db *pgxpool.Pool, sql string, args ...any) {
	t.Helper()
	_, err := db.Exec(context.Background(), sql, args...)
	require.NoError(t, err)
}

func count(t *testing.T, db *pgxpool.Pool, sql string) int {
	t.Helper()
	var n int
	require.NoError(t, db.QueryRow(context.Background(), sql).Scan(&n))
	return n
}

// rows of every pruned table at ages on both sides of their retention.
func seed(t *testing.T, db *pgxpool.Pool) {
	for i, age := range []int{40, 36, 34, 1} { // days; ledger retention 35d
		for k := range 5 {
			exec(t, db, `INSERT INTO processed_events (event_id, event_type, payload_sha256, processed_at)
				VALUES ($1, 't', '\x00', now() - $2 * interval '1 day')`, fmt.Sprintf("evt_%d_%d", i, k), age)
		}
		exec(t, db, `INSERT INTO event_conflicts (event_id, source, stored_sha256, received_sha256, body, recorded_at)
			VALUES ($1, 'stripe', '\x00', '\x01', '{}', now() - $2 * interval '1 day')`, fmt.Sprintf("evt_%d", i), age)
		exec(t, db, `INSERT INTO reconcile_runs (source, window_start, window_end, state, finished_at)
			VALUES ($1, now(), now(), 'done', now() - $2 * interval '1 day')`, fmt.Sprintf("s%d", i), age)
		exec(t, db, `INSERT INTO event_archive (event_id, source, provider_id, event_type, body, archived_at)
			VALUES ($1, 'stripe', $1, 't', '{}', now() - $2 * interval '1 day')`, fmt.Sprintf("evt_%d", i), age)
		// A finished backfill with one item, finished at age.
		exec(t, db, `WITH b AS (INSERT INTO backfills (handler, since, rate, finished_at) VALUES ('h', now(), 1, now() - $2 * interval '1 day') RETURNING id)
			INSERT INTO backfill_items (backfill_id, handler, event_id, outcome, finished_at) SELECT id, 'h', $1, 'applied', now() - $2 * interval '1 day' FROM b`,
			fmt.Sprintf("evt_%d", i), age)
	}
	// An open backfill and its pending item are never pruned, however old.
	exec(t, db, `WITH b AS (INSERT INTO backfills (handler, since, rate, created_at) VALUES ('open', now(), 1, now() - interval '90 days') RETURNING id)
		INSERT INTO backfill_items (backfill_id, handler, event_id) SELECT id, 'open', 'evt_open' FROM b`)
	// An unfinished run is never pruned, however old.
	exec(t, db, `INSERT INTO reconcile_runs (source, window_start, window_end, started_at) VALUES ('open', now(), now(), now() - interval '90 days')`)
	for _, age := range []int{400, 366, 100} { // audit retention 365d
		exec(t, db, `INSERT INTO dlq_audit (operator, via, action, dlq_id, outcome, at) VALUES ('o', 'cli', 'replay', 'd', 'replayed', now() - $1 * interval '1 day')`, age)
		exec(t, db, `INSERT INTO outbox_audit (operator, via, action, outbox_id, idempotency_key, at) VALUES ('o', 'cli', 'retry', 1, 'k', now() - $1 * interval '1 day')`, age)
	}
}

func TestPruneDeletesWhatIsOlderThanItsRetentionInBatches(t *testing.T) {
	t.Parallel()
	db := pool(t)
	seed(t, db)
	o := retention.Options{DB: db, Ledger: retention.DefaultLedger, Audit: retention.DefaultAudit, Archive: 10 * 24 * time.Hour, Batch: 3}

	dry := o
	dry.DryRun = true
	rep, err := retention.Prune(context.Background(), dry)
	require.NoError(t, err)
	want := map[string]int64{"processed_events": 10, "event_conflicts": 2, "reconcile_runs": 2, "dlq_audit": 2, "outbox_audit": 2,
		"event_archive": 3, "backfill_items": 2, "backfills": 2}
	assert.Equal(t, want, rep.Deleted)
	assert.Equal(t, 20, count(t, db, `SELECT count(*) FROM processed_events`), "a dry run deletes nothing")
	assert.Zero(t, count(t, db, `SELECT count(*) FROM prune_runs`), "nor records a run")

	batches := map[string]int{}
	o.AfterBatch = func(table string, _ int64) { batches[table]++ }
	rep, err = retention.Prune(context.Background(), o)
	require.NoError(t, err)
	assert.Equal(t, want, rep.Deleted)
	assert.Equal(t, 4, batches["processed_events"], "10 rows in batches of 3: 3, 3, 3, 1")
	assert.Equal(t, 10, count(t, db, `SELECT count(*) FROM processed_events WHERE processed_at > now() - interval '35 days'`))
	assert.Zero(t, count(t, db, `SELECT count(*) FROM processed_events WHERE processed_at < now() - interval '35 days'`))
	assert.Equal(t, 1, count(t, db, `SELECT count(*) FROM reconcile_runs WHERE source = 'open'`))
	assert.Equal(t, 1, count(t, db, `SELECT count(*) FROM dlq_audit`))
	assert.Equal(t, 1, count(t, db, `SELECT count(*) FROM event_archive`), "the archive by its own retention (10d)")
	assert.Equal(t, 1, count(t, db, `SELECT count(*) FROM backfill_items WHERE handler = 'open'`))
	assert.Equal(t, 3, count(t, db, `SELECT count(*) FROM backfills`), "the open one and the two within the ledger retention")
	assert.Equal(t, 1, count(t, db, `SELECT count(*) FROM prune_runs WHERE finished_at IS NOT NULL AND deleted->>'processed_events' = '10'`))

	keep, ok, err := retention.LedgerRetention(context.Background(), db)
	require.NoError(t, err)
	require.True(t, ok)
	assert.Equal(t, retention.DefaultLedger, keep)
}

func TestRetentionsHaveFloors(t *testing.T) {
	_, err := retention.Prune(context.Background(), retention.Options{Ledger: 6 * 24 * time.Hour, Audit: time.Hour})
	require.Error(t, err)
	for _, want := range []string{"DB", "Ledger", "Audit", "Batch"} {
		assert.Contains(t, err.Error(), want)
	}
	d, err := retention.ParseDays("35d")
	require.NoError(t, err)
	assert.Equal(t, 35*24*time.Hour, d)
	d, err = retention.ParseDays("90m")
	require.NoError(t, err)
	assert.Equal(t, 90*time.Minute, d)
	_, err = retention.ParseDays("xd")
	assert.Error(t, err)
}

// After a prune, a redelivery of an event inside the retention is a
// duplicate, found in the ledger (Redis forgot it).
func TestARedeliveryInsideTheRetentionIsStillADuplicate(t *testing.T) {
	t.Parallel()
	p := pipelinetest.New(t)
	p.StartWorker("")
	var recent, old []string
	for i := range 20 {
		id := fmt.Sprintf("evt_keep_%d", i)
		if i%2 == 0 {
			id = fmt.Sprintf("evt_old_%d", i)
			old = append(old, id)
		} else {
			recent = append(recent, id)
		}
		p.PublishEvent(id)
	}
	p.Eventually(func() bool { return p.LedgerRows() == 20 }, "processed")
	exec(t, p.DB, `UPDATE processed_events SET processed_at = now() - interval '40 days' WHERE event_id LIKE 'evt_old_%'`)
	_, err := retention.Prune(context.Background(), retention.Options{DB: p.DB, Ledger: retention.DefaultLedger, Audit: retention.DefaultAudit, Batch: 4})
	require.NoError(t, err)
	require.Equal(t, 10, p.LedgerRows())
	for _, id := range old {
		_, ledger := p.Rows(id)
		require.Zero(t, ledger, "%s was older than the retention", id)
	}
	require.NoError(t, servicetest.DeleteKeys(servicetest.RedisURL, p.Prefix))

	for _, id := range recent {
		p.PublishEvent(id)
	}
	p.Eventually(func() bool { return p.Outcomes("duplicate") >= 10 }, "redelivered")
	for _, id := range recent {
		payments, ledger := p.Rows(id)
		assert.Equal(t, [2]int{1, 1}, [2]int{payments, ledger}, "%s is inside the retention: a duplicate", id)
	}
	assert.Equal(t, float64(10), p.Outcomes("duplicate"))
	assert.Equal(t, 10, p.LedgerRows())
	// The worker exports the prune runs.
	assert.Equal(t, float64(10), servicetest.Metric(p.Reg, "idempotent_events_prune_deleted_rows_total", "table", "processed_events"))
	assert.Equal(t, retention.DefaultLedger.Seconds(), servicetest.Metric(p.Reg, "idempotent_events_prune_ledger_retention_seconds"))
	assert.InDelta(t, float64(time.Now().Unix()), servicetest.Metric(p.Reg, "idempotent_events_prune_last_success_timestamp_seconds"), 120)
	p.Invariant()

	// One whose ledger row is gone is processed again, and its payment
	// rows, which are not pruned, refuse it: the DLQ says so.
	p.PublishEvent(old[0])
	p.Eventually(func() bool { return p.Depth(broker.DLQ) == 1 }, "the pruned event came back")
	d, ok := p.Broker.Get(broker.DLQ)
	require.True(t, ok)
	assert.Equal(t, string(broker.ReasonRejectedByDatabase), broker.String(d.Headers, broker.HeaderDLQReason))
	assert.Equal(t, old[0], d.MessageId)
}

// The reconciler refuses a window that reaches past the latest prune's
// ledger retention: it would feed in events whose ledger rows are gone.
func TestReconcileRefusesAWindowPastTheRetention(t *testing.T) {
	t.Parallel()
	db := pool(t)
	_, err := retention.Prune(context.Background(), retention.Options{DB: db, Ledger: 8 * 24 * time.Hour, Audit: retention.DefaultAudit, Batch: 10})
	require.NoError(t, err)
	_, err = reconcile.Run(context.Background(), reconcile.Options{Source: "stripe", DB: db, DryRun: true, Since: 9 * 24 * time.Hour,
		Log: reconcile.NewStripeLog(reconcile.StripeOptions{APIKey: "sk_test", URL: "http://127.0.0.1:1"})})
	require.ErrorContains(t, err, "reaches past the ledger's retention")
}
