package outbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Row is one outbox row as operators see it.
type Row struct {
	ID             int64             `json:"id"`
	IdempotencyKey string            `json:"idempotency_key"`
	EventID        string            `json:"event_id"`
	Effect         string            `json:"effect"`
	ObjectID       string            `json:"object_id"`
	Seq            int64             `json:"seq"`
	Exchange       string            `json:"exchange"`
	RoutingKey     string            `json:"routing_key"`
	Headers        map[string]string `json:"headers"`
	Body           []byte            `json:"body"`
	CreatedAt      time.Time         `json:"created_at"`
	PublishedAt    *time.Time        `json:"published_at"`
	Attempts       int               `json:"attempts"`
	LastError      string            `json:"last_error"`
	NextAttemptAt  time.Time         `json:"next_attempt_at"`
	ParkedAt       *time.Time        `json:"parked_at"`
}

const rowColumns = `id, idempotency_key, event_id, effect, object_id, seq, exchange, routing_key, headers, body,
	created_at, published_at, attempts, last_error, next_attempt_at, parked_at`

func scanRow(r pgx.Row) (Row, error) {
	var x Row
	err := r.Scan(&x.ID, &x.IdempotencyKey, &x.EventID, &x.Effect, &x.ObjectID, &x.Seq, &x.Exchange, &x.RoutingKey,
		&x.Headers, &x.Body, &x.CreatedAt, &x.PublishedAt, &x.Attempts, &x.LastError, &x.NextAttemptAt, &x.ParkedAt)
	return x, err
}

// List returns the parked rows, oldest first (with unpublished, every row
// not yet published), at most limit.
func List(ctx context.Context, db *pgxpool.Pool, unpublished bool, limit int) ([]Row, error) {
	where := `parked_at IS NOT NULL AND published_at IS NULL`
	if unpublished {
		where = `published_at IS NULL`
	}
	rows, err := db.Query(ctx, `SELECT `+rowColumns+` FROM outbox WHERE `+where+` ORDER BY id LIMIT $1`, limit)
	if err != nil {
		return nil, fmt.Errorf("list outbox rows: %w", err)
	}
	defer rows.Close()
	var out []Row
	for rows.Next() {
		x, err := scanRow(rows)
		if err != nil {
			return nil, fmt.Errorf("list outbox rows: %w", err)
		}
		out = append(out, x)
	}
	return out, rows.Err()
}

// ErrNotFound is returned for an id or key that names no row.
var ErrNotFound = errors.New("no such outbox row")

// Get returns the row with id ref (a number) or idempotency key ref.
func Get(ctx context.Context, db *pgxpool.Pool, ref string) (Row, error) {
	q := `SELECT ` + rowColumns + ` FROM outbox WHERE idempotency_key = $1`
	var arg any = ref
	if id, err := strconv.ParseInt(ref, 10, 64); err == nil {
		q, arg = `SELECT `+rowColumns+` FROM outbox WHERE id = $1`, id
	}
	x, err := scanRow(db.QueryRow(ctx, q, arg))
	if errors.Is(err, pgx.ErrNoRows) {
		return Row{}, fmt.Errorf("%w: %s", ErrNotFound, ref)
	}
	return x, err
}

// Actor says who acts on the outbox, for the audit trail.
type Actor struct {
	Operator, Via string
}

// Retry gives parked rows ref… a new start: attempts 0, due now, not
// parked, and records each in outbox_audit in the same transaction. A row
// that is not parked is left alone and reported. It returns the rows it
// released.
func Retry(ctx context.Context, db *pgxpool.Pool, who Actor, refs []string) (released []Row, notParked []string, err error) {
	if who.Operator == "" || who.Via == "" {
		return nil, nil, errors.New("outbox retry: an operator and a channel (via) are required for the audit trail")
	}
	err = pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		for _, ref := range refs {
			x, err := Get(ctx, db, ref)
			if err != nil {
				return err
			}
			tag, err := tx.Exec(ctx, `UPDATE outbox SET parked_at = NULL, attempts = 0, next_attempt_at = now()
				WHERE id = $1 AND parked_at IS NOT NULL AND published_at IS NULL`, x.ID)
			if err != nil {
				return fmt.Errorf("release outbox row %d: %w", x.ID, err)
			}
			if tag.RowsAffected() == 0 {
				notParked = append(notParked, ref)
				continue
			}
			detail, _ := json.Marshal(map[string]any{"attempts": x.Attempts, "last_error": x.LastError, "parked_at": x.ParkedAt})
			if _, err := tx.Exec(ctx, `INSERT INTO outbox_audit (operator, via, action, outbox_id, idempotency_key, detail)
				VALUES ($1, $2, 'retry', $3, $4, $5)`, who.Operator, who.Via, x.ID, x.IdempotencyKey, string(detail)); err != nil {
				return fmt.Errorf("audit the retry of outbox row %d: %w", x.ID, err)
			}
			released = append(released, x)
		}
		if len(released) > 0 {
			_, err := tx.Exec(ctx, `SELECT pg_notify('`+Channel+`', '')`)
			return err
		}
		return nil
	})
	if err != nil {
		return nil, nil, err
	}
	return released, notParked, nil
}
