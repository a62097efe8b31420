package eventsctl

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idempotent-events/idempotent-events/pkg/internal/outbox"
)

const outboxUsage = `eventsctl outbox: the messages effects handlers enqueued for downstream services

usage:
  eventsctl outbox list [-all] [-limit n] [-json]    parked rows (with -all, every unpublished one)
  eventsctl outbox show <id|idempotency key> [-json]
  eventsctl outbox retry <id|key>... [-operator name] give parked rows a new start; audited in outbox_audit

A row is parked after OUTBOX_MAX_ATTEMPTS failed publishes (the broker nacked
or returned it: usually no queue bound to its routing key); it holds back its
object's later rows. Bind the missing queue first, then retry. Never delete a
row: its message would be lost. The database is $DATABASE_URL (-database-url).
`

func outboxCmd(ctx context.Context, args []string, env Env, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, outboxUsage)
		return 2
	}
	switch args[0] {
	case "list", "ls":
		return outboxList(ctx, args[1:], env, stdout, stderr)
	case "show":
		return outboxShow(ctx, args[1:], env, stdout, stderr)
	case "retry":
		return outboxRetry(ctx, args[1:], env, stdout, stderr)
	case "-h", "--help", "help":
		fmt.Fprint(stdout, outboxUsage)
		return 0
	}
	fmt.Fprintf(stderr, "eventsctl outbox: unknown command %q\n\n%s", args[0], outboxUsage)
	return 2
}

// outboxFlags are the flags every outbox command shares.
type outboxFlags struct {
	dbURL  string
	asJSON bool
	env    Env
}

func newOutboxFlags(name string, env Env, stderr io.Writer) (*flag.FlagSet, *outboxFlags) {
	fs := flag.NewFlagSet("eventsctl outbox "+name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	f := &outboxFlags{env: env}
	credentialVar(fs, &f.dbURL, "database-url", env("DATABASE_URL"), "PostgreSQL `URL` of the ledger ($DATABASE_URL)")
	fs.BoolVar(&f.asJSON, "json", false, "print JSON")
	return fs, f
}

func (f *outboxFlags) open(ctx context.Context, name string, stderr io.Writer) (*pgxpool.Pool, int) {
	if f.dbURL == "" {
		fmt.Fprintf(stderr, "eventsctl outbox %s: DATABASE_URL (or -database-url) is required\n", name)
		return nil, 2
	}
	if err := checkDatabaseURL(f.dbURL); err != nil {
		fmt.Fprintf(stderr, "eventsctl outbox %s: %v\n", name, err)
		return nil, 2
	}
	db, err := openPool(ctx, f.env, f.dbURL)
	if err != nil {
		fmt.Fprintf(stderr, "eventsctl outbox %s: %v\n", name, err)
		return nil, 1
	}
	return db, 0
}

func outboxList(ctx context.Context, args []string, env Env, stdout, stderr io.Writer) int {
	fs, f := newOutboxFlags("list", env, stderr)
	all := fs.Bool("all", false, "every unpublished row, not only the parked ones")
	limit := fs.Int("limit", 100, "rows at most, oldest first")
	if _, err := parseInterspersed(fs, args); err != nil {
		return flagStatus(err)
	}
	db, code := f.open(ctx, "list", stderr)
	if db == nil {
		return code
	}
	defer db.Close()
	rows, err := outbox.List(ctx, db, *all, *limit)
	if err != nil {
		fmt.Fprintln(stderr, "eventsctl outbox list:", err)
		return 1
	}
	if f.asJSON {
		printJSON(stdout, rows)
		return 0
	}
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tIDEMPOTENCY KEY\tOBJECT\tSEQ\tROUTING KEY\tATTEMPTS\tPARKED\tLAST ERROR")
	for _, x := range rows {
		parked := "-"
		if x.ParkedAt != nil {
			parked = stamp(*x.ParkedAt)
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%d\t%s\t%d\t%s\t%s\n", x.ID, x.IdempotencyKey, x.ObjectID, x.Seq, x.RoutingKey, x.Attempts,
			parked, oneLine(x.LastError, 60))
	}
	_ = tw.Flush()
	if len(rows) == 0 {
		fmt.Fprintln(stdout, "no row")
	}
	return 0
}

func outboxShow(ctx context.Context, args []string, env Env, stdout, stderr io.Writer) int {
	fs, f := newOutboxFlags("show", env, stderr)
	refs, err := parseInterspersed(fs, args)
	if err != nil {
		return flagStatus(err)
	}
	if len(refs) != 1 {
		fmt.Fprintln(stderr, "eventsctl outbox show: give one id or idempotency key")
		return 2
	}
	db, code := f.open(ctx, "show", stderr)
	if db == nil {
		return code
	}
	defer db.Close()
	x, err := outbox.Get(ctx, db, refs[0])
	if err != nil {
		fmt.Fprintln(stderr, "eventsctl outbox show:", err)
		return 1
	}
	if f.asJSON {
		printJSON(stdout, x)
		return 0
	}
	row := func(k, v string) { fmt.Fprintf(stdout, "%-16s %s\n", k+":", v) }
	row("id", fmt.Sprint(x.ID))
	row("idempotency key", x.IdempotencyKey)
	row("event", x.EventID)
	row("effect", x.Effect)
	row("object / seq", fmt.Sprintf("%s / %d", x.ObjectID, x.Seq))
	row("destination", x.Exchange+" "+x.RoutingKey)
	row("created", stamp(x.CreatedAt))
	row("published", stampPtr(x.PublishedAt))
	row("attempts", fmt.Sprint(x.Attempts))
	row("next attempt", stamp(x.NextAttemptAt))
	row("parked", stampPtr(x.ParkedAt))
	row("last error", dash(x.LastError))
	for k, v := range x.Headers {
		row("header "+k, v)
	}
	if utf8.Valid(x.Body) {
		row("body", string(x.Body))
	} else {
		row("body", fmt.Sprintf("%d bytes, not UTF-8 (-json shows them in base64)", len(x.Body)))
	}
	return 0
}

func outboxRetry(ctx context.Context, args []string, env Env, stdout, stderr io.Writer) int {
	fs, f := newOutboxFlags("retry", env, stderr)
	operator := fs.String("operator", orDefault(env("DLQ_OPERATOR"), env("USER")), "who acts, for the audit trail ($DLQ_OPERATOR, else $USER)")
	refs, err := parseInterspersed(fs, args)
	if err != nil {
		return flagStatus(err)
	}
	if len(refs) == 0 {
		fmt.Fprintln(stderr, "eventsctl outbox retry: give the ids or idempotency keys of the parked rows")
		return 2
	}
	if *operator == "" {
		fmt.Fprintln(stderr, "eventsctl outbox retry: no operator: pass -operator or set DLQ_OPERATOR")
		return 2
	}
	db, code := f.open(ctx, "retry", stderr)
	if db == nil {
		return code
	}
	defer db.Close()
	host, _ := os.Hostname()
	released, notParked, err := outbox.Retry(ctx, db, outbox.Actor{Operator: *operator, Via: "cli@" + host}, refs)
	if err != nil {
		fmt.Fprintln(stderr, "eventsctl outbox retry:", err)
		return 1
	}
	for _, x := range released {
		fmt.Fprintf(stdout, "released %d %s (after %d attempts: %s)\n", x.ID, x.IdempotencyKey, x.Attempts, oneLine(x.LastError, 80))
	}
	if len(notParked) > 0 {
		fmt.Fprintf(stdout, "not parked, left as they are: %s\n", strings.Join(notParked, ", "))
	}
	return 0
}

func stampPtr(t *time.Time) string {
	if t == nil {
		return "-"
	}
	return stamp(*t)
}
