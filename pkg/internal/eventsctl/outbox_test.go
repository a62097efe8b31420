package eventsctl_test

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotent-events/idempotent-events/pkg/effects"
	"github.com/idempotent-events/idempotent-events/pkg/internal/eventsctl"
	"github.com/idempotent-events/idempotent-events/pkg/internal/outbox"
	"github.com/idempotent-events/idempotent-events/pkg/internal/servicetest"
)

// A parked outbox row is listed, shown, and released by retry, which is
// recorded in outbox_audit; a row that is not parked is left alone.
func TestOutboxListShowRetry(t *testing.T) {
	t.Parallel()
	dbURL := servicetest.Schema(t)
	ctx := context.Background()
	db, err := pgxpool.New(ctx, dbURL)
	require.NoError(t, err)
	defer db.Close()
	for _, key := range []string{"evt_stuck", "evt_fine"} {
		require.NoError(t, pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
			return outbox.Writer{Tx: tx}.Enqueue(ctx, effects.Event{Key: key}, effects.Message{
				Effect: "mail", ObjectID: "pi_" + key, RoutingKey: "nobody.home", Body: []byte(`{"hello":"world"}`)})
		}))
	}
	_, err = db.Exec(ctx, `UPDATE outbox SET parked_at = now(), attempts = 10, last_error = 'broker returned the message as unroutable: 312 NO_ROUTE'
		WHERE idempotency_key = 'evt_stuck/mail'`)
	require.NoError(t, err)
	env := map[string]string{"DATABASE_URL": dbURL, "USER": "ops-alice"}
	run := func(args ...string) (int, string, string) {
		var stdout, stderr bytes.Buffer
		code := eventsctl.Main(ctx, args, func(k string) string { return env[k] }, strings.NewReader(""), &stdout, &stderr)
		return code, stdout.String(), stderr.String()
	}

	code, out, errOut := run("outbox", "list")
	require.Equal(t, 0, code, errOut)
	assert.Contains(t, out, "evt_stuck/mail")
	assert.NotContains(t, out, "evt_fine/mail", "only parked rows without -all")
	assert.Contains(t, out, "NO_ROUTE")
	code, out, _ = run("outbox", "list", "-all")
	require.Equal(t, 0, code)
	assert.Contains(t, out, "evt_fine/mail")

	code, out, errOut = run("outbox", "show", "evt_stuck/mail")
	require.Equal(t, 0, code, errOut)
	assert.Contains(t, out, `{"hello":"world"}`)
	assert.Contains(t, out, "nobody.home")

	code, out, errOut = run("outbox", "retry", "evt_stuck/mail", "evt_fine/mail")
	require.Equal(t, 0, code, errOut)
	assert.Contains(t, out, "released")
	assert.Contains(t, out, "not parked, left as they are: evt_fine/mail")
	var parked, attempts, audited int
	require.NoError(t, db.QueryRow(ctx, `SELECT count(*) FILTER (WHERE parked_at IS NOT NULL), max(attempts) FROM outbox`).Scan(&parked, &attempts))
	assert.Zero(t, parked)
	assert.Zero(t, attempts)
	require.NoError(t, db.QueryRow(ctx, `SELECT count(*) FROM outbox_audit WHERE operator = 'ops-alice' AND action = 'retry'
		AND idempotency_key = 'evt_stuck/mail' AND detail LIKE '%NO_ROUTE%'`).Scan(&audited))
	assert.Equal(t, 1, audited)

	code, _, errOut = run("outbox", "show", "evt_none/mail")
	assert.Equal(t, 1, code)
	assert.Contains(t, errOut, "no such outbox row")
}
