package eventsctl_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotent-events/idempotent-events/pkg/internal/event"
	"github.com/idempotent-events/idempotent-events/pkg/internal/provider"
	"github.com/idempotent-events/idempotent-events/pkg/internal/provider/paypal"
	"github.com/idempotent-events/idempotent-events/pkg/internal/servicetest"
	"github.com/idempotent-events/idempotent-events/pkg/internal/webhook"
)

// took is one delivery a providerReceiver accepted.
type took struct {
	source string
	d      webhook.Delivery
	ev     event.Event
	h      http.Header
	raw    []byte
}

// providerReceiver answers as the receiver does, with the registry's real
// providers: /webhooks/payment is Stripe's default source, /webhooks/<name>
// the source of that name; a delivery is verified on its raw body (401
// naming the reason when it does not), identified and decoded (400), then
// answered 202 and kept.
type providerReceiver struct {
	srv *httptest.Server
	mu  sync.Mutex
	got []took
}

func newProviderReceiver(t *testing.T, sources map[string]provider.Provider) *providerReceiver {
	f := &providerReceiver{}
	f.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		name := strings.TrimPrefix(r.URL.Path, "/webhooks/")
		if name == "payment" {
			name = event.DefaultSource
		}
		p, ok := sources[name]
		body, err := io.ReadAll(r.Body)
		if !ok || err != nil {
			http.NotFound(w, r)
			return
		}
		if _, err := p.Verify(r.Header, body); err != nil {
			w.WriteHeader(http.StatusUnauthorized)
			fmt.Fprintf(w, `{"error":%q}`, webhook.ReasonOf(err))
			return
		}
		d := p.Identify(r.Header)
		ev, err := p.Decode(d, body)
		if err != nil {
			w.WriteHeader(http.StatusBadRequest)
			fmt.Fprintf(w, `{"error":"invalid_event","message":%q}`, err.Error())
			return
		}
		f.mu.Lock()
		f.got = append(f.got, took{source: name, d: d, ev: ev, h: r.Header.Clone(), raw: body})
		f.mu.Unlock()
		w.WriteHeader(http.StatusAccepted)
		fmt.Fprintf(w, `{"status":"accepted","event_id":%q}`, ev.ID)
	}))
	t.Cleanup(f.srv.Close)
	return f
}

func (f *providerReceiver) took() []took {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.got)
}

func newProvider(t *testing.T, scheme string, s provider.Settings) provider.Provider {
	t.Helper()
	s.Tolerance = 5 * time.Minute
	p, err := provider.New(scheme, s)
	require.NoError(t, err)
	return p
}

// A -paypal-dev directory made for the test: its stand-in serves on a free
// loopback port. It returns the directory and the settings of a PayPal
// provider that trusts it, as the receiver is configured from
// -paypal-dev-env's output.
func paypalDevDir(t *testing.T) (string, provider.Settings) {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "paypal-dev")
	addr := servicetest.FreeAddr()
	code, out, stderr := sendCmd(t, nil, "-source", "paypal", "-paypal-dev", dir, "-paypal-cert-addr", addr, "-paypal-dev-env")
	require.Equal(t, 0, code, stderr)
	ca, err := filepath.Abs(filepath.Join(dir, "ca.pem"))
	require.NoError(t, err)
	require.Equal(t, "export PAYPAL_CERT_HOSTS='"+addr+"'\nexport PAYPAL_CA_FILE='"+ca+"'\n", out)
	return dir, provider.Settings{CertHosts: []string{addr}, CAFile: ca}
}

// send -source signs as each provider does: the registry's own verifier of
// each accepts what send signed with the source's secret (taken from the
// receiver's own variable, WEBHOOK_SECRETS_<NAME> or its _FILE), the body
// is the event the provider's decoder expects, and -times resends the same
// event (PayPal: a new transmission each time, as PayPal retries). A wrong
// secret and -unsigned are refused 401, and send says so with exit 1.
func TestSendSignsAsEachProvider(t *testing.T) {
	t.Parallel()
	dir, pp := paypalDevDir(t)
	secretsFile := filepath.Join(t.TempDir(), "gh-secrets")
	require.NoError(t, os.WriteFile(secretsFile, []byte("gh-secret-1\ngh-secret-0\n"), 0o600))
	env := map[string]string{
		"WEBHOOK_SOURCES":         "connect:stripe,acme:standard,gh:github,paypal:paypal",
		"WEBHOOK_SECRETS":         "whsec_default",
		"WEBHOOK_SECRETS_CONNECT": "whsec_connect",
		"WEBHOOK_SECRETS_ACME":    "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
		"WEBHOOK_SECRETS_GH_FILE": secretsFile,
		"WEBHOOK_SECRETS_PAYPAL":  "8PT597110X687430LKGECATA",
	}
	pp.Secrets = []string{"8PT597110X687430LKGECATA"}
	f := newProviderReceiver(t, map[string]provider.Provider{
		"stripe":  newProvider(t, "stripe", provider.Settings{Secrets: []string{"whsec_default"}}),
		"connect": newProvider(t, "stripe", provider.Settings{Secrets: []string{"whsec_connect"}}),
		"acme":    newProvider(t, "standard", provider.Settings{Secrets: []string{"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"}}),
		"gh":      newProvider(t, "github", provider.Settings{Secrets: []string{"gh-secret-1"}}),
		"paypal":  newProvider(t, "paypal", pp),
	})
	for _, c := range []struct {
		source string
		args   []string
		check  func(t *testing.T, tk took)
	}{
		{"stripe", nil, func(t *testing.T, tk took) {
			assert.Equal(t, "payment_intent.succeeded", tk.ev.Type)
			assert.NotNil(t, tk.ev.Payment)
		}},
		{"connect", []string{"-id", "evt_connect_1"}, func(t *testing.T, tk took) {
			assert.Equal(t, "evt_connect_1", tk.ev.ID)
		}},
		{"acme", []string{"-id", "msg_acme_1", "-amount", "1234"}, func(t *testing.T, tk took) {
			assert.Equal(t, "msg_acme_1", tk.ev.ID, "the webhook-id header")
			require.NotNil(t, tk.ev.Payment, "the seed's payment fields in data")
			assert.Equal(t, int64(1234), tk.ev.Payment.AmountCents)
		}},
		{"gh", nil, func(t *testing.T, tk took) {
			assert.Equal(t, "ping", tk.ev.Type, "a ping unless -type")
			assert.Regexp(t, `^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`, tk.ev.ID, "a delivery id as GitHub's")
		}},
		{"paypal", []string{"-object", "5O190127TN364715T", "-amount", "2500", "-currency", "eur"}, func(t *testing.T, tk took) {
			assert.Equal(t, "PAYMENT.CAPTURE.COMPLETED", tk.ev.Type)
			assert.Equal(t, event.Object{Type: "capture", ID: "5O190127TN364715T"}, tk.ev.Object)
			assert.True(t, strings.HasPrefix(tk.ev.ID, "WH-"), tk.ev.ID)
			assert.Contains(t, string(tk.raw), `"amount":{"currency_code":"EUR","value":"25.00"}`)
			assert.Equal(t, "https://"+pp.CertHosts[0]+"/v1/notifications/certs/CERT-idempotent-events-dev", tk.h.Get(paypal.CertURLHeader))
		}},
	} {
		before := len(f.took())
		args := append([]string{"-url", f.srv.URL, "-source", c.source, "-times", "2", "-paypal-dev", dir}, c.args...)
		code, out, stderr := sendCmd(t, env, args...)
		require.Equal(t, 0, code, "%s: %s%s", c.source, out, stderr)
		got := f.took()[before:]
		require.Len(t, got, 2, c.source)
		assert.Equal(t, got[0].ev.ID, got[1].ev.ID, "%s: -times sends the same event", c.source)
		assert.Equal(t, got[0].raw, got[1].raw, "%s: the same body", c.source)
		assert.Equal(t, c.source, got[0].source)
		assert.Equal(t, strings.Repeat(`202 {"status":"accepted","event_id":"`+got[0].ev.ID+`"}`+"\n", 2), out, c.source)
		if c.source == "paypal" {
			assert.NotEqual(t, got[0].d.DeliveryID, got[1].d.DeliveryID, "a new PAYPAL-TRANSMISSION-ID per POST")
		}
		c.check(t, got[0])

		code, out, _ = sendCmd(t, env, append(args, "-secret", "wrongsecret")...)
		assert.Equal(t, 1, code, "%s: a wrong secret", c.source)
		assert.Contains(t, out, `401 {"error":"signature_mismatch"}`, c.source)
		code, out, _ = sendCmd(t, env, append(args, "-unsigned")...)
		assert.Equal(t, 1, code, "%s: unsigned", c.source)
		assert.Contains(t, out, `401 {"error":"missing_signature"}`, c.source)
	}
	assert.Len(t, f.took(), 10, "nothing refused was taken")
}

// A PayPal capture's lifecycle: one event per type about one capture, step
// apart; every PAYMENT.CAPTURE.REFUNDED refunds an equal share, the last
// the rest, so the refunded totals grow to the captured amount; the
// refunds are refund resources naming the capture in their "up" link, as
// PayPal sends them.
func TestSendPayPalCaptureLifecycle(t *testing.T) {
	t.Parallel()
	dir, pp := paypalDevDir(t)
	pp.Secrets = []string{"WHLIFECYCLE1"}
	f := newProviderReceiver(t, map[string]provider.Provider{"pp": newProvider(t, "paypal", pp)})
	types := []string{"PAYMENT.CAPTURE.PENDING", "PAYMENT.CAPTURE.COMPLETED", "PAYMENT.CAPTURE.REFUNDED", "PAYMENT.CAPTURE.REFUNDED"}
	start := time.Date(2026, 12, 7, 10, 0, 0, 0, time.UTC)
	code, out, stderr := sendCmd(t, map[string]string{"WEBHOOK_SOURCES": "pp:paypal", "WEBHOOK_SECRETS_PAYPAL": "WHOTHER", "WEBHOOK_SECRETS_PP": "WHLIFECYCLE1"},
		"-url", f.srv.URL, "-source", "pp", "-paypal-dev", dir, "-types", strings.Join(types, ","), "-object", "CAPLIFE1",
		"-amount", "2000", "-created", start.Format(time.RFC3339), "-step", "10s")
	require.Equal(t, 0, code, "%s%s", out, stderr)
	got := f.took()
	require.Len(t, got, len(types))
	wantTotals := []string{"", "", "10.00", "20.00"}
	for i, tk := range got {
		assert.Equal(t, types[i], tk.ev.Type)
		assert.Equal(t, start.Add(time.Duration(i)*10*time.Second), tk.ev.Created, "%s: the resource's update_time", types[i])
		var w struct {
			ResourceType string `json:"resource_type"`
			Resource     struct {
				ID, Status             string
				SellerPayableBreakdown struct {
					TotalRefundedAmount struct{ Value string } `json:"total_refunded_amount"`
				} `json:"seller_payable_breakdown"`
				Links []struct{ Href, Rel string }
			}
		}
		require.NoError(t, json.Unmarshal(tk.raw, &w))
		if wantTotals[i] == "" {
			assert.Equal(t, event.Object{Type: "capture", ID: "CAPLIFE1"}, tk.ev.Object)
			assert.Equal(t, strings.TrimPrefix(types[i], "PAYMENT.CAPTURE."), w.Resource.Status)
			continue
		}
		assert.Equal(t, "refund", tk.ev.Object.Type)
		assert.Equal(t, wantTotals[i], w.Resource.SellerPayableBreakdown.TotalRefundedAmount.Value)
		assert.Contains(t, w.Resource.Links, struct{ Href, Rel string }{"https://api.sandbox.paypal.com/v2/payments/captures/CAPLIFE1", "up"})
		assert.Contains(t, out, types[i]+" CAPLIFE1 created="+tk.ev.Created.Format(time.RFC3339))
	}
}

// The stand-in is made once and kept: a second use of the directory
// serves the same certificate with the same key (the receiver caches a
// certificate by URL), and its address cannot be changed afterwards.
func TestThePayPalStandInIsKept(t *testing.T) {
	t.Parallel()
	dir, _ := paypalDevDir(t)
	chain, err := os.ReadFile(filepath.Join(dir, "cert-chain.pem"))
	require.NoError(t, err)
	code, _, stderr := sendCmd(t, nil, "-source", "paypal", "-paypal-dev", dir, "-paypal-dev-env")
	require.Equal(t, 0, code, stderr)
	again, err := os.ReadFile(filepath.Join(dir, "cert-chain.pem"))
	require.NoError(t, err)
	assert.Equal(t, chain, again)
	info, err := os.Stat(filepath.Join(dir, "signing-key.pem"))
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o600), info.Mode().Perm(), "the key is the user's alone")
}

// What send cannot do for a source is refused with status 2 before
// anything is posted, naming the flag and what is wrong.
func TestSendRefusesWhatASourceCannotTake(t *testing.T) {
	t.Parallel()
	f := newFakeReceiver(t)
	dir := filepath.Join(t.TempDir(), "pp")
	env := map[string]string{"WEBHOOK_SOURCES": "gh:github,pp:paypal", "WEBHOOK_SECRETS_GH": "s", "WEBHOOK_SECRETS_PP": "WH1"}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"-source", "nowhere"}, "-source nowhere is not in $WEBHOOK_SOURCES: pass -scheme (stripe, standard, github, paypal)"},
		{[]string{"-source", "Bad/Name"}, `-source must be 1-32 of a-z, 0-9 and -, got "Bad/Name"`},
		{[]string{"-source", "gh", "-scheme", "adyen"}, `-scheme must be one of stripe, standard, github, paypal, got "adyen"`},
		{[]string{"-source", "gh", "-types", "ping"}, "-types makes the lifecycle of a Stripe PaymentIntent or a PayPal capture; a github source takes one event at a time"},
		{[]string{"-source", "gh", "-short"}, "-short is the seed's form of a Stripe event; a github source does not take it"},
		{[]string{"-source", "acme", "-scheme", "standard"}, "no secret: set WEBHOOK_SECRETS_ACME or pass -secret (or -unsigned)"},
		{[]string{"-source", "pp"}, "a PayPal source needs -paypal-dev DIR"},
		{[]string{"-source", "pp", "-paypal-dev", dir, "-type", "PAYMENT.SALE.COMPLETED"}, `-type: send makes the PayPal events PAYMENT.CAPTURE.COMPLETED, `},
		{[]string{"-source", "pp", "-paypal-dev", dir, "-types", "PAYMENT.CAPTURE.COMPLETED,charge.succeeded"}, `-types: unknown PayPal event type "charge.succeeded"`},
		{[]string{"-source", "pp", "-paypal-dev", dir, "-object", "CAP 1"}, "the PAYMENT.CAPTURE.COMPLETED event would be refused by the receiver (check -object, -amount, -currency): resource.id: "},
		{[]string{"-source", "gh", "-paypal-dev-env"}, "-paypal-dev-env is for a PayPal source; gh signs as github"},
		{[]string{"-source", "pp", "-paypal-dev", filepath.Join(t.TempDir(), "x"), "-paypal-cert-addr", "10.1.2.3:8443", "-paypal-dev-env"},
			`-paypal-cert-addr: the stand-in serves on a loopback address only, got "10.1.2.3:8443"`},
		{[]string{"-source", "gh", "-object", "x"}, "-object needs -types"},
	} {
		code, out, stderr := sendCmd(t, env, append([]string{"-url", f.srv.URL}, c.args...)...)
		assert.Equal(t, 2, code, "%v: %s", c.args, out)
		assert.Contains(t, stderr, "eventsctl send: "+c.want, "%v", c.args)
	}
	assert.Empty(t, f.posts(), "nothing posted")
}
