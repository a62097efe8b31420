package providertest_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotent-events/idempotent-events/pkg/internal/event"
	"github.com/idempotent-events/idempotent-events/pkg/internal/event/eventtest"
	"github.com/idempotent-events/idempotent-events/pkg/internal/provider"
	"github.com/idempotent-events/idempotent-events/pkg/internal/provider/github"
	"github.com/idempotent-events/idempotent-events/pkg/internal/provider/providertest"
	"github.com/idempotent-events/idempotent-events/pkg/internal/provider/standard"
	"github.com/idempotent-events/idempotent-events/pkg/internal/provider/stripe"
	"github.com/idempotent-events/idempotent-events/pkg/internal/webhook"
)

// recorder is a testing.TB that records failures instead of failing the
// test, so a test can see the suite fail. Everything else (Cleanup, Helper,
// Log) goes to the real test.
type recorder struct {
	testing.TB
	mu       sync.Mutex
	failures []string
}

func (r *recorder) Errorf(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.failures = append(r.failures, fmt.Sprintf(format, args...))
}
func (r *recorder) Error(args ...any) { r.Errorf("%s", fmt.Sprint(args...)) }
func (r *recorder) Fail()             { r.Errorf("Fail") }
func (r *recorder) FailNow()          { r.Fail(); runtime.Goexit() }
func (r *recorder) Fatalf(format string, args ...any) {
	r.Errorf(format, args...)
	runtime.Goexit()
}
func (r *recorder) Fatal(args ...any) { r.Error(args...); runtime.Goexit() }
func (r *recorder) Failed() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.failures) > 0
}

// runRecorded runs the suite on f with a recorder and returns what it
// reported. FailNow ends the goroutine, as it ends a test.
func runRecorded(t *testing.T, f providertest.Fixture) []string {
	r := &recorder{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		providertest.Run(r, f)
	}()
	<-done
	return r.failures
}

// failedCases returns the names of the cases that reported a failure (the
// text before the first ": " of each).
func failedCases(failures []string) map[string]bool {
	out := map[string]bool{}
	for _, f := range failures {
		name, _, _ := strings.Cut(strings.TrimSpace(f), ": ")
		out[name] = true
	}
	return out
}

func stripeFixture() providertest.Fixture {
	return providertest.Fixture{
		New:     func(_ testing.TB, secrets []string) provider.Provider { return stripe.New(secrets, 5*time.Minute) },
		Secrets: [3]string{"whsec_a", "whsec_b", "whsec_c"},
		Event: func(n int) ([]byte, string) {
			id := fmt.Sprintf("evt_self_%d", n)
			return eventtest.Payment(id), id
		},
		Sign: func(_ testing.TB, secret string, at time.Time, _ string, body []byte) http.Header {
			return stripe.Sign(secret, at, body)
		},
		Tolerance:     5 * time.Minute,
		SignedHeaders: []string{webhook.StripeHeader},
	}
}

// The recorder itself reports nothing for a provider that conforms, so
// what it reports below is the defect's.
func TestASoundProviderPassesUnderTheRecorder(t *testing.T) {
	t.Parallel()
	assert.Empty(t, runRecorded(t, stripeFixture()))
}

// skipsTimestamps is a Stripe provider whose verifier forgets the
// timestamp check: a replay from last week would pass.
type skipsTimestamps struct{ provider.Provider }

func (p skipsTimestamps) Verify(h http.Header, body []byte) (int, error) {
	i, err := p.Provider.Verify(h, body)
	if r := webhook.ReasonOf(err); r == webhook.ReasonStale || r == webhook.ReasonFuture {
		return 0, nil
	}
	return i, err
}

func TestTheSuiteFailsAVerifierThatSkipsTheTimestampCheck(t *testing.T) {
	t.Parallel()
	f := stripeFixture()
	f.New = func(_ testing.TB, secrets []string) provider.Provider {
		return skipsTimestamps{stripe.New(secrets, 5*time.Minute)}
	}
	failures := runRecorded(t, f)
	require.NotEmpty(t, failures)
	assert.Equal(t, map[string]bool{"stale and future timestamps are refused": true}, failedCases(failures))
	assert.Contains(t, strings.Join(failures, "\n"), "timestamp_too_old")
}

// acceptsAnything is a provider whose verifier checks nothing.
type acceptsAnything struct{ provider.Provider }

func (acceptsAnything) Verify(http.Header, []byte) (int, error) { return 0, nil }

func TestTheSuiteFailsAVerifierThatChecksNothing(t *testing.T) {
	t.Parallel()
	f := stripeFixture()
	f.New = func(_ testing.TB, secrets []string) provider.Provider {
		return acceptsAnything{stripe.New(secrets, 5*time.Minute)}
	}
	failed := failedCases(runRecorded(t, f))
	for _, c := range []string{"rotated secrets both verify, each with its index", "wrong secret is refused", "tampered body is refused",
		"tampered signed header is refused", "missing header is refused", "stale and future timestamps are refused"} {
		assert.True(t, failed[c], "the suite reports %q; it reported %v", c, failed)
	}
}

// lastIdentity is a Standard Webhooks provider that verifies the first
// webhook-id but takes the event id from the last one: a sender could sign
// one event and have another recorded.
type lastIdentity struct{ provider.Provider }

func (lastIdentity) Identify(h http.Header) webhook.Delivery {
	v := h.Values(webhook.StandardIDHeader)
	if len(v) == 0 {
		return webhook.Delivery{}
	}
	return webhook.Delivery{EventID: v[len(v)-1]}
}

func TestTheSuiteFailsAProviderThatIdentifiesByAnotherValueThanItVerified(t *testing.T) {
	t.Parallel()
	secrets := [3]string{"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "whsec_QUJDREVGR0hJSktMTU5PUA==", "whsec_enp6enp6enp6enp6enp6eno="}
	f := providertest.Fixture{
		New: func(t testing.TB, s []string) provider.Provider {
			p, err := standard.New(s, 5*time.Minute)
			require.NoError(t, err)
			return lastIdentity{p}
		},
		Secrets: secrets,
		Event: func(n int) ([]byte, string) {
			return []byte(`{"type":"a.b"}`), fmt.Sprintf("msg_%d", n)
		},
		Sign: func(_ testing.TB, secret string, at time.Time, id string, body []byte) http.Header {
			return standard.Sign(secret, id, at, body)
		},
		Tolerance:     5 * time.Minute,
		SignedHeaders: []string{webhook.StandardIDHeader, webhook.StandardTimestampHeader, webhook.StandardSignatureHeader},
	}
	failures := runRecorded(t, f)
	assert.Equal(t, map[string]bool{"duplicated header, the first value is the one verified and used": true}, failedCases(failures))
}

// batchOf is a provider that batches, for the suite's batch cases: a
// GitHub-signed {"events":[{"id":…,"type":…},…]}, each event published on
// its own and read by the worker as a GitHub event (id and type from the
// headers the receiver sets). dropBad makes it skip items it cannot read,
// as a careless Split would.
type batchOf struct {
	*github.Provider
	dropBad bool
}

func (batchOf) Identify(http.Header) webhook.Delivery { return webhook.Delivery{} }

func (b batchOf) Split(_ http.Header, body []byte) ([]provider.Item, error) {
	var w struct {
		Events []json.RawMessage `json:"events"`
	}
	if err := json.Unmarshal(body, &w); err != nil {
		return nil, &event.FieldError{Field: "body", Problem: "not a batch"}
	}
	var items []provider.Item
	for i, raw := range w.Events {
		var head struct{ ID, Type string }
		if err := json.Unmarshal(raw, &head); err != nil {
			return nil, &event.FieldError{Field: fmt.Sprintf("events[%d]", i), Problem: "not an object"}
		}
		if b.dropBad && strings.Contains(head.ID, " ") {
			continue
		}
		items = append(items, provider.Item{Delivery: webhook.Delivery{EventID: head.ID, Type: head.Type}, Body: raw,
			Path: fmt.Sprintf("events[%d]", i)})
	}
	return items, nil
}

func batchFixture(dropBad bool) providertest.Fixture {
	batchBody := func(ids []string, bad int) []byte {
		var parts []string
		for i, id := range ids {
			if i == bad {
				id = "not a valid id"
			}
			parts = append(parts, fmt.Sprintf(`{"id":%q,"type":"thing.happened"}`, id))
		}
		return []byte(`{"events":[` + strings.Join(parts, ",") + `]}`)
	}
	return providertest.Fixture{
		New: func(_ testing.TB, s []string) provider.Provider {
			return batchOf{Provider: github.New(s), dropBad: dropBad}
		},
		Secrets: [3]string{"s1", "s2", "s3"},
		Event: func(n int) ([]byte, string) {
			id := fmt.Sprintf("item-%d", n)
			return batchBody([]string{id}, -1), id
		},
		Sign: func(_ testing.TB, secret string, _ time.Time, _ string, body []byte) http.Header {
			h := http.Header{}
			h.Set(webhook.GitHubSignatureHeader, webhook.SignGitHub(secret, body))
			return h
		},
		SignedHeaders: []string{webhook.GitHubSignatureHeader},
		Batch: func(_ testing.TB, secret string, _ time.Time, ids []string, bad int) (http.Header, []byte, int) {
			body := batchBody(ids, bad)
			h := http.Header{}
			h.Set(webhook.GitHubSignatureHeader, webhook.SignGitHub(secret, body))
			return h, body, http.StatusBadRequest
		},
	}
}

// A batching provider passes the suite, batch cases included...
func TestABatchingProviderPasses(t *testing.T) {
	t.Parallel()
	providertest.Run(t, batchFixture(false))
}

// ...and one that drops the items it cannot read (publishing the rest of a
// delivery PayPal-style providers would resend whole) fails it.
func TestTheSuiteFailsASplitThatDropsABadItem(t *testing.T) {
	t.Parallel()
	failures := runRecorded(t, batchFixture(true))
	assert.Equal(t, map[string]bool{"batch with one bad item publishes nothing": true}, failedCases(failures))
}
