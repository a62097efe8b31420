package reconcile_test

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/stripe/stripe-go/v82"

	"github.com/idempotent-events/idempotent-events/pkg/internal/reconcile"
)

// The contract with Stripe's API: stripe-mock serves it from Stripe's
// OpenAPI spec and answers 400 to a request whose parameters the spec does
// not allow (an unknown name, a string where an integer goes). Every shape
// of GET /v1/events that StripeLog.Page sends is made against it, so a
// stripe-go upgrade that encodes the listing differently fails here rather
// than against Stripe. stripe-mock is pinned by hack/tools/stripe-mock and
// built into bin/ by hack/stripe-mock.sh.

// stripeMockBin is $STRIPE_MOCK_BIN or the repository's bin/stripe-mock.
// Missing, it fails the test in CI and skips it elsewhere.
func stripeMockBin(t *testing.T) string {
	t.Helper()
	bin := os.Getenv("STRIPE_MOCK_BIN")
	if bin == "" {
		bin = "../../../bin/stripe-mock"
	}
	bin, err := filepath.Abs(bin)
	require.NoError(t, err)
	if fi, err := os.Stat(bin); err != nil || fi.IsDir() || fi.Mode()&0o111 == 0 {
		msg := fmt.Sprintf("stripe-mock is not at %s (STRIPE_MOCK_BIN or bin/stripe-mock): run hack/stripe-mock.sh (make test-go and make check do)", bin)
		if os.Getenv("CI") != "" {
			t.Fatal(msg)
		}
		t.Skip("SKIPPED: " + msg)
	}
	return bin
}

var listening = regexp.MustCompile(`Listening for HTTP at address: (127\.0\.0\.1:\d+)`)

// startStripeMock runs stripe-mock on loopback ports the system chooses
// (HTTPS too: it would otherwise take 12112 on every interface) and returns
// its HTTP base URL. Its output goes to a file, read for the port; the
// process is killed and waited for when the test ends.
func startStripeMock(t *testing.T) string {
	t.Helper()
	bin := stripeMockBin(t)
	logPath := filepath.Join(t.TempDir(), "stripe-mock.log")
	logFile, err := os.Create(logPath)
	require.NoError(t, err)
	cmd := exec.Command(bin, "-http-addr", "127.0.0.1:0", "-https-addr", "127.0.0.1:0")
	cmd.Stdout, cmd.Stderr = logFile, logFile
	require.NoError(t, cmd.Start(), "start %s", bin)
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		_ = logFile.Close()
	})
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		out, err := os.ReadFile(logPath)
		require.NoError(c, err)
		assert.Regexp(c, listening, string(out), "stripe-mock's output")
	}, 30*time.Second, 20*time.Millisecond, "stripe-mock did not start listening")
	out, err := os.ReadFile(logPath)
	require.NoError(t, err)
	return "http://" + string(listening.FindSubmatch(out)[1])
}

// wire is the HTTP client's transport: it records each request's query
// and, when spoil is set, changes it before it is sent.
type wire struct {
	spoil func(url.Values)

	mu      sync.Mutex
	queries []url.Values
}

func (w *wire) RoundTrip(r *http.Request) (*http.Response, error) {
	q := r.URL.Query()
	if w.spoil != nil {
		r = r.Clone(r.Context())
		w.spoil(q)
		r.URL.RawQuery = q.Encode()
	}
	w.mu.Lock()
	w.queries = append(w.queries, q)
	w.mu.Unlock()
	return http.DefaultTransport.RoundTrip(r)
}

func (w *wire) sent(t *testing.T) url.Values {
	t.Helper()
	w.mu.Lock()
	defer w.mu.Unlock()
	require.Len(t, w.queries, 1, "requests sent")
	return w.queries[0]
}

// stripeMockLog is a StripeLog as eventsctl builds it, pointed at
// stripe-mock through w; MaxWait is short so that a 5xx fails the test
// quickly instead of being retried for minutes.
func stripeMockLog(base string, w *wire) *reconcile.StripeLog {
	return reconcile.NewStripeLog(reconcile.StripeOptions{
		APIKey:     "sk_test_123",
		URL:        base,
		MaxWait:    5 * time.Second,
		HTTPClient: &http.Client{Transport: w, Timeout: 30 * time.Second},
	})
}

func window() (from, to time.Time) {
	to = time.Now().Truncate(time.Second)
	return to.Add(-reconcile.MaxWindow), to
}

func TestStripeMockAcceptsEveryRequestTheReconcilerSends(t *testing.T) {
	t.Parallel()
	base := startStripeMock(t)
	from, to := window()
	var twenty []string
	for _, obj := range []string{"charge", "payment_intent", "invoice", "customer.subscription"} {
		for _, what := range []string{"created", "updated", "succeeded", "failed", "canceled"} {
			twenty = append(twenty, obj+"."+what)
		}
	}
	typeKeys := func(n int) []string {
		var keys []string
		for i := range n {
			keys = append(keys, fmt.Sprintf("types[%d]", i))
		}
		return keys
	}
	windowKeys := []string{"created[gte]", "created[lte]", "limit"}
	for _, c := range []struct {
		name string
		q    reconcile.PageQuery
		// keys are the query parameters the request must carry.
		keys []string
	}{
		{"window", reconcile.PageQuery{From: from, To: to}, windowKeys},
		{"after", reconcile.PageQuery{From: from, To: to, After: "evt_1PgafmB7WZ01zgkWfUBzqCyY"},
			slices.Concat(windowKeys, []string{"starting_after"})},
		{"one type", reconcile.PageQuery{From: from, To: to, Types: []string{"payment_intent.succeeded"}},
			slices.Concat(windowKeys, typeKeys(1))},
		{"twenty types", reconcile.PageQuery{From: from, To: to, Types: twenty},
			slices.Concat(windowKeys, typeKeys(20))},
		{"undelivered only", reconcile.PageQuery{From: from, To: to, UndeliveredOnly: true},
			slices.Concat(windowKeys, []string{"delivery_success"})},
		{"small limit", reconcile.PageQuery{From: from, To: to, Limit: 3}, windowKeys},
		{"all at once", reconcile.PageQuery{From: from, To: to, After: "evt_1PgafmB7WZ01zgkWfUBzqCyY", Types: twenty, UndeliveredOnly: true, Limit: 3},
			slices.Concat(windowKeys, []string{"starting_after", "delivery_success"}, typeKeys(20))},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			w := &wire{}
			log := stripeMockLog(base, w)
			page, err := log.Page(context.Background(), c.q)
			require.NoError(t, err, "stripe-mock refused %v", w.queries)
			assert.Equal(t, 1, log.Calls, "one request, no retries")

			sent := w.sent(t)
			assert.ElementsMatch(t, c.keys, slices.Collect(maps.Keys(sent)), "parameters sent: %v", sent)
			assert.Equal(t, fmt.Sprint(from.Unix()), sent.Get("created[gte]"))
			assert.Equal(t, fmt.Sprint(to.Unix()), sent.Get("created[lte]"))

			require.NotEmpty(t, page.Events)
			limit := c.q.Limit
			if limit == 0 {
				limit = reconcile.PageSize
			}
			assert.LessOrEqual(t, len(page.Events), limit)
			for _, e := range page.Events {
				assert.True(t, strings.HasPrefix(e.ID, "evt_"), "id %q", e.ID)
				assert.NotEmpty(t, e.Type)
				assert.False(t, e.Created.IsZero())
				var obj struct {
					Object string `json:"object"`
				}
				require.NoError(t, json.Unmarshal(e.Raw, &obj))
				assert.Equal(t, "event", obj.Object)
			}
		})
	}
}

// The negative control: the same StripeLog with one parameter spoiled on
// the wire gets stripe-mock's 400, so the test above would see a request
// shape Stripe does not accept.
func TestStripeMockRefusesWhatStripeWouldRefuse(t *testing.T) {
	t.Parallel()
	base := startStripeMock(t)
	from, to := window()
	for _, c := range []struct {
		name  string
		spoil func(url.Values)
	}{
		{"unknown parameter", func(q url.Values) { q.Set("delivered", "false") }},
		{"non-integer created", func(q url.Values) { q.Set("created[gte]", "yesterday") }},
		{"non-boolean delivery_success", func(q url.Values) { q.Set("delivery_success", "no") }},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			w := &wire{spoil: c.spoil}
			log := stripeMockLog(base, w)
			_, err := log.Page(context.Background(), reconcile.PageQuery{From: from, To: to, UndeliveredOnly: true})
			require.Error(t, err, "stripe-mock accepted %v", w.queries)
			var se *stripe.Error
			require.ErrorAs(t, err, &se, "a Stripe API error")
			assert.Equal(t, http.StatusBadRequest, se.HTTPStatusCode)
			assert.Equal(t, stripe.ErrorTypeInvalidRequest, se.Type)
			assert.Contains(t, se.Msg, "Request validation error")
			assert.Equal(t, 1, log.Calls, "a refused parameter is not retried")
		})
	}
}
