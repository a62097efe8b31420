// Package eventsctl implements the operator's command line: signing and
// sending test events to a receiver, checking they took effect once, queue
// status, and the DLQ tools. Every command writes to the given writers and
// returns an exit status, so it can be tested in-process.
package eventsctl

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/idempotent-events/idempotent-events/pkg/internal/event"
	"github.com/idempotent-events/idempotent-events/pkg/internal/telemetry"
	"github.com/idempotent-events/idempotent-events/pkg/internal/webhook"
)

// Env reads an environment variable; tests pass their own.
type Env func(string) string

const usage = `eventsctl: operate idempotent-events

usage:
  eventsctl send [flags]   sign a sample (or given) event as its source's provider does (-source), or a
                           PaymentIntent's or PayPal capture's lifecycle (-types), and POST it to the receiver
  eventsctl sign [flags]   print the Stripe-Signature header for a body
  eventsctl verify [flags] wait until an event has exactly its expected rows
  eventsctl status [flags] queue depths and lag, DLQ size, ledger and duplicate rate
  eventsctl events <command>  where is an event and what happened to it; an object's events (eventsctl events -h)
  eventsctl dlq <command>  list, show, replay or discard messages in events.dlq (eventsctl dlq -h)
  eventsctl outbox <command>  list, show or retry parked outbox messages (eventsctl outbox -h)
  eventsctl reconcile [flags] feed the events Stripe has and the ledger lacks into the pipeline,
                              or have GitHub redeliver a hook's failed deliveries
  eventsctl prune [flags]     delete ledger and audit rows older than their retention
  eventsctl effects <command> backfill a handler over the events committed without it (eventsctl effects -h)

Run "eventsctl <command> -h" for the flags of a command.
`

// Main runs eventsctl with args (without the program name) and returns the
// exit status.
func Main(ctx context.Context, args []string, env Env, stdin io.Reader, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	switch args[0] {
	case "send":
		return send(ctx, args[1:], env, stdin, stdout, stderr)
	case "sign":
		return sign(args[1:], env, stdin, stdout, stderr)
	case "verify":
		return verify(ctx, args[1:], env, stdout, stderr)
	case "status":
		return status(ctx, args[1:], env, stdout, stderr)
	case "dlq":
		return dlqCmd(ctx, args[1:], env, stdout, stderr)
	case "outbox":
		return outboxCmd(ctx, args[1:], env, stdout, stderr)
	case "reconcile":
		return reconcileCmd(ctx, args[1:], env, stdout, stderr)
	case "prune":
		return pruneCmd(ctx, args[1:], env, stdout, stderr)
	case "effects":
		return effectsCmd(ctx, args[1:], env, stdout, stderr)
	case "events":
		return eventsCmd(ctx, args[1:], env, stdout, stderr)
	case "--version", "version":
		fmt.Fprintln(stdout, "eventsctl", telemetry.Version)
		return 0
	case "-h", "--help", "help":
		fmt.Fprint(stdout, usage)
		return 0
	}
	fmt.Fprintf(stderr, "eventsctl: unknown command %q\n\n%s", args[0], usage)
	return 2
}

// flagStatus is the exit status of a command whose flags did not parse:
// 0 for -h or --help (help is not an error; the flag package printed the
// usage), 2 for a bad flag.
func flagStatus(err error) int {
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	return 2
}

// eventFlags builds or reads the body of an event.
type eventFlags struct {
	id, typ, currency, status, file string
	amount                          int64
	short                           bool
}

func (f *eventFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.id, "id", "", "event id (default: a new random evt_…)")
	fs.StringVar(&f.typ, "type", "payment_intent.succeeded", "event type")
	fs.Int64Var(&f.amount, "amount", 2000, "amount in cents")
	fs.StringVar(&f.currency, "currency", "usd", "ISO 4217 currency")
	fs.StringVar(&f.status, "status", "succeeded", "payment status")
	fs.BoolVar(&f.short, "short", false, "use the seed's short form instead of a Stripe event")
	fs.StringVar(&f.file, "file", "", "send this file's bytes as the body instead (- for stdin)")
}

func (f *eventFlags) body(stdin io.Reader) ([]byte, error) {
	switch f.file {
	case "":
	case "-":
		return io.ReadAll(stdin)
	default:
		return os.ReadFile(f.file)
	}
	id := f.id
	if id == "" {
		id = NewEventID()
	}
	return event.Example{ID: id, Type: f.typ, AmountCents: f.amount, Currency: f.currency, Status: f.status, Short: f.short}.JSON(), nil
}

// NewEventID returns a random Stripe-like event id.
func NewEventID() string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return "evt_" + hex.EncodeToString(b[:])
}

func firstSecret(env Env) string {
	s, _, _ := strings.Cut(env("WEBHOOK_SECRETS"), ",")
	return strings.TrimSpace(s)
}

func sign(args []string, env Env, stdin io.Reader, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("eventsctl sign", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var ef eventFlags
	ef.register(fs)
	secret := credentialFlag(fs, "secret", firstSecret(env), "signing `secret` (default: the first of $WEBHOOK_SECRETS)")
	at := fs.Int64("timestamp", 0, "unix time to sign at (default: now)")
	if err := fs.Parse(args); err != nil {
		return flagStatus(err)
	}
	if *secret == "" {
		fmt.Fprintln(stderr, "eventsctl sign: no secret: set WEBHOOK_SECRETS or pass -secret")
		return 2
	}
	body, err := ef.body(stdin)
	if err != nil {
		fmt.Fprintln(stderr, "eventsctl sign:", err)
		return 2
	}
	t := time.Now()
	if *at != 0 {
		t = time.Unix(*at, 0)
	}
	if ef.file == "" {
		fmt.Fprintf(stdout, "%s\n", body)
	}
	fmt.Fprintf(stdout, "%s: %s\n", webhook.StripeHeader, webhook.SignStripe(*secret, t, body))
	return 0
}
