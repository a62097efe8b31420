package reconcile

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/idempotent-events/idempotent-events/pkg/internal/telemetry"
)

// Collector exports what reconcile_runs records. Runs are short-lived jobs
// (eventsctl reconcile, the chart's CronJob) that Prometheus cannot scrape,
// so the worker, which always runs beside the ledger, reads the table at
// each scrape. Every worker replica exports the same figures: aggregate
// with max by (source).
type Collector struct {
	db  *pgxpool.Pool
	log *zap.Logger

	lastSuccess, lastMissing, lastInjected, missing, injected, open *prometheus.Desc
}

// NewCollector returns a Collector over db's reconcile_runs.
func NewCollector(db *pgxpool.Pool, log *zap.Logger) *Collector {
	name := func(n string) string { return prometheus.BuildFQName(telemetry.Namespace, "reconcile", n) }
	src := []string{"source"}
	return &Collector{
		db: db, log: log,
		lastSuccess: prometheus.NewDesc(name("last_success_timestamp_seconds"),
			"When the source's latest reconcile run finished (unix seconds).", src, nil),
		lastMissing: prometheus.NewDesc(name("last_run_missing"),
			"Events the source's latest finished run found missing from the ledger: more than 0 means deliveries are failing.", src, nil),
		lastInjected: prometheus.NewDesc(name("last_run_injected"),
			"Events the source's latest finished run fed into the pipeline.", src, nil),
		missing: prometheus.NewDesc(name("missing_events_total"),
			"Events found missing from the ledger, over the recorded runs.", src, nil),
		injected: prometheus.NewDesc(name("injected_events_total"),
			"Missing events fed into the pipeline, over the recorded runs.", src, nil),
		open: prometheus.NewDesc(name("unfinished_runs"),
			"Runs of the source that stopped before the end and wait to be resumed.", src, nil),
	}
}

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.lastSuccess, c.lastMissing, c.lastInjected, c.missing, c.injected, c.open} {
		ch <- d
	}
}

// Collect implements prometheus.Collector. A source with no run exports
// nothing; a failed query exports nothing and is logged.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	rows, err := c.db.Query(ctx, `
		SELECT s.source, s.missing, s.injected, s.open, l.finished_at, l.missing, l.injected
		FROM (SELECT source, sum(missing) AS missing, sum(injected) AS injected, count(*) FILTER (WHERE state <> 'done') AS open
		      FROM reconcile_runs GROUP BY source) s
		LEFT JOIN LATERAL (SELECT finished_at, missing, injected FROM reconcile_runs r
		      WHERE r.source = s.source AND r.state = 'done' ORDER BY finished_at DESC LIMIT 1) l ON true`)
	if err != nil {
		c.log.Debug("reconcile metrics: query failed", zap.Error(err))
		return
	}
	var source string
	var missing, injected, open int64
	var finished *time.Time
	var lastMissing, lastInjected *int64
	_, err = pgx.ForEachRow(rows, []any{&source, &missing, &injected, &open, &finished, &lastMissing, &lastInjected}, func() error {
		ch <- prometheus.MustNewConstMetric(c.missing, prometheus.CounterValue, float64(missing), source)
		ch <- prometheus.MustNewConstMetric(c.injected, prometheus.CounterValue, float64(injected), source)
		ch <- prometheus.MustNewConstMetric(c.open, prometheus.GaugeValue, float64(open), source)
		if finished != nil {
			ch <- prometheus.MustNewConstMetric(c.lastSuccess, prometheus.GaugeValue, float64(finished.Unix()), source)
			ch <- prometheus.MustNewConstMetric(c.lastMissing, prometheus.GaugeValue, float64(*lastMissing), source)
			ch <- prometheus.MustNewConstMetric(c.lastInjected, prometheus.GaugeValue, float64(*lastInjected), source)
		}
		return nil
	})
	if err != nil {
		c.log.Debug("reconcile metrics: query failed", zap.Error(err))
	}
}
