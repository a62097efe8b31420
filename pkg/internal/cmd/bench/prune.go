package main

import (
	"context"
	"fmt"
	"time"
)

// vsPrune measures what a prune costs the pipeline: on a ledger of
// o.pruneRows rows, half of them older than the 35-day retention, the
// worker drains a backlog alone, then another while eventsctl prune
// deletes the old half, then a third alone again. The figure is the drain
// beside the prune over the mean of the two alone (target >= 0.85), and
// the prune's own rate.
func vsPrune(ctx context.Context, binDir string, o options) {
	s := newStack(ctx, binDir)
	defer s.Close()
	t := time.Now()
	_, err := s.DB.Exec(ctx, `INSERT INTO processed_events (event_id, event_type, payload_sha256, received_at, processed_at)
		SELECT 'evt_seeded_' || g, 'payment_intent.succeeded', sha256(g::text::bytea), now() - (g % 70) * interval '1 day',
			now() - (g % 70) * interval '1 day' - interval '1 hour'
		FROM generate_series(1, $1) g`, o.pruneRows)
	check(err)
	_, err = s.DB.Exec(ctx, `VACUUM ANALYZE processed_events`)
	check(err)
	var old int
	check(s.DB.QueryRow(ctx, `SELECT count(*) FROM processed_events WHERE processed_at < now() - interval '35 days'`).Scan(&old))
	fmt.Printf("prune: seeded %d ledger rows (%d older than 35 days) in %s\n", o.pruneRows, old, time.Since(t).Round(time.Second))

	unique, dups := o.baselineEvents, o.dups
	drain := func(prefix string) float64 {
		publishBacklog(ctx, s, prefix, unique, dups)
		rate, _, _ := drainPattern(ctx, s, "worker", "evt_"+prefix+"%", unique*(1+dups), unique, splitEnv(o.workerEnv)...)
		return rate
	}
	before := drain("pa")
	publishBacklog(ctx, s, "pb", unique, dups)
	prune, err := s.Start("prune", "eventsctl", s.Env("LOG_LEVEL=error"), "prune", "-ledger-retention", "35d", "-pause", o.prunePause.String())
	check(err)
	started := time.Now()
	beside, _, _ := drainPattern(ctx, s, "worker", "evt_pb%", unique*(1+dups), unique, splitEnv(o.workerEnv)...)
	stillPruning := true
	select {
	case <-prune.Exited():
		stillPruning = false
	default:
	}
	select {
	case <-prune.Exited():
	case <-time.After(30 * time.Minute):
		check(fmt.Errorf("prune did not finish in 30 minutes:\n%s", prune.Log()))
	}
	took := time.Since(started)
	if prune.ExitCode() != 0 {
		check(fmt.Errorf("prune exited %d:\n%s", prune.ExitCode(), prune.Log()))
	}
	var deleted int
	check(s.DB.QueryRow(ctx, `SELECT (deleted->>'processed_events')::int FROM prune_runs ORDER BY id DESC LIMIT 1`).Scan(&deleted))
	after := drain("pc")
	alone := (before + after) / 2
	fmt.Printf("prune: %d rows deleted in %s (%.0f rows/s, -pause %s) beside the drain\n", deleted, took.Round(time.Second), float64(deleted)/took.Seconds(), o.prunePause)
	fmt.Printf("  worker deliveries/s alone %.0f and %.0f, beside the prune %.0f (the prune still ran at the drain's end: %v)\n",
		before, after, beside, stillPruning)
	fmt.Printf("  beside / alone                       %9.2f        (target >= 0.85)\n", beside/alone)
}
