package eventsctl_test

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotent-events/idempotent-events/pkg/effects"
	"github.com/idempotent-events/idempotent-events/pkg/internal/backfill"
	"github.com/idempotent-events/idempotent-events/pkg/internal/eventsctl"
	"github.com/idempotent-events/idempotent-events/pkg/internal/servicetest"
	"github.com/idempotent-events/idempotent-events/pkg/internal/store"
)

// eventsctl effects backfill plans, refuses what cannot be backfilled,
// queues once, and follows the workers' progress to the end; status and
// cancel see the same backfills.
func TestEffectsBackfillCommand(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := servicetest.Schema(t)
	st, err := store.Open(ctx, dbURL, 8)
	require.NoError(t, err)
	defer st.Close()
	db := st.Pool()
	_, err = db.Exec(ctx, `CREATE TABLE orders (event_id text NOT NULL)`)
	require.NoError(t, err)

	stock := effects.NewRegistry()
	stock.HandleFunc("payments", "stripe", "*", func(context.Context, effects.Event, effects.Tx, effects.Outbox) error { return nil })
	mine := effects.NewRegistry()
	mine.HandleFunc("payments", "stripe", "*", func(context.Context, effects.Event, effects.Tx, effects.Outbox) error { return nil })
	mine.HandleFunc("orders.create", "stripe", "payment_intent.succeeded", func(ctx context.Context, ev effects.Event, tx effects.Tx, _ effects.Outbox) error {
		_, err := tx.Exec(ctx, `INSERT INTO orders (event_id) VALUES ($1)`, ev.Key)
		return err
	})
	mine.OnTransitionFunc("receipts", "payment_intent", "succeeded", func(context.Context, effects.Transition, effects.Tx, effects.Outbox) error { return nil })

	// The stock set committed five events, three of them archived.
	set := stock.Set()
	old, _, err := st.Register(ctx, "v1", set.ID, set.Handlers)
	require.NoError(t, err)
	for i := range 5 {
		id := fmt.Sprintf("evt_cli_%d", i)
		_, err = db.Exec(ctx, `INSERT INTO processed_events (event_id, source, event_type, payload_sha256, generation) VALUES ($1, 'stripe', 'payment_intent.succeeded', '\x00', $2)`, id, old.Generation)
		require.NoError(t, err)
		if i < 3 {
			_, err = db.Exec(ctx, `INSERT INTO event_archive (event_id, source, provider_id, event_type, body) VALUES ($1, 'stripe', $1, 'payment_intent.succeeded', '{}')`, id)
			require.NoError(t, err)
		}
	}
	env := map[string]string{"DATABASE_URL": dbURL, "USER": "tester"}
	run := func(args ...string) (int, string, string) {
		var stdout, stderr bytes.Buffer
		code := eventsctl.Main(ctx, args, func(k string) string { return env[k] }, strings.NewReader(""), &stdout, &stderr)
		return code, stdout.String(), stderr.String()
	}

	code, _, errOut := run("effects", "backfill", "-handler", "orders.create", "-since", "1h")
	assert.Equal(t, 2, code, "the stock set is current: nobody runs orders.create")
	assert.Contains(t, errOut, "does not run it")

	set = mine.Set()
	cur, _, err := st.Register(ctx, "v2", set.ID, set.Handlers)
	require.NoError(t, err)

	code, _, errOut = run("effects", "backfill", "-handler", "receipts", "-since", "1h")
	assert.Equal(t, 2, code)
	assert.Contains(t, errOut, "transition handler")
	code, _, errOut = run("effects", "backfill", "-since", "yesterday", "-rate", "0")
	assert.Equal(t, 2, code)
	for _, want := range []string{"-handler is required", "-since: \"yesterday\"", "-rate must be above 0"} {
		assert.Contains(t, errOut, want)
	}

	code, out, errOut := run("effects", "backfill", "-handler", "orders.create", "-since", "1h", "-dry-run")
	require.Equal(t, 0, code, errOut)
	assert.Contains(t, out, "committed without it: 5")
	assert.Contains(t, out, "to queue: 3 (0 queued")
	assert.Contains(t, out, "cannot be backfilled: 2 without a body in event_archive")
	assert.Contains(t, out, "evt_cli_3, evt_cli_4")
	assert.Contains(t, out, "dry run: nothing queued")

	// The workers: one Runner of the current set.
	r, err := backfill.NewRunner(backfill.RunnerOptions{DB: db, Ledger: st, Effects: mine, Fence: func() store.Fence { return cur }, Poll: 20 * time.Millisecond})
	require.NoError(t, err)
	rctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { r.Run(rctx); close(done) }()
	code, out, errOut = run("effects", "backfill", "-handler", "orders.create", "-since", "1h", "-rate", "100", "-progress", "50ms")
	stop()
	<-done
	require.Equal(t, 0, code, errOut+out)
	assert.Contains(t, out, "3 events queued for orders.create")
	assert.Contains(t, out, "3/3 done (3 applied, 0 skipped, 0 failed), finished")
	var orders int
	require.NoError(t, db.QueryRow(ctx, `SELECT count(*) FROM orders`).Scan(&orders))
	assert.Equal(t, 3, orders)

	// Again: nothing to queue.
	code, out, errOut = run("effects", "backfill", "-handler", "orders.create", "-since", "1h")
	require.Equal(t, 0, code, errOut)
	assert.Contains(t, out, "0 events queued")

	code, out, errOut = run("effects", "status")
	require.Equal(t, 0, code, errOut)
	assert.Contains(t, out, "no backfill is open")

	// A backfill nobody runs can be cancelled.
	_, err = db.Exec(ctx, `INSERT INTO processed_events (event_id, source, event_type, payload_sha256, generation) VALUES ('evt_cli_late', 'stripe', 'payment_intent.succeeded', '\x00', $1)`, old.Generation)
	require.NoError(t, err)
	_, err = db.Exec(ctx, `INSERT INTO event_archive (event_id, source, provider_id, event_type, body) VALUES ('evt_cli_late', 'stripe', 'evt_cli_late', 'payment_intent.succeeded', '{}')`)
	require.NoError(t, err)
	code, out, errOut = run("effects", "backfill", "-handler", "orders.create", "-since", "1h", "-detach")
	require.Equal(t, 0, code, errOut)
	assert.Contains(t, out, "1 events queued")
	open, err := backfill.Open(ctx, pool(t, dbURL))
	require.NoError(t, err)
	require.Len(t, open, 1)
	code, out, errOut = run("effects", "status")
	require.Equal(t, 0, code, errOut)
	assert.Contains(t, out, "0/1 done")
	code, out, errOut = run("effects", "cancel", "-id", fmt.Sprint(open[0]))
	require.Equal(t, 0, code, errOut)
	assert.Contains(t, out, "1 events unqueued")
}

func pool(t *testing.T, dbURL string) *pgxpool.Pool {
	t.Helper()
	db, err := pgxpool.New(context.Background(), dbURL)
	require.NoError(t, err)
	t.Cleanup(db.Close)
	return db
}
