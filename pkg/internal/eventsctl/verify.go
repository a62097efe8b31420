package eventsctl

import (
	"context"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"
)

// verify waits until an event has had its effect exactly as expected:
// one processed_events row and the expected number of payments rows, and
// the design's invariant query returns no rows.
func verify(ctx context.Context, args []string, env Env, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("eventsctl verify", flag.ContinueOnError)
	fs.SetOutput(stderr)
	id := fs.String("id", "", "event id to check (required)")
	expect := fs.Int("expect", 1, "payments rows the event must have")
	timeout := fs.Duration("timeout", 60*time.Second, "how long to wait for the event to be processed")
	dbURL := credentialFlag(fs, "database-url", env("DATABASE_URL"), "PostgreSQL `URL` ($DATABASE_URL)")
	if err := fs.Parse(args); err != nil {
		return flagStatus(err)
	}
	// Name only what is missing: "-id and DATABASE_URL are required" sent
	// users who had given -id looking for a problem with it.
	var missing []string
	if *id == "" {
		missing = append(missing, "-id")
	}
	if *dbURL == "" {
		missing = append(missing, "DATABASE_URL (or -database-url)")
	}
	if len(missing) > 0 {
		verb := "is"
		if len(missing) > 1 {
			verb = "are"
		}
		fmt.Fprintf(stderr, "eventsctl verify: %s %s required\n", strings.Join(missing, " and "), verb)
		return 2
	}
	if err := checkDatabaseURL(*dbURL); err != nil {
		fmt.Fprintln(stderr, "eventsctl verify:", err)
		return 2
	}
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	var payments, ledger, doubled int
	var lastErr error
	for {
		lastErr = count(ctx, env, *dbURL, *id, &payments, &ledger, &doubled)
		if lastErr == nil && (doubled > 0 || payments > *expect || ledger > 1) {
			break // can only get worse
		}
		if lastErr == nil && payments == *expect && ledger == 1 {
			fmt.Fprintf(stdout, "ok: %s has 1 processed_events row and %d payments rows; no event id is duplicated\n", *id, payments)
			return 0
		}
		select {
		case <-ctx.Done():
			if lastErr != nil {
				fmt.Fprintf(stderr, "eventsctl verify: %v\n", lastErr)
			}
			fmt.Fprintf(stdout, "FAIL: %s has %d processed_events rows and %d payments rows (want 1 and %d)\n", *id, ledger, payments, *expect)
			return 1
		case <-time.After(250 * time.Millisecond):
		}
	}
	fmt.Fprintf(stdout, "FAIL: %s has %d processed_events rows and %d payments rows (want 1 and %d); %d event ids duplicated\n",
		*id, ledger, payments, *expect, doubled)
	return 1
}

func count(ctx context.Context, env Env, dbURL, id string, payments, ledger, doubled *int) error {
	conn, err := connectDB(ctx, env, dbURL)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	return conn.QueryRow(ctx, `SELECT
		(SELECT count(*) FROM payments WHERE event_id = $1),
		(SELECT count(*) FROM processed_events WHERE event_id = $1),
		(SELECT count(*) FROM (SELECT event_id FROM processed_events GROUP BY event_id HAVING COUNT(*) > 1) d)`, id).
		Scan(payments, ledger, doubled)
}
