package migrate_test

import (
	"context"
	"io/fs"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotent-events/idempotent-events/migrations"
	"github.com/idempotent-events/idempotent-events/pkg/internal/migrate"
	"github.com/idempotent-events/idempotent-events/pkg/internal/servicetest"
)

// A fresh database: created by the first of several concurrent migrate
// runs, each migration applied exactly once, re-runs change nothing.
func TestConcurrentRunsCreateTheDatabaseAndApplyOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	name := servicetest.Name("ie_migrate")
	cfg, err := pgx.ParseConfig(servicetest.DatabaseURL)
	require.NoError(t, err)
	dbURL := replaceDatabase(t, servicetest.DatabaseURL, name)
	t.Cleanup(func() {
		admin := cfg.Copy()
		admin.Database = "postgres"
		if c, err := pgx.ConnectConfig(context.Background(), admin); err == nil {
			_, _ = c.Exec(context.Background(), "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)")
			_ = c.Close(context.Background())
		}
	})

	files, err := fs.Glob(migrations.FS, "*.sql")
	require.NoError(t, err)
	require.NotEmpty(t, files)

	const runs = 5
	results := make([]migrate.Result, runs)
	errs := make([]error, runs)
	var wg sync.WaitGroup
	for i := 0; i < runs; i++ {
		wg.Go(func() { results[i], errs[i] = migrate.Up(ctx, dbURL, time.Minute) })
	}
	wg.Wait()
	created, applied := 0, 0
	for i := 0; i < runs; i++ {
		require.NoError(t, errs[i], "run %d", i)
		if results[i].CreatedDatabase {
			created++
		}
		applied += len(results[i].Applied)
		assert.Equal(t, int64(len(files)), results[i].Version)
	}
	assert.Equal(t, 1, created, "exactly one run created the database")
	assert.Equal(t, len(files), applied, "each migration was applied once in total")

	again, err := migrate.Up(ctx, dbURL, time.Minute)
	require.NoError(t, err)
	assert.Empty(t, again.Applied)
	assert.False(t, again.CreatedDatabase)

	pending, err := migrate.Pending(ctx, dbURL)
	require.NoError(t, err)
	assert.False(t, pending)
}

func TestPendingOnAnEmptySchema(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, err := migrate.EnsureDatabase(ctx, servicetest.DatabaseURL)
	require.NoError(t, err)
	conn := servicetest.Conn(t, servicetest.DatabaseURL)
	schema := servicetest.Name("t_empty")
	_, err = conn.Exec(ctx, "CREATE SCHEMA "+schema)
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = conn.Exec(context.Background(), "DROP SCHEMA "+schema+" CASCADE") })

	pending, err := migrate.Pending(ctx, servicetest.WithSearchPath(servicetest.DatabaseURL, schema))
	require.NoError(t, err)
	assert.True(t, pending)
}

func replaceDatabase(t *testing.T, databaseURL, name string) string {
	t.Helper()
	cfg, err := pgx.ParseConfig(databaseURL)
	require.NoError(t, err)
	return "postgres://" + cfg.User + "@" + cfg.Host + ":" + strconv.Itoa(int(cfg.Port)) + "/" + name + "?sslmode=disable"
}
