package eventsctl

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/url"
	"strings"
	"time"

	"github.com/idempotent-events/idempotent-events/pkg/internal/broker"
	"github.com/idempotent-events/idempotent-events/pkg/internal/logging"
	"github.com/idempotent-events/idempotent-events/pkg/internal/reconcile"
)

const reconcileUsage = `  eventsctl reconcile [-since 72h] [-dry-run] [flags]
  eventsctl reconcile -source NAME (-repo OWNER/REPO | -org ORG) -hook-id N [-since 72h] [-dry-run] [flags]

Stripe (the default; -provider stripe): lists the Stripe account's events
created in the window (GET /v1/events, newest first, 100 a page), finds
those the ledger does not hold, and publishes them oldest first to the
receiver's exchange, marked x-ie-origin: reconcile; the worker then treats
them as webhooks. Progress is kept in Postgres (reconcile_runs): a run that
is killed is resumed by the next one, whatever its -since. The key is read
from $STRIPE_API_KEY only, never from a flag; a restricted key with read
access to Events is enough. Cost: one API request per 100 events in the
window.

GitHub (-provider github, or given -repo or -org): lists the deliveries of
one repository or organization webhook over the window (at most 72h: GitHub
keeps 3 days), and for each event (X-GitHub-Delivery guid) that the ledger
does not hold as <source>:<guid> and that no attempt delivered (2xx), asks
GitHub to redeliver its latest attempt, once; GitHub then posts it to the
receiver as usual. Events with a 2xx attempt are on their way and are only
reported. The token is read from $GITHUB_TOKEN only: a fine-grained or
GitHub App installation token with "Webhooks: read and write" on the
repository (organization hooks: on the organization). Cost: one API request
per 100 deliveries plus one per redelivery. $GITHUB_API_URL points at GitHub
Enterprise Server (https://HOST/api/v3).

One run per source at a time. Exit status: 0 done (see the report), 1 a
failure (Stripe: the next run resumes; GitHub: also when GitHub refused a
redelivery), 2 bad flags or configuration, 3 another run for the source
holds the lock. With -check-config: 0 or 2, and no service is called (the
Helm chart's tests run it with the CronJob's arguments and environment).

flags:
`

// Flags that only one provider has; giving one to the other is a mistake
// worth stopping at (a -types filter silently ignored, a -repo that
// switches providers).
var (
	stripeOnlyFlags = []string{"settle", "types", "undelivered-only", "amqp-url"}
	githubOnlyFlags = []string{"repo", "org", "hook-id", "max-wait"}
)

func reconcileCmd(ctx context.Context, args []string, env Env, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("eventsctl reconcile", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(stderr, "Usage of %s:\n\n%s", fs.Name(), reconcileUsage)
		fs.PrintDefaults()
	}
	provider := fs.String("provider", "", "stripe or github (default: github when -repo or -org is given, else stripe)")
	source := fs.String("source", "stripe", "the webhook source the events belong to (their ledger keys); for GitHub the name of its name:github entry in WEBHOOK_SOURCES")
	since := fs.Duration("since", 72*time.Hour, "how far back the window starts (at most 720h for Stripe, which keeps 30 days; 72h for GitHub, which keeps 3)")
	settle := fs.Duration("settle", 5*time.Minute, "Stripe: how far back the window ends: newer events are left to their webhooks")
	types := fs.String("types", env("RECONCILE_TYPES"), "Stripe: comma-separated event types to compare, at most 20; name the types your endpoint subscribes to ($RECONCILE_TYPES; empty: all)")
	undelivered := fs.Bool("undelivered-only", false, "Stripe: list only events Stripe has not delivered to every endpoint (delivery_success=false); cheaper, but blind to events an endpoint answered 2xx and then lost")
	dryRun := fs.Bool("dry-run", false, "list and compare only: inject or redeliver nothing, record nothing")
	rate := fs.Float64("rate", 0, "most API requests per second (default 20 for Stripe: 100/s live, 25/s test mode, shared with every other use of the key; 1 for GitHub: 5,000 requests an hour, 80 redeliveries a minute)")
	apiURL := fs.String("api-url", "", "API address (default $STRIPE_API_URL or "+reconcile.StripeAPIURL+"; for GitHub $GITHUB_API_URL or "+reconcile.GitHubAPIURL+")")
	dbURL := credentialFlag(fs, "database-url", env("DATABASE_URL"), "PostgreSQL `URL` of the ledger ($DATABASE_URL)")
	amqpURL := credentialFlag(fs, "amqp-url", orDefault(env("AMQP_URL"), defaultAMQP), "Stripe: RabbitMQ `URL` with the pipeline's vhost ($AMQP_URL)")
	repo := fs.String("repo", "", "GitHub: the repository (owner/name) of a repository webhook")
	org := fs.String("org", "", "GitHub: the organization of an organization webhook")
	hookID := fs.Int64("hook-id", 0, "GitHub: the webhook's id (the number in its settings page's address)")
	maxWait := fs.Duration("max-wait", 10*time.Minute, "GitHub: the longest one request waits out a rate limit or retries an outage before the run fails")
	asJSON := fs.Bool("json", false, "print the report as JSON")
	checkOnly := fs.Bool("check-config", false, "check the flags and the environment as a run would, then exit 0 (or 2) without calling the provider, PostgreSQL or RabbitMQ")
	if err := fs.Parse(args); err != nil {
		return flagStatus(err)
	}
	fail := func(code int, format string, a ...any) int {
		fmt.Fprintf(stderr, "eventsctl reconcile: "+format+"\n", a...)
		return code
	}
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	if *provider == "" {
		*provider = "stripe"
		if *repo != "" || *org != "" {
			*provider = "github"
		}
	}
	others := githubOnlyFlags
	if *provider == "github" {
		others = stripeOnlyFlags
	}
	for _, name := range others {
		if given[name] {
			return fail(2, "-%s does not apply to -provider %s", name, *provider)
		}
	}
	switch {
	case fs.NArg() > 0:
		return fail(2, "unexpected argument %q", fs.Arg(0))
	case *provider != "stripe" && *provider != "github":
		return fail(2, "-provider: stripe or github, got %q", *provider)
	case *provider == "stripe" && *source != "stripe":
		return fail(2, "-source: only the Stripe source can be reconciled with Stripe's API, got %q (a GitHub source needs -repo or -org)", *source)
	case *provider == "stripe" && env("STRIPE_API_KEY") == "":
		return fail(2, "STRIPE_API_KEY is required (a restricted key with read access to Events is enough)")
	case *provider == "github" && (!given["source"] || *source == "stripe" || *source == "payment"):
		return fail(2, "-source: name the GitHub source (its name:github entry in WEBHOOK_SOURCES): its events' ledger keys are <source>:<guid>")
	case *provider == "github" && (*repo == "") == (*org == ""):
		return fail(2, "-repo owner/name or -org org: name the webhook's owner, one of the two")
	case *provider == "github" && *hookID <= 0:
		return fail(2, "-hook-id is required: the webhook's id")
	case *provider == "github" && (*since <= 0 || *since > reconcile.GitHubMaxWindow):
		return fail(2, "-since must be more than 0 and at most 72h (GitHub keeps 3 days of deliveries)")
	case *provider == "github" && env("GITHUB_TOKEN") == "":
		return fail(2, "GITHUB_TOKEN is required (a token with \"Webhooks: read and write\" on the repository or organization)")
	case *dbURL == "":
		return fail(2, "DATABASE_URL (or -database-url) is required")
	case *rate < 0:
		return fail(2, "-rate must be positive")
	}
	if err := checkDatabaseURL(*dbURL); err != nil {
		return fail(2, "%v", err)
	}

	log, err := logging.New(orDefault(env("LOG_LEVEL"), "info"), orDefault(env("LOG_FORMAT"), "json"))
	if err != nil {
		return fail(2, "%v", err)
	}
	defer func() { _ = log.Sync() }()

	if *provider == "github" {
		hook, err := reconcile.NewGitHubHook(reconcile.GitHubHookOptions{
			Token: env("GITHUB_TOKEN"), URL: orDefault(*apiURL, orDefault(env("GITHUB_API_URL"), reconcile.GitHubAPIURL)),
			Repo: *repo, Org: *org, HookID: *hookID, Rate: *rate, MaxWait: *maxWait,
		})
		if err != nil {
			return fail(2, "%v", err)
		}
		if *checkOnly {
			return checkReconcileConfig(nil, stdout, fail)
		}
		db, err := openPool(ctx, env, *dbURL)
		if err != nil {
			return fail(2, "DATABASE_URL: %v", err)
		}
		defer db.Close()
		rep, err := reconcile.RunGitHub(ctx, reconcile.GitHubOptions{
			Source: *source, Hook: hook, DB: db, Since: *since, DryRun: *dryRun, Logger: log.Named("reconcile"),
		})
		if errors.Is(err, reconcile.ErrLocked) {
			return fail(3, "%v", err)
		}
		if *asJSON {
			printJSON(stdout, rep)
		} else {
			printGitHubReport(stdout, rep, err == nil)
		}
		switch {
		case err != nil:
			return fail(1, "%v", err)
		case rep.RedeliverFailed > 0:
			return fail(1, "GitHub refused %d of %d redeliveries (see the report)", rep.RedeliverFailed, rep.Failed)
		}
		return 0
	}

	var typeList []string
	for _, t := range strings.Split(*types, ",") {
		if t = strings.TrimSpace(t); t != "" {
			typeList = append(typeList, t)
		}
	}
	if *rate == 0 {
		*rate = 20
	}
	stripeURL := orDefault(*apiURL, orDefault(env("STRIPE_API_URL"), reconcile.StripeAPIURL))
	if !isHTTPURL(stripeURL) {
		return fail(2, "-api-url (STRIPE_API_URL): want an http(s) URL, got %q", stripeURL)
	}
	opts := reconcile.Options{
		Source: *source, Since: *since, Settle: *settle, Types: typeList, UndeliveredOnly: *undelivered,
		DryRun: *dryRun, PublishTimeout: 10 * time.Second, Logger: log.Named("reconcile"),
	}
	if !*dryRun {
		if err := checkAMQPURL(*amqpURL); err != nil {
			return fail(2, "%v", err)
		}
	}
	if *checkOnly {
		return checkReconcileConfig(&opts, stdout, fail)
	}
	db, err := openPool(ctx, env, *dbURL)
	if err != nil {
		return fail(2, "DATABASE_URL: %v", err)
	}
	defer db.Close()
	opts.DB = db
	opts.Log = reconcile.NewStripeLog(reconcile.StripeOptions{APIKey: env("STRIPE_API_KEY"), URL: stripeURL, Rate: *rate})
	if !*dryRun {
		d, err := dialer(env, *amqpURL, "eventsctl reconcile")
		if err != nil {
			return fail(2, "%v", err)
		}
		conn, err := d.Dial()
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
		printJSON(stdout, rep)
	} else {
		printReconcileReport(stdout, rep, err == nil)
	}
	if err != nil {
		return fail(1, "%v (the next run resumes run %d)", err, rep.RunID)
	}
	return 0
}

// checkReconcileConfig is -check-config: every check a run makes before it
// calls a service (opts nil: GitHub's, checked by NewGitHubHook already).
// The URLs were checked as the clients parse them before it is called.
func checkReconcileConfig(opts *reconcile.Options, stdout io.Writer, fail func(int, string, ...any) int) int {
	if opts != nil {
		if err := opts.CheckSettings(); err != nil {
			return fail(2, "%v", err)
		}
	}
	fmt.Fprintln(stdout, "eventsctl reconcile: configuration ok")
	return 0
}

func isHTTPURL(s string) bool {
	u, err := url.Parse(s)
	return err == nil && (u.Scheme == "https" || u.Scheme == "http") && u.Host != ""
}

// runHeading names a run and how it ended: "run 12 (resumed) finished".
func runHeading(dryRun, resumed bool, id int64, done bool) string {
	what := "run"
	switch {
	case dryRun:
		what = "dry run"
	case id != 0:
		what = fmt.Sprintf("run %d", id)
	}
	if resumed {
		what += " (resumed)"
	}
	if !done {
		return what + " stopped"
	}
	return what + " finished"
}

func printReconcileReport(w io.Writer, r reconcile.Report, done bool) {
	fmt.Fprintf(w, "%s: %s, events created %s .. %s\n", runHeading(r.DryRun, r.Resumed, r.RunID, done), r.Source,
		r.From.Format(time.RFC3339), r.To.Format(time.RFC3339))
	fmt.Fprintf(w, "  listed %d in %d pages: %d in the ledger, %d missing\n", r.Listed, r.Pages, r.Present, r.Missing)
	if r.DryRun {
		for _, id := range r.MissingIDs {
			fmt.Fprintf(w, "  missing %s\n", id)
		}
		return
	}
	fmt.Fprintf(w, "  injected %d, arrived by webhook meanwhile %d, refused by the decoder %d\n", r.Injected, r.Arrived, r.Invalid)
	if r.Refreshed+r.RefreshFailed > 0 {
		fmt.Fprintf(w, "  objects marked needs_refresh: %d fetched and fed in, %d could not be fetched\n", r.Refreshed, r.RefreshFailed)
	}
}

func printGitHubReport(w io.Writer, r reconcile.GitHubReport, done bool) {
	fmt.Fprintf(w, "%s: %s, deliveries %s .. %s\n", runHeading(r.DryRun, false, r.RunID, done), r.Source,
		r.From.Format(time.RFC3339), r.To.Format(time.RFC3339))
	fmt.Fprintf(w, "  listed %d deliveries in %d pages (%d before the window): %d events\n", r.Listed, r.Pages, r.OutsideWindow, r.GUIDs)
	fmt.Fprintf(w, "  %d in the ledger, %d succeeded but not yet in the ledger, %d failed\n", r.Present, r.Accepted, r.Failed)
	if !r.DryRun {
		fmt.Fprintf(w, "  redelivered %d, refused by GitHub %d\n", r.Redelivered, r.RedeliverFailed)
	}
	for _, guid := range r.AcceptedGUIDs {
		fmt.Fprintf(w, "  succeeded, not yet in the ledger %s\n", guid)
	}
	if r.DryRun {
		for _, guid := range r.FailedGUIDs {
			fmt.Fprintf(w, "  would redeliver %s\n", guid)
		}
	}
	for _, f := range r.Failures {
		fmt.Fprintf(w, "  refused %s (delivery %d): %s\n", f.GUID, f.DeliveryID, f.Error)
	}
}
