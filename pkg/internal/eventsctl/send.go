package eventsctl

import (
	"context"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/idempotent-events/idempotent-events/pkg/internal/webhook"
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

// delivery is one POST of send: a body and, for the lines it prints, what
// it is.
type delivery struct {
	body []byte
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
	secret := fs.String("secret", firstSecret(env), "signing secret (default: the first of $WEBHOOK_SECRETS)")
	times := fs.Int("times", 1, "send each signed event this many times")
	unsigned := fs.Bool("unsigned", false, "send without a Stripe-Signature header")
	timeout := fs.Duration("timeout", 10*time.Second, "timeout per request")
	var lf lifecycleFlags
	lf.register(fs)
	if err := fs.Parse(args); err != nil {
		return flagStatus(err)
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if msg := conflict(set); msg != "" {
		fmt.Fprintln(stderr, "eventsctl send:", msg)
		return 2
	}
	if !set["url"] && defErr != nil {
		fmt.Fprintln(stderr, "eventsctl send:", defErr)
		return 2
	}
	if *times < 1 {
		fmt.Fprintf(stderr, "eventsctl send: -times must be at least 1, got %d\n", *times)
		return 2
	}
	if *secret == "" && !*unsigned {
		fmt.Fprintln(stderr, "eventsctl send: no secret: set WEBHOOK_SECRETS or pass -secret (or -unsigned)")
		return 2
	}
	var deliveries []delivery
	if set["types"] {
		evs, err := lf.events(ef.amount, ef.currency, NewEventID)
		if err != nil {
			fmt.Fprintln(stderr, "eventsctl send:", err)
			return 2
		}
		for _, ev := range evs {
			label := ev.typ + " " + ev.objectID + " created=" + ev.created.Format(time.RFC3339)
			for range *times {
				deliveries = append(deliveries, delivery{body: ev.body, label: label})
			}
		}
		if lf.shuffle {
			rand.Shuffle(len(deliveries), func(i, j int) { deliveries[i], deliveries[j] = deliveries[j], deliveries[i] })
		}
	} else {
		body, err := ef.body(stdin)
		if err != nil {
			fmt.Fprintln(stderr, "eventsctl send:", err)
			return 2
		}
		for range *times {
			deliveries = append(deliveries, delivery{body: body})
		}
	}

	// A transport of its own, closed at the end: the command may run
	// in-process (tests, a team's tooling), where idle keep-alive
	// connections would outlive it.
	client := &http.Client{Timeout: *timeout, Transport: http.DefaultTransport.(*http.Transport).Clone()}
	defer client.CloseIdleConnections()
	target := strings.TrimSuffix(*url, "/") + "/webhooks/payment"
	status := 0
	for _, d := range deliveries {
		code, answer, err := post(ctx, client, target, d.body, *secret, *unsigned)
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

// conflict names a flag given for the other mode of send: one event built
// from -id, -type, -status… (or read with -file), or the events of a
// lifecycle (-types), whose ids, statuses and bodies send makes itself.
func conflict(set map[string]bool) string {
	if set["types"] {
		for _, name := range singleOnly {
			if set[name] {
				return fmt.Sprintf("-%s does not go with -types: each event of a lifecycle gets a new id, the status of its type and a Stripe body", name)
			}
		}
		return ""
	}
	for _, name := range lifecycleOnly {
		if set[name] {
			return fmt.Sprintf("-%s needs -types (the event types of the object's lifecycle, in order)", name)
		}
	}
	return ""
}

func post(ctx context.Context, client *http.Client, url string, body []byte, secret string, unsigned bool) (int, string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(string(body)))
	if err != nil {
		return 0, "", err
	}
	req.Header.Set("Content-Type", "application/json")
	if !unsigned {
		req.Header.Set(webhook.StripeHeader, webhook.SignStripe(secret, time.Now(), body))
	}
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
