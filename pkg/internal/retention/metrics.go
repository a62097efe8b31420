package retention

import (
	"context"
	"encoding/json"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/idempotent-events/idempotent-events/pkg/internal/telemetry"
)

// Collector exports what prune_runs records: prunes are short jobs
// (eventsctl prune, the chart's CronJob), so the worker reads the table at
// each scrape. Every worker replica exports the same values.
type Collector struct {
	db                    *pgxpool.Pool
	log                   *zap.Logger
	lastSuccess, deleted  *prometheus.Desc
	ledgerRetentionSecond *prometheus.Desc
}

// NewCollector returns a Collector over db's prune_runs.
func NewCollector(db *pgxpool.Pool, log *zap.Logger) *Collector {
	name := func(n string) string { return prometheus.BuildFQName(telemetry.Namespace, "prune", n) }
	return &Collector{db: db, log: log,
		lastSuccess: prometheus.NewDesc(name("last_success_timestamp_seconds"), "When the latest prune run finished (unix seconds).", nil, nil),
		deleted: prometheus.NewDesc(name("deleted_rows_total"), "Rows prune runs deleted, per table, over the recorded runs.",
			[]string{"table"}, nil),
		ledgerRetentionSecond: prometheus.NewDesc(name("ledger_retention_seconds"), "The ledger retention of the latest prune run.", nil, nil),
	}
}

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.lastSuccess
	ch <- c.deleted
	ch <- c.ledgerRetentionSecond
}

// Collect implements prometheus.Collector; before any prune it exports
// nothing.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	var last *time.Time
	var keep *float64
	err := c.db.QueryRow(ctx, `SELECT max(finished_at),
		(SELECT extract(epoch FROM ledger_retention)::float8 FROM prune_runs WHERE finished_at IS NOT NULL ORDER BY finished_at DESC LIMIT 1)
		FROM prune_runs`).Scan(&last, &keep)
	if err != nil {
		c.log.Debug("prune metrics: query failed", zap.Error(err))
		return
	}
	if last == nil {
		return
	}
	ch <- prometheus.MustNewConstMetric(c.lastSuccess, prometheus.GaugeValue, float64(last.Unix()))
	ch <- prometheus.MustNewConstMetric(c.ledgerRetentionSecond, prometheus.GaugeValue, *keep)
	rows, err := c.db.Query(ctx, `SELECT deleted FROM prune_runs WHERE finished_at IS NOT NULL`)
	if err != nil {
		c.log.Debug("prune metrics: query failed", zap.Error(err))
		return
	}
	totals := map[string]int64{}
	var raw []byte
	_, err = pgx.ForEachRow(rows, []any{&raw}, func() error {
		var d map[string]int64
		if json.Unmarshal(raw, &d) == nil {
			for t, n := range d {
				totals[t] += n
			}
		}
		return nil
	})
	if err != nil {
		c.log.Debug("prune metrics: query failed", zap.Error(err))
		return
	}
	for t, n := range totals {
		ch <- prometheus.MustNewConstMetric(c.deleted, prometheus.CounterValue, float64(n), t)
	}
}
