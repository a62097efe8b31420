package eventsctl

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/idempotent-events/idempotent-events/pkg/internal/broker"
	"github.com/idempotent-events/idempotent-events/pkg/internal/dlq"
	"github.com/idempotent-events/idempotent-events/pkg/internal/tlsconfig"
)

const dlqUsage = `eventsctl dlq: inspect, replay and discard messages in events.dlq

usage:
  eventsctl dlq list    [filters] [-limit N] [-json]        messages with their reason and attempts
  eventsctl dlq show    <dlq-id> [-json]                    one message with headers and body
  eventsctl dlq replay  <dlq-id>... | filters | -all  [-dry-run] [-rate 20] [-max N]
  eventsctl dlq discard <dlq-id>... | filters | -all  [-dry-run] [-max N]
  eventsctl dlq audit   [-id <dlq-id>] [-limit N]            the audit trail of replays and discards

filters: -id ID (repeatable, or comma-separated), -event-id, -type (payment_intent.* for a prefix),
         -source, -reason, -older-than 1h, -newer-than 24h
Replays go to events.replay through the normal dedupe: an event that was processed already is a
duplicate, never a second effect. Every replay and discard is recorded in dlq_audit (DATABASE_URL)
with the operator (-operator, $DLQ_OPERATOR or $USER). See docs/dlq.md.
`

// dlqCmd runs `eventsctl dlq …`.
func dlqCmd(ctx context.Context, args []string, env Env, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, dlqUsage)
		return 2
	}
	switch args[0] {
	case "list", "ls":
		return dlqList(ctx, args[1:], env, stdout, stderr)
	case "show":
		return dlqShow(ctx, args[1:], env, stdout, stderr)
	case "replay":
		return dlqMutate(ctx, dlq.ActionReplay, args[1:], env, stdout, stderr)
	case "discard":
		return dlqMutate(ctx, dlq.ActionDiscard, args[1:], env, stdout, stderr)
	case "audit":
		return dlqAudit(ctx, args[1:], env, stdout, stderr)
	case "-h", "--help", "help":
		fmt.Fprint(stdout, dlqUsage)
		return 0
	}
	fmt.Fprintf(stderr, "eventsctl dlq: unknown command %q\n\n%s", args[0], dlqUsage)
	return 2
}

// idList is a repeatable, comma-separated -id flag.
type idList []string

func (l *idList) String() string { return strings.Join(*l, ",") }

func (l *idList) Set(v string) error {
	for _, id := range strings.Split(v, ",") {
		if id = strings.TrimSpace(id); id != "" {
			*l = append(*l, id)
		}
	}
	return nil
}

// dlqFlags are the flags every dlq subcommand shares.
type dlqFlags struct {
	amqpURL, dbURL string
	scanLimit      int
	asJSON         bool
	ids            idList
	filter         dlq.Filter
	env            Env
	amqpTLS        *tlsconfig.Client
}

func newDLQFlags(name string, env Env, stderr io.Writer, withFilter bool) (*flag.FlagSet, *dlqFlags) {
	fs := flag.NewFlagSet("eventsctl dlq "+name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	f := &dlqFlags{env: env}
	credentialVar(fs, &f.amqpURL, "amqp-url", orDefault(env("AMQP_URL"), defaultAMQP), "RabbitMQ `URL` with the pipeline's vhost ($AMQP_URL)")
	credentialVar(fs, &f.dbURL, "database-url", env("DATABASE_URL"), "PostgreSQL `URL` for the audit trail ($DATABASE_URL)")
	fs.IntVar(&f.scanLimit, "scan-limit", dlq.DefaultScanLimit, "DLQ messages read per pass")
	fs.BoolVar(&f.asJSON, "json", false, "print JSON")
	if withFilter {
		fs.Var(&f.ids, "id", "DLQ id (x-ie-dlq-id); repeatable or comma-separated")
		fs.StringVar(&f.filter.EventID, "event-id", "", "event id")
		fs.StringVar(&f.filter.EventType, "type", "", "event type; a trailing * matches a prefix")
		fs.StringVar(&f.filter.Source, "source", "", "webhook source (x-ie-source), e.g. stripe")
		fs.Func("reason", "DLQ reason: "+broker.DLQReasonNames(), func(v string) error { f.filter.Reason = broker.DLQReason(v); return nil })
		fs.DurationVar(&f.filter.OlderThan, "older-than", 0, "only messages in the DLQ for at least this long")
		fs.DurationVar(&f.filter.NewerThan, "newer-than", 0, "only messages in the DLQ for at most this long")
	}
	return fs, f
}

// parseInterspersed parses flags and positional arguments in any order.
func parseInterspersed(fs *flag.FlagSet, args []string) ([]string, error) {
	var positional []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		args = fs.Args()
		if len(args) == 0 {
			return positional, nil
		}
		positional = append(positional, args[0])
		args = args[1:]
	}
}

// urlsOK reports on stderr, after name, the first of the URLs a subcommand
// uses (the broker's, with amqp; the database's, with db) that does not
// parse, and returns whether all do.
func (f *dlqFlags) urlsOK(name string, amqp, db bool, stderr io.Writer) bool {
	var err error
	if amqp {
		err = checkAMQPURL(f.amqpURL)
		if err == nil {
			f.amqpTLS, err = tlsOf(f.env, tlsconfig.RabbitMQ)
		}
	}
	if err == nil && db {
		err = checkDatabaseURL(f.dbURL)
	}
	if err != nil {
		fmt.Fprintln(stderr, name+":", err)
		return false
	}
	return true
}

func (f *dlqFlags) client(opts dlq.Options) *dlq.Client {
	opts.Dialer = broker.Dialer{URL: f.amqpURL, Name: "eventsctl dlq", TLS: f.amqpTLS}
	opts.ScanLimit = f.scanLimit
	return dlq.New(opts)
}

func printJSON(w io.Writer, v any) {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}

func dlqList(ctx context.Context, args []string, env Env, stdout, stderr io.Writer) int {
	fs, f := newDLQFlags("list", env, stderr, true)
	limit := fs.Int("limit", 50, "show at most this many messages (0: all scanned)")
	rest, err := parseInterspersed(fs, args)
	if err != nil {
		return flagStatus(err)
	}
	if len(rest) > 0 {
		fmt.Fprintf(stderr, "eventsctl dlq list: unexpected arguments %q (use -id)\n", rest)
		return 2
	}
	if !f.urlsOK("eventsctl dlq list", true, false, stderr) {
		return 2
	}
	f.filter.IDs = f.ids
	l, err := f.client(dlq.Options{}).List(ctx, f.filter, *limit)
	if err != nil {
		fmt.Fprintln(stderr, "eventsctl dlq list:", err)
		return 1
	}
	if f.asJSON {
		printJSON(stdout, l)
		return 0
	}
	now := time.Now()
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "DLQ ID\tEVENT\tTYPE\tSOURCE\tREASON\tATTEMPTS\tAGE\tLAST ERROR")
	for _, m := range l.Messages {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\n", m.ID, dash(m.EventID), dash(m.EventType), dash(m.Source), m.Reason,
			m.Attempts, age(m, now), oneLine(m.LastError, 60))
	}
	_ = tw.Flush()
	fmt.Fprintf(stdout, "%d matching (%d shown); scanned %d of %d in %s\n", l.Matched, len(l.Messages), l.Scanned, l.Depth, broker.DLQ)
	if !l.Complete {
		fmt.Fprintf(stdout, "note: the scan stopped at -scan-limit %d; messages further back were not looked at\n", f.scanLimit)
	}
	return 0
}

func dlqShow(ctx context.Context, args []string, env Env, stdout, stderr io.Writer) int {
	fs, f := newDLQFlags("show", env, stderr, false)
	rest, err := parseInterspersed(fs, args)
	if err != nil {
		return flagStatus(err)
	}
	if len(rest) != 1 {
		fmt.Fprintln(stderr, "eventsctl dlq show: give exactly one DLQ id")
		return 2
	}
	if !f.urlsOK("eventsctl dlq show", true, false, stderr) {
		return 2
	}
	m, err := f.client(dlq.Options{}).Show(ctx, rest[0])
	if err != nil {
		fmt.Fprintln(stderr, "eventsctl dlq show:", err)
		return 1
	}
	if f.asJSON {
		printJSON(stdout, struct {
			dlq.Message
			Body string `json:"body"`
		}{m, m.BodyText()})
		return 0
	}
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
	row := func(k, v string) { fmt.Fprintf(tw, "%s\t%s\n", k, v) }
	if m.DerivedID {
		row("dlq id", m.ID+" (derived: RabbitMQ dead-lettered it itself)")
	} else {
		row("dlq id", m.ID)
	}
	row("event id", dash(m.EventID))
	row("type", dash(m.EventType))
	row("source", dash(m.Source))
	row("reason", string(m.Reason))
	row("attempts", fmt.Sprint(m.Attempts))
	row("first error", oneLine(m.FirstError, 200)+" "+stamp(m.FirstFailedAt))
	row("last error", oneLine(m.LastError, 200)+" "+stamp(m.LastFailedAt))
	row("dead-lettered", stamp(m.DeadLetteredAt)+" ("+age(m, time.Now())+" ago)")
	row("received", stamp(m.ReceivedAt))
	row("size", fmt.Sprintf("%d bytes, %s", m.Size, dash(m.ContentType)))
	_ = tw.Flush()
	fmt.Fprintln(stdout, "\nheaders:")
	for _, l := range m.HeaderLines() {
		fmt.Fprintln(stdout, "  "+l)
	}
	fmt.Fprintln(stdout, "\nbody:")
	fmt.Fprintln(stdout, m.PrettyBody())
	return 0
}

func dlqMutate(ctx context.Context, action string, args []string, env Env, stdout, stderr io.Writer) int {
	name := "eventsctl dlq " + action
	fs, f := newDLQFlags(action, env, stderr, true)
	all := fs.Bool("all", false, "act on every message (when no id or filter is given)")
	dryRun := fs.Bool("dry-run", false, "only say what would happen to each message (recorded in the audit trail as a dry run)")
	maxN := fs.Int("max", 0, "act on at most this many messages (0: no bound)")
	operator := fs.String("operator", orDefault(env("DLQ_OPERATOR"), env("USER")), "who acts, for the audit trail ($DLQ_OPERATOR, else $USER)")
	var rateLimit *float64
	if action == dlq.ActionReplay {
		rateLimit = fs.Float64("rate", dlq.DefaultRate, "replays per second at most")
	}
	rest, err := parseInterspersed(fs, args)
	if err != nil {
		return flagStatus(err)
	}
	_ = f.ids.Set(strings.Join(rest, ","))
	f.filter.IDs = f.ids
	f.filter.All = *all
	if *operator == "" {
		fmt.Fprintln(stderr, name+": no operator: pass -operator or set DLQ_OPERATOR")
		return 2
	}
	if f.dbURL == "" {
		fmt.Fprintln(stderr, name+": DATABASE_URL (or -database-url) is required: every "+action+" is recorded in dlq_audit")
		return 2
	}
	if !f.filter.Selective() && !*all {
		fmt.Fprintln(stderr, name+": select messages: DLQ ids, a filter (-type, -reason, -source, -event-id, -older-than, -newer-than), or -all")
		return 2
	}
	if *maxN < 0 || (rateLimit != nil && *rateLimit <= 0) {
		fmt.Fprintln(stderr, name+": -max must not be negative and -rate must be positive")
		return 2
	}
	if !f.urlsOK(name, true, true, stderr) {
		return 2
	}
	audit, err := openAudit(ctx, f.env, f.dbURL)
	if err != nil {
		fmt.Fprintln(stderr, name+":", err)
		return 1
	}
	defer audit.Close()
	opts := dlq.Options{Audit: audit}
	if rateLimit != nil {
		opts.Rate = *rateLimit
	}
	host, _ := os.Hostname()
	req := dlq.Request{Filter: f.filter, Max: *maxN, DryRun: *dryRun,
		Actor: dlq.Actor{Operator: *operator, Via: "cli", Client: host}}
	c := f.client(opts)
	run := c.Replay
	if action == dlq.ActionDiscard {
		run = c.Discard
	}
	rep, err := run(ctx, req)
	if f.asJSON {
		printJSON(stdout, rep)
	} else {
		printReport(stdout, rep)
	}
	switch {
	case err != nil:
		fmt.Fprintln(stderr, name+":", err)
		return 1
	case len(rep.NotFound) > 0:
		fmt.Fprintf(stderr, "%s: not in %s: %s\n", name, broker.DLQ, strings.Join(rep.NotFound, ", "))
		return 1
	}
	return 0
}

func printReport(w io.Writer, rep dlq.Report) {
	for _, it := range rep.Items {
		m := it.Message
		line := fmt.Sprintf("%-13s %s  event %s  type %s  reason %s  attempts %d", strings.ReplaceAll(it.Outcome, "_", " "),
			m.ID, dash(m.EventID), dash(m.EventType), m.Reason, m.Attempts)
		if it.Detail != "" && it.Outcome != dlq.OutcomeWouldReplay && it.Outcome != dlq.OutcomeWouldDiscard {
			line += "  (" + it.Detail + ")"
		}
		fmt.Fprintln(w, line)
	}
	var summary string
	if rep.DryRun {
		summary = fmt.Sprintf("dry run: %d would be %s", len(rep.Items), pastTense(rep.Action))
	} else {
		done := rep.Count(dlq.OutcomeReplayed) + rep.Count(dlq.OutcomeDiscarded)
		summary = fmt.Sprintf("%d %s, %d failed", done, pastTense(rep.Action), rep.Count(dlq.OutcomeFailed)+rep.Count(dlq.OutcomePending))
	}
	fmt.Fprintf(w, "%s; scanned %d, %s held %d\n", summary, rep.Scanned, broker.DLQ, rep.Depth)
	if len(rep.Items) == 0 && len(rep.NotFound) == 0 {
		fmt.Fprintln(w, "no message matched")
	}
	if !rep.Complete {
		fmt.Fprintln(w, "note: a pass stopped at the scan limit before the end of the queue; raise -scan-limit to reach messages further back")
	}
}

func pastTense(action string) string {
	if action == dlq.ActionDiscard {
		return "discarded"
	}
	return "replayed"
}

func dlqAudit(ctx context.Context, args []string, env Env, stdout, stderr io.Writer) int {
	fs, f := newDLQFlags("audit", env, stderr, false)
	id := fs.String("id", "", "only this DLQ id")
	limit := fs.Int("limit", 20, "rows, newest first")
	if _, err := parseInterspersed(fs, args); err != nil {
		return flagStatus(err)
	}
	if f.dbURL == "" {
		fmt.Fprintln(stderr, "eventsctl dlq audit: DATABASE_URL (or -database-url) is required")
		return 2
	}
	if !f.urlsOK("eventsctl dlq audit", false, true, stderr) {
		return 2
	}
	audit, err := openAudit(ctx, f.env, f.dbURL)
	if err != nil {
		fmt.Fprintln(stderr, "eventsctl dlq audit:", err)
		return 1
	}
	defer audit.Close()
	entries, err := audit.Recent(ctx, *limit, *id)
	if err != nil {
		fmt.Fprintln(stderr, "eventsctl dlq audit:", err)
		return 1
	}
	if f.asJSON {
		printJSON(stdout, entries)
		return 0
	}
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "AT\tOPERATOR\tVIA\tACTION\tDLQ ID\tEVENT\tREASON\tOUTCOME\tDETAIL")
	for _, e := range entries {
		action := e.Action
		if e.DryRun {
			action += " (dry run)"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", e.At.UTC().Format(time.RFC3339), e.Operator, e.Via, action,
			e.DLQID, dash(e.EventID), dash(e.Reason), e.Outcome, oneLine(e.Detail, 60))
	}
	_ = tw.Flush()
	return 0
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func oneLine(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if r := []rune(s); len(r) > n {
		return string(r[:n]) + "…"
	}
	return dash(s)
}

func stamp(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format(time.RFC3339)
}

func age(m dlq.Message, now time.Time) string {
	if m.DeadLetteredAt.IsZero() {
		return "?"
	}
	return m.Age(now).Round(time.Second).String()
}
