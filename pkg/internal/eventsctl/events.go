package eventsctl

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/idempotent-events/idempotent-events/pkg/internal/broker"
	"github.com/idempotent-events/idempotent-events/pkg/internal/dlq"
	"github.com/idempotent-events/idempotent-events/pkg/internal/lookup"
)

const eventsUsage = `usage:
  eventsctl events show -id EVENT_ID [-dlq=false] [-json]
      where is this event, and what happened to it: the ledger row (when, by
      which handler set, how), its payment state, the deliveries that reused
      its id, its outbox messages, backfills, the archive, the DLQ and the
      DLQ tools' audit trail
  eventsctl events object -id OBJECT_ID [-json]
      a PaymentIntent's or Charge's state and every event that described it,
      in the order of their created times, with how each was taken

DATABASE_URL (or -database-url) is required; AMQP_URL (or -amqp-url) for the
DLQ scan.
`

func eventsCmd(ctx context.Context, args []string, env Env, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, eventsUsage)
		return 2
	}
	switch args[0] {
	case "show":
		return eventsShow(ctx, args[1:], env, stdout, stderr)
	case "object":
		return eventsObject(ctx, args[1:], env, stdout, stderr)
	case "-h", "--help", "help":
		fmt.Fprint(stdout, eventsUsage)
		return 0
	}
	fmt.Fprintf(stderr, "eventsctl events: unknown command %q\n\n%s", args[0], eventsUsage)
	return 2
}

type eventsFlags struct {
	id, dbURL, amqpURL string
	scanDLQ, asJSON    bool
	scanLimit          int
	retryDelays        []time.Duration
}

func (f *eventsFlags) parse(name string, args []string, env Env, stderr io.Writer, withDLQ bool) int {
	fs := flag.NewFlagSet("eventsctl events "+name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&f.id, "id", "", "the id (required)")
	credentialVar(fs, &f.dbURL, "database-url", env("DATABASE_URL"), "PostgreSQL `URL` of the ledger ($DATABASE_URL)")
	fs.BoolVar(&f.asJSON, "json", false, "print the report as JSON")
	if withDLQ {
		credentialVar(fs, &f.amqpURL, "amqp-url", orDefault(env("AMQP_URL"), "amqp://guest:guest@127.0.0.1:5672/"), "RabbitMQ `URL`, for the DLQ scan ($AMQP_URL)")
		fs.BoolVar(&f.scanDLQ, "dlq", true, "scan events.dlq for the event (every message read is returned)")
		fs.IntVar(&f.scanLimit, "scan-limit", dlq.DefaultScanLimit, "messages read at most per queue")
		fs.Func("retry-delays", "the retry tiers to scan, as the workers' RETRY_DELAYS ($RETRY_DELAYS; default 5s,30s,2m,10m,1h)", func(v string) error {
			d, err := parseDelays(v)
			f.retryDelays = d
			return err
		})
		if v := env("RETRY_DELAYS"); v != "" {
			if d, err := parseDelays(v); err == nil {
				f.retryDelays = d
			}
		}
	}
	if err := fs.Parse(args); err != nil {
		return flagStatus(err)
	}
	var problems []string
	if f.id == "" {
		problems = append(problems, "-id is required")
	}
	if f.dbURL == "" {
		problems = append(problems, "DATABASE_URL (or -database-url) is required")
	} else if err := checkDatabaseURL(f.dbURL); err != nil {
		problems = append(problems, err.Error())
	}
	if withDLQ && f.retryDelays == nil {
		f.retryDelays, _ = parseDelays("5s,30s,2m,10m,1h")
	}
	if withDLQ && f.scanDLQ {
		if err := checkAMQPURL(f.amqpURL); err != nil {
			problems = append(problems, err.Error())
		}
	}
	if fs.NArg() > 0 {
		problems = append(problems, fmt.Sprintf("unexpected argument %q", fs.Arg(0)))
	}
	if len(problems) > 0 {
		fmt.Fprintf(stderr, "eventsctl events %s: %s\n", name, strings.Join(problems, "; "))
		return 2
	}
	return -1
}

func eventsShow(ctx context.Context, args []string, env Env, stdout, stderr io.Writer) int {
	var f eventsFlags
	if code := f.parse("show", args, env, stderr, true); code >= 0 {
		return code
	}
	db, err := openPool(ctx, env, f.dbURL)
	if err != nil {
		fmt.Fprintf(stderr, "eventsctl events show: %v\n", err)
		return 2
	}
	defer db.Close()
	rep, err := lookup.FindEvent(ctx, db, f.id)
	if err != nil {
		fmt.Fprintf(stderr, "eventsctl events show: %v\n", err)
		return 1
	}
	if f.scanDLQ {
		d, err := dialer(env, f.amqpURL, "eventsctl events")
		if err != nil {
			fmt.Fprintf(stderr, "eventsctl events show: %v\n", err)
			return 2
		}
		topo := broker.Topology{RetryDelays: f.retryDelays}
		rep.Locate(ctx, dlq.New(dlq.Options{Dialer: d, ScanLimit: f.scanLimit}), f.id, append([]string{broker.DLQ}, topo.RetryQueues()...))
	} else {
		rep.Unknown = append(rep.Unknown, "events.dlq and the retry tiers (-dlq=false)", lookup.Unscanned)
	}
	if f.asJSON {
		printJSON(stdout, rep)
	} else {
		printEvent(stdout, f.id, rep)
	}
	if !rep.Found() {
		return 1
	}
	return 0
}

// at is a time to the millisecond: the steps of an event are often less
// than a second apart.
func at(t time.Time) string { return t.UTC().Format("2006-01-02T15:04:05.000Z") }

func printEvent(w io.Writer, id string, r lookup.Event) {
	if l := r.Ledger; l != nil {
		fmt.Fprintf(w, "event %s: %s, %s\n", r.Key, l.Source, l.Type)
		line := "  ledger: committed " + at(l.ProcessedAt)
		if l.ReceivedAt != nil {
			line += fmt.Sprintf(" (received %s, %s before)", at(*l.ReceivedAt), l.ProcessedAt.Sub(*l.ReceivedAt).Round(time.Millisecond))
		}
		line += fmt.Sprintf(", attempt %d, outcome %s", l.Attempt, l.Outcome)
		fmt.Fprintln(w, line)
		if l.Generation != nil {
			release := "release " + l.Release
			if strings.HasPrefix(l.Release, "set:") {
				release = "no WORKER_RELEASE"
			}
			fmt.Fprintf(w, "  handler set: generation %d (%s), set %s: %s\n", *l.Generation, release, l.SetID, strings.Join(l.Handlers, ", "))
		} else {
			fmt.Fprintln(w, "  handler set: not recorded (committed before handler sets were, or by a tool)")
		}
		if l.LastSeenAt != nil {
			fmt.Fprintf(w, "  last duplicate seen by a worker: %s\n", at(*l.LastSeenAt))
		}
	} else {
		fmt.Fprintf(w, "event %s: not in the ledger (not committed yet, or pruned after LEDGER_RETENTION, or never received)\n", id)
	}
	for _, p := range r.Payment {
		from := ""
		if p.From != "" {
			from = " from " + p.From
		}
		refresh := ""
		if p.NeedsRefresh {
			refresh = ", marked needs_refresh"
		}
		fmt.Fprintf(w, "  payment state: %s %s: %s (%s%s, event created %s); the object is %s now%s\n",
			p.ObjectType, p.ObjectID, p.Outcome, p.Status, from, at(p.Created), p.Now, refresh)
	}
	for _, c := range r.Conflicts {
		fmt.Fprintf(w, "  conflict: a delivery with other content under this id, recorded %s (sha256 %s…)\n", at(c.RecordedAt), c.Digest[:min(12, len(c.Digest))])
	}
	for _, o := range r.Outbox {
		state := "waiting to be published"
		switch {
		case o.PublishedAt != nil:
			state = "published " + at(*o.PublishedAt)
		case o.ParkedAt != nil:
			state = fmt.Sprintf("PARKED %s after %d attempts: %s (eventsctl outbox retry -id %d)", at(*o.ParkedAt), o.Attempts, o.LastError, o.ID)
		case o.Attempts > 0:
			state = fmt.Sprintf("%d failed attempts so far: %s", o.Attempts, o.LastError)
		}
		fmt.Fprintf(w, "  outbox #%d: %s -> %s, %s\n", o.ID, o.Effect, o.RoutingKey, state)
	}
	for _, b := range r.Backfills {
		state := "queued"
		if b.FinishedAt != nil {
			state = b.Outcome + " " + at(*b.FinishedAt)
		}
		if b.LastError != "" {
			state += ": " + firstLine(b.LastError)
		}
		fmt.Fprintf(w, "  backfill %d: handler %s %s\n", b.Backfill, b.Handler, state)
	}
	if r.Archived != nil {
		fmt.Fprintf(w, "  archive: body kept (%d bytes)\n", *r.Archived)
	}
	if r.QueuesError != "" {
		fmt.Fprintf(w, "  queues: not (all) scanned: %s\n", r.QueuesError)
	}
	if q := r.Queues; q != nil {
		for _, h := range q.Hits {
			switch h.Queue {
			case broker.DLQ:
				fmt.Fprintf(w, "  DLQ: IN %s as %s, reason %s, attempts %d, dead-lettered %s: %s (eventsctl dlq show %s)\n",
					h.Queue, h.ID, h.Reason, h.Attempts, at(h.At), firstLine(h.LastError), h.ID)
			default:
				fmt.Fprintf(w, "  retrying: IN %s after attempt %d, failed %s: %s\n", h.Queue, h.Attempts, at(h.FailedAt), firstLine(h.LastError))
			}
		}
		var partial []string
		read := 0
		var missing []string
		for _, s := range q.Scanned {
			read += s.Read
			if s.Missing {
				missing = append(missing, s.Queue)
			}
			if !s.Complete {
				partial = append(partial, fmt.Sprintf("%s (%d of %d)", s.Queue, s.Read, s.Depth))
			}
		}
		if len(q.Hits) == 0 {
			fmt.Fprintf(w, "  queues: not in events.dlq nor a retry tier (%d messages scanned in %d queues)\n", read, len(q.Scanned))
		}
		if len(missing) > 0 {
			fmt.Fprintf(w, "  queues that do not exist (is RETRY_DELAYS the workers'?): %s\n", strings.Join(missing, ", "))
		}
		if len(partial) > 0 {
			fmt.Fprintf(w, "  queues scanned in part only (the scan limit): %s\n", strings.Join(partial, ", "))
		}
	}
	for _, a := range r.Audit {
		fmt.Fprintf(w, "  DLQ audit: %s %s by %s at %s (%s)\n", a.Action, a.Outcome, a.Operator, at(a.At), a.Reason)
	}
	for _, u := range r.Unknown {
		fmt.Fprintf(w, "  not looked at: %s\n", u)
	}
}

func eventsObject(ctx context.Context, args []string, env Env, stdout, stderr io.Writer) int {
	var f eventsFlags
	if code := f.parse("object", args, env, stderr, false); code >= 0 {
		return code
	}
	db, err := openPool(ctx, env, f.dbURL)
	if err != nil {
		fmt.Fprintf(stderr, "eventsctl events object: %v\n", err)
		return 2
	}
	defer db.Close()
	o, err := lookup.FindObject(ctx, db, f.id)
	if errors.Is(err, lookup.ErrNoObject) {
		fmt.Fprintln(stdout, err)
		return 1
	}
	if err != nil {
		fmt.Fprintf(stderr, "eventsctl events object: %v\n", err)
		return 1
	}
	if f.asJSON {
		printJSON(stdout, o)
		return 0
	}
	refresh := ""
	if o.NeedsRefresh {
		refresh = "; marked needs_refresh: its events contradict each other, eventsctl reconcile fetches it from Stripe"
	}
	fmt.Fprintf(stdout, "%s %s: %s since %s (event %s); %s%s\n", o.Type, o.ID, o.Status, at(o.StatusAt), o.StatusEvent, o.Amounts, refresh)
	for i, p := range o.Events {
		from := ""
		if p.From != "" {
			from = " from " + p.From
		}
		fmt.Fprintf(stdout, "  %s  %-34s %-20s %s%s\n", at(p.Created), o.EventIDs[i], p.Outcome, p.Status, from)
	}
	return 0
}

// parseDelays reads a RETRY_DELAYS value.
func parseDelays(v string) ([]time.Duration, error) {
	var ds []time.Duration
	for _, s := range strings.Split(v, ",") {
		d, err := time.ParseDuration(strings.TrimSpace(s))
		if err != nil || d <= 0 {
			return nil, fmt.Errorf("RETRY_DELAYS: %q is not a positive duration", s)
		}
		ds = append(ds, d)
	}
	return ds, nil
}
