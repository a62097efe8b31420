// Package retention prunes what grows without bound: the ledger
// (processed_events), the deliveries kept as conflicts, finished reconcile
// runs and backfills, the event archive, and the audit trails of the DLQ
// and outbox tools.
//
// A ledger row is what makes a redelivery a duplicate, so it must outlive
// every way the same event can come again: the provider's retries (Stripe:
// 3 days), a replay from the DLQ of a copy that was in flight, and a
// reconcile window (at most Stripe's 30 days). The default keeps 35 days
// and nothing under 7 days is accepted; the reconciler refuses a window
// longer than the retention the latest prune run recorded.
//
// Rows go in batches of their own transaction, oldest first by an indexed
// time column, so a prune never holds a long lock or a long transaction,
// and the pipeline drains beside it (docs/operations.md#retention).
package retention

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/zap"

	"github.com/idempotent-events/idempotent-events/pkg/internal/options"
)

// Defaults and floors of the retentions.
const (
	DefaultLedger = 35 * 24 * time.Hour
	MinLedger     = 7 * 24 * time.Hour
	DefaultAudit  = 365 * 24 * time.Hour
	MinAudit      = 30 * 24 * time.Hour
)

// table is one pruned table: which rows are old, by which column, and how
// a batch of them is named.
type table struct {
	name, key, age, where string
	audit, archive        bool
}

// tables are pruned in this order.
var tables = []table{
	{name: "processed_events", key: "event_id", age: "processed_at"},
	{name: "event_conflicts", key: "id", age: "recorded_at"},
	{name: "reconcile_runs", key: "id", age: "finished_at", where: "state = 'done'"},
	{name: "dlq_audit", key: "id", age: "at", audit: true},
	{name: "outbox_audit", key: "id", age: "at", audit: true},
	// The event archive (package backfill) has its own retention: what a
	// backfill may still reach.
	{name: "event_archive", key: "event_id", age: "archived_at", archive: true},
	{name: "backfill_items", key: "id", age: "finished_at", where: "finished_at IS NOT NULL"},
	// A backfill finishes after its items (they cascade with it).
	{name: "backfills", key: "id", age: "finished_at", where: "finished_at IS NOT NULL"},
}

// Options configures a prune.
type Options struct {
	DB *pgxpool.Pool
	// Ledger is the retention of the ledger, the conflicts, the reconcile
	// runs and the finished backfills; Audit that of the audit trails;
	// Archive that of the event archive (the Ledger's when 0).
	Ledger, Audit, Archive time.Duration
	// Batch is the rows one DELETE removes; Pause the wait between two.
	Batch int
	Pause time.Duration
	// DryRun counts what would go and deletes nothing.
	DryRun bool
	Logger *zap.Logger
	// AfterBatch, when set, runs after each batch (tests).
	AfterBatch func(table string, deleted int64)
}

func (o *Options) validate() error {
	p := options.Check("retention")
	p.Need(o.DB != nil, "DB", "is required")
	o.settings(p)
	return p.Err()
}

// CheckSettings reports the settings Prune would refuse, leaving out the
// database (eventsctl prune -check-config).
func (o Options) CheckSettings() error {
	p := options.Check("retention")
	o.settings(p)
	return p.Err()
}

func (o *Options) settings(p *options.Problems) {
	p.Need(o.Ledger >= MinLedger, "Ledger", "must be at least 7d: a ledger row must outlive the provider's retries and the replay and reconcile windows")
	p.Need(o.Audit >= MinAudit, "Audit", "must be at least 30d")
	p.Need(o.Archive >= 0, "Archive", "must not be negative")
	p.Need(o.Batch >= 1, "Batch", "must be at least 1")
	p.Need(o.Pause >= 0, "Pause", "must not be negative")
}

// Report is what a prune deleted (or, dry, would delete), per table.
type Report struct {
	RunID   int64            `json:"run_id,omitempty"`
	DryRun  bool             `json:"dry_run"`
	Deleted map[string]int64 `json:"deleted"`
	Elapsed time.Duration    `json:"elapsed_ns"`
}

// Prune deletes the rows older than their retention, table by table.
func Prune(ctx context.Context, o Options) (Report, error) {
	if err := o.validate(); err != nil {
		return Report{}, err
	}
	if o.Logger == nil {
		o.Logger = zap.NewNop()
	}
	start := time.Now()
	rep := Report{DryRun: o.DryRun, Deleted: map[string]int64{}}
	if !o.DryRun {
		if err := o.DB.QueryRow(ctx, `INSERT INTO prune_runs (ledger_retention, audit_retention)
			VALUES ($1 * interval '1 second', $2 * interval '1 second') RETURNING id`,
			o.Ledger.Seconds(), o.Audit.Seconds()).Scan(&rep.RunID); err != nil {
			return rep, fmt.Errorf("prune: record the run: %w", err)
		}
	}
	for _, t := range tables {
		keep := o.Ledger
		switch {
		case t.audit:
			keep = o.Audit
		case t.archive && o.Archive > 0:
			keep = o.Archive
		}
		n, err := o.prune(ctx, t, keep)
		rep.Deleted[t.name] = n
		if err != nil {
			return rep, err
		}
		o.Logger.Info("pruned", zap.String("table", t.name), zap.Int64("rows", n), zap.Duration("retention", keep), zap.Bool("dry_run", o.DryRun))
	}
	rep.Elapsed = time.Since(start)
	if !o.DryRun {
		deleted, _ := json.Marshal(rep.Deleted)
		if _, err := o.DB.Exec(ctx, `UPDATE prune_runs SET deleted = $2, finished_at = now() WHERE id = $1`, rep.RunID, deleted); err != nil {
			return rep, fmt.Errorf("prune: record the run: %w", err)
		}
	}
	return rep, nil
}

func (o *Options) prune(ctx context.Context, t table, keep time.Duration) (int64, error) {
	cond := t.age + " < now() - $1 * interval '1 second'"
	if t.where != "" {
		cond += " AND " + t.where
	}
	if o.DryRun {
		var n int64
		err := o.DB.QueryRow(ctx, `SELECT count(*) FROM `+t.name+` WHERE `+cond, keep.Seconds()).Scan(&n)
		if err != nil {
			return 0, fmt.Errorf("prune %s: %w", t.name, err)
		}
		return n, nil
	}
	del := `DELETE FROM ` + t.name + ` WHERE ` + t.key + ` IN (SELECT ` + t.key + ` FROM ` + t.name + ` WHERE ` + cond +
		` ORDER BY ` + t.age + ` LIMIT $2 FOR UPDATE SKIP LOCKED)`
	var total int64
	for {
		tag, err := o.DB.Exec(ctx, del, keep.Seconds(), o.Batch)
		if err != nil {
			return total, fmt.Errorf("prune %s: %w", t.name, err)
		}
		total += tag.RowsAffected()
		if o.AfterBatch != nil {
			o.AfterBatch(t.name, tag.RowsAffected())
		}
		if tag.RowsAffected() < int64(o.Batch) {
			return total, nil
		}
		if o.Pause > 0 {
			select {
			case <-ctx.Done():
				return total, ctx.Err()
			case <-time.After(o.Pause):
			}
		}
	}
}

// LedgerRetention is the ledger retention of the latest finished prune
// run; ok is false when no prune has run.
func LedgerRetention(ctx context.Context, db *pgxpool.Pool) (keep time.Duration, ok bool, err error) {
	var secs *float64
	err = db.QueryRow(ctx, `SELECT (SELECT extract(epoch FROM ledger_retention)::float8 FROM prune_runs
		WHERE finished_at IS NOT NULL ORDER BY finished_at DESC LIMIT 1)`).Scan(&secs)
	if err != nil || secs == nil {
		return 0, false, err
	}
	return time.Duration(*secs * float64(time.Second)), true, nil
}

// ParseDays reads a duration that may also be given in days ("35d"), as
// retentions usually are.
func ParseDays(s string) (time.Duration, error) {
	if days, ok := strings.CutSuffix(strings.TrimSpace(s), "d"); ok {
		n, err := strconv.Atoi(days)
		if err != nil || n < 0 {
			return 0, fmt.Errorf("%q is not a number of days", s)
		}
		return time.Duration(n) * 24 * time.Hour, nil
	}
	return time.ParseDuration(s)
}
