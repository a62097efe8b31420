package eventsctl

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/idempotent-events/idempotent-events/pkg/internal/broker"
	"github.com/idempotent-events/idempotent-events/pkg/internal/queuestats"
	"github.com/idempotent-events/idempotent-events/pkg/internal/tlsconfig"
)

const defaultAMQP = "amqp://guest:guest@127.0.0.1:5672/"

func orDefault(v, def string) string {
	if v == "" {
		return def
	}
	return v
}

// status prints queue depths and lag, the DLQ size, the ledger's recent
// throughput and the workers' recent duplicate rate.
func status(ctx context.Context, args []string, env Env, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("eventsctl status", flag.ContinueOnError)
	fs.SetOutput(stderr)
	amqpURL := credentialFlag(fs, "amqp-url", orDefault(env("AMQP_URL"), defaultAMQP), "RabbitMQ `URL`, for the vhost ($AMQP_URL)")
	mgmt := credentialFlag(fs, "management-url", orDefault(env("RABBITMQ_MANAGEMENT_URL"), "auto"), "RabbitMQ management API `URL` ($RABBITMQ_MANAGEMENT_URL; auto derives it from the AMQP URL)")
	dbURL := credentialFlag(fs, "database-url", env("DATABASE_URL"), "PostgreSQL `URL` for ledger figures ($DATABASE_URL; skipped when empty)")
	workers := fs.String("worker-metrics", "http://127.0.0.1:9091/metrics", "comma-separated worker /metrics URLs for the duplicate rate (empty to skip)")
	window := fs.Duration("window", 5*time.Second, "window over which the duplicate rate is measured")
	if err := fs.Parse(args); err != nil {
		return flagStatus(err)
	}
	checks := []error{checkAMQPURL(*amqpURL), checkManagementURL(*mgmt)}
	if *dbURL != "" {
		checks = append(checks, checkDatabaseURL(*dbURL))
	}
	if err := errors.Join(checks...); err != nil {
		for _, line := range strings.Split(err.Error(), "\n") {
			fmt.Fprintln(stderr, "eventsctl status:", line)
		}
		return 2
	}
	failed := false

	base, err := queuestats.ManagementURL(*mgmt, *amqpURL)
	if err == nil && base == "" {
		err = errors.New("management API is off")
	}
	var client *queuestats.Client
	if err == nil {
		var tc *tlsconfig.Client
		if tc, err = tlsOf(env, tlsconfig.RabbitMQ); err == nil {
			client, err = queuestats.ForAMQPTLS(base, *amqpURL, tc)
		}
	}
	var queues []queuestats.Queue
	if err == nil {
		queues, err = client.Queues(ctx, broker.QueuePrefix)
	}
	if err != nil {
		fmt.Fprintf(stderr, "eventsctl status: queues: %v\n", err)
		failed = true
	} else {
		printQueues(stdout, queues, time.Now())
	}

	// A section left out says so: without the line, a missing DATABASE_URL
	// looked like a ledger with nothing to show.
	if *dbURL == "" {
		fmt.Fprintln(stdout, "\nledger: skipped, DATABASE_URL is not set (set it or pass -database-url for the ledger's throughput and handler sets)")
	} else if err := printLedger(ctx, env, stdout, *dbURL); err != nil {
		fmt.Fprintf(stderr, "eventsctl status: ledger: %v\n", err)
		failed = true
	}

	if *workers != "" {
		if err := printDuplicateRate(ctx, stdout, strings.Split(*workers, ","), *window); err != nil {
			fmt.Fprintf(stderr, "eventsctl status: workers: %v\n", err)
			failed = true
		}
	}
	if failed {
		return 1
	}
	return 0
}

// pipelineOrder sorts queues as messages flow: main, retry tiers by delay,
// then the DLQ.
func pipelineOrder(queues []queuestats.Queue) {
	rank := func(q queuestats.Queue) (int, time.Duration) {
		switch {
		case q.Name == broker.MainQueue:
			return 0, 0
		case q.Name == broker.DLQ:
			return 2, 0
		}
		d, _ := time.ParseDuration(strings.TrimPrefix(q.Name, broker.RetryQueuePrefix))
		return 1, d
	}
	sort.SliceStable(queues, func(i, j int) bool {
		ri, di := rank(queues[i])
		rj, dj := rank(queues[j])
		return ri < rj || (ri == rj && di < dj)
	})
}

func printQueues(w io.Writer, queues []queuestats.Queue, now time.Time) {
	pipelineOrder(queues)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "QUEUE\tTYPE\tREADY\tUNACKED\tCONSUMERS\tOLDEST")
	for _, q := range queues {
		oldest := "-"
		if !q.Oldest.IsZero() && q.Ready+q.Unacked > 0 {
			oldest = now.Sub(q.Oldest).Round(time.Second).String()
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%s\n", q.Name, q.Type, q.Ready, q.Unacked, q.Consumers, oldest)
	}
	_ = tw.Flush()
	for _, q := range queues {
		if q.Name == broker.DLQ && q.Ready+q.Unacked > 0 {
			fmt.Fprintf(w, "DLQ: %d message(s) wait in %s; inspect them before they age out of the providers' retry window\n", q.Ready+q.Unacked, broker.DLQ)
		}
	}
}

func printLedger(ctx context.Context, env Env, w io.Writer, dbURL string) error {
	conn, err := connectDB(ctx, env, dbURL)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var last5m, last1h, total, payments, doubled int64
	err = conn.QueryRow(ctx, `SELECT
		(SELECT count(*) FROM processed_events WHERE processed_at > now() - interval '5 minutes'),
		(SELECT count(*) FROM processed_events WHERE processed_at > now() - interval '1 hour'),
		(SELECT count(*) FROM processed_events),
		(SELECT count(*) FROM payments),
		(SELECT count(*) FROM (SELECT event_id FROM processed_events GROUP BY event_id HAVING COUNT(*) > 1) d)`).
		Scan(&last5m, &last1h, &total, &payments, &doubled)
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "\nledger: %d events processed in the last 5m, %d in the last 1h, %d in total; %d payments rows; %d event ids duplicated\n",
		last5m, last1h, total, payments, doubled)
	return printHandlerSets(ctx, w, conn)
}

// printHandlerSets lists the newest generations of the workers' handler
// sets (package store, fence.go): the first is current, and only workers
// of its set commit.
func printHandlerSets(ctx context.Context, w io.Writer, conn *pgx.Conn) error {
	rows, err := conn.Query(ctx, `SELECT g.generation, g.release, coalesce(g.set_id, ''),
		coalesce((SELECT string_agg(h->>'name', ', ' ORDER BY h->>'name') FROM jsonb_array_elements(g.handlers) h), ''),
		(SELECT count(*) FROM processed_events e WHERE e.generation = g.generation)
		FROM handler_generations g ORDER BY g.generation DESC LIMIT 5`)
	if err != nil {
		return err
	}
	type gen struct {
		n, events    int64
		release, set string
		handlers     string
	}
	gens, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (gen, error) {
		var g gen
		err := r.Scan(&g.n, &g.release, &g.set, &g.handlers, &g.events)
		return g, err
	})
	if err != nil {
		return err
	}
	if len(gens) == 0 {
		fmt.Fprintln(w, "handler sets: none registered yet (no worker has started on this ledger)")
		return nil
	}
	fmt.Fprintln(w, "handler sets, newest first (only workers of the current one commit):")
	for i, g := range gens {
		mark := " "
		if i == 0 {
			mark = "*"
		}
		if g.set == "" {
			fmt.Fprintf(w, " %s generation %d  release %s  announced; no worker of it has registered yet (no worker commits until one does)\n", mark, g.n, g.release)
			continue
		}
		fmt.Fprintf(w, " %s generation %d  release %s  set %s  handlers: %s  (%d events committed)\n", mark, g.n, g.release, g.set, g.handlers, g.events)
	}
	return nil
}

// printDuplicateRate scrapes the workers twice, window apart, and prints
// the share of settled deliveries that were duplicates in between.
func printDuplicateRate(ctx context.Context, w io.Writer, urls []string, window time.Duration) error {
	before, err := scrapeOutcomes(ctx, urls)
	if err != nil {
		return err
	}
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(window):
	}
	after, err := scrapeOutcomes(ctx, urls)
	if err != nil {
		return err
	}
	d := map[string]float64{}
	for k, v := range after {
		d[k] = v - before[k]
	}
	settled := d["processed"] + d["duplicate"] + d["retried"] + d["dead_lettered"]
	rate := 0.0
	if settled > 0 {
		rate = d["duplicate"] / settled
	}
	fmt.Fprintf(w, "\nworkers (%d) over %s: %.1f settled/s, duplicate rate %.1f%%, %.0f retried, %.0f dead-lettered\n",
		len(urls), window, settled/window.Seconds(), 100*rate, d["retried"], d["dead_lettered"])
	fmt.Fprintf(w, "workers since start: %.0f processed, %.0f duplicates, %.0f retried, %.0f dead-lettered\n",
		after["processed"], after["duplicate"], after["retried"], after["dead_lettered"])
	return nil
}

// scrapeOutcomes sums idempotent_events_worker_events_total by outcome over
// the workers at urls.
func scrapeOutcomes(ctx context.Context, urls []string) (map[string]float64, error) {
	out := map[string]float64{}
	client := &http.Client{Timeout: 5 * time.Second}
	for _, u := range urls {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimSpace(u), nil)
		if err != nil {
			return nil, err
		}
		resp, err := client.Do(req)
		if err != nil {
			return nil, err
		}
		parser := expfmt.NewTextParser(model.UTF8Validation)
		families, err := parser.TextToMetricFamilies(resp.Body)
		resp.Body.Close()
		if err != nil {
			return nil, fmt.Errorf("parse %s: %w", u, err)
		}
		addOutcomes(out, families["idempotent_events_worker_events_total"])
	}
	return out, nil
}

func addOutcomes(out map[string]float64, mf *dto.MetricFamily) {
	if mf == nil {
		return
	}
	for _, m := range mf.GetMetric() {
		for _, lp := range m.GetLabel() {
			if lp.GetName() == "outcome" {
				out[lp.GetValue()] += m.GetCounter().GetValue()
			}
		}
	}
}
