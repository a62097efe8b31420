package eventsctl

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idempotent-events/idempotent-events/pkg/internal/backfill"
)

const effectsUsage = `usage:
  eventsctl effects backfill -handler NAME -since T [-until T] [-rate 20] [-dry-run] [flags]
      run one handler over the events committed without it (docs/effects.md#backfill)
  eventsctl effects status [-id N]
      the open backfills (or backfill N) and where they stand
  eventsctl effects cancel -id N
      stop backfill N: what ran stays, what did not is unqueued

Run "eventsctl effects <command> -h" for its flags.
`

const backfillUsage = `  eventsctl effects backfill -handler NAME -since T [-until T] [-rate 20] [-dry-run] [flags]

Runs the handler NAME over the events committed (processed_at) in
[since, until) by handler sets that did not run it, exactly once per
(event, handler): the events are queued once (a second run, or two at
once, queue nothing again), and the current workers that run NAME take
them at -rate events a second between them, each in a transaction that
also records it done. This command queues and then shows the progress;
stopping it does not stop the backfill (eventsctl effects cancel does).

Cannot be backfilled, and said so: a transition handler (OnTransition);
events whose body is not in event_archive (committed while EVENT_ARCHIVE
was off, or pruned); events committed before handler sets were recorded,
unless -unrecorded (whether their set ran NAME is not known).

Exit status: 0 done (or queued, with -detach; planned, with -dry-run),
1 items failed or a failure, 2 bad flags or a handler that cannot be
backfilled.

flags:
`

func effectsCmd(ctx context.Context, args []string, env Env, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, effectsUsage)
		return 2
	}
	switch args[0] {
	case "backfill":
		return backfillCmd(ctx, args[1:], env, stdout, stderr)
	case "status":
		return backfillStatusCmd(ctx, args[1:], env, stdout, stderr)
	case "cancel":
		return backfillCancelCmd(ctx, args[1:], env, stdout, stderr)
	case "-h", "--help", "help":
		fmt.Fprint(stdout, effectsUsage)
		return 0
	}
	fmt.Fprintf(stderr, "eventsctl effects: unknown command %q\n\n%s", args[0], effectsUsage)
	return 2
}

// parseSince reads a point in time: RFC 3339, or a duration back from now
// ("72h").
func parseSince(s string, now time.Time) (time.Time, error) {
	if d, err := time.ParseDuration(s); err == nil {
		return now.Add(-d), nil
	}
	t, err := time.Parse(time.RFC3339, s)
	if err != nil {
		return time.Time{}, fmt.Errorf("%q is neither an RFC 3339 time (2026-12-01T00:00:00Z) nor a duration back from now (72h)", s)
	}
	return t, nil
}

func backfillCmd(ctx context.Context, args []string, env Env, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("eventsctl effects backfill", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(stderr, "Usage of %s:\n\n%s", fs.Name(), backfillUsage)
		fs.PrintDefaults()
	}
	handler := fs.String("handler", "", "the handler's name, as registered (required)")
	since := fs.String("since", "", "the window's start: RFC 3339, or a duration back from now such as 72h (required)")
	until := fs.String("until", "", "the window's end, excluded (default: open)")
	rate := fs.Float64("rate", 20, "events a second, across every worker")
	dryRun := fs.Bool("dry-run", false, "say what would be queued and what cannot be backfilled; queue nothing")
	unrecorded := fs.Bool("unrecorded", false, "include the events committed before handler sets were recorded")
	detach := fs.Bool("detach", false, "queue and exit; do not wait for the workers")
	every := fs.Duration("progress", 2*time.Second, "how often to print the progress line")
	dbURL := credentialFlag(fs, "database-url", env("DATABASE_URL"), "PostgreSQL `URL` of the ledger ($DATABASE_URL)")
	if err := fs.Parse(args); err != nil {
		return flagStatus(err)
	}
	fail := func(code int, format string, a ...any) int {
		fmt.Fprintf(stderr, "eventsctl effects backfill: "+format+"\n", a...)
		return code
	}
	now := time.Now()
	req := backfill.Request{Handler: *handler, Unrecorded: *unrecorded}
	var problems []string
	if *handler == "" {
		problems = append(problems, "-handler is required")
	}
	if *since == "" {
		problems = append(problems, "-since is required")
	} else if t, err := parseSince(*since, now); err != nil {
		problems = append(problems, "-since: "+err.Error())
	} else {
		req.Since = t
	}
	if *until != "" {
		if t, err := parseSince(*until, now); err != nil {
			problems = append(problems, "-until: "+err.Error())
		} else if req.Until = t; !req.Since.IsZero() && !t.After(req.Since) {
			problems = append(problems, "-until must be after -since")
		}
	}
	if !(*rate > 0) {
		problems = append(problems, fmt.Sprintf("-rate must be above 0, got %v", *rate))
	}
	if *dbURL == "" {
		problems = append(problems, "DATABASE_URL (or -database-url) is required")
	} else if err := checkDatabaseURL(*dbURL); err != nil {
		problems = append(problems, err.Error())
	}
	if fs.NArg() > 0 {
		problems = append(problems, fmt.Sprintf("unexpected argument %q", fs.Arg(0)))
	}
	if len(problems) > 0 {
		return fail(2, "%s", strings.Join(problems, "; "))
	}
	db, err := openPool(ctx, env, *dbURL)
	if err != nil {
		return fail(2, "%v", err)
	}
	defer db.Close()

	plan, err := backfill.MakePlan(ctx, db, req)
	if err != nil {
		if errors.Is(err, backfill.ErrNotBackfillable) {
			return fail(2, "%v", err)
		}
		return fail(1, "%v", err)
	}
	printPlan(stdout, req, plan)
	if *dryRun {
		fmt.Fprintln(stdout, "dry run: nothing queued")
		return 0
	}
	id, queued, err := backfill.Queue(ctx, db, req, *rate, operator(env))
	if err != nil {
		return fail(1, "%v", err)
	}
	fmt.Fprintf(stdout, "backfill %d: %d events queued for %s at %g/s; the workers that run it take them (stopping this command does not stop them: eventsctl effects cancel -id %d does)\n",
		id, queued, req.Handler, *rate, id)
	if *detach || queued == 0 {
		return 0
	}
	return watch(ctx, db, id, *every, stdout, stderr)
}

// printPlan says what a backfill would do and what it cannot.
func printPlan(w io.Writer, req backfill.Request, p backfill.Plan) {
	route := p.Handler.Source + " " + p.Handler.EventType
	window := "since " + req.Since.UTC().Format(time.RFC3339)
	if !req.Until.IsZero() {
		window += ", until " + req.Until.UTC().Format(time.RFC3339)
	}
	fmt.Fprintf(w, "handler %s (%s), current in generation %d; events committed %s:\n", p.Handler.Name, route, p.Generation, window)
	fmt.Fprintf(w, "  committed without it: %d\n", p.Missed)
	fmt.Fprintf(w, "  to queue: %d (%d queued or done by an earlier backfill)\n", p.ToQueue(), p.Queued)
	if n := p.Missed - p.Archived; n > 0 {
		fmt.Fprintf(w, "  cannot be backfilled: %d without a body in event_archive (EVENT_ARCHIVE off when they committed, or pruned), e.g. %s\n",
			n, strings.Join(p.NoBody, ", "))
	}
	if p.Unrecorded > 0 {
		verb := "left out (-unrecorded takes them)"
		if req.Unrecorded {
			verb = "included (-unrecorded)"
		}
		fmt.Fprintf(w, "  committed before handler sets were recorded: %d, %s\n", p.Unrecorded, verb)
	}
}

// operator names who queued a backfill, for its record.
func operator(env Env) string {
	if u := env("USER"); u != "" {
		return "eventsctl:" + u
	}
	if h, err := os.Hostname(); err == nil {
		return "eventsctl@" + h
	}
	return "eventsctl"
}

// watch prints backfill id's progress until it is finished.
func watch(ctx context.Context, db *pgxpool.Pool, id int64, every time.Duration, stdout, stderr io.Writer) int {
	start := time.Now()
	for {
		p, err := backfill.ProgressOf(ctx, db, id)
		if err != nil {
			fmt.Fprintf(stderr, "eventsctl effects backfill: %v\n", err)
			return 1
		}
		fmt.Fprintln(stdout, progressLine(p, time.Since(start)))
		if p.Finished {
			if p.Failed > 0 {
				fmt.Fprintf(stdout, "backfill %d: %d failed; the last error: %s\n", id, p.Failed, p.LastError)
				return 1
			}
			return 0
		}
		select {
		case <-ctx.Done():
			return 1
		case <-time.After(every):
		}
	}
}

func progressLine(p backfill.Progress, elapsed time.Duration) string {
	done := p.Total() - p.Pending
	line := fmt.Sprintf("backfill %d %s: %d/%d done (%d applied, %d skipped, %d failed)", p.ID, p.Handler, done, p.Total(), p.Applied, p.Skipped, p.Failed)
	switch {
	case p.Finished:
		line += ", finished"
	case p.Rate > 0:
		line += fmt.Sprintf(", about %s left at %g/s", (time.Duration(float64(p.Pending)/p.Rate) * time.Second).Round(time.Second), p.Rate)
	}
	if p.LastError != "" && !p.Finished {
		line += "; last error: " + firstLine(p.LastError)
	}
	return line
}

func firstLine(s string) string {
	first, _, _ := strings.Cut(s, "\n")
	return first
}

// backfillDB parses the flags common to status and cancel and opens the
// ledger.
func backfillDB(ctx context.Context, name string, args []string, env Env, stderr io.Writer, needID bool) (*pgxpool.Pool, int64, int) {
	fs := flag.NewFlagSet("eventsctl effects "+name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	id := fs.Int64("id", 0, "the backfill's id")
	dbURL := credentialFlag(fs, "database-url", env("DATABASE_URL"), "PostgreSQL `URL` of the ledger ($DATABASE_URL)")
	if err := fs.Parse(args); err != nil {
		return nil, 0, flagStatus(err)
	}
	var problems []string
	if needID && *id <= 0 {
		problems = append(problems, "-id is required")
	}
	if *dbURL == "" {
		problems = append(problems, "DATABASE_URL (or -database-url) is required")
	} else if err := checkDatabaseURL(*dbURL); err != nil {
		problems = append(problems, err.Error())
	}
	if len(problems) > 0 {
		fmt.Fprintf(stderr, "eventsctl effects %s: %s\n", name, strings.Join(problems, "; "))
		return nil, 0, 2
	}
	db, err := openPool(ctx, env, *dbURL)
	if err != nil {
		fmt.Fprintf(stderr, "eventsctl effects %s: %v\n", name, err)
		return nil, 0, 2
	}
	return db, *id, -1
}

func backfillStatusCmd(ctx context.Context, args []string, env Env, stdout, stderr io.Writer) int {
	db, id, code := backfillDB(ctx, "status", args, env, stderr, false)
	if code >= 0 {
		return code
	}
	defer db.Close()
	ids := []int64{id}
	if id == 0 {
		var err error
		if ids, err = backfill.Open(ctx, db); err != nil {
			fmt.Fprintf(stderr, "eventsctl effects status: %v\n", err)
			return 1
		}
		if len(ids) == 0 {
			fmt.Fprintln(stdout, "no backfill is open")
			return 0
		}
	}
	for _, id := range ids {
		p, err := backfill.ProgressOf(ctx, db, id)
		if err != nil {
			fmt.Fprintf(stderr, "eventsctl effects status: %v\n", err)
			return 1
		}
		fmt.Fprintln(stdout, progressLine(p, 0))
	}
	return 0
}

func backfillCancelCmd(ctx context.Context, args []string, env Env, stdout, stderr io.Writer) int {
	db, id, code := backfillDB(ctx, "cancel", args, env, stderr, true)
	if code >= 0 {
		return code
	}
	defer db.Close()
	unqueued, err := backfill.Cancel(ctx, db, id)
	if err != nil {
		fmt.Fprintf(stderr, "eventsctl effects cancel: %v\n", err)
		return 1
	}
	fmt.Fprintf(stdout, "backfill %d cancelled: %d events unqueued (what ran stays; a new backfill can queue them again)\n", id, unqueued)
	return 0
}
