package eventsctl

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/idempotent-events/idempotent-events/pkg/internal/event"
	"github.com/idempotent-events/idempotent-events/pkg/internal/provider"
	"github.com/idempotent-events/idempotent-events/pkg/internal/provider/paypal"
	"github.com/idempotent-events/idempotent-events/pkg/internal/provider/stripe"
)

// defaultReceiverURL is where send posts without -url, $RECEIVER_URL or
// $HTTP_ADDR: the receiver's default address.
const defaultReceiverURL = "http://127.0.0.1:8080"

// receiverURL is send's default target. $RECEIVER_URL names it outright;
// otherwise it is the address the receiver listens on by the same
// environment, $HTTP_ADDR (as status and dlq take $AMQP_URL and
// $DATABASE_URL from the services' own variables), with loopback in place
// of an address of every interface (":8080", "0.0.0.0:8080", "[::]:8080"),
// which is no address to connect to. A malformed $HTTP_ADDR is an error
// naming it, worded as the receiver's own check words it.
func receiverURL(env Env) (string, error) {
	if u := env("RECEIVER_URL"); u != "" {
		return u, nil
	}
	addr := env("HTTP_ADDR")
	if addr == "" {
		return defaultReceiverURL, nil
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil || port == "" {
		return "", fmt.Errorf("HTTP_ADDR: must be host:port or :port, got %q (or pass -url)", addr)
	}
	if ip := net.ParseIP(host); host == "" || ip != nil && ip.IsUnspecified() {
		host = "127.0.0.1"
	}
	return "http://" + net.JoinHostPort(host, port), nil
}

// delivery is one POST of send: a body, the identity the provider puts in
// headers (the event id of a Standard Webhooks message or a GitHub
// delivery, GitHub's event type), and, for the lines it prints, what it
// is.
type delivery struct {
	body    []byte
	id, typ string
	// label describes a lifecycle's event on its output line ("" for a
	// single event, whose line is only the answer, as it always was).
	label string
}

// Flags of one mode that the other does not take.
var (
	singleOnly    = []string{"id", "type", "status", "short", "file"}
	lifecycleOnly = []string{"object", "created", "step", "shuffle"}
)

func send(ctx context.Context, args []string, env Env, stdin io.Reader, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("eventsctl send", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var ef eventFlags
	ef.register(fs)
	defURL, defErr := receiverURL(env)
	url := fs.String("url", defURL, "receiver base URL ($RECEIVER_URL, else the receiver of $HTTP_ADDR on this host)")
	source := fs.String("source", event.DefaultSource, "the `source` to send to: stripe (/webhooks/payment) or a $WEBHOOK_SOURCES name (/webhooks/<name>)")
	scheme := fs.String("scheme", "", "how the source signs: "+strings.Join(provider.Names(), ", ")+
		" (default: the source's scheme in $WEBHOOK_SOURCES, else the source's name)")
	secret := credentialFlag(fs, "secret", "", "signing `secret`, or PayPal's webhook id (default: the first of $WEBHOOK_SECRETS for stripe,\n"+
		"of $WEBHOOK_SECRETS_<NAME> (or its _FILE) for another source)")
	times := fs.Int("times", 1, "send each signed event this many times")
	unsigned := fs.Bool("unsigned", false, "send without the signature header")
	timeout := fs.Duration("timeout", 10*time.Second, "timeout per request")
	var lf lifecycleFlags
	lf.register(fs)
	var pf paypalFlags
	pf.register(fs)
	if err := fs.Parse(args); err != nil {
		return flagStatus(err)
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	fail := func(err error) int {
		fmt.Fprintln(stderr, "eventsctl send:", err)
		return 2
	}
	kind, err := sourceScheme(env, *source, *scheme)
	if err != nil {
		return fail(err)
	}
	if msg := conflict(set, kind); msg != "" {
		return fail(errors.New(msg))
	}
	if pf.env {
		if kind != paypal.Name {
			return fail(fmt.Errorf("-paypal-dev-env is for a PayPal source; %s signs as %s", *source, kind))
		}
		dev, err := pf.dev()
		if err != nil {
			return fail(err)
		}
		fmt.Fprint(stdout, dev.receiverEnv())
		return 0
	}
	if !set["url"] && defErr != nil {
		return fail(defErr)
	}
	if *times < 1 {
		return fail(fmt.Errorf("-times must be at least 1, got %d", *times))
	}
	if !set["secret"] {
		if *secret, err = sourceSecret(env, *source); err != nil {
			return fail(err)
		}
	}
	if *secret == "" && !*unsigned {
		return fail(fmt.Errorf("no secret: set %s or pass -secret (or -unsigned)", secretsVar(*source)))
	}
	deliveries, err := makeDeliveries(kind, &ef, &lf, set, *times, stdin)
	if err != nil {
		return fail(err)
	}
	s := signer{scheme: kind, secret: *secret, unsigned: *unsigned}
	if kind == paypal.Name {
		dev, err := pf.dev()
		if err != nil {
			return fail(err)
		}
		stop, err := dev.serve()
		if err != nil {
			return fail(err)
		}
		// The receiver fetches the certificate while it verifies a
		// delivery: it is served until the last answer is in.
		defer stop()
		s.paypal = &dev.signer
	}

	// A transport of its own, closed at the end: the command may run
	// in-process (tests, a team's tooling), where idle keep-alive
	// connections would outlive it.
	client := &http.Client{Timeout: *timeout, Transport: http.DefaultTransport.(*http.Transport).Clone()}
	defer client.CloseIdleConnections()
	target := strings.TrimSuffix(*url, "/") + sourceRoute(*source)
	status := 0
	for _, d := range deliveries {
		h, err := s.headers(d)
		if err != nil {
			fmt.Fprintln(stderr, "eventsctl send:", err)
			return 1
		}
		code, answer, err := post(ctx, client, target, d.body, h)
		if err != nil {
			fmt.Fprintln(stderr, "eventsctl send:", err)
			return 1
		}
		line := fmt.Sprintf("%d %s", code, strings.TrimSpace(answer))
		if d.label != "" {
			line += "  " + d.label
		}
		fmt.Fprintln(stdout, line)
		if code >= 300 {
			status = 1
		}
	}
	return status
}

// makeDeliveries builds what send posts: one event from the flags (or the
// file), or the events of a lifecycle (-types), each times times, in the
// body and headers of the provider scheme.
func makeDeliveries(scheme string, ef *eventFlags, lf *lifecycleFlags, set map[string]bool, times int, stdin io.Reader) ([]delivery, error) {
	var deliveries []delivery
	if set["types"] {
		var evs []lifecycleEvent
		var err error
		switch scheme {
		case stripe.Name:
			evs, err = lf.events(ef.amount, ef.currency, NewEventID)
		case paypal.Name:
			evs, err = lf.paypalEvents(ef.amount, ef.currency)
		default:
			err = fmt.Errorf("-types makes the lifecycle of a Stripe PaymentIntent or a PayPal capture; a %s source takes one event at a time", scheme)
		}
		if err != nil {
			return nil, err
		}
		for _, ev := range evs {
			label := ev.typ + " " + ev.objectID + " created=" + ev.created.Format(time.RFC3339)
			for range times {
				deliveries = append(deliveries, delivery{body: ev.body, label: label})
			}
		}
		if lf.shuffle {
			rand.Shuffle(len(deliveries), func(i, j int) { deliveries[i], deliveries[j] = deliveries[j], deliveries[i] })
		}
		return deliveries, nil
	}
	d, err := ef.delivery(scheme, lf.object, set, stdin)
	if err != nil {
		return nil, err
	}
	for range times {
		deliveries = append(deliveries, d)
	}
	return deliveries, nil
}

// conflict names a flag given for the other mode of send: one event built
// from -id, -type, -status… (or read with -file), or the events of a
// lifecycle (-types), whose ids, statuses and bodies send makes itself.
// One PayPal event may name its capture (-object): a refund is about a
// capture sent before.
func conflict(set map[string]bool, scheme string) string {
	if set["types"] {
		for _, name := range singleOnly {
			if set[name] {
				return fmt.Sprintf("-%s does not go with -types: each event of a lifecycle gets a new id, the status of its type and the provider's body", name)
			}
		}
		return ""
	}
	for _, name := range lifecycleOnly {
		if set[name] && !(name == "object" && scheme == paypal.Name) {
			return fmt.Sprintf("-%s needs -types (the event types of the object's lifecycle, in order)", name)
		}
	}
	return ""
}

// post sends one delivery with headers h and returns the receiver's
// answer.
func post(ctx context.Context, client *http.Client, url string, body []byte, h http.Header) (int, string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return 0, "", err
	}
	req.Header = h
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return 0, "", fmt.Errorf("POST %s: %w", url, err)
	}
	defer resp.Body.Close()
	answer, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if err != nil {
		return 0, "", fmt.Errorf("read answer: %w", err)
	}
	return resp.StatusCode, string(answer), nil
}
