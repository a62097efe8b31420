// Package providertest is the conformance suite every webhook provider
// passes (as watermill's pub/sub tests and river's driver tests are for
// theirs): one contract, one suite, run by each provider's own test:
//
//	func TestConformance(t *testing.T) { providertest.Run(t, fixture) }
//
// The suite drives the provider through the real receiver handler, which
// publishes to a real RabbitMQ vhost of its own, and checks the documented
// answers: 202 for a valid delivery (published as the worker reads it, the
// worker's event.Parse agreeing with the provider's Decode), either of two
// rotated secrets verifying with its index, and 401 for a wrong secret, a
// tampered body, a tampered or missing signed header, a duplicated header
// whose first value is not the signed one, and timestamps beyond the
// tolerance both ways (where the scheme signs one); 400 naming the header
// for a missing identity header and naming the body for a body that is not
// JSON; 413 and 415; and for a provider that batches, a batch with one bad
// item refused whole. After every refused request the queue is empty.
//
// Run takes a testing.TB, so a test can run it against a broken provider
// with a recording TB and see it fail (providertest_test.go does).
package providertest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"

	"github.com/idempotent-events/idempotent-events/pkg/internal/broker"
	"github.com/idempotent-events/idempotent-events/pkg/internal/event"
	"github.com/idempotent-events/idempotent-events/pkg/internal/provider"
	"github.com/idempotent-events/idempotent-events/pkg/internal/receiver"
	"github.com/idempotent-events/idempotent-events/pkg/internal/servicetest"
	"github.com/idempotent-events/idempotent-events/pkg/internal/webhook"
)

// Fixture is what the suite needs to know of a provider.
type Fixture struct {
	// New builds the provider under test for secrets, with Tolerance.
	New func(t testing.TB, secrets []string) provider.Provider
	// Secrets are three distinct secrets of the provider's form. The
	// suite configures the first two (the second as the one a rotation
	// retires) and signs with the third as a wrong one.
	Secrets [3]string
	// Event returns a valid event body, different for every n, and the
	// provider's id of that event.
	Event func(n int) (body []byte, id string)
	// Sign returns the headers (without Content-Type) of a delivery of
	// body, whose event id is id, signed with secret at time at, as the
	// provider sends it.
	Sign func(t testing.TB, secret string, at time.Time, id string, body []byte) http.Header
	// Tolerance is the provider's bound on signed timestamps; 0 for a
	// scheme that signs no timestamp (the timestamp cases are skipped).
	Tolerance time.Duration
	// SignedHeaders are the headers that carry the signature or that it
	// covers: changing one is refused 401, and so is leaving one out.
	SignedHeaders []string
	// IdentityHeaders are unsigned headers that identify the event: leaving
	// one out is refused 400 naming it.
	IdentityHeaders []string
	// Batch, for a provider that batches, returns a delivery of the events
	// ids signed with secret at at, item bad made invalid (-1 for none),
	// and the status a delivery with that bad item is refused with.
	Batch func(t testing.TB, secret string, at time.Time, ids []string, bad int) (h http.Header, body []byte, refused int)
}

// Source is the name of the source the suite serves the provider as, on
// Route: events are published under the key "conformance:<id>".
const (
	Source = "conformance"
	Route  = "/webhooks/" + Source
)

// maxBody is the receiver's body limit in the suite: small, so a body one
// byte over it is still written whole before the receiver answers 413 and
// closes the connection.
const maxBody = 8 << 10

type env struct {
	f      Fixture
	p      provider.Provider
	url    string
	broker *servicetest.Broker
	n      int
}

type testCase struct {
	name    string
	applies func(Fixture) string // "" when it applies, else why not
	run     func(t testing.TB, e *env)
}

var cases = []testCase{
	{"valid delivery is published as the worker reads it", always, valid},
	{"rotated secrets both verify, each with its index", always, rotation},
	{"wrong secret is refused", always, wrongSecret},
	{"tampered body is refused", always, tamperedBody},
	{"tampered signed header is refused", always, tamperedHeaders},
	{"missing header is refused", always, missingHeaders},
	{"duplicated header, the first value is the one verified and used", always, duplicatedHeaders},
	{"stale and future timestamps are refused", timestamped, timestamps},
	{"oversized body is refused", always, oversized},
	{"body that is not JSON is refused", always, notJSON},
	{"batch with one bad item publishes nothing", batches, batch},
}

func always(Fixture) string { return "" }

func timestamped(f Fixture) string {
	if f.Tolerance == 0 {
		return "the scheme signs no timestamp"
	}
	return ""
}

func batches(f Fixture) string {
	if f.Batch == nil {
		return "the provider does not batch"
	}
	return ""
}

// Run runs the suite against the provider f describes. With a *testing.T
// each case is a subtest (one that does not apply is skipped, and says
// why); with another testing.TB the cases run in turn, each failure
// prefixed with its case.
func Run(t testing.TB, f Fixture) {
	t.Helper()
	require.NotNil(t, f.New, "Fixture.New")
	require.NotNil(t, f.Event, "Fixture.Event")
	require.NotNil(t, f.Sign, "Fixture.Sign")
	require.NotEmpty(t, f.SignedHeaders, "Fixture.SignedHeaders")
	e := start(t, f)
	for _, c := range cases {
		why := c.applies(f)
		if tt, ok := t.(*testing.T); ok {
			tt.Run(c.name, func(t *testing.T) {
				if why != "" {
					t.Skip(why)
				}
				c.run(t, e)
			})
			continue
		}
		if why == "" {
			c.run(named{TB: t, name: c.name}, e)
		}
	}
}

// named prefixes a case's failures with its name.
type named struct {
	testing.TB
	name string
}

func (n named) Errorf(format string, args ...any) { n.TB.Errorf(n.name+": "+format, args...) }

// start serves the provider (secrets 0 and 1) on Route through a receiver
// handler that publishes to a vhost of the test's own.
func start(t testing.TB, f Fixture) *env {
	t.Helper()
	topo := broker.Topology{QueueType: broker.QueueClassic, RetryDelays: []time.Duration{time.Second}, DeliveryLimit: 100}
	amqpURL := servicetest.VHost(t)
	e := &env{f: f, p: f.New(t, f.Secrets[:2]), broker: servicetest.NewBroker(t, amqpURL, topo)}
	pub := &broker.Publisher{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		d := broker.Dialer{URL: amqpURL, Name: "providertest", MaxBackoff: 200 * time.Millisecond, DialTimeout: time.Second}
		_ = broker.Supervise(ctx, d, zap.NewNop(), func(bool) {}, func(ctx context.Context, conn *amqp.Connection) error {
			if err := topo.DeclareOn(conn); err != nil {
				return err
			}
			return pub.Serve(ctx, conn, 1)
		})
	}()
	t.Cleanup(func() { cancel(); <-done })
	require.Eventually(t, pub.Ready, 10*time.Second, 10*time.Millisecond, "the publisher connects")
	h, err := receiver.NewHandler(receiver.Options{
		Sources:        []receiver.Source{{Name: Source, Route: Route, Provider: e.p, Verifier: e.p}},
		Publisher:      pub,
		MaxBodyBytes:   maxBody,
		PublishTimeout: 5 * time.Second,
		RetryAfter:     time.Second,
		MaxInFlight:    16,
		Metrics:        receiver.NewMetrics(prometheus.NewRegistry()),
	})
	require.NoError(t, err)
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	e.url = srv.URL + Route
	return e
}

// next returns a new event of the fixture's.
func (e *env) next() ([]byte, string) {
	e.n++
	return e.f.Event(e.n)
}

// signed returns the headers of body signed with secret i at at.
func (e *env) signed(t testing.TB, i int, at time.Time, id string, body []byte) http.Header {
	h := e.f.Sign(t, e.f.Secrets[i], at, id, body)
	h.Set("Content-Type", "application/json")
	return h
}

type answer struct {
	code int
	body map[string]any
}

func (a answer) String() string { return fmt.Sprintf("%d %v", a.code, a.body) }

func (a answer) field(k string) string {
	s, _ := a.body[k].(string)
	return s
}

// post sends body with h; chunked sends it without a Content-Length.
func (e *env) post(t testing.TB, h http.Header, body []byte, chunked bool) answer {
	var r io.Reader = bytes.NewReader(body)
	if chunked {
		r = io.MultiReader(r) // hides the length: Transfer-Encoding chunked
	}
	req, err := http.NewRequest(http.MethodPost, e.url, r)
	require.NoError(t, err)
	req.Header = h.Clone()
	resp, err := (&http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}).Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	a := answer{code: resp.StatusCode}
	assert.NoError(t, json.Unmarshal(raw, &a.body), "the answer is JSON: %s", raw)
	return a
}

// refused posts and checks the answer's code (and error, unless ""), and
// that nothing was published.
func (e *env) refused(t testing.TB, what string, h http.Header, body []byte, code int, reason string) {
	a := e.post(t, h, body, false)
	e.checkRefused(t, what, a, code, reason)
}

func (e *env) checkRefused(t testing.TB, what string, a answer, code int, reason string) {
	assert.Equal(t, code, a.code, "%s: answer %s", what, a)
	if reason != "" {
		assert.Equal(t, reason, a.field("error"), "%s: answer %s", what, a)
	}
	if n := e.broker.Depth(broker.MainQueue); n != 0 {
		assert.Fail(t, "a refused request was published", "%s: %d message(s) in the queue", what, n)
		e.broker.Drain(broker.MainQueue)
	}
}

// accepted checks a 202 for the event id and that the one message
// published is that event, as the worker will read it.
func (e *env) accepted(t testing.TB, what string, a answer, h http.Header, body []byte, id string) {
	if !assert.Equal(t, http.StatusAccepted, a.code, "%s: answer %s", what, a) {
		e.broker.Drain(broker.MainQueue)
		return
	}
	if _, batched := e.p.(provider.Splitter); batched {
		assert.Equal(t, []any{id}, a.body["event_ids"], "%s: the answer names the event", what)
	} else {
		assert.Equal(t, id, a.field("event_id"), "%s: the answer names the event", what)
	}
	msgs := e.broker.Drain(broker.MainQueue)
	if !assert.Len(t, msgs, 1, "%s: one message published", what) {
		return
	}
	item := provider.Item{Delivery: e.p.Identify(h), Body: body}
	if sp, batched := e.p.(provider.Splitter); batched {
		items, err := sp.Split(h, body)
		if !assert.NoError(t, err, "%s: Split", what) || !assert.Len(t, items, 1, "%s: Split", what) { //nolint:testifylint // a recording testing.TB: report and go on
			return
		}
		item = items[0]
	}
	e.published(t, what, msgs[0], item.Delivery, item.Body, id)
}

// published checks that d is the event id, body (an item's, for a batch),
// keyed and labelled so the worker reads it as the provider decodes it.
func (e *env) published(t testing.TB, what string, d amqp.Delivery, dl webhook.Delivery, body []byte, id string) {
	assert.Equal(t, event.Key(Source, id), d.MessageId, "%s: the dedupe key is (source, event id)", what)
	assert.Equal(t, body, d.Body, "%s: the body is published as signed", what)
	assert.Equal(t, Source, d.Headers[broker.HeaderSource], what)
	scheme := broker.String(d.Headers, broker.HeaderScheme)
	if e.p.Scheme() == event.DefaultScheme {
		assert.Empty(t, scheme, "%s: the default scheme is published without one", what)
	} else {
		assert.Equal(t, e.p.Scheme(), scheme, "%s: the scheme is published", what)
	}
	decoded, err := e.p.Decode(dl, body)
	if !assert.NoError(t, err, "%s: Decode", what) { //nolint:testifylint // the suite's own tests run it on a recording testing.TB: it reports and goes on
		return
	}
	got, err := event.Parse(scheme, broker.String(d.Headers, broker.HeaderEventID), broker.String(d.Headers, broker.HeaderEventType), d.Body)
	if assert.NoError(t, err, "%s: the worker decodes the message", what) {
		assert.Equal(t, decoded, got, "%s: the worker reads the event as the provider decodes it", what)
	}
	assert.Equal(t, id, decoded.ID, "%s: Decode names the event", what)
	assert.NotEmpty(t, decoded.Type, "%s: Decode gives the event a type", what)
	assert.Equal(t, decoded.DigestHex(), broker.String(d.Headers, broker.HeaderDigest), "%s: the digest header is the event's", what)
}

func valid(t testing.TB, e *env) {
	body, id := e.next()
	h := e.signed(t, 0, time.Now(), id, body)
	e.accepted(t, "valid delivery", e.post(t, h, body, false), h, body, id)
	// Once more, without a Content-Length.
	body, id = e.next()
	h = e.signed(t, 0, time.Now(), id, body)
	e.accepted(t, "valid chunked delivery", e.post(t, h, body, true), h, body, id)
}

func rotation(t testing.TB, e *env) {
	for i := range 2 {
		body, id := e.next()
		h := e.signed(t, i, time.Now(), id, body)
		idx, err := e.p.Verify(h, body)
		if assert.NoError(t, err, "signed with secret %d", i) {
			assert.Equal(t, i, idx, "Verify reports the secret that matched")
		}
		e.accepted(t, "signed with secret "+strconv.Itoa(i), e.post(t, h, body, false), h, body, id)
	}
}

func wrongSecret(t testing.TB, e *env) {
	body, id := e.next()
	h := e.signed(t, 2, time.Now(), id, body)
	_, err := e.p.Verify(h, body)
	assert.Equal(t, webhook.ReasonMismatch, webhook.ReasonOf(err), "Verify of a wrong secret's signature: %v", err)
	e.refused(t, "wrong secret", h, body, http.StatusUnauthorized, string(webhook.ReasonMismatch))
}

func tamperedBody(t testing.TB, e *env) {
	body, id := e.next()
	h := e.signed(t, 0, time.Now(), id, body)
	e.refused(t, "a character of the body changed", h, Tamper(body), http.StatusUnauthorized, string(webhook.ReasonMismatch))
	e.refused(t, "a space added to the body", h, append(append([]byte(nil), body...), ' '), http.StatusUnauthorized, string(webhook.ReasonMismatch))
}

func tamperedHeaders(t testing.TB, e *env) {
	for _, name := range e.f.SignedHeaders {
		body, id := e.next()
		h := e.signed(t, 0, time.Now(), id, body)
		require.NotEmpty(t, h.Get(name), "Fixture.Sign sets %s", name)
		h.Set(name, string(Tamper([]byte(h.Get(name)))))
		e.refused(t, name+" changed", h, body, http.StatusUnauthorized, "")
	}
}

func missingHeaders(t testing.TB, e *env) {
	for _, name := range e.f.SignedHeaders {
		body, id := e.next()
		h := e.signed(t, 0, time.Now(), id, body)
		h.Del(name)
		e.refused(t, "no "+name, h, body, http.StatusUnauthorized, string(webhook.ReasonMissing))
	}
	for _, name := range e.f.IdentityHeaders {
		body, id := e.next()
		h := e.signed(t, 0, time.Now(), id, body)
		h.Del(name)
		a := e.post(t, h, body, false)
		e.checkRefused(t, "no "+name, a, http.StatusBadRequest, "invalid_event")
		assert.Equal(t, name, a.field("field"), "no %s: the answer names the header", name)
	}
}

// duplicatedHeaders sends each header twice. Go (like most servers) keeps
// both values and Get reads the first, so the first is what must be
// verified and used: a forged first value with the genuine one after it is
// refused, and a genuine first value is accepted as the event it signs.
func duplicatedHeaders(t testing.TB, e *env) {
	for _, name := range e.f.SignedHeaders {
		body, id := e.next()
		h := e.signed(t, 0, time.Now(), id, body)
		v := h.Get(name)
		h[http.CanonicalHeaderKey(name)] = []string{string(Tamper([]byte(v))), v}
		e.refused(t, name+" twice, a forged value first", h, body, http.StatusUnauthorized, "")

		h[http.CanonicalHeaderKey(name)] = []string{v, string(Tamper([]byte(v)))}
		a := e.post(t, h, body, false)
		if a.code == http.StatusAccepted {
			e.accepted(t, name+" twice, the genuine value first", a, h, body, id)
		} else {
			e.checkRefused(t, name+" twice, the genuine value first", a, a.code, "")
		}
	}
	for _, name := range e.f.IdentityHeaders {
		body, id := e.next()
		h := e.signed(t, 0, time.Now(), id, body)
		v := h.Get(name)
		h[http.CanonicalHeaderKey(name)] = []string{v, string(Tamper([]byte(v)))}
		e.accepted(t, name+" twice: the first value counts", e.post(t, h, body, false), h, body, id)
	}
}

func timestamps(t testing.TB, e *env) {
	tol := e.f.Tolerance
	for _, c := range []struct {
		what   string
		offset time.Duration
		reason webhook.Reason
	}{
		{"signed beyond the tolerance ago", -tol - time.Minute, webhook.ReasonStale},
		{"signed beyond the tolerance ahead", tol + time.Minute, webhook.ReasonFuture},
	} {
		body, id := e.next()
		e.refused(t, c.what, e.signed(t, 0, time.Now().Add(c.offset), id, body), body, http.StatusUnauthorized, string(c.reason))
	}
	for _, offset := range []time.Duration{-tol / 2, tol / 2} {
		body, id := e.next()
		h := e.signed(t, 0, time.Now().Add(offset), id, body)
		e.accepted(t, "signed within the tolerance ("+offset.String()+")", e.post(t, h, body, false), h, body, id)
	}
}

func oversized(t testing.TB, e *env) {
	body := []byte(`{"pad":"` + strings.Repeat("x", maxBody-9) + `"}`) // maxBody+1 bytes
	_, id := e.next()
	h := e.signed(t, 0, time.Now(), id, body)
	e.checkRefused(t, "body over the limit", e.post(t, h, body, false), http.StatusRequestEntityTooLarge, "body_too_large")
	e.checkRefused(t, "body over the limit, chunked", e.post(t, h, body, true), http.StatusRequestEntityTooLarge, "body_too_large")
}

func notJSON(t testing.TB, e *env) {
	for _, body := range [][]byte{[]byte("not json"), {}, []byte(`["an array"]`)} {
		_, id := e.next()
		a := e.post(t, e.signed(t, 0, time.Now(), id, body), body, false)
		e.checkRefused(t, fmt.Sprintf("signed body %q", body), a, http.StatusBadRequest, "invalid_event")
		assert.Equal(t, "body", a.field("field"), "signed body %q: the answer names the body", body)
	}
	body, id := e.next()
	h := e.signed(t, 0, time.Now(), id, body)
	h.Set("Content-Type", "text/plain")
	e.refused(t, "Content-Type text/plain", h, body, http.StatusUnsupportedMediaType, "unsupported_media_type")
}

func batch(t testing.TB, e *env) {
	ids := make([]string, 3)
	for i := range ids {
		_, ids[i] = e.next()
	}
	h, body, _ := e.f.Batch(t, e.f.Secrets[0], time.Now(), ids, -1)
	h.Set("Content-Type", "application/json")
	a := e.post(t, h, body, false)
	if assert.Equal(t, http.StatusAccepted, a.code, "valid batch: answer %s", a) {
		assert.Equal(t, []any{ids[0], ids[1], ids[2]}, a.body["event_ids"], "the answer names every event")
	}
	msgs := e.broker.Drain(broker.MainQueue)
	if assert.Len(t, msgs, len(ids), "every event of the batch is published") {
		for i, d := range msgs {
			assert.Equal(t, event.Key(Source, ids[i]), d.MessageId, "event %d of the batch", i)
		}
	}
	for i := range ids {
		_, ids[i] = e.next()
	}
	h, body, code := e.f.Batch(t, e.f.Secrets[0], time.Now(), ids, 1)
	h.Set("Content-Type", "application/json")
	e.refused(t, "batch whose second item is bad", h, body, code, "")
}

// Tamper returns a copy of b with the letter or digit nearest its middle
// changed to another of its kind: a forgery that keeps the value's shape.
// The middle, not the end: the last character of a base64 value may hold
// only padding bits, and changing those changes nothing that is signed.
func Tamper(b []byte) []byte {
	out := append([]byte(nil), b...)
	mid := len(out) / 2
	for d := 0; d <= len(out); d++ {
		for _, i := range []int{mid + d, mid - d} {
			if i < 0 || i >= len(out) {
				continue
			}
			switch c := out[i]; {
			case c >= '0' && c <= '8', c >= 'a' && c <= 'y', c >= 'A' && c <= 'Y':
				out[i] = c + 1
			case c == '9':
				out[i] = '0'
			case c == 'z':
				out[i] = 'a'
			case c == 'Z':
				out[i] = 'A'
			default:
				continue
			}
			return out
		}
	}
	return append(out, 'x')
}
