package dlq

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Audit outcomes, the outcome column of dlq_audit.
const (
	OutcomePending      = "pending"
	OutcomeReplayed     = "replayed"
	OutcomeDiscarded    = "discarded"
	OutcomeWouldReplay  = "would_replay"
	OutcomeWouldDiscard = "would_discard"
	OutcomeFailed       = "failed"
)

// Actions.
const (
	ActionReplay  = "replay"
	ActionDiscard = "discard"
)

// Actor says who acts and through what, for the audit trail.
type Actor struct {
	// Operator is the person or automation responsible.
	Operator string `json:"operator"`
	// Via is cli, api or web.
	Via string `json:"via"`
	// Client is the host (cli) or remote address (api, web).
	Client string `json:"client,omitempty"`
}

// AuditEntry is one row of dlq_audit.
type AuditEntry struct {
	ID        int64     `json:"id"`
	At        time.Time `json:"at"`
	Operator  string    `json:"operator"`
	Via       string    `json:"via"`
	Client    string    `json:"client"`
	Action    string    `json:"action"`
	DryRun    bool      `json:"dry_run"`
	DLQID     string    `json:"dlq_id"`
	EventID   string    `json:"event_id"`
	EventType string    `json:"event_type"`
	Reason    string    `json:"reason"`
	Outcome   string    `json:"outcome"`
	Detail    string    `json:"detail"`
}

// Audit writes and reads dlq_audit.
type Audit struct {
	pool *pgxpool.Pool
}

// NewAudit returns an Audit on pool; the schema must have migration 00002.
func NewAudit(pool *pgxpool.Pool) *Audit { return &Audit{pool: pool} }

// OpenAudit connects a small pool to databaseURL. Close it with Close.
func OpenAudit(ctx context.Context, databaseURL string) (*Audit, error) {
	cfg, err := pgxpool.ParseConfig(databaseURL)
	if err != nil {
		return nil, fmt.Errorf("parse DATABASE_URL: %w", err)
	}
	cfg.MaxConns = 2
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("connect to postgres: %w", err)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("connect to postgres: %w", err)
	}
	return &Audit{pool: pool}, nil
}

// Close closes the pool.
func (a *Audit) Close() { a.pool.Close() }

// record inserts one row and returns its id. The insert commits on its own:
// once record returns, the row is durable.
func (a *Audit) record(ctx context.Context, who Actor, action string, dryRun bool, m Message, outcome, detail string, keep *kept) (int64, error) {
	var payload []byte
	var props []byte
	if keep != nil {
		payload = keep.body
		var err error
		if props, err = json.Marshal(keep.properties); err != nil {
			return 0, fmt.Errorf("encode headers of %s: %w", m.ID, err)
		}
	}
	var id int64
	err := a.pool.QueryRow(ctx, `INSERT INTO dlq_audit
		(operator, via, client, action, dry_run, dlq_id, event_id, event_type, reason, outcome, detail, payload, properties)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13) RETURNING id`,
		who.Operator, who.Via, who.Client, action, dryRun, m.ID, m.EventID, m.EventType, string(m.Reason), outcome, detail,
		payload, nullJSON(props)).Scan(&id)
	if err != nil {
		return 0, fmt.Errorf("record %s of %s in dlq_audit: %w", action, m.ID, err)
	}
	return id, nil
}

// finish sets the outcome of row id.
func (a *Audit) finish(ctx context.Context, id int64, outcome, detail string) error {
	_, err := a.pool.Exec(ctx, `UPDATE dlq_audit SET outcome = $2, detail = $3, updated_at = now() WHERE id = $1`, id, outcome, detail)
	if err != nil {
		return fmt.Errorf("update dlq_audit row %d: %w", id, err)
	}
	return nil
}

// Recent returns the latest limit rows, newest first; with dlqID set, only
// that message's.
func (a *Audit) Recent(ctx context.Context, limit int, dlqID string) ([]AuditEntry, error) {
	if limit <= 0 || limit > 1000 {
		limit = 100
	}
	rows, err := a.pool.Query(ctx, `SELECT id, at, operator, via, client, action, dry_run, dlq_id, event_id, event_type, reason, outcome, detail
		FROM dlq_audit WHERE ($2 = '' OR dlq_id = $2) ORDER BY id DESC LIMIT $1`, limit, dlqID)
	if err != nil {
		return nil, fmt.Errorf("read dlq_audit: %w", err)
	}
	entries, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (AuditEntry, error) {
		var e AuditEntry
		err := r.Scan(&e.ID, &e.At, &e.Operator, &e.Via, &e.Client, &e.Action, &e.DryRun, &e.DLQID, &e.EventID,
			&e.EventType, &e.Reason, &e.Outcome, &e.Detail)
		return e, err
	})
	if err != nil {
		return nil, fmt.Errorf("read dlq_audit: %w", err)
	}
	return entries, nil
}

// kept is a discarded message's content, stored in its audit row.
type kept struct {
	body       []byte
	properties map[string]any
}

func nullJSON(b []byte) any {
	if b == nil {
		return nil
	}
	return string(b)
}
