package eventsctl_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotent-events/idempotent-events/pkg/internal/event"
	"github.com/idempotent-events/idempotent-events/pkg/internal/eventsctl"
	"github.com/idempotent-events/idempotent-events/pkg/internal/webhook"
)

const sendSecret = "whsec_send_test"

// posted is one request a fake receiver took: the verified body, decoded
// as the receiver decodes it and as the payment effect reads it.
type posted struct {
	raw    []byte
	ev     event.Event
	object map[string]any
}

// fakeReceiver answers 202 to every request whose Stripe signature checks
// out under sendSecret, as the receiver would, and keeps what it took; a
// request it would refuse fails the test.
type fakeReceiver struct {
	t   *testing.T
	srv *httptest.Server
	mu  sync.Mutex
	got []posted
}

func newFakeReceiver(t *testing.T) *fakeReceiver {
	f := &fakeReceiver{t: t}
	verifier := webhook.NewStripeVerifier([]string{sendSecret}, 5*time.Minute)
	f.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if !assert.NoError(t, err) || !assert.Equal(t, "/webhooks/payment", r.URL.Path) {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		_, err = verifier.Verify(r.Header, body)
		assert.NoError(t, err, "signature of %s", body)
		ev, err := event.Decode(body)
		assert.NoError(t, err, "the receiver would refuse %s", body)
		var wire struct {
			Data struct {
				Object map[string]any `json:"object"`
			} `json:"data"`
		}
		assert.NoError(t, json.Unmarshal(body, &wire))
		f.mu.Lock()
		f.got = append(f.got, posted{raw: body, ev: ev, object: wire.Data.Object})
		f.mu.Unlock()
		w.WriteHeader(http.StatusAccepted)
		_, _ = w.Write([]byte(`{"status":"accepted","event_id":"` + ev.ID + `"}`))
	}))
	t.Cleanup(f.srv.Close)
	return f
}

func (f *fakeReceiver) posts() []posted {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.got)
}

// sendCmd runs `eventsctl send args…` in-process with env.
func sendCmd(t *testing.T, env map[string]string, args ...string) (int, string, string) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	code := eventsctl.Main(ctx, append([]string{"send"}, args...), func(k string) string { return env[k] }, strings.NewReader(""), &stdout, &stderr)
	return code, stdout.String(), stderr.String()
}

// The statuses Stripe reports in the events of each type (the
// PaymentIntent's for payment_intent.*, the charge's for charge.*).
var stripeStatus = map[string]string{
	"payment_intent.created":                   "requires_payment_method",
	"payment_intent.processing":                "processing",
	"payment_intent.requires_action":           "requires_action",
	"payment_intent.amount_capturable_updated": "requires_capture",
	"payment_intent.payment_failed":            "requires_payment_method",
	"payment_intent.succeeded":                 "succeeded",
	"payment_intent.canceled":                  "canceled",
	"charge.pending":                           "pending",
	"charge.succeeded":                         "succeeded",
	"charge.captured":                          "succeeded",
	"charge.failed":                            "failed",
	"charge.refunded":                          "succeeded",
}

func num(v any) int64 {
	f, _ := v.(float64)
	return int64(f)
}

// -object and -types send one signed Stripe event per type about the same
// PaymentIntent (its charge for charge.*), in the order given, created
// -step apart from -created, each shaped as Stripe shapes it at that point
// of the lifecycle: the status of its type, the amounts received or
// captured once it succeeded.
func TestSendLifecycleSendsOneStripeEventPerType(t *testing.T) {
	t.Parallel()
	f := newFakeReceiver(t)
	types := []string{"payment_intent.created", "payment_intent.requires_action", "payment_intent.processing",
		"charge.succeeded", "payment_intent.succeeded", "charge.refunded"}
	start := time.Date(2026, 12, 7, 10, 0, 0, 0, time.UTC)
	step := 10 * time.Second
	code, out, stderr := sendCmd(t, map[string]string{"WEBHOOK_SECRETS": sendSecret}, "-url", f.srv.URL,
		"-object", "pi_life_1", "-types", strings.Join(types, ","), "-created", start.Format(time.RFC3339), "-step", step.String(),
		"-amount", "1500", "-currency", "eur")
	require.Equal(t, 0, code, stderr)

	got := f.posts()
	require.Len(t, got, len(types))
	lines := strings.Split(strings.TrimSpace(out), "\n")
	require.Len(t, lines, len(types))
	ids := map[string]bool{}
	for i, p := range got {
		typ := types[i]
		created := start.Add(time.Duration(i) * step)
		assert.Equal(t, typ, p.ev.Type)
		assert.Equal(t, created, p.ev.Created, "%s", typ)
		assert.True(t, strings.HasPrefix(p.ev.ID, "evt_"), p.ev.ID)
		ids[p.ev.ID] = true
		o := p.object
		assert.Equal(t, stripeStatus[typ], o["status"], "%s", typ)
		assert.Equal(t, "eur", o["currency"], "%s", typ)
		assert.Equal(t, int64(1500), num(o["amount"]), "%s", typ)
		if strings.HasPrefix(typ, "charge.") {
			assert.Equal(t, event.Object{Type: "charge", ID: "ch_life_1"}, p.ev.Object)
			assert.Equal(t, "pi_life_1", o["payment_intent"])
			assert.Equal(t, true, o["captured"], "an automatic capture: the succeeded charge is captured")
			assert.Equal(t, int64(1500), num(o["amount_captured"]), "%s", typ)
			assert.Nil(t, p.ev.Payment, "a charge event is no payment row")
		} else {
			assert.Equal(t, event.Object{Type: "payment_intent", ID: "pi_life_1"}, p.ev.Object)
			require.NotNil(t, p.ev.Payment, "%s describes a payment", typ)
			assert.Equal(t, "pi_life_1", p.ev.Payment.IntentID)
			received := int64(0)
			if o["status"] == "succeeded" {
				received = 1500
			}
			assert.Equal(t, received, num(o["amount_received"]), "%s", typ)
		}
		assert.Equal(t, typ == "charge.refunded", num(o["amount_refunded"]) == 1500, "%s refunds", typ)
		assert.True(t, strings.HasPrefix(lines[i], `202 {"status":"accepted","event_id":"`+p.ev.ID+`"}`), lines[i])
		assert.Contains(t, lines[i], typ+" "+p.ev.Object.ID+" created="+created.Format(time.RFC3339))
	}
	assert.Len(t, ids, len(types), "every event has an id of its own")
}

// A PaymentIntent captured later (amount_capturable_updated, then
// charge.captured): its charge succeeds as an authorisation, not captured,
// until charge.captured; only then is the PaymentIntent's amount received.
func TestSendLifecycleOfAManualCapture(t *testing.T) {
	t.Parallel()
	f := newFakeReceiver(t)
	types := []string{"payment_intent.created", "payment_intent.amount_capturable_updated", "charge.succeeded",
		"charge.captured", "payment_intent.succeeded"}
	code, _, stderr := sendCmd(t, map[string]string{"WEBHOOK_SECRETS": sendSecret}, "-url", f.srv.URL,
		"-object", "pi_manual_1", "-types", strings.Join(types, ","))
	require.Equal(t, 0, code, stderr)
	got := f.posts()
	require.Len(t, got, len(types))
	byType := map[string]map[string]any{}
	for i, p := range got {
		require.Equal(t, types[i], p.ev.Type)
		byType[p.ev.Type] = p.object
		if i > 0 {
			assert.Equal(t, time.Second, p.ev.Created.Sub(got[i-1].ev.Created), "the default -step")
		}
	}
	assert.WithinDuration(t, time.Now(), got[0].ev.Created, time.Minute, "the default -created is now")
	capturable := byType["payment_intent.amount_capturable_updated"]
	assert.Equal(t, "manual", capturable["capture_method"])
	assert.Equal(t, num(capturable["amount"]), num(capturable["amount_capturable"]))
	assert.Zero(t, num(capturable["amount_received"]))
	assert.Equal(t, false, byType["charge.succeeded"]["captured"], "authorised, not yet captured")
	assert.Zero(t, num(byType["charge.succeeded"]["amount_captured"]))
	assert.Equal(t, true, byType["charge.captured"]["captured"])
	assert.Equal(t, num(byType["charge.captured"]["amount"]), num(byType["charge.captured"]["amount_captured"]))
	succeeded := byType["payment_intent.succeeded"]
	assert.Equal(t, num(succeeded["amount"]), num(succeeded["amount_received"]))
}

// -times sends every event of the lifecycle that many times, the same
// signed body each time; -shuffle posts them in a random order, each event
// keeping the created time of its place in the list.
func TestSendLifecycleShuffledWithDuplicates(t *testing.T) {
	t.Parallel()
	types := []string{"payment_intent.created", "payment_intent.processing", "payment_intent.payment_failed",
		"payment_intent.processing", "payment_intent.succeeded"}
	start := time.Date(2026, 12, 7, 10, 0, 0, 0, time.UTC)
	inOrder := func(got []posted) bool {
		return slices.IsSortedFunc(got, func(a, b posted) int { return a.ev.Created.Compare(b.ev.Created) })
	}
	shuffled := false
	for attempt := 0; attempt < 5 && !shuffled; attempt++ {
		f := newFakeReceiver(t)
		code, _, stderr := sendCmd(t, map[string]string{"WEBHOOK_SECRETS": sendSecret}, "-url", f.srv.URL,
			"-types", strings.Join(types, ","), "-created", start.Format(time.RFC3339), "-times", "2", "-shuffle")
		require.Equal(t, 0, code, stderr)
		got := f.posts()
		require.Len(t, got, 2*len(types))
		bodies := map[string][][]byte{}
		var objects []string
		for _, p := range got {
			bodies[p.ev.ID] = append(bodies[p.ev.ID], p.raw)
			objects = append(objects, p.ev.Object.ID)
		}
		require.Len(t, bodies, len(types), "one id per event")
		for id, bs := range bodies {
			require.Len(t, bs, 2, "%s sent -times 2", id)
			assert.Equal(t, bs[0], bs[1], "%s: the same body both times", id)
		}
		assert.True(t, strings.HasPrefix(objects[0], "pi_"), "the default -object is a new PaymentIntent id: %s", objects[0])
		assert.Len(t, slices.Compact(slices.Sorted(slices.Values(objects))), 1, "every event about one object")
		// Each type keeps the created time of its place in the list.
		slices.SortStableFunc(got, func(a, b posted) int { return a.ev.Created.Compare(b.ev.Created) })
		for i, p := range got {
			assert.Equal(t, types[i/2], p.ev.Type)
			assert.Equal(t, start.Add(time.Duration(i/2)*time.Second), p.ev.Created)
		}
		shuffled = !inOrder(f.posts())
	}
	assert.True(t, shuffled, "-shuffle posted the events in list order five times running")
}

// What send cannot make faithfully is refused with status 2 before
// anything is posted, naming the flag and what is wrong with it.
func TestSendRefusesALifecycleItCannotMake(t *testing.T) {
	t.Parallel()
	f := newFakeReceiver(t)
	env := map[string]string{"WEBHOOK_SECRETS": sendSecret}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"-types", "payment_intent.created,invoice.paid"}, `-types: unknown event type "invoice.paid"; send makes charge.captured, `},
		{[]string{"-types", "payment_intent.created,"}, `-types: unknown event type ""`},
		{[]string{"-types", "payment_intent.created", "-status", "succeeded"}, "-status does not go with -types"},
		{[]string{"-types", "payment_intent.created", "-id", "evt_1"}, "-id does not go with -types"},
		{[]string{"-types", "payment_intent.created", "-file", "-"}, "-file does not go with -types"},
		{[]string{"-object", "pi_1"}, "-object needs -types"},
		{[]string{"-shuffle"}, "-shuffle needs -types"},
		{[]string{"-types", "payment_intent.created", "-step", "1500ms"}, "-step: want whole seconds, 0 or more"},
		{[]string{"-types", "payment_intent.created", "-step", "-1s"}, "-step: want whole seconds"},
		{[]string{"-types", "payment_intent.created", "-created", "yesterday"}, `-created: want an RFC 3339 time such as 2026-12-07T10:00:00Z, got "yesterday"`},
		{[]string{"-types", "payment_intent.created", "-object", "pi 1"}, "the payment_intent.created event would be refused by the receiver (check -object, -amount, -currency): data.object.id: "},
		{[]string{"-types", "charge.succeeded", "-object", "ch_1"}, `-object names the PaymentIntent (pi_…), got "ch_1"`},
		{[]string{"-types", "payment_intent.created", "-times", "0"}, "-times must be at least 1, got 0"},
	} {
		code, out, stderr := sendCmd(t, env, append([]string{"-url", f.srv.URL}, c.args...)...)
		assert.Equal(t, 2, code, "%v: %s", c.args, out)
		assert.Contains(t, stderr, "eventsctl send: "+c.want, "%v", c.args)
	}
	assert.Empty(t, f.posts(), "nothing posted")
}

// Without -url, send posts where the receiver listens by the same
// environment: $RECEIVER_URL, else $HTTP_ADDR on this host (loopback for
// an address of every interface), as the other commands take $AMQP_URL and
// $DATABASE_URL. A malformed $HTTP_ADDR is named, unless -url makes it moot.
func TestSendPostsToTheReceiverOfHTTPAddr(t *testing.T) {
	t.Parallel()
	f := newFakeReceiver(t)
	_, port, err := net.SplitHostPort(f.srv.Listener.Addr().String())
	require.NoError(t, err)
	for _, env := range []map[string]string{
		{"HTTP_ADDR": ":" + port},
		{"HTTP_ADDR": "0.0.0.0:" + port},
		{"HTTP_ADDR": "127.0.0.1:" + port},
		{"RECEIVER_URL": f.srv.URL, "HTTP_ADDR": ":1"},
	} {
		env["WEBHOOK_SECRETS"] = sendSecret
		before := len(f.posts())
		code, out, stderr := sendCmd(t, env, "-id", "evt_addr_1")
		assert.Equal(t, 0, code, "%v: %s", env, stderr)
		assert.Equal(t, `202 {"status":"accepted","event_id":"evt_addr_1"}`, strings.TrimSpace(out), "%v", env)
		assert.Len(t, f.posts(), before+1, "%v: the fake receiver took it", env)
	}

	env := map[string]string{"WEBHOOK_SECRETS": sendSecret, "HTTP_ADDR": "8080"}
	code, _, stderr := sendCmd(t, env, "-id", "evt_addr_2")
	assert.Equal(t, 2, code)
	assert.Equal(t, "eventsctl send: HTTP_ADDR: must be host:port or :port, got \"8080\" (or pass -url)\n", stderr)
	code, _, stderr = sendCmd(t, env, "-id", "evt_addr_2", "-url", f.srv.URL)
	assert.Equal(t, 0, code, stderr)
}
