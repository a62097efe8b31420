package eventsctl_test

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotent-events/idempotent-events/pkg/internal/eventsctl"
	"github.com/idempotent-events/idempotent-events/pkg/internal/servicetest"
)

func TestPruneCommand(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := servicetest.Schema(t)
	db, err := pgxpool.New(ctx, dbURL)
	require.NoError(t, err)
	defer db.Close()
	_, err = db.Exec(ctx, `INSERT INTO processed_events (event_id, event_type, payload_sha256, processed_at)
		VALUES ('evt_old', 't', '\x00', now() - interval '10 days'), ('evt_new', 't', '\x00', now())`)
	require.NoError(t, err)
	env := map[string]string{"DATABASE_URL": dbURL, "LEDGER_RETENTION": "8d", "LOG_LEVEL": "error"}
	run := func(args ...string) (int, string, string) {
		var stdout, stderr bytes.Buffer
		code := eventsctl.Main(ctx, args, func(k string) string { return env[k] }, strings.NewReader(""), &stdout, &stderr)
		return code, stdout.String(), stderr.String()
	}

	code, out, errOut := run("prune", "-dry-run")
	require.Equal(t, 0, code, errOut)
	assert.Contains(t, out, "processed_events   would delete 1 rows")
	code, out, errOut = run("prune")
	require.Equal(t, 0, code, errOut)
	assert.Contains(t, out, "processed_events   deleted 1 rows")
	var left []string
	rows, err := db.Query(ctx, `SELECT event_id FROM processed_events`)
	require.NoError(t, err)
	for rows.Next() {
		var id string
		require.NoError(t, rows.Scan(&id))
		left = append(left, id)
	}
	assert.Equal(t, []string{"evt_new"}, left)

	code, _, errOut = run("prune", "-ledger-retention", "6d")
	assert.Equal(t, 2, code)
	assert.Contains(t, errOut, "Ledger")
	code, out, errOut = run("prune", "-check-config", "-batch", "100")
	assert.Equal(t, 0, code, errOut)
	assert.Contains(t, out, "configuration ok")
	code, _, errOut = run("prune", "-check-config", "-batch", "0")
	assert.Equal(t, 2, code)
	assert.Contains(t, errOut, "Batch")
	code, _, errOut = run("prune", "-audit-retention", "soon")
	assert.Equal(t, 2, code)
	assert.Contains(t, errOut, "AUDIT_RETENTION")
}
