package backfill

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idempotent-events/idempotent-events/pkg/effects"
)

// Request is what an operator asks for: handler over the events committed
// (processed_at) in [Since, Until) by handler sets without it.
type Request struct {
	Handler string
	Since   time.Time
	// Until is open when zero.
	Until time.Time
	// Unrecorded includes the events committed before handler sets were
	// recorded (no generation): whether their set ran the handler is not
	// known, so they are left out unless asked for.
	Unrecorded bool
}

// Plan is what a backfill of a Request would do.
type Plan struct {
	// Handler is the handler as the current generation runs it.
	Handler effects.HandlerInfo
	// Generation is the current generation.
	Generation int64
	// Missed are the events of the window that the handler's routes take
	// and that were committed by a set without it (or, with Unrecorded,
	// by an unknown set); Archived of them have their body archived, the
	// others cannot be backfilled.
	Missed, Archived int64
	// Queued of Archived are queued or done already, by an earlier backfill.
	Queued int64
	// Unrecorded is how many events of the window the handler's routes
	// take were committed without a generation (counted in Missed only
	// with Request.Unrecorded).
	Unrecorded int64
	// NoBody are up to ten ids of missed events without a body.
	NoBody []string
}

// ToQueue is how many events a Queue of the Plan would queue.
func (p Plan) ToQueue() int64 { return p.Archived - p.Queued }

// ErrNotBackfillable says the request names a handler that cannot be
// backfilled: not in the current handler set, or a transition handler.
var ErrNotBackfillable = errors.New("cannot be backfilled")

// route is the current generation's handler: its routes, in the form the
// candidates query matches them.
func route(ctx context.Context, db *pgxpool.Pool, name string) (effects.HandlerInfo, int64, error) {
	var gen int64
	var handlers []byte
	err := db.QueryRow(ctx, `SELECT generation, coalesce(handlers, 'null') FROM handler_generations ORDER BY generation DESC LIMIT 1`).Scan(&gen, &handlers)
	if errors.Is(err, pgx.ErrNoRows) {
		return effects.HandlerInfo{}, 0, fmt.Errorf("handler %q %w: no worker has registered a handler set yet", name, ErrNotBackfillable)
	}
	if err != nil {
		return effects.HandlerInfo{}, 0, fmt.Errorf("read the current handler set: %w", err)
	}
	var set []effects.HandlerInfo
	if err := json.Unmarshal(handlers, &set); err != nil {
		return effects.HandlerInfo{}, 0, fmt.Errorf("read the current handler set: %w", err)
	}
	if set == nil {
		return effects.HandlerInfo{}, 0, fmt.Errorf("handler %q %w yet: generation %d is announced and no worker of it has registered", name, ErrNotBackfillable, gen)
	}
	for _, h := range set {
		switch {
		case h.Name != name:
		case h.ObjectType != "":
			return effects.HandlerInfo{}, 0, fmt.Errorf("handler %q %w: it is a transition handler (OnTransition %s to %s); a transition happens once, when an event changes its object's state, and is not run again", name, ErrNotBackfillable, h.ObjectType, h.To)
		default:
			return h, gen, nil
		}
	}
	return effects.HandlerInfo{}, 0, fmt.Errorf("handler %q %w: the current handler set (generation %d) does not run it; deploy the workers that do first", name, ErrNotBackfillable, gen)
}

// candidates selects the ledger rows of a request: committed in the window,
// taken by the handler's current routes ($4 source, $5 type pattern), and
// committed by a generation whose handlers did not take them (no handler
// of that name, or one routed elsewhere) — or, with $6, by no recorded
// generation. A route's type pattern ("*", exact, "prefix.*") becomes a
// LIKE pattern with LIKE's own wildcards escaped.
var candidates = `
SELECT p.event_id, p.generation IS NULL AS unrecorded
FROM processed_events p
LEFT JOIN handler_generations g ON g.generation = p.generation
WHERE p.processed_at >= $2 AND ($3::timestamptz IS NULL OR p.processed_at < $3)
  AND ($4 = '*' OR p.source = $4)
  AND p.event_type LIKE ` + likePattern("$5::text") + `
  AND CASE WHEN p.generation IS NULL THEN $6::bool
      ELSE NOT EXISTS (
        SELECT 1 FROM jsonb_to_recordset(coalesce(g.handlers, '[]')) AS h(name text, source text, event_type text)
        WHERE h.name = $1 AND h.event_type IS NOT NULL
          AND (h.source = '*' OR h.source = p.source)
          AND p.event_type LIKE ` + likePattern("h.event_type") + `)
      END`

// likePattern turns a handler's type pattern into a LIKE pattern in SQL.
func likePattern(expr string) string {
	return `replace(replace(replace(replace(` + expr + `, '\', '\\'), '%', '\%'), '_', '\_'), '*', '%')`
}

// MakePlan says what a backfill of req would do, writing nothing.
func MakePlan(ctx context.Context, db *pgxpool.Pool, req Request) (Plan, error) {
	h, gen, err := route(ctx, db, req.Handler)
	if err != nil {
		return Plan{}, err
	}
	p := Plan{Handler: h, Generation: gen}
	// The candidates with the unrecorded rows ($6 true), which are counted
	// apart and taken only with req.Unrecorded ($7).
	err = db.QueryRow(ctx, `
WITH c AS (`+candidates+`), t AS (SELECT * FROM c WHERE NOT c.unrecorded OR $7)
SELECT (SELECT count(*) FROM c WHERE c.unrecorded),
       count(*), count(a.event_id), count(b.event_id) FILTER (WHERE a.event_id IS NOT NULL),
       coalesce((array_agg(t.event_id ORDER BY t.event_id) FILTER (WHERE a.event_id IS NULL))[1:10], '{}')
FROM t
LEFT JOIN event_archive a ON a.event_id = t.event_id
LEFT JOIN backfill_items b ON b.handler = $1 AND b.event_id = t.event_id`,
		req.Handler, req.Since, until(req), h.Source, h.EventType, true, req.Unrecorded).
		Scan(&p.Unrecorded, &p.Missed, &p.Archived, &p.Queued, &p.NoBody)
	if err != nil {
		return Plan{}, fmt.Errorf("plan the backfill of %s: %w", req.Handler, err)
	}
	return p, nil
}

func until(req Request) *time.Time {
	if req.Until.IsZero() {
		return nil
	}
	return &req.Until
}

// Queue queues the backfill of req at rate events a second (across every
// worker) and returns its id and how many events it queued: the archived
// events of its plan that no backfill queued before. A backfill with none
// is recorded finished. by names who asked, for the record.
func Queue(ctx context.Context, db *pgxpool.Pool, req Request, rate float64, by string) (id, queued int64, err error) {
	if !(rate > 0) {
		return 0, 0, fmt.Errorf("backfill rate must be above 0, got %v", rate)
	}
	h, _, err := route(ctx, db, req.Handler)
	if err != nil {
		return 0, 0, err
	}
	err = pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		if err := tx.QueryRow(ctx, `INSERT INTO backfills (handler, since, until, rate, created_by) VALUES ($1, $2, $3, $4, $5) RETURNING id`,
			req.Handler, req.Since, until(req), rate, by).Scan(&id); err != nil {
			return err
		}
		tag, err := tx.Exec(ctx, `
INSERT INTO backfill_items (backfill_id, handler, event_id)
SELECT $7, $1, c.event_id FROM (`+candidates+`) c
JOIN event_archive a ON a.event_id = c.event_id
ORDER BY c.event_id
ON CONFLICT (handler, event_id) DO NOTHING`, req.Handler, req.Since, until(req), h.Source, h.EventType, req.Unrecorded, id)
		if err != nil {
			return err
		}
		if queued = tag.RowsAffected(); queued == 0 {
			_, err = tx.Exec(ctx, `UPDATE backfills SET finished_at = now() WHERE id = $1`, id)
		}
		return err
	})
	if err != nil {
		return 0, 0, fmt.Errorf("queue the backfill of %s: %w", req.Handler, err)
	}
	return id, queued, nil
}

// Progress is where a backfill stands.
type Progress struct {
	ID      int64
	Handler string
	Rate    float64
	// Items by state.
	Pending, Applied, Skipped, Failed int64
	// Finished: every item is done (the workers recorded it).
	Finished bool
	// LastError is the newest failure's, "" without one.
	LastError string
}

// Total is the number of items.
func (p Progress) Total() int64 { return p.Pending + p.Applied + p.Skipped + p.Failed }

// ProgressOf reads backfill id's progress.
func ProgressOf(ctx context.Context, db *pgxpool.Pool, id int64) (Progress, error) {
	p := Progress{ID: id}
	err := db.QueryRow(ctx, `
SELECT b.handler, b.rate, b.finished_at IS NOT NULL,
       count(i.id) FILTER (WHERE i.finished_at IS NULL),
       count(i.id) FILTER (WHERE i.outcome = 'applied'),
       count(i.id) FILTER (WHERE i.outcome = 'skipped'),
       count(i.id) FILTER (WHERE i.outcome = 'failed'),
       coalesce((array_agg(i.last_error ORDER BY i.id DESC) FILTER (WHERE i.last_error IS NOT NULL))[1], '')
FROM backfills b LEFT JOIN backfill_items i ON i.backfill_id = b.id
WHERE b.id = $1
GROUP BY b.id`, id).Scan(&p.Handler, &p.Rate, &p.Finished, &p.Pending, &p.Applied, &p.Skipped, &p.Failed, &p.LastError)
	if errors.Is(err, pgx.ErrNoRows) {
		return Progress{}, fmt.Errorf("no backfill %d", id)
	}
	if err != nil {
		return Progress{}, fmt.Errorf("read backfill %d: %w", id, err)
	}
	p.Finished = p.Finished || p.Pending == 0
	return p, nil
}

// Open returns the ids of the backfills with events still to run, oldest
// first. (One whose last event ran is finished, though its record may wait
// for a worker's next look to say so.)
func Open(ctx context.Context, db *pgxpool.Pool) ([]int64, error) {
	rows, err := db.Query(ctx, `SELECT b.id FROM backfills b WHERE b.finished_at IS NULL
		AND EXISTS (SELECT 1 FROM backfill_items i WHERE i.backfill_id = b.id AND i.finished_at IS NULL) ORDER BY b.id`)
	if err != nil {
		return nil, fmt.Errorf("read the open backfills: %w", err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return nil, fmt.Errorf("read the open backfills: %w", err)
	}
	return ids, nil
}

// Cancel finishes backfill id and unqueues its items that have not run
// (a later backfill can queue them again); what ran stays. A worker running
// one of them at that moment commits it, or is unqueued with it: the item's
// lock decides.
func Cancel(ctx context.Context, db *pgxpool.Pool, id int64) (unqueued int64, err error) {
	err = pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, `UPDATE backfills SET finished_at = coalesce(finished_at, now()) WHERE id = $1`, id)
		if err != nil {
			return err
		}
		if tag.RowsAffected() == 0 {
			return fmt.Errorf("no backfill %d", id)
		}
		tag, err = tx.Exec(ctx, `DELETE FROM backfill_items WHERE backfill_id = $1 AND finished_at IS NULL`, id)
		unqueued = tag.RowsAffected()
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("cancel backfill %d: %w", id, err)
	}
	return unqueued, nil
}
