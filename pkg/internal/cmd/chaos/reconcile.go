package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idempotent-events/idempotent-events/pkg/internal/event"
	"github.com/idempotent-events/idempotent-events/pkg/internal/harness"
	"github.com/idempotent-events/idempotent-events/pkg/internal/reconcile"
)

// stripeKey is the API key the harness's Stripe answers to.
const stripeKey = "rk_test_chaos"

// reconcileArgs is the run an operator makes after fixing the secret: the
// last hour, up to now.
var reconcileArgs = []string{"reconcile", "-since", "1h", "-settle", "0s"}

// reconcileRejected recovers the events the provider gave up on with the
// real eventsctl reconcile, against the provider's record of every event
// (system.stripe), once the deliveries have settled. It runs it twice: the
// first run is SIGKILLed at a random moment of its expected length (before
// it opened its run, while listing, while injecting, or not at all if it
// was quicker), and the second resumes it. Then it checks what the
// reconciler recorded and what the ledger holds: exactly the rejected
// events were found missing, each was settled, and each ledger row of an
// event the reconciler fed in (content digest event.AnyDigest) is a
// rejected event's, and every rejected event has one.
func reconcileRejected(ctx context.Context, sys *system, ids []string, rejected map[string]bool, o options) recovery {
	var rec recovery
	problem := func(format string, a ...any) { rec.problems = append(rec.problems, fmt.Sprintf(format, a...)) }
	// Every delivered event is in the ledger before the reconciler looks:
	// one still in flight would be found missing and injected too (a
	// duplicate, harmless), and blur what this checks.
	drain(ctx, sys, len(ids)-len(rejected))

	env := sys.stack.Env("STRIPE_API_KEY="+stripeKey, "STRIPE_API_URL="+sys.stripe.URL())
	first, err := sys.stack.Start("reconcile-1", "eventsctl", env, reconcileArgs...)
	check(err)
	// A run starts, pages the window at eventsctl's default 20 requests a
	// second, then publishes the missing events with confirms: 1500
	// events took it 0.95 s on the 2-core machine, 0.7 s of them paging.
	pages := (len(ids) + reconcile.PageSize - 1) / reconcile.PageSize
	expected := 200*time.Millisecond + time.Duration(pages)*50*time.Millisecond + time.Duration(len(rejected))*time.Millisecond
	at := rand.N(expected)
	var firstRun string
	select {
	case <-first.Exited():
		firstRun = fmt.Sprintf("run 1 exited %d before its kill at %s", first.ExitCode(), at.Round(time.Millisecond))
	case <-time.After(at):
		first.Kill()
		firstRun = fmt.Sprintf("run 1 exited %d just before its kill at %s", first.ExitCode(), at.Round(time.Millisecond))
		if first.ExitCode() == -1 {
			rec.faults++
			firstRun = fmt.Sprintf("run 1 SIGKILLed after %s %s", at.Round(time.Millisecond), killedWhere(ctx, sys, pages))
		}
	}
	if code := first.ExitCode(); code != -1 {
		if code != 0 {
			problem("reconcile run 1 exited %d:\n%s", code, lastLines(first.Log(), 15))
		}
		// It finished: its injections are processed before the next run
		// looks, as above.
		drain(ctx, sys, len(ids))
	}

	// The second run; the killed run's session may hold the source's lock
	// for a moment (exit 3) until Postgres notices it is gone.
	var second *harness.Proc
	for try := 0; ; try++ {
		second, err = sys.stack.Start("reconcile-2", "eventsctl", env, reconcileArgs...)
		check(err)
		select {
		case <-second.Exited():
		case <-time.After(10 * time.Minute):
			second.Kill()
		}
		if second.ExitCode() != 3 || try == 50 {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if code := second.ExitCode(); code != 0 {
		problem("reconcile run 2 exited %d:\n%s", code, lastLines(second.Log(), 15))
	}
	drain(ctx, sys, len(ids))

	runs, err := readRuns(ctx, sys)
	check(err)
	missing, err := readMissing(ctx, sys)
	check(err)
	fed, err := reconciledInLedger(ctx, sys)
	check(err)
	if runs.open > 0 {
		problem("%d reconcile runs left unfinished", runs.open)
	}
	if runs.minListed != len(ids) || runs.maxListed != len(ids) {
		problem("reconcile runs listed %d to %d events of the provider's %d", runs.minListed, runs.maxListed, len(ids))
	}
	if runs.injected+runs.arrived != len(rejected) || runs.invalid != 0 {
		problem("reconcile runs settled %d injected + %d arrived (%d invalid) for %d rejected events",
			runs.injected, runs.arrived, runs.invalid, len(rejected))
	}
	var notFound, notRejected, unsettled, notFed, fedDelivered []string
	for id := range rejected {
		if _, ok := missing[id]; !ok {
			notFound = append(notFound, id)
		}
		if !fed[id] {
			notFed = append(notFed, id)
		}
	}
	for id, outcome := range missing {
		if !rejected[id] {
			notRejected = append(notRejected, id)
		}
		if outcome != "injected" && outcome != "arrived" {
			unsettled = append(unsettled, id+" ("+outcome+")")
		}
	}
	for id := range fed {
		if !rejected[id] {
			fedDelivered = append(fedDelivered, id)
		}
	}
	for _, c := range []struct {
		ids  []string
		what string
	}{
		{notFound, "rejected events the reconciler did not find missing"},
		{notRejected, "delivered events the reconciler took for missing"},
		{unsettled, "missing events not settled as injected or arrived"},
		{notFed, "rejected events without a ledger row of the reconciler's"},
		{fedDelivered, "delivered events whose ledger row is the reconciler's"},
	} {
		if len(c.ids) > 0 {
			problem("%d %s: %v", len(c.ids), c.what, head(c.ids, 10))
		}
	}
	if runs.duplicates > 0 {
		problem("%d events were found missing by more than one run", runs.duplicates)
	}
	rec.note = fmt.Sprintf("  reconcile: %d of %d events rejected (401, given up); %s; run 2 exit %d; %d API requests\n"+
		"  reconcile_runs: %d, listed %d, missing %d, injected %d, arrived %d, invalid %d; ledger rows fed by the reconciler: %d, %d of them rejected events",
		len(rejected), len(ids), firstRun, second.ExitCode(), sys.stripe.Requests(),
		runs.count, runs.maxListed, len(missing), runs.injected, runs.arrived, runs.invalid, len(fed), len(fed)-len(fedDelivered))
	return rec
}

// killedWhere says where a killed run left its progress.
func killedWhere(ctx context.Context, sys *system, pages int) string {
	var state string
	var kept, settled, missing int
	err := sys.stack.DB.QueryRow(ctx, `SELECT state, pages, injected + arrived + invalid, missing FROM reconcile_runs ORDER BY id DESC LIMIT 1`).
		Scan(&state, &kept, &settled, &missing)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return "before it opened a run"
	case err != nil:
		check(err)
	}
	switch state {
	case "listing":
		return fmt.Sprintf("while listing (%d of %d pages kept)", kept, pages)
	case "injecting":
		return fmt.Sprintf("while injecting (%d of %d settled)", settled, missing)
	}
	return "after it finished its run"
}

// runTotals sums the reconcile_runs of the scenario's schema.
type runTotals struct {
	count, open                int
	minListed, maxListed       int
	injected, arrived, invalid int
	duplicates                 int
}

func readRuns(ctx context.Context, sys *system) (runTotals, error) {
	var t runTotals
	err := sys.stack.DB.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE state <> 'done'),
		coalesce(min(listed), 0), coalesce(max(listed), 0),
		coalesce(sum(injected), 0), coalesce(sum(arrived), 0), coalesce(sum(invalid), 0),
		(SELECT count(*) FROM (SELECT event_id FROM reconcile_missing GROUP BY event_id HAVING count(*) > 1) d)
		FROM reconcile_runs`).
		Scan(&t.count, &t.open, &t.minListed, &t.maxListed, &t.injected, &t.arrived, &t.invalid, &t.duplicates)
	return t, err
}

// readMissing returns the events the runs found missing, with their
// outcome ("" while unsettled).
func readMissing(ctx context.Context, sys *system) (map[string]string, error) {
	rows, err := sys.stack.DB.Query(ctx, `SELECT event_id, coalesce(outcome, '') FROM reconcile_missing`)
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	var id, outcome string
	_, err = pgx.ForEachRow(rows, []any{&id, &outcome}, func() error { out[id] = outcome; return nil })
	return out, err
}

// reconciledInLedger returns the events whose ledger row the reconciler's
// message wrote: the worker gives those the content digest
// event.AnyDigest, a webhook's its body's SHA-256.
func reconciledInLedger(ctx context.Context, sys *system) (map[string]bool, error) {
	rows, err := sys.stack.DB.Query(ctx, `SELECT event_id FROM processed_events WHERE payload_sha256 = $1`, event.AnyDigest[:])
	if err != nil {
		return nil, err
	}
	out := map[string]bool{}
	var id string
	_, err = pgx.ForEachRow(rows, []any{&id}, func() error { out[id] = true; return nil })
	return out, err
}
