package receiver_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotent-events/idempotent-events/pkg/internal/broker"
	"github.com/idempotent-events/idempotent-events/pkg/internal/config"
	"github.com/idempotent-events/idempotent-events/pkg/internal/event"
	"github.com/idempotent-events/idempotent-events/pkg/internal/provider"
	"github.com/idempotent-events/idempotent-events/pkg/internal/provider/github"
	"github.com/idempotent-events/idempotent-events/pkg/internal/receiver"
	"github.com/idempotent-events/idempotent-events/pkg/internal/store"
	"github.com/idempotent-events/idempotent-events/pkg/internal/webhook"
)

// unavailableVerifier cannot check signatures for now, as PayPal's
// provider when PayPal's certificate host is down.
type unavailableVerifier struct{}

func (unavailableVerifier) Verify(http.Header, []byte) (int, error) {
	return -1, &webhook.Error{Reason: webhook.ReasonUnavailable, Detail: "the certificate host answered 503"}
}
func (unavailableVerifier) Scheme() string { return webhook.SchemeStandard }

// A signature that cannot be checked for now is our outage, not a bad
// request: 503 with Retry-After, so the provider retries; nothing is
// published.
func TestAVerificationOutageIsAnswered503(t *testing.T) {
	t.Parallel()
	f := start(t, setup{sources: []receiver.Source{{Name: "pp", Route: "/webhooks/pp", Scheme: webhook.SchemeStandard, Verifier: unavailableVerifier{}}}})
	r := f.postTo(t, "/webhooks/pp", []byte(`{"type":"a"}`), map[string]string{"Content-Type": "application/json", webhook.StandardIDHeader: "msg_1"})
	assert.Equal(t, http.StatusServiceUnavailable, r.code)
	assert.Equal(t, "7", r.header.Get("Retry-After"))
	assert.Equal(t, "verification_unavailable", r.body["error"])
	assert.Equal(t, 0, f.broker.Depth(broker.MainQueue))
}

// items is a provider that batches: a GitHub-signed {"events":[{"id":…,
// "type":…},…]}, each event published on its own.
type items struct{ *github.Provider }

func (items) Identify(http.Header) webhook.Delivery { return webhook.Delivery{} }

func (items) Split(_ http.Header, body []byte) ([]provider.Item, error) {
	var w struct{ Events []json.RawMessage }
	if err := json.Unmarshal(body, &w); err != nil {
		return nil, &event.FieldError{Field: "body", Problem: "not a batch"}
	}
	out := make([]provider.Item, len(w.Events))
	for i, raw := range w.Events {
		var head struct{ ID, Type string }
		_ = json.Unmarshal(raw, &head)
		out[i] = provider.Item{Delivery: webhook.Delivery{EventID: head.ID, Type: head.Type}, Body: raw, Path: fmt.Sprintf("events[%d]", i)}
	}
	return out, nil
}

func batchOf(ids ...string) []byte {
	var parts []string
	for _, id := range ids {
		parts = append(parts, fmt.Sprintf(`{"id":%q,"type":"thing.done"}`, id))
	}
	return []byte(`{"events":[` + strings.Join(parts, ",") + `]}`)
}

// failingAt confirms every publish but the nth, as a broker that dies in
// the middle of a batch.
type failingAt struct {
	mu        sync.Mutex
	n, calls  int
	published []string
}

func (p *failingAt) Publish(_ context.Context, _, _ string, msg amqp.Publishing) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.calls++
	if p.calls == p.n {
		return errors.New("connection lost")
	}
	p.published = append(p.published, msg.MessageId)
	return nil
}
func (*failingAt) Ready() bool { return true }

// postBatch posts body with hdr and returns the status and the answer,
// whose event_ids is a list.
func postBatch(t *testing.T, f *fixture, body []byte, hdr map[string]string) (int, map[string]any) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, f.url+"/webhooks/b", bytes.NewReader(body))
	require.NoError(t, err)
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := client.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	var a map[string]any
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&a))
	return resp.StatusCode, a
}

// A batch is answered 2xx only once every event in it is confirmed: a
// publish failing in the middle is a 503 for the whole delivery, which the
// provider sends again (the events confirmed before are duplicates then).
func TestABatchIsAcceptedOnlyWhenEveryEventIsConfirmed(t *testing.T) {
	t.Parallel()
	pub := &failingAt{n: 2}
	src := receiver.Source{Name: "b", Route: "/webhooks/b", Provider: items{github.New([]string{"s"})}}
	src.Verifier = src.Provider
	f := start(t, setup{publisher: pub, sources: []receiver.Source{src}})
	body := batchOf("e1", "e2", "e3")
	hdr := map[string]string{"Content-Type": "application/json", webhook.GitHubSignatureHeader: webhook.SignGitHub("s", body)}
	code, a := postBatch(t, f, body, hdr)
	assert.Equal(t, http.StatusServiceUnavailable, code, "%v", a)
	assert.Equal(t, "broker_unavailable", a["error"])
	assert.Equal(t, []string{"b:e1"}, pub.published, "the publishing stopped at the failure")

	code, a = postBatch(t, f, body, hdr)
	assert.Equal(t, http.StatusAccepted, code, "%v", a)
	assert.Equal(t, []any{"e1", "e2", "e3"}, a["event_ids"])
	assert.Equal(t, []string{"b:e1", "b:e1", "b:e2", "b:e3"}, pub.published, "the resend publishes every event")
}

// A batch with one event that does not decode publishes none, and the
// answer names the item's field.
func TestABatchWithABadEventPublishesNothing(t *testing.T) {
	t.Parallel()
	src := receiver.Source{Name: "b", Route: "/webhooks/b", Provider: items{github.New([]string{"s"})}}
	src.Verifier = src.Provider
	f := start(t, setup{sources: []receiver.Source{src}})
	body := batchOf("e1", "not valid", "e3")
	r := f.postTo(t, "/webhooks/b", body, map[string]string{"Content-Type": "application/json", webhook.GitHubSignatureHeader: webhook.SignGitHub("s", body)})
	assert.Equal(t, http.StatusBadRequest, r.code)
	assert.Equal(t, "events[1].X-GitHub-Delivery", r.body["field"])
	assert.Equal(t, 0, f.broker.Depth(broker.MainQueue))
}

// A source given only a scheme is served by the registry's provider of
// it; an unknown scheme is refused by NewHandler, naming the source.
func TestSourcesNeedAKnownScheme(t *testing.T) {
	t.Parallel()
	_, err := receiver.NewHandler(receiver.Options{
		Sources:   []receiver.Source{{Name: "x", Route: "/webhooks/x", Scheme: "soap"}},
		Publisher: &failingAt{}, MaxBodyBytes: 1, PublishTimeout: time.Second, RetryAfter: time.Second, MaxInFlight: 1,
		Metrics: receiver.NewMetrics(prometheus.NewRegistry()),
	})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "Sources[0].Scheme")
}

// SourcesOf builds every configured source with its provider, and reports
// every setting a provider refuses, naming its variable.
func TestSourcesOfConfiguration(t *testing.T) {
	t.Parallel()
	cfg := config.Receiver{WebhookSecrets: []string{"whsec_x"}, WebhookTolerance: 5 * time.Minute,
		PayPalCertHosts: []string{"api.paypal.com"},
		Sources: []config.Source{
			{Name: "acme", Scheme: "standard", Secrets: []string{"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"}, SecretsVar: "WEBHOOK_SECRETS_ACME"},
			{Name: "pp", Scheme: "paypal", Secrets: []string{"8PT597110X687430LKGECATA"}, SecretsVar: "WEBHOOK_SECRETS_PP"},
		}}
	sources, err := receiver.SourcesOf(cfg)
	require.NoError(t, err)
	var got []string
	for _, s := range sources {
		got = append(got, s.Name+" "+s.Route+" "+s.Scheme)
		assert.NotNil(t, s.Verifier, s.Name)
	}
	assert.Equal(t, []string{"stripe /webhooks/payment stripe", "acme /webhooks/acme standard", "pp /webhooks/pp paypal"}, got)

	cfg.PayPalCAFile = "/nonexistent/ca.pem"
	cfg.Sources = append(cfg.Sources,
		config.Source{Name: "bad", Scheme: "standard", Secrets: []string{"not base64!"}, SecretsVar: "WEBHOOK_SECRETS_BAD"},
		config.Source{Name: "soap", Scheme: "soap", Secrets: []string{"s"}, SecretsVar: "WEBHOOK_SECRETS_SOAP"})
	_, err = receiver.SourcesOf(cfg)
	var cerr *config.Error
	require.ErrorAs(t, err, &cerr)
	var vars []string
	for _, p := range cerr.Problems {
		vars = append(vars, p.Var)
	}
	assert.ElementsMatch(t, []string{"PAYPAL_CA_FILE", "WEBHOOK_SECRETS_BAD", "WEBHOOK_SOURCES"}, vars, err.Error())
	assert.NotContains(t, err.Error(), "not base64!")
}

// A batch whose events are all committed is a duplicate and publishes
// nothing; one whose event id was committed with other content is
// published for event_conflicts beside the new ones, and the batch is
// accepted all the same.
func TestCommittedEventsOfABatchAreNotPublishedAgain(t *testing.T) {
	t.Parallel()
	src := receiver.Source{Name: "b", Route: "/webhooks/b", Provider: items{github.New([]string{"s"})}}
	src.Verifier = src.Provider
	f := start(t, setup{dupCheck: true, sources: []receiver.Source{src}})
	for _, id := range []string{"e1", "e2"} {
		ev, err := event.DecodeGitHub(id, "thing.done", []byte(fmt.Sprintf(`{"id":%q,"type":"thing.done"}`, id)))
		require.NoError(t, err)
		ev.ID = event.Key("b", id)
		_, err = f.store.Commit(context.Background(), []store.Record{{Event: ev, Source: "b", PayloadSHA256: ev.Digest[:]}}, nil)
		require.NoError(t, err)
	}
	sign := func(body []byte) map[string]string {
		return map[string]string{"Content-Type": "application/json", webhook.GitHubSignatureHeader: webhook.SignGitHub("s", body)}
	}

	body := batchOf("e1", "e2")
	code, a := postBatch(t, f, body, sign(body))
	assert.Equal(t, http.StatusOK, code, "%v", a)
	assert.Equal(t, "duplicate", a["status"])
	assert.Equal(t, 0, f.broker.Depth(broker.MainQueue))

	body = []byte(`{"events":[{"id":"e1","type":"thing.done"},{"id":"e2","type":"thing.done","changed":true},{"id":"e3","type":"thing.done"}]}`)
	code, a = postBatch(t, f, body, sign(body))
	assert.Equal(t, http.StatusAccepted, code, "%v", a)
	assert.Equal(t, []any{"e1", "e2", "e3"}, a["event_ids"])
	var published []string
	for _, d := range f.broker.Drain(broker.MainQueue) {
		published = append(published, d.MessageId)
	}
	assert.Equal(t, []string{"b:e2", "b:e3"}, published, "the conflicting event (for event_conflicts) and the new one")
}
