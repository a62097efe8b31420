// Package migrate brings the Postgres schema of idempotent-events up to date.
//
// The migrations are the embedded SQL files of package migrations, applied
// with github.com/pressly/goose/v3 (chosen for its Provider API: versioned
// files from an fs.FS, a per-database version table, and a session locker).
//
// Several migrate processes may run at once (a Helm hook on every upgrade,
// replicas of an init container): each takes a Postgres session advisory lock
// before it looks at the version table, so exactly one applies a given
// migration and the others find nothing pending. Running it again when
// nothing is pending changes nothing. The lock id is derived from the
// database and schema names, so migrations of unrelated schemas do not wait
// on each other.
package migrate

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"hash/fnv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"

	"github.com/idempotent-events/idempotent-events/migrations"
	"github.com/idempotent-events/idempotent-events/pkg/internal/tlsconfig"
)

// Result describes one run.
type Result struct {
	// CreatedDatabase is true when this run created the database.
	CreatedDatabase bool
	// Applied lists the versions this run applied, in order.
	Applied []int64
	// Version is the schema version after the run.
	Version int64
}

// Target is a database to migrate: its DATABASE_URL and the TLS of its
// connections (DATABASE_TLS_*; nil: none of ours). The functions of the
// package are Target's methods without TLS.
type Target struct {
	URL string
	TLS *tlsconfig.Client
}

// Up creates the database named in databaseURL if it does not exist, then
// applies every pending migration. lockTimeout bounds the wait for another
// migrate that holds the lock.
func Up(ctx context.Context, databaseURL string, lockTimeout time.Duration) (Result, error) {
	return Target{URL: databaseURL}.Up(ctx, lockTimeout)
}

// Up is the package's Up on t.
func (t Target) Up(ctx context.Context, lockTimeout time.Duration) (Result, error) {
	var res Result
	created, err := t.EnsureDatabase(ctx)
	if err != nil {
		return res, err
	}
	res.CreatedDatabase = created

	db, err := t.openDB()
	if err != nil {
		return res, err
	}
	defer db.Close()
	p, err := newProvider(ctx, db, lockTimeout)
	if err != nil {
		return res, err
	}
	results, err := p.Up(ctx)
	for _, r := range results {
		if r.Error == nil && !r.Empty {
			res.Applied = append(res.Applied, r.Source.Version)
		}
	}
	if err != nil {
		return res, fmt.Errorf("apply migrations: %w", err)
	}
	if res.Version, err = p.GetDBVersion(ctx); err != nil {
		return res, fmt.Errorf("read schema version: %w", err)
	}
	return res, nil
}

// Pending reports whether the database lacks any embedded migration; an
// error means the schema could not be read (no database, no version table).
func Pending(ctx context.Context, databaseURL string) (bool, error) {
	return Target{URL: databaseURL}.Pending(ctx)
}

// Pending is the package's Pending on t.
func (t Target) Pending(ctx context.Context) (bool, error) {
	db, err := t.openDB()
	if err != nil {
		return false, err
	}
	defer db.Close()
	p, err := goose.NewProvider(goose.DialectPostgres, db, migrations.FS)
	if err != nil {
		return false, fmt.Errorf("load migrations: %w", err)
	}
	return p.HasPending(ctx)
}

// Wait polls until the database exists and has no pending migration, or
// ctx is done. It is what receiver and worker pods run before starting, so
// they never run against an old schema.
func Wait(ctx context.Context, databaseURL string, every time.Duration, progress func(error)) error {
	return Target{URL: databaseURL}.Wait(ctx, every, progress)
}

// Wait is the package's Wait on t.
func (t Target) Wait(ctx context.Context, every time.Duration, progress func(error)) error {
	for {
		pending, err := t.Pending(ctx)
		if err == nil && !pending {
			return nil
		}
		if err == nil {
			err = errors.New("migrations pending")
		}
		progress(err)
		select {
		case <-ctx.Done():
			return fmt.Errorf("schema not current: %w (last: %w)", ctx.Err(), err)
		case <-time.After(every):
		}
	}
}

func (t Target) openDB() (*sql.DB, error) {
	cfg, err := pgx.ParseConfig(t.URL)
	if err != nil {
		return nil, fmt.Errorf("parse DATABASE_URL: %w", err)
	}
	t.TLS.ConfigurePgx(&cfg.Config)
	// database/sql reconnects with the same configuration: refresh its
	// TLS before each connection, for a rotation during a long run.
	return stdlib.OpenDB(*cfg, stdlib.OptionBeforeConnect(func(_ context.Context, cc *pgx.ConnConfig) error {
		t.TLS.ConfigurePgx(&cc.Config)
		return nil
	})), nil
}

func newProvider(ctx context.Context, db *sql.DB, lockTimeout time.Duration) (*goose.Provider, error) {
	var dbName, schema string
	if err := db.QueryRowContext(ctx, "SELECT current_database(), coalesce(current_schema(), '')").Scan(&dbName, &schema); err != nil {
		return nil, fmt.Errorf("connect: %w", err)
	}
	h := fnv.New64a()
	h.Write([]byte("idempotent-events migrate\x00" + dbName + "\x00" + schema))
	seconds := uint64(max(lockTimeout/time.Second, 1))
	locker, err := lock.NewPostgresSessionLocker(
		lock.WithLockID(int64(h.Sum64()>>1)),
		lock.WithLockTimeout(1, seconds),
	)
	if err != nil {
		return nil, fmt.Errorf("migration lock: %w", err)
	}
	p, err := goose.NewProvider(goose.DialectPostgres, db, migrations.FS, goose.WithSessionLocker(locker))
	if err != nil {
		return nil, fmt.Errorf("load migrations: %w", err)
	}
	return p, nil
}

// EnsureDatabase creates the database named in databaseURL when it does not
// exist, connecting to the server's "postgres" database to do so. It is safe
// when several callers race: losing the race is not an error.
func EnsureDatabase(ctx context.Context, databaseURL string) (bool, error) {
	return Target{URL: databaseURL}.EnsureDatabase(ctx)
}

// EnsureDatabase is the package's EnsureDatabase on t.
func (t Target) EnsureDatabase(ctx context.Context) (bool, error) {
	cfg, err := pgx.ParseConfig(t.URL)
	if err != nil {
		return false, fmt.Errorf("parse DATABASE_URL: %w", err)
	}
	t.TLS.ConfigurePgx(&cfg.Config)
	target := cfg.Database
	if target == "" {
		return false, errors.New("DATABASE_URL names no database")
	}
	// Fast path: the database exists and we can connect to it.
	if conn, err := pgx.ConnectConfig(ctx, cfg); err == nil {
		_ = conn.Close(ctx)
		return false, nil
	} else if !isCode(err, "3D000") { // invalid_catalog_name
		return false, fmt.Errorf("connect to database %s: %w", target, tlsconfig.Postgres.Explain(err))
	}
	admin := cfg.Copy()
	admin.Database = "postgres"
	conn, err := pgx.ConnectConfig(ctx, admin)
	if err != nil {
		return false, fmt.Errorf("connect to the postgres database to create %s: %w", target, tlsconfig.Postgres.Explain(err))
	}
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{target}.Sanitize())
	switch {
	case err == nil:
		return true, nil
	// duplicate_database, or the unique index on pg_database when two
	// CREATE DATABASE statements race.
	case isCode(err, "42P04"), isCode(err, "23505"):
		return false, nil
	}
	return false, fmt.Errorf("create database %s: %w", target, err)
}

func isCode(err error, code string) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == code
}
