package eventsctl

import (
	"context"
	"flag"
	"fmt"
	"io"
	"sort"
	"time"

	"github.com/idempotent-events/idempotent-events/pkg/internal/logging"
	"github.com/idempotent-events/idempotent-events/pkg/internal/retention"
)

const pruneUsage = `  eventsctl prune [-ledger-retention 35d] [-audit-retention 365d] [-archive-retention 35d] [-dry-run] [flags]

Deletes, in batches of their own transaction, the rows older than their
retention: processed_events, event_conflicts, finished reconcile runs and
finished backfills by the ledger retention; dlq_audit and outbox_audit by
the audit retention; event_archive by the archive retention.
Each run is recorded in prune_runs. A ledger row is what makes a
redelivery a duplicate: keep it longer than the provider retries and than
any reconcile window (at least 7d; eventsctl reconcile refuses a window
longer than the latest prune's ledger retention).

Exit status: 0 done, 1 a failure (what was deleted stays deleted; run it
again), 2 bad flags or configuration. With -check-config: 0 or 2, and the
database is not called (the Helm chart's tests run it with the CronJob's
arguments and environment).

flags:
`

func pruneCmd(ctx context.Context, args []string, env Env, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("eventsctl prune", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(stderr, "Usage of %s:\n\n%s", fs.Name(), pruneUsage)
		fs.PrintDefaults()
	}
	ledger := fs.String("ledger-retention", orDefault(env("LEDGER_RETENTION"), "35d"), "keep the ledger, conflicts and reconcile runs this long, e.g. 35d or 840h ($LEDGER_RETENTION; at least 7d)")
	audit := fs.String("audit-retention", orDefault(env("AUDIT_RETENTION"), "365d"), "keep the DLQ and outbox audit trails this long ($AUDIT_RETENTION; at least 30d)")
	archive := fs.String("archive-retention", env("ARCHIVE_RETENTION"), "keep the event archive's bodies (EVENT_ARCHIVE) this long; what a backfill can still reach ($ARCHIVE_RETENTION; default: the ledger retention)")
	batch := fs.Int("batch", 5000, "rows one DELETE removes")
	pause := fs.Duration("pause", 250*time.Millisecond, "wait between two batches, to leave the pipeline the database (0 deletes as fast as it can)")
	dryRun := fs.Bool("dry-run", false, "count what would be deleted, delete nothing")
	dbURL := credentialFlag(fs, "database-url", env("DATABASE_URL"), "PostgreSQL `URL` of the ledger ($DATABASE_URL)")
	asJSON := fs.Bool("json", false, "print the report as JSON")
	checkOnly := fs.Bool("check-config", false, "check the flags and the environment as a run would, then exit 0 (or 2) without calling PostgreSQL")
	if err := fs.Parse(args); err != nil {
		return flagStatus(err)
	}
	fail := func(code int, format string, a ...any) int {
		fmt.Fprintf(stderr, "eventsctl prune: "+format+"\n", a...)
		return code
	}
	if fs.NArg() > 0 {
		return fail(2, "unexpected argument %q", fs.Arg(0))
	}
	keepLedger, err := retention.ParseDays(*ledger)
	if err != nil {
		return fail(2, "-ledger-retention (LEDGER_RETENTION): %v", err)
	}
	keepAudit, err := retention.ParseDays(*audit)
	if err != nil {
		return fail(2, "-audit-retention (AUDIT_RETENTION): %v", err)
	}
	var keepArchive time.Duration
	if *archive != "" {
		if keepArchive, err = retention.ParseDays(*archive); err != nil {
			return fail(2, "-archive-retention (ARCHIVE_RETENTION): %v", err)
		}
	}
	if *dbURL == "" {
		return fail(2, "DATABASE_URL (or -database-url) is required")
	}
	if err := checkDatabaseURL(*dbURL); err != nil {
		return fail(2, "%v", err)
	}
	log, err := logging.New(orDefault(env("LOG_LEVEL"), "info"), orDefault(env("LOG_FORMAT"), "json"))
	if err != nil {
		return fail(2, "%v", err)
	}
	defer func() { _ = log.Sync() }()
	opts := retention.Options{Ledger: keepLedger, Audit: keepAudit, Archive: keepArchive, Batch: *batch, Pause: *pause, DryRun: *dryRun, Logger: log.Named("prune")}
	if *checkOnly {
		if err := opts.CheckSettings(); err != nil {
			return fail(2, "%v", err)
		}
		fmt.Fprintln(stdout, "eventsctl prune: configuration ok")
		return 0
	}
	db, err := openPool(ctx, env, *dbURL)
	if err != nil {
		return fail(2, "DATABASE_URL: %v", err)
	}
	defer db.Close()
	opts.DB = db
	rep, err := retention.Prune(ctx, opts)
	if err != nil && rep.Deleted == nil {
		return fail(2, "%v", err)
	}
	if *asJSON {
		printJSON(stdout, rep)
	} else {
		verb := "deleted"
		if rep.DryRun {
			verb = "would delete"
		}
		names := make([]string, 0, len(rep.Deleted))
		for name := range rep.Deleted {
			names = append(names, name)
		}
		sort.Strings(names)
		for _, name := range names {
			fmt.Fprintf(stdout, "%-18s %s %d rows\n", name, verb, rep.Deleted[name])
		}
		fmt.Fprintf(stdout, "in %s\n", rep.Elapsed.Round(time.Millisecond))
	}
	if err != nil {
		return fail(1, "%v", err)
	}
	return 0
}
