package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// Handler sets and their generations: no event commits without the
// handlers of the current set, even while workers with different handler
// sets consume the same queue (every rolling deploy).
//
// A release is one deploy of a worker (the chart names it after the Helm
// release and revision: WORKER_RELEASE); without a name, a worker's release
// is its handler set. Each release gets a generation, a number the ledger
// hands out in order (handler_generations): when the release is announced
// (the chart's migration hook, before an upgrade or a rollback; Announce),
// or when its first worker registers (Register). The newest generation is
// current, and a worker commits only while its handler set is the current
// generation's. So:
//
//   - a rollout: the new release is announced by its hook (or registered by
//     its first worker); from that COMMIT on, workers of another handler set
//     commit nothing, and their events wait in the queue for the new ones;
//   - a rollback: Helm re-runs the old release's hook, which announces the
//     old release again, as the newest generation;
//   - an old pod restarted mid-rollout registers its old release, whose
//     generation is not the newest: it is fenced from its first transaction;
//   - workers whose handler set is the current generation's (a rollout that
//     changed only configuration) go on committing; while an announced
//     generation has no worker yet, nobody commits.
//
// announced_at is read after the exclusive lock was granted, so every
// commit of another set has processed_at before it.
//
// The fence is part of each commit's correctness, not a poll: every
// transaction takes the fence's advisory lock shared and then reads the
// current generation, in the same round trip as its ledger insert; an
// announcement or registration takes it exclusively. An announcement
// therefore waits for the transactions in flight, and every transaction
// after it sees the new generation (READ COMMITTED: the read is a statement
// after the lock, so its snapshot is too).

// Fence is a worker's registration: the generation it records with the
// events it commits, and its handler set.
type Fence struct {
	Generation int64
	SetID      string
}

// Generation is one row of handler_generations.
type Generation struct {
	Generation int64
	Release    string
	// SetID is "" while the generation is announced and no worker of it
	// has registered.
	SetID    string
	Handlers json.RawMessage
}

// FencedError says a commit was refused because the worker's handler set
// is not the current generation's. Nothing of the transaction was written.
type FencedError struct {
	Mine    Fence
	Current Generation
}

func (e *FencedError) Error() string {
	cur := e.Current.SetID
	if cur == "" {
		cur = "not yet registered by a worker"
	}
	return fmt.Sprintf("handler set %s (generation %d) is not current: generation %d runs handler set %s",
		e.Mine.SetID, e.Mine.Generation, e.Current.Generation, cur)
}

// ErrGenerationTaken says a worker asked to register its handler set for a
// release whose generation runs another set.
var ErrGenerationTaken = errors.New("release registered with another handler set")

// ErrFenced matches every *FencedError (errors.Is).
var ErrFenced = errors.New("handler set fenced")

// Is makes errors.Is(err, ErrFenced) true.
func (e *FencedError) Is(target error) bool { return target == ErrFenced }

// The fence's advisory lock: a class of our own and the table's OID, so
// that ledgers in different schemas of one database have their own.
const (
	fenceLockShared    = `SELECT pg_advisory_xact_lock_shared(1768300561, 'handler_generations'::regclass::oid::int)`
	fenceLockExclusive = `SELECT pg_advisory_xact_lock(1768300561, 'handler_generations'::regclass::oid::int)`
	currentGeneration  = `SELECT generation, release, coalesce(set_id, '') FROM handler_generations ORDER BY generation DESC LIMIT 1`
)

// Register records the worker's handler set as the set of release
// ("": the release is the set itself); the worker then commits with
// CommitAs and the Fence it returns. The release's newest generation is the worker's; a release the
// ledger has not seen gets the next one. It returns the registration and
// the current generation: the worker is current when their sets are the
// same. A release whose generation runs another set is ErrGenerationTaken.
func (s *Store) Register(ctx context.Context, release, setID string, handlers any) (Fence, Generation, error) {
	js, err := json.Marshal(handlers)
	if err != nil {
		return Fence{}, Generation{}, fmt.Errorf("register handler set %s: %w", setID, err)
	}
	release = ReleaseOf(release, setID)
	var mine Fence
	var cur Generation
	err = pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, fenceLockExclusive); err != nil {
			return err
		}
		var gen int64
		var have *string
		err := tx.QueryRow(ctx, `SELECT generation, set_id FROM handler_generations WHERE release = $1 ORDER BY generation DESC LIMIT 1`, release).
			Scan(&gen, &have)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			err = tx.QueryRow(ctx, `
INSERT INTO handler_generations (generation, release, set_id, handlers, announced_at, registered_at)
SELECT coalesce(max(generation), 0) + 1, $1, $2, $3, clock_timestamp(), clock_timestamp() FROM handler_generations
RETURNING generation`, release, setID, js).Scan(&gen)
		case err == nil && have == nil:
			// Announced; the first worker of the release says which set it runs.
			_, err = tx.Exec(ctx, `UPDATE handler_generations SET set_id = $2, handlers = $3, registered_at = clock_timestamp() WHERE generation = $1`, gen, setID, js)
		case err == nil && *have != setID:
			return fmt.Errorf("%w: release %s (generation %d) runs handler set %s, not this worker's %s: one release, one handler set",
				ErrGenerationTaken, release, gen, *have, setID)
		}
		if err != nil {
			return err
		}
		mine = Fence{Generation: gen, SetID: setID}
		return tx.QueryRow(ctx, currentGeneration).Scan(&cur.Generation, &cur.Release, &cur.SetID)
	})
	if err != nil {
		return Fence{}, Generation{}, fmt.Errorf("register handler set %s: %w", setID, err)
	}
	return mine, cur, nil
}

// ReleaseOf is the release a worker registers as: release, or without one
// its handler set.
func ReleaseOf(release, setID string) string {
	if release == "" {
		return "set:" + setID
	}
	return release
}

// Announce makes release the newest generation before any worker of it
// runs (the chart's migration hook, before an upgrade or a rollback): from
// its COMMIT on, no worker commits until one of release registers its
// handler set; workers of that set then go on. A release announced before
// (a rollback to it) gets a new generation. It waits for the transactions
// in flight, and returns the generation.
func (s *Store) Announce(ctx context.Context, release string) (int64, error) {
	if release == "" {
		return 0, errors.New("announce a release: the name is empty")
	}
	var gen int64
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, fenceLockExclusive); err != nil {
			return err
		}
		return tx.QueryRow(ctx, `
INSERT INTO handler_generations (generation, release, announced_at)
SELECT coalesce(max(generation), 0) + 1, $1, clock_timestamp() FROM handler_generations
RETURNING generation`, release).Scan(&gen)
	})
	if err != nil {
		return 0, fmt.Errorf("announce release %s: %w", release, err)
	}
	return gen, nil
}

// Current returns the current generation; the zero Generation when none
// is registered.
func (s *Store) Current(ctx context.Context) (Generation, error) {
	var g Generation
	err := s.pool.QueryRow(ctx, `SELECT generation, release, coalesce(set_id, ''), handlers FROM handler_generations ORDER BY generation DESC LIMIT 1`).
		Scan(&g.Generation, &g.Release, &g.SetID, &g.Handlers)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return Generation{}, fmt.Errorf("read the current generation: %w", err)
	}
	return g, nil
}

// Generations returns every generation, newest first.
func (s *Store) Generations(ctx context.Context) ([]Generation, error) {
	rows, err := s.pool.Query(ctx, `SELECT generation, release, coalesce(set_id, ''), handlers FROM handler_generations ORDER BY generation DESC`)
	if err != nil {
		return nil, fmt.Errorf("read the generations: %w", err)
	}
	gens, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Generation, error) {
		var g Generation
		err := r.Scan(&g.Generation, &g.Release, &g.SetID, &g.Handlers)
		return g, err
	})
	if err != nil {
		return nil, fmt.Errorf("read the generations: %w", err)
	}
	return gens, nil
}

// fenceHead is the fence's part of a transaction's first round trip: the
// lock shared, then the current generation, read in a statement of its own
// after it; a *FencedError when it is not mine's.
func fenceHead(mine Fence) []stmt {
	return []stmt{{sql: fenceLockShared}, {sql: currentGeneration, read: func(rows pgx.Rows) error {
		var cur Generation
		if _, err := pgx.ForEachRow(rows, []any{&cur.Generation, &cur.Release, &cur.SetID}, func() error { return nil }); err != nil {
			return err
		}
		if cur.SetID != mine.SetID {
			return &FencedError{Mine: mine, Current: cur}
		}
		return nil
	}}}
}

// InFence runs fn in a transaction fenced as CommitAs's are: nothing of it
// commits, and fn does not run, unless mine's handler set is the current
// generation's (a *FencedError otherwise). A worker's work beside its
// events (a backfill) goes through it, so a fenced worker writes nothing.
func (s *Store) InFence(ctx context.Context, mine Fence, fn func(tx Tx) error) error {
	if mine.SetID == "" {
		return errors.New("fenced transaction: the worker has not registered its handler set")
	}
	return s.inTx(ctx, fenceHead(mine), fn)
}
