package eventsctl

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/url"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idempotent-events/idempotent-events/pkg/internal/broker"
	"github.com/idempotent-events/idempotent-events/pkg/internal/logging"
	"github.com/idempotent-events/idempotent-events/pkg/internal/reconcile"
)

const reconcileUsage = `  eventsctl reconcile [-since 72h] [-dry-run] [flags]

Lists the Stripe account's events created in the window (GET /v1/events,
newest first, 100 a page), finds those the ledger does not hold, and
publishes them oldest first to the receiver's exchange, marked
x-ie-origin: reconcile; the worker then treats them as webhooks. Progress
is kept in Postgres (reconcile_runs): a run that is killed is resumed by the
next one, whatever its -since. One run per source at a time.

The key is read from $STRIPE_API_KEY only, never from a flag. A restricted
key with read access to Events is enough. Cost: one API request per 100
events in the window, at most -rate a second.

Exit status: 0 done (missing events found or not; see the report), 1 a
failure (the next run resumes), 2 bad flags or configuration, 3 another
run for the source holds the lock. With -check-config: 0 or 2, and no
service is called (the Helm chart's tests run it with the CronJob's
arguments and environment).

flags:
`

func reconcileCmd(ctx context.Context, args []string, env Env, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("eventsctl reconcile", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(stderr, "Usage of %s:\n\n%s", fs.Name(), reconcileUsage)
		fs.PrintDefaults()
	}
	source := fs.String("source", "stripe", "the webhook source the events belong to (its ledger keys)")
	since := fs.Duration("since", 72*time.Hour, "how far back the window starts (at most 720h: Stripe keeps 30 days)")
	settle := fs.Duration("settle", 5*time.Minute, "how far back the window ends: newer events are left to their webhooks")
	types := fs.String("types", env("RECONCILE_TYPES"), "comma-separated event types to compare, at most 20; name the types your endpoint subscribes to ($RECONCILE_TYPES; empty: all)")
	undelivered := fs.Bool("undelivered-only", false, "list only events Stripe has not delivered to every endpoint (delivery_success=false); cheaper, but blind to events an endpoint answered 2xx and then lost")
	dryRun := fs.Bool("dry-run", false, "list and compare only: inject nothing, record nothing")
	rate := fs.Float64("rate", 20, "most API requests per second (Stripe: 100/s live, 25/s test mode, shared with every other use of the key)")
	apiURL := fs.String("api-url", orDefault(env("STRIPE_API_URL"), reconcile.StripeAPIURL), "Stripe API address ($STRIPE_API_URL)")
	dbURL := fs.String("database-url", env("DATABASE_URL"), "PostgreSQL URL of the ledger ($DATABASE_URL)")
	amqpURL := fs.String("amqp-url", orDefault(env("AMQP_URL"), defaultAMQP), "RabbitMQ URL with the pipeline's vhost ($AMQP_URL)")
	asJSON := fs.Bool("json", false, "print the report as JSON")
	checkOnly := fs.Bool("check-config", false, "check the flags and the environment as a run would, then exit 0 (or 2) without calling Stripe, PostgreSQL or RabbitMQ")
	if err := fs.Parse(args); err != nil {
		return flagStatus(err)
	}
	fail := func(code int, format string, a ...any) int {
		fmt.Fprintf(stderr, "eventsctl reconcile: "+format+"\n", a...)
		return code
	}
	key := env("STRIPE_API_KEY")
	switch {
	case fs.NArg() > 0:
		return fail(2, "unexpected argument %q", fs.Arg(0))
	case *source != "stripe":
		return fail(2, "-source: only Stripe sources can be reconciled, got %q", *source)
	case key == "":
		return fail(2, "STRIPE_API_KEY is required (a restricted key with read access to Events is enough)")
	case *dbURL == "":
		return fail(2, "DATABASE_URL (or -database-url) is required")
	case *rate <= 0:
		return fail(2, "-rate must be positive")
	case !isHTTPURL(*apiURL):
		return fail(2, "-api-url (STRIPE_API_URL): want an http(s) URL, got %q", *apiURL)
	}
	var typeList []string
	for _, t := range strings.Split(*types, ",") {
		if t = strings.TrimSpace(t); t != "" {
			typeList = append(typeList, t)
		}
	}

	log, err := logging.New(orDefault(env("LOG_LEVEL"), "info"), orDefault(env("LOG_FORMAT"), "json"))
	if err != nil {
		return fail(2, "%v", err)
	}
	defer func() { _ = log.Sync() }()
	opts := reconcile.Options{
		Source: *source, Since: *since, Settle: *settle, Types: typeList, UndeliveredOnly: *undelivered,
		DryRun: *dryRun, PublishTimeout: 10 * time.Second, Logger: log.Named("reconcile"),
	}
	if *checkOnly {
		return checkReconcileConfig(opts, *dbURL, *amqpURL, stdout, fail)
	}
	db, err := pgxpool.New(ctx, *dbURL)
	if err != nil {
		return fail(2, "DATABASE_URL: %v", err)
	}
	defer db.Close()
	opts.DB = db
	opts.Log = reconcile.NewStripeLog(reconcile.StripeOptions{APIKey: key, URL: *apiURL, Rate: *rate})
	if !*dryRun {
		conn, err := broker.Dialer{URL: *amqpURL, Name: "eventsctl reconcile"}.Dial()
		if err != nil {
			return fail(1, "rabbitmq: %v", err)
		}
		defer conn.Close()
		pub, err := broker.OpenConfirmChannel(conn)
		if err != nil {
			return fail(1, "rabbitmq: %v", err)
		}
		defer pub.Close()
		opts.Publisher = pub
	}
	rep, err := reconcile.Run(ctx, opts)
	switch {
	case errors.Is(err, reconcile.ErrLocked):
		return fail(3, "%v", err)
	case err != nil && rep.RunID == 0 && !rep.DryRun:
		return fail(2, "%v", err)
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		_ = enc.Encode(rep)
	} else {
		printReconcileReport(stdout, rep, err == nil)
	}
	if err != nil {
		return fail(1, "%v (the next run resumes run %d)", err, rep.RunID)
	}
	return 0
}

// checkReconcileConfig is -check-config: every check a run makes before it
// calls a service, and the URLs parsed as the clients would parse them.
func checkReconcileConfig(opts reconcile.Options, dbURL, amqpURL string, stdout io.Writer, fail func(int, string, ...any) int) int {
	if err := opts.CheckSettings(); err != nil {
		return fail(2, "%v", err)
	}
	if _, err := pgxpool.ParseConfig(dbURL); err != nil {
		return fail(2, "DATABASE_URL: %v", err)
	}
	if !opts.DryRun {
		if _, err := amqp.ParseURI(amqpURL); err != nil {
			return fail(2, "AMQP_URL: %v", err)
		}
	}
	fmt.Fprintln(stdout, "eventsctl reconcile: configuration ok")
	return 0
}

func isHTTPURL(s string) bool {
	u, err := url.Parse(s)
	return err == nil && (u.Scheme == "https" || u.Scheme == "http") && u.Host != ""
}

func printReconcileReport(w io.Writer, r reconcile.Report, done bool) {
	var what string
	switch {
	case r.DryRun:
		what = "dry run"
	case r.Resumed:
		what = fmt.Sprintf("run %d (resumed)", r.RunID)
	default:
		what = fmt.Sprintf("run %d", r.RunID)
	}
	state := "finished"
	if !done {
		state = "stopped"
	}
	fmt.Fprintf(w, "%s %s: %s, events created %s .. %s\n", what, state, r.Source,
		r.From.Format(time.RFC3339), r.To.Format(time.RFC3339))
	fmt.Fprintf(w, "  listed %d in %d pages: %d in the ledger, %d missing\n", r.Listed, r.Pages, r.Present, r.Missing)
	if r.DryRun {
		for _, id := range r.MissingIDs {
			fmt.Fprintf(w, "  missing %s\n", id)
		}
		return
	}
	fmt.Fprintf(w, "  injected %d, arrived by webhook meanwhile %d, refused by the decoder %d\n", r.Injected, r.Arrived, r.Invalid)
}
