// Package store is the ledger in Postgres, the only source of truth of
// idempotent-events.
//
// Commit writes a batch of events in one transaction: the processed_events
// rows (event_id is the primary key) with INSERT … ON CONFLICT DO NOTHING
// RETURNING, then the effects (the handlers of package effects) of exactly
// the events that insert returned. An event whose ledger row already existed
// is a duplicate and gets no second effect. The caller acks only after
// Commit returned, so a crash anywhere before COMMIT leaves the message
// unacked (it is redelivered) and a crash after COMMIT leaves a ledger row
// that makes the redelivery a duplicate.
//
// Rows are inserted in event_id order, so two transactions that share events
// lock them in the same order and cannot deadlock each other.
package store

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idempotent-events/idempotent-events/pkg/internal/tlsconfig"

	"github.com/idempotent-events/idempotent-events/pkg/internal/event"
)

// Record is one event to commit.
type Record struct {
	Event  event.Event
	Source string
	// PayloadSHA256 is the digest of the body as the provider signed it.
	PayloadSHA256 []byte
	// ReceivedAt is when the receiver accepted the event.
	ReceivedAt time.Time
	// Attempt is the processing attempt, 1 for the first delivery.
	Attempt int
}

// Store is a Postgres connection pool with the queries of the pipeline.
type Store struct {
	pool *pgxpool.Pool
	// coverDuplicates: a batch whose events were all duplicates still
	// commits a write, so that its COMMIT waits for the synchronous
	// standby (SetSynchronous).
	coverDuplicates atomic.Bool
	// repWaitCancelled holds the connections on which Postgres warned that
	// a COMMIT stopped waiting for the synchronous standby.
	repWaitCancelled sync.Map
}

// CommitTimeout bounds how long a COMMIT may wait, a synchronous
// standby's confirmation included. COMMIT does not stop with the caller's
// context: a cancelled wait for synchronous replication leaves the
// transaction committed on the primary only, and reports success.
const CommitTimeout = time.Minute

// Open connects a pool to databaseURL. maxConns of 0 keeps pgx's default.
func Open(ctx context.Context, databaseURL string, maxConns int32) (*Store, error) {
	return OpenTLS(ctx, databaseURL, maxConns, nil)
}

// OpenTLS is Open with the TLS of the DATABASE_TLS_* files: every
// connection the pool makes, then and later, is verified TLS with the files
// as they are at that moment (a rotated certificate reaches the next
// connection; open ones keep theirs). A nil tc is Open.
func OpenTLS(ctx context.Context, databaseURL string, maxConns int32, tc *tlsconfig.Client) (*Store, error) {
	cfg, err := pgxpool.ParseConfig(databaseURL)
	if err != nil {
		return nil, fmt.Errorf("parse DATABASE_URL: %w", err)
	}
	tc.ConfigurePool(cfg)
	if maxConns > 0 {
		cfg.MaxConns = maxConns
	}
	// A connection that sat idle through a network cut is found dead on first
	// use; checking on acquire turns that into a fresh connection instead.
	cfg.HealthCheckPeriod = 5 * time.Second
	s := &Store{}
	cfg.ConnConfig.OnNotice = func(c *pgconn.PgConn, n *pgconn.Notice) {
		// "canceling wait for synchronous replication ... The transaction
		// has already committed locally, but might not have been
		// replicated to the standby."
		if strings.HasPrefix(n.Message, "canceling wait for synchronous replication") {
			s.repWaitCancelled.Store(c, true)
		}
	}
	if s.pool, err = pgxpool.NewWithConfig(ctx, cfg); err != nil {
		return nil, fmt.Errorf("create pool: %w", tlsconfig.Postgres.Explain(err))
	}
	return s, nil
}

// SetSynchronous says whether the database has a synchronous standby (see
// Durability). With one, a batch of nothing but duplicates touches their
// ledger rows (last_seen_at), so its COMMIT returns only once the standby
// has the WAL up to there, which holds the original COMMIT of every one of
// them. Without it, a duplicate could be acked on
// the strength of a row the primary committed but never replicated: a
// failover then loses the event.
func (s *Store) SetSynchronous(on bool) { s.coverDuplicates.Store(on) }

// Durability is what a database says of its replication.
type Durability struct {
	// Standbys are the standbys streaming from it (pg_stat_replication).
	Standbys int
	// SynchronousStandbyNames and SynchronousCommit are the settings.
	SynchronousStandbyNames, SynchronousCommit string
	// InRecovery: it is a standby itself.
	InRecovery bool
}

// Durability modes.
const (
	// DurabilitySingle: no standby; a COMMIT is durable once flushed here.
	DurabilitySingle = "single"
	// DurabilitySync: COMMIT waits for a synchronous standby.
	DurabilitySync = "sync"
	// DurabilityAsync: standbys that COMMIT does not wait for; a failover
	// may lose committed transactions.
	DurabilityAsync = "async"
	// DurabilityStandby: the database is a standby (read-only).
	DurabilityStandby = "standby"
)

// Mode classifies d.
func (d Durability) Mode() string {
	switch {
	case d.InRecovery:
		return DurabilityStandby
	case d.SynchronousStandbyNames != "" && d.SynchronousCommit != "off" && d.SynchronousCommit != "local":
		return DurabilitySync
	case d.Standbys == 0:
		return DurabilitySingle
	}
	return DurabilityAsync
}

// ReadDurability reads the database's replication settings.
func (s *Store) ReadDurability(ctx context.Context) (Durability, error) {
	var d Durability
	err := s.pool.QueryRow(ctx, `SELECT current_setting('synchronous_standby_names'), current_setting('synchronous_commit'),
		pg_is_in_recovery(), (SELECT count(*) FROM pg_stat_replication)`).Scan(
		&d.SynchronousStandbyNames, &d.SynchronousCommit, &d.InRecovery, &d.Standbys)
	if err != nil {
		return Durability{}, fmt.Errorf("read the replication settings: %w", err)
	}
	return d, nil
}

// ErrCommitUnknown means COMMIT's outcome is not known: it failed, timed
// out, or Postgres stopped waiting for the synchronous standby. The
// transaction may be committed on the primary only. Nothing may be acked
// on its strength, and Redis must not learn of it: the redelivery decides.
var ErrCommitUnknown = errors.New("commit outcome unknown")

// Close closes every connection.
func (s *Store) Close() { s.pool.Close() }

// Ping checks that Postgres answers.
func (s *Store) Ping(ctx context.Context) error { return s.pool.Ping(ctx) }

// epochQuery names the ledger this pool writes to. It changes when any part
// changes: the ledger's own identity (a new one when the schema is created,
// or set by hand after a snapshot restore), the table (dropped and created
// again, or restored by pg_restore), the database (recreated, or restored
// into a new one), the cluster (initdb), and the WAL timeline (a standby
// promoted, a point-in-time recovery). pg_current_wal_lsn fails on a
// standby: an epoch is only read from a primary.
const epochQuery = `
SELECT left(md5(concat_ws('/', l.id, 'processed_events'::regclass::oid, d.oid, s.system_identifier,
	substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))), 16)
FROM ledger_identity l, pg_database d, pg_control_system() s
WHERE d.datname = current_database()`

// Epoch returns the ledger's epoch: 16 hex digits that stay the same for as
// long as this is the same ledger with the same history, and differ for
// any other. Redis entries are tagged with it (see package dedupe).
func (s *Store) Epoch(ctx context.Context) (string, error) {
	var epoch string
	if err := s.pool.QueryRow(ctx, epochQuery).Scan(&epoch); err != nil {
		return "", fmt.Errorf("read the ledger epoch: %w", err)
	}
	return epoch, nil
}

// Pool exposes the pool for tests and tools.
func (s *Store) Pool() *pgxpool.Pool { return s.pool }

// insertLedger writes the ledger rows of a batch and returns the ids it
// inserted: an event whose row exists is a duplicate and is not returned.
// processed_at is the statement's clock, not now() (the transaction's
// start), so received_at -> processed_at measures the pipeline's latency.
// generation is the committing worker's (see fence.go), NULL without one.
const insertLedger = `
INSERT INTO processed_events (event_id, source, event_type, payload_sha256, received_at, attempt, processed_at, generation)
SELECT e.*, clock_timestamp(), $7::bigint
FROM unnest($1::text[], $2::text[], $3::text[], $4::bytea[], $5::timestamptz[], $6::int[]) AS e
ORDER BY 1
ON CONFLICT (event_id) DO NOTHING
RETURNING event_id`

// customPlan runs a statement as pgx's unnamed statement, planned by
// Postgres for the values it is given every time. A lookup by "= ANY($1)"
// kept prepared gets a generic plan after five runs; on a ledger that was
// nearly empty then (a new install) that plan is a sequential scan, and the
// connection keeps it while the ledger grows. pkg/payments does the same
// for its reads, where a bench run showed it.
var customPlan = pgx.QueryExecModeCacheDescribe

// Ledger outcomes of an event (processed_events.outcome).
const (
	OutcomeApplied = "applied"
	OutcomeSkipped = "skipped"
)

// Tx is the transaction Commit gives Apply.
type Tx interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// Apply writes the effects of the records at fresh (indexes into the
// records given to Commit, whose ledger rows are new) in tx, and reports
// for each of them whether it was applied (false: no handler had anything
// to do, outcome skipped). An error rolls the whole transaction back.
type Apply func(ctx context.Context, tx Tx, fresh []int) (applied []bool, err error)

// Commit writes recs in one transaction: their ledger rows, then through
// apply the effects of the records whose row is new; a record whose row
// existed is a duplicate and gets no second effect. It reports, for each
// record in order, whether it was new. Records must have distinct event
// ids. On error nothing was written.
//
// Commit does not fence (fence.go): it is for tools and tests that write the
// ledger themselves. A worker commits with CommitAs.
func (s *Store) Commit(ctx context.Context, recs []Record, apply Apply) ([]bool, error) {
	return s.commit(ctx, nil, recs, apply)
}

// CommitAs is Commit for a worker registered as mine (Register): it writes
// nothing and returns a *FencedError when mine's handler set is not the
// current generation's, and records mine's generation in the ledger rows.
func (s *Store) CommitAs(ctx context.Context, mine Fence, recs []Record, apply Apply) ([]bool, error) {
	return s.commit(ctx, &mine, recs, apply)
}

func (s *Store) commit(ctx context.Context, f *Fence, recs []Record, apply Apply) ([]bool, error) {
	if f != nil && f.SetID == "" {
		return nil, errors.New("commit: the worker has not registered its handler set")
	}
	n := len(recs)
	if n == 0 {
		return nil, nil
	}
	ids := make([]string, n)
	sources := make([]string, n)
	types := make([]string, n)
	digests := make([][]byte, n)
	received := make([]*time.Time, n)
	attempts := make([]int32, n)
	for i := range recs {
		r := &recs[i]
		ids[i] = r.Event.ID
		sources[i] = r.Source
		types[i] = r.Event.Type
		digests[i] = r.PayloadSHA256
		if !r.ReceivedAt.IsZero() {
			received[i] = &r.ReceivedAt
		}
		attempts[i] = int32(max(r.Attempt, 1))
	}
	var isNew []bool
	var inserted []string
	var head []stmt
	var gen *int64
	if f != nil {
		gen = &f.Generation
		head = fenceHead(*f)
	}
	head = append(head, stmt{sql: insertLedger, args: []any{ids, sources, types, digests, received, attempts, gen}, read: func(rows pgx.Rows) (err error) {
		inserted, err = pgx.CollectRows(rows, pgx.RowTo[string])
		return err
	}})
	err := s.inTx(ctx, head, func(tx Tx) error {
		slices.Sort(inserted)
		isNew = make([]bool, n)
		var fresh []int
		for i := range recs {
			if _, isNew[i] = slices.BinarySearch(inserted, recs[i].Event.ID); isNew[i] {
				fresh = append(fresh, i)
			}
		}
		if len(fresh) == 0 && s.coverDuplicates.Load() {
			// A write of the batch's own, so that COMMIT waits for the
			// standby (a transaction id alone writes no WAL before its
			// commit record, and Postgres does not wait for that one).
			if _, err := tx.Exec(ctx, `UPDATE processed_events SET last_seen_at = clock_timestamp() WHERE event_id = ANY($1)`, customPlan, ids); err != nil {
				return err
			}
		}
		if len(fresh) == 0 || apply == nil {
			return nil
		}
		applied, err := apply(ctx, tx, fresh)
		if err != nil {
			return err
		}
		var skipped []string
		for j, i := range fresh {
			if !applied[j] {
				skipped = append(skipped, ids[i])
			}
		}
		if len(skipped) > 0 {
			if _, err := tx.Exec(ctx, `UPDATE processed_events SET outcome = $2 WHERE event_id = ANY($1)`, customPlan, skipped, OutcomeSkipped); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("commit %d events: %w", n, err)
	}
	return isNew, nil
}

// stmt is one statement of a transaction's first round trip; read, when
// set, reads its rows.
type stmt struct {
	sql  string
	args []any
	read func(pgx.Rows) error
}

// inTx runs a transaction on one connection: BEGIN and the statements of
// head in one round trip, each read by its read, then fn. It commits when
// all return nil and rolls back otherwise.
func (s *Store) inTx(ctx context.Context, head []stmt, fn func(tx Tx) error) error {
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	b := &pgx.Batch{}
	b.Queue("BEGIN")
	for _, st := range head {
		b.Queue(st.sql, st.args...)
	}
	br := conn.SendBatch(ctx, b)
	_, err = br.Exec()
	for _, st := range head {
		if err != nil {
			break
		}
		if st.read == nil {
			_, err = br.Exec()
			continue
		}
		var rows pgx.Rows
		if rows, err = br.Query(); err == nil {
			err = st.read(rows)
			rows.Close()
		}
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = fn(conn)
	}
	if err == nil {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), CommitTimeout)
		_, err = conn.Exec(cctx, "COMMIT")
		cancel()
		_, cancelledWait := s.repWaitCancelled.LoadAndDelete(conn.Conn().PgConn())
		var pgErr *pgconn.PgError
		switch {
		case err == nil && !cancelledWait:
			return nil
		case errors.As(err, &pgErr):
			// Postgres answered with an error (a deferred constraint): the
			// transaction is rolled back, the outcome known.
			return err
		case err == nil:
			err = fmt.Errorf("%w: postgres stopped waiting for the synchronous standby", ErrCommitUnknown)
		default:
			err = fmt.Errorf("%w: %w", ErrCommitUnknown, err)
		}
		// A connection that may be mid-COMMIT is not given back.
		_ = conn.Conn().Close(context.WithoutCancel(ctx))
		return err
	}
	// The connection may be broken or mid-transaction: roll back what can
	// be, and let the pool drop a connection that is not idle afterwards.
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	_, _ = conn.Exec(rctx, "ROLLBACK")
	return err
}

// Digests returns, for each id in order, the hex content digest of its
// committed event, or "" when it has not committed.
func (s *Store) Digests(ctx context.Context, ids []string) ([]string, error) {
	rows, err := s.pool.Query(ctx, `SELECT event_id, encode(payload_sha256, 'hex') FROM processed_events WHERE event_id = ANY($1)`, customPlan, ids)
	if err != nil {
		return nil, fmt.Errorf("look up processed_events: %w", err)
	}
	found := map[string]string{}
	var id, digest string
	_, err = pgx.ForEachRow(rows, []any{&id, &digest}, func() error {
		found[id] = digest
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("look up processed_events: %w", err)
	}
	out := make([]string, len(ids))
	for i, id := range ids {
		out[i] = found[id]
	}
	return out, nil
}

// Conflict is a delivery that reused a committed event's id with other
// content.
type Conflict struct {
	EventID        string
	Source         string
	StoredDigest   []byte
	ReceivedDigest []byte
	Body           []byte
	ReceivedAt     time.Time
}

// RecordConflicts keeps conflicting deliveries for inspection, once per
// distinct content.
func (s *Store) RecordConflicts(ctx context.Context, cs []Conflict) error {
	batch := &pgx.Batch{}
	for _, c := range cs {
		var received *time.Time
		if !c.ReceivedAt.IsZero() {
			received = &c.ReceivedAt
		}
		batch.Queue(`INSERT INTO event_conflicts (event_id, source, stored_sha256, received_sha256, body, received_at)
			VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (event_id, received_sha256) DO NOTHING`,
			c.EventID, c.Source, c.StoredDigest, c.ReceivedDigest, c.Body, received)
	}
	if err := s.pool.SendBatch(ctx, batch).Close(); err != nil {
		return fmt.Errorf("record %d conflicting deliveries: %w", len(cs), err)
	}
	return nil
}

// IsOutage reports whether err means Postgres could not be reached or
// talked to — no answer at all, a cut connection, a timeout, or the server
// refusing work while it starts, stops or is out of connections — as
// opposed to an answer about the data. Waiting, not retrying elsewhere, is
// the cure.
func IsOutage(err error) bool {
	if err == nil {
		return false
	}
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return !errors.Is(err, context.Canceled)
	}
	switch {
	case strings.HasPrefix(pgErr.Code, "08"), // connection_exception
		pgErr.Code == "57P01", pgErr.Code == "57P02", pgErr.Code == "57P03", // shutdowns, cannot_connect_now
		pgErr.Code == "53300": // too_many_connections
		return true
	}
	return false
}

// IsPermanent reports whether err is a problem with the data itself (SQLSTATE
// class 22 data exception or 23 integrity violation), which no retry can fix.
// Everything else (connection loss, timeouts, serialization failures, a
// server shutting down) is transient.
func IsPermanent(err error) bool {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return false
	}
	switch pgErr.Code[:2] {
	case "22", "23":
		return true
	}
	return false
}

// Hint says what an operator can do about a database error that is not an
// outage of the server but of what the worker expects on it: the database
// or the schema missing ("" for any other error).
func Hint(err error) string {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return ""
	}
	switch pgErr.Code {
	case "3D000": // invalid_catalog_name
		return "the database does not exist: run migrate (`migrate up` creates it and its schema)"
	case "3F000", "42P01": // invalid_schema_name, undefined_table
		return "the schema is missing or older than this binary: run migrate (`migrate up`)"
	case "28P01", "28000": // invalid_password, invalid_authorization_specification
		return "PostgreSQL refused the credentials of DATABASE_URL"
	}
	return ""
}
