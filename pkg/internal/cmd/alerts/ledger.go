package main

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idempotent-events/idempotent-events/pkg/internal/harness"
	"github.com/idempotent-events/idempotent-events/pkg/internal/pgcluster"
)

// replicatedLedger is a second deployment whose ledger is a private
// primary with a synchronous standby (pgcluster), with a worker of its own
// (the orders worker, so it runs the same handler set as the main one).
// It is where the ledger turns asynchronous: the machine's Postgres has no
// standby, and its settings are not the suite's to change.
type replicatedLedger struct {
	cluster *pgcluster.Cluster
	stack   *harness.Stack
	worker  *harness.Proc
	metrics string
}

func startReplicatedLedger(ctx context.Context, binDir string, mon *monitor) (*replicatedLedger, error) {
	if err := pgcluster.Available(pgcluster.Options{}); err != nil {
		return nil, fmt.Errorf("a private Postgres cluster cannot run here: %w", err)
	}
	l := &replicatedLedger{metrics: harness.FreeAddr()}
	var err error
	if l.cluster, err = pgcluster.Start(ctx, pgcluster.Options{}); err != nil {
		return nil, err
	}
	if l.stack, err = harness.NewStackOn(ctx, binDir, "ie_alerts_ledger", l.cluster.URL("idempotent_events")); err != nil {
		l.close()
		return nil, err
	}
	if l.worker, err = l.stack.Start("worker-ledger", "orders", l.stack.Env("METRICS_ADDR="+l.metrics,
		"RABBITMQ_MANAGEMENT_URL=off", "OUTBOX_RELAY=off", "SHUTDOWN_TIMEOUT=3s")); err != nil {
		l.close()
		return nil, err
	}
	if err := harness.WaitHTTPEvery("http://"+l.metrics+"/readyz", 60*time.Second, 100*time.Millisecond); err != nil {
		err = fmt.Errorf("worker on the replicated ledger: %w\n%s", err, lastLines(l.worker.Log(), 15))
		l.close()
		return nil, err
	}
	if err := mon.addTarget(l.metrics, "worker"); err != nil {
		l.close()
		return nil, err
	}
	return l, mon.waitScraped(ctx, l.metrics, 30*time.Second)
}

// setSynchronous makes the primary's standby synchronous again (the
// cluster's configuration), or asynchronous (synchronous_standby_names
// emptied, as Patroni does without synchronous_mode_strict after losing
// its last synchronous standby).
func (l *replicatedLedger) setSynchronous(ctx context.Context, sync bool) error {
	conn, err := pgx.Connect(ctx, l.cluster.Primary().URL("postgres"))
	if err != nil {
		return err
	}
	defer func() { _ = conn.Close(ctx) }()
	stmt := `ALTER SYSTEM SET synchronous_standby_names = ''`
	if sync {
		stmt = `ALTER SYSTEM RESET synchronous_standby_names`
	}
	if _, err := conn.Exec(ctx, stmt); err != nil {
		return err
	}
	_, err = conn.Exec(ctx, `SELECT pg_reload_conf()`)
	return err
}

func (l *replicatedLedger) close() {
	if l.worker != nil {
		l.worker.Term(5 * time.Second)
		l.worker = nil
	}
	if l.stack != nil {
		l.stack.Close()
		l.stack = nil
	}
	if l.cluster != nil {
		l.cluster.Close()
		l.cluster = nil
	}
}

// ledgerAsync: the replicated ledger's primary turns asynchronous while its
// worker runs; the worker reads the settings every 30 s.
func ledgerAsync(l **replicatedLedger) *scenario {
	return &scenario{
		name: "ledger async",
		expect: []expectation{{"IdempotentEventsLedgerAsync", nil,
			"a private primary + standby (pgcluster): synchronous_standby_names emptied and reloaded under a running worker"}},
		removal: "synchronous_standby_names reset and reloaded (the worker re-reads within 30s)",
		induce: func(ctx context.Context, s *system) error {
			if *l == nil {
				return fmt.Errorf("no replicated ledger")
			}
			return (*l).setSynchronous(ctx, false)
		},
		remove: func(ctx context.Context, s *system) error { return (*l).setSynchronous(ctx, true) },
	}
}
