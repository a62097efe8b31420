package receiver_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	stripewebhook "github.com/stripe/stripe-go/v82/webhook"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"
	"go.uber.org/zap/zaptest/observer"

	"github.com/idempotent-events/idempotent-events/pkg/internal/broker"
	"github.com/idempotent-events/idempotent-events/pkg/internal/dedupe"
	"github.com/idempotent-events/idempotent-events/pkg/internal/event"
	"github.com/idempotent-events/idempotent-events/pkg/internal/event/eventtest"
	"github.com/idempotent-events/idempotent-events/pkg/internal/faulttest"
	"github.com/idempotent-events/idempotent-events/pkg/internal/receiver"
	"github.com/idempotent-events/idempotent-events/pkg/internal/servicetest"
	"github.com/idempotent-events/idempotent-events/pkg/internal/store"
	"github.com/idempotent-events/idempotent-events/pkg/internal/webhook"
)

const secret = "whsec_test_secret"

// client keeps no idle connections, so no goroutine outlives a request.
var client = &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}

var topo = broker.Topology{QueueType: broker.QueueClassic, RetryDelays: []time.Duration{time.Second}, DeliveryLimit: 100}

type fixture struct {
	url     string
	handler http.Handler
	broker  *servicetest.Broker
	pub     *broker.Publisher
	store   *store.Store
	proxy   *faulttest.Proxy
}

type setup struct {
	viaProxy  bool
	dupCheck  bool
	insecure  bool
	publisher receiver.Publisher
	maxBody   int64
	inFlight  int
	sources   []receiver.Source
	logger    *zap.Logger
}

// start runs a receiver handler with a real publisher on its own vhost.
func start(t *testing.T, s setup) *fixture {
	t.Helper()
	amqpURL := servicetest.VHost(t)
	f := &fixture{broker: servicetest.NewBroker(t, amqpURL, topo)}
	dial := amqpURL
	if s.viaProxy {
		p, err := faulttest.Start("127.0.0.1:5672")
		require.NoError(t, err)
		t.Cleanup(p.Close)
		f.proxy = p
		dial = servicetest.ReplaceHost(amqpURL, p.Addr())
	}
	f.pub = &broker.Publisher{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		d := broker.Dialer{URL: dial, Name: t.Name(), MaxBackoff: 200 * time.Millisecond, DialTimeout: time.Second}
		_ = broker.Supervise(ctx, d, zaptest.NewLogger(t), func(bool) {}, func(ctx context.Context, conn *amqp.Connection) error {
			if err := topo.DeclareOn(conn); err != nil {
				return err
			}
			return f.pub.Serve(ctx, conn, 2)
		})
	}()
	t.Cleanup(func() { cancel(); <-done })
	require.Eventually(t, f.pub.Ready, 10*time.Second, 10*time.Millisecond)

	opts := receiver.Options{
		Publisher:             f.pub,
		DuplicateCheckTimeout: time.Second,
		MaxBodyBytes:          64 << 10,
		PublishTimeout:        3 * time.Second,
		RetryAfter:            7 * time.Second,
		MaxInFlight:           64,
		Logger:                zaptest.NewLogger(t),
		Metrics:               receiver.NewMetrics(prometheus.NewRegistry()),
	}
	if s.logger != nil {
		opts.Logger = s.logger
	}
	opts.Sources = []receiver.Source{{Name: "stripe", Route: receiver.PaymentRoute, Scheme: webhook.SchemeStripe}}
	if !s.insecure {
		opts.Sources[0].Verifier = webhook.NewStripeVerifier([]string{secret}, 5*time.Minute)
	}
	opts.Sources = append(opts.Sources, s.sources...)
	if s.publisher != nil {
		opts.Publisher = s.publisher
	}
	if s.maxBody > 0 {
		opts.MaxBodyBytes = s.maxBody
	}
	if s.inFlight > 0 {
		opts.MaxInFlight = s.inFlight
	}
	if s.dupCheck {
		st, err := store.Open(context.Background(), servicetest.Schema(t), 2)
		require.NoError(t, err)
		t.Cleanup(st.Close)
		cache, err := dedupe.Open(servicetest.RedisURL, servicetest.RedisPrefix(t), time.Minute)
		require.NoError(t, err)
		t.Cleanup(func() { _ = cache.Close() })
		f.store = st
		lookups, err := dedupe.NewCoalescer(dedupe.CoalescerOptions{Cache: cache, Timeout: time.Second, Parallel: 2})
		require.NoError(t, err)
		lctx, stop := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { defer close(done); _ = lookups.Run(lctx) }()
		t.Cleanup(func() { stop(); <-done })
		opts.Duplicates = dedupe.Checker{Cache: lookups, Ledger: st}
	}
	h, err := receiver.NewHandler(opts)
	require.NoError(t, err)
	f.handler = h
	srv := httptest.NewServer(f.handler)
	t.Cleanup(srv.Close)
	f.url = srv.URL
	return f
}

type response struct {
	code   int
	header http.Header
	body   map[string]string
}

func (f *fixture) post(t *testing.T, body []byte, header map[string]string) response {
	t.Helper()
	return f.postTo(t, receiver.PaymentRoute, body, header)
}

func (f *fixture) postTo(t *testing.T, route string, body []byte, header map[string]string) response {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, f.url+route, bytes.NewReader(body))
	require.NoError(t, err)
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := client.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	r := response{code: resp.StatusCode, header: resp.Header}
	require.NoError(t, json.Unmarshal(raw, &r.body), "answer is JSON: %s", raw)
	return r
}

func sample(t *testing.T, id string) []byte {
	t.Helper()
	return eventtest.Payment(id, eventtest.Amount(1999))
}

func signed(body []byte) map[string]string {
	return map[string]string{"Content-Type": "application/json", webhook.StripeHeader: webhook.SignStripe(secret, time.Now(), body)}
}

func TestAcceptedEventIsConfirmedAndQueuedWithItsHeaders(t *testing.T) {
	t.Parallel()
	f := start(t, setup{})
	body := sample(t, "evt_accept_1")
	before := time.Now()
	r := f.post(t, body, signed(body))
	assert.Equal(t, http.StatusAccepted, r.code)
	assert.Equal(t, map[string]string{"status": "accepted", "event_id": "evt_accept_1"}, r.body)

	d, ok := f.broker.Get(broker.MainQueue)
	require.True(t, ok, "the 202 was given for a message that is in the queue")
	assert.Equal(t, body, d.Body, "the raw body is published as signed")
	assert.Equal(t, "evt_accept_1", d.MessageId)
	assert.Equal(t, "payment_intent.succeeded", d.Type)
	assert.Equal(t, amqp.Persistent, d.DeliveryMode)
	assert.Equal(t, "stripe", d.Headers[broker.HeaderSource])
	ev, err := event.Decode(body)
	require.NoError(t, err)
	assert.Equal(t, ev.DigestHex(), d.Headers[broker.HeaderDigest], "the content digest travels with the message")
	assert.WithinDuration(t, before, broker.ReceivedAt(d.Headers), 5*time.Second)
}

func TestSignaturesFromStripesLibraryAreAccepted(t *testing.T) {
	t.Parallel()
	f := start(t, setup{})
	body := sample(t, "evt_stripe_go")
	sp := stripewebhook.GenerateTestSignedPayload(&stripewebhook.UnsignedPayload{Payload: body, Secret: secret})
	r := f.post(t, body, map[string]string{"Content-Type": "application/json; charset=utf-8", webhook.StripeHeader: sp.Header})
	assert.Equal(t, http.StatusAccepted, r.code, "%v", r.body)
	assert.Equal(t, 1, f.broker.Depth(broker.MainQueue))
}

// Every bad input gets its documented 4xx with a JSON body naming the
// problem, and nothing reaches the broker.
func TestBadInputIsRejectedAndNothingIsPublished(t *testing.T) {
	t.Parallel()
	f := start(t, setup{maxBody: 4096})
	good := sample(t, "evt_bad_inputs")
	now := time.Now()
	withSig := func(b []byte, at time.Time, s string) map[string]string {
		return map[string]string{"Content-Type": "application/json", webhook.StripeHeader: webhook.SignStripe(s, at, b)}
	}
	badJSON := []byte(`{"id":"evt_x",`)
	missingField := []byte(`{"id":"evt_x","type":"payment_intent.succeeded","data":{"payment_intent":"pi","currency":"usd","status":"succeeded"}}`)
	illTyped := []byte(`{"id":"evt_x","type":"payment_intent.succeeded","data":{"payment_intent":"pi","amount_cents":"12","currency":"usd","status":"succeeded"}}`)
	huge := []byte(`{"id":"evt_x","pad":"` + strings.Repeat("a", 5000) + `"}`)
	tampered := bytes.Replace(good, []byte("1999"), []byte("9999"), 1)

	cases := []struct {
		name   string
		body   []byte
		header map[string]string
		code   int
		err    string
		field  string
	}{
		{"no signature", good, map[string]string{"Content-Type": "application/json"}, 401, "missing_signature", ""},
		{"malformed signature", good, map[string]string{"Content-Type": "application/json", webhook.StripeHeader: "t=x,v1=y"}, 401, "malformed_signature", ""},
		{"wrong secret", good, withSig(good, now, "whsec_other"), 401, "signature_mismatch", ""},
		{"tampered body", tampered, withSig(good, now, secret), 401, "signature_mismatch", ""},
		{"stale timestamp", good, withSig(good, now.Add(-10*time.Minute), secret), 401, "timestamp_too_old", ""},
		{"future timestamp", good, withSig(good, now.Add(10*time.Minute), secret), 401, "timestamp_in_future", ""},
		{"malformed JSON", badJSON, withSig(badJSON, now, secret), 400, "invalid_event", "body"},
		{"missing field", missingField, withSig(missingField, now, secret), 400, "invalid_event", "data.amount_cents"},
		{"ill-typed field", illTyped, withSig(illTyped, now, secret), 400, "invalid_event", "data.amount_cents"},
		{"empty body", []byte{}, withSig([]byte{}, now, secret), 400, "invalid_event", "body"},
		{"wrong content type", good, map[string]string{"Content-Type": "text/plain", webhook.StripeHeader: webhook.SignStripe(secret, now, good)}, 415, "unsupported_media_type", ""},
		{"no content type", good, map[string]string{webhook.StripeHeader: webhook.SignStripe(secret, now, good)}, 415, "unsupported_media_type", ""},
		{"oversize body", huge, withSig(huge, now, secret), 413, "body_too_large", ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := f.post(t, c.body, c.header)
			assert.Equal(t, c.code, r.code, "%v", r.body)
			assert.Equal(t, c.err, r.body["error"])
			assert.Equal(t, c.field, r.body["field"])
			assert.NotEmpty(t, r.body["message"])
		})
	}
	// A body over the limit without a Content-Length is cut off while read.
	req, err := http.NewRequest(http.MethodPost, f.url+receiver.PaymentRoute, io.MultiReader(bytes.NewReader(huge)))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(webhook.StripeHeader, webhook.SignStripe(secret, now, huge))
	req.ContentLength = -1
	resp, err := client.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusRequestEntityTooLarge, resp.StatusCode)

	assert.Equal(t, 0, f.broker.Depth(broker.MainQueue), "no bad input was published")
}

// failingVerifier breaks the Verifier contract: it fails with err, which is
// not a usable *webhook.Error.
type failingVerifier struct{ err error }

func (v failingVerifier) Verify(http.Header, []byte) (int, error) { return -1, v.err }
func (failingVerifier) Scheme() string                            { return webhook.SchemeStandard }

// A verifier that fails without a reason (a plain error, or a nil
// *webhook.Error in a non-nil error) has still not verified the request: it
// is answered 401, nothing is published, and the rejection is logged once,
// without the error's text, which may quote the signature it failed on.
func TestAVerificationErrorWithoutAReasonIsAnswered401(t *testing.T) {
	t.Parallel()
	core, logs := observer.New(zap.DebugLevel)
	f := start(t, setup{logger: zap.New(core), sources: []receiver.Source{
		{Name: "plain", Route: "/webhooks/plain", Scheme: webhook.SchemeStandard,
			Verifier: failingVerifier{err: errors.New("key service unreachable: v1,tok_internal")}},
		{Name: "typed-nil", Route: "/webhooks/typed-nil", Scheme: webhook.SchemeStandard,
			Verifier: failingVerifier{err: (*webhook.Error)(nil)}},
	}})
	body := []byte(`{"type":"x.y","data":{}}`)
	for _, route := range []string{"/webhooks/plain", "/webhooks/typed-nil"} {
		r := f.postTo(t, route, body, map[string]string{"Content-Type": "application/json", webhook.StandardIDHeader: "msg_1"})
		require.Equal(t, http.StatusUnauthorized, r.code, "%s: %v", route, r.body)
		require.Equal(t, "verification_failed", r.body["error"], route)
		require.NotEmpty(t, r.body["message"], route)
		require.NotContains(t, r.body["message"], "tok_internal", route)
	}
	require.Equal(t, 0, f.broker.Depth(broker.MainQueue), "nothing was published")
	rejected := logs.FilterMessageSnippet("webhook rejected")
	require.Equal(t, 2, rejected.Len(), "one line per rejected request")
	for _, e := range logs.All() {
		line := e.Message
		for k, v := range e.ContextMap() {
			line += fmt.Sprintf(" %s=%v", k, v)
		}
		require.NotContains(t, line, "tok_internal")
	}
}

func TestBrokerDownAnswers503UntilItIsBack(t *testing.T) {
	t.Parallel()
	f := start(t, setup{viaProxy: true})
	f.proxy.SetDown(true)
	require.Eventually(t, func() bool { return !f.pub.Ready() }, 10*time.Second, 10*time.Millisecond)

	body := sample(t, "evt_while_down")
	r := f.post(t, body, signed(body))
	assert.Equal(t, http.StatusServiceUnavailable, r.code)
	assert.Equal(t, "7", r.header.Get("Retry-After"))
	assert.Equal(t, "broker_unavailable", r.body["error"])

	f.proxy.SetDown(false)
	require.Eventually(t, func() bool {
		return f.post(t, body, signed(body)).code == http.StatusAccepted
	}, 15*time.Second, 100*time.Millisecond)
	assert.Equal(t, 1, f.broker.Depth(broker.MainQueue), "exactly the accepted request was published")
}

// Connections cut while publishes wait for their confirms: every request
// that got 202 has its message in the queue.
func TestNo2xxWithoutConfirmWhenTheConnectionIsCut(t *testing.T) {
	t.Parallel()
	f := start(t, setup{viaProxy: true})
	var (
		mu       sync.Mutex
		accepted []string
		refused  int
		seq      atomic.Int64
		stop     = make(chan struct{})
	)
	var wg sync.WaitGroup
	for g := 0; g < 16; g++ {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				id := fmt.Sprintf("evt_cut_%05d", seq.Add(1))
				body := sample(t, id)
				code := f.post(t, body, signed(body)).code
				mu.Lock()
				switch code {
				case http.StatusAccepted:
					accepted = append(accepted, id)
				case http.StatusServiceUnavailable:
					refused++
				default:
					t.Errorf("unexpected answer %d", code)
				}
				mu.Unlock()
			}
		})
	}
	count := func() (int, int) { mu.Lock(); defer mu.Unlock(); return len(accepted), refused }
	for cut := 0; cut < 3; cut++ {
		base, _ := count()
		require.Eventually(t, func() bool { n, _ := count(); return n > base+50 }, 15*time.Second, 5*time.Millisecond)
		f.proxy.Cut()
	}
	before, _ := count()
	require.Eventually(t, func() bool { n, _ := count(); return n > before+50 }, 15*time.Second, 5*time.Millisecond)
	close(stop)
	wg.Wait()

	inQueue := map[string]bool{}
	for _, d := range f.broker.Drain(broker.MainQueue) {
		inQueue[d.MessageId] = true
	}
	for _, id := range accepted {
		assert.True(t, inQueue[id], "event %s was answered 202 but is not in the queue", id)
	}
	t.Logf("3 cuts: %d answered 202, %d answered 503, %d messages in the queue", len(accepted), refused, len(inQueue))
}

func TestUnroutableEventAnswers503(t *testing.T) {
	t.Parallel()
	f := start(t, setup{})
	conn, err := amqp.Dial(f.broker.URL)
	require.NoError(t, err)
	defer conn.Close()
	ch, err := conn.Channel()
	require.NoError(t, err)
	require.NoError(t, ch.QueueUnbind(broker.MainQueue, broker.RoutingKey, broker.Exchange, nil))

	body := sample(t, "evt_unroutable")
	r := f.post(t, body, signed(body))
	assert.Equal(t, http.StatusServiceUnavailable, r.code, "a returned message is not accepted")
}

func TestCommittedEventIsAnsweredDuplicateWithoutPublishing(t *testing.T) {
	t.Parallel()
	f := start(t, setup{dupCheck: true})
	body := sample(t, "evt_done")
	ev, err := event.Decode(body)
	require.NoError(t, err)
	_, err = f.store.Commit(context.Background(), []store.Record{{Event: ev, Source: "stripe", PayloadSHA256: ev.Digest[:]}}, nil)
	require.NoError(t, err)

	r := f.post(t, body, signed(body))
	assert.Equal(t, http.StatusOK, r.code)
	assert.Equal(t, map[string]string{"status": "duplicate", "event_id": "evt_done"}, r.body)
	assert.Equal(t, 0, f.broker.Depth(broker.MainQueue))

	fresh := sample(t, "evt_fresh")
	assert.Equal(t, http.StatusAccepted, f.post(t, fresh, signed(fresh)).code)

	// The same id with other content: 409, and it goes to the worker only to
	// be recorded as a conflict.
	changed := bytes.Replace(body, []byte(`"amount":1999`), []byte(`"amount":5`), 1)
	require.NotEqual(t, body, changed)
	r = f.post(t, changed, signed(changed))
	assert.Equal(t, http.StatusConflict, r.code)
	assert.Equal(t, "event_id_conflict", r.body["error"])
	queued := f.broker.Drain(broker.MainQueue)
	require.Len(t, queued, 2, "evt_fresh and the conflicting delivery")
	assert.Equal(t, changed, queued[1].Body)
}

// An event the reconciler fed in from Stripe's API is committed with
// event.AnyDigest: its webhook, whatever its bytes, is a duplicate.
func TestAWebhookOfAReconciledEventIsAnsweredDuplicate(t *testing.T) {
	t.Parallel()
	f := start(t, setup{dupCheck: true})
	body := sample(t, "evt_reconciled")
	ev, err := event.Decode(body)
	require.NoError(t, err)
	_, err = f.store.Commit(context.Background(), []store.Record{{Event: ev, Source: "stripe", PayloadSHA256: event.AnyDigest[:]}}, nil)
	require.NoError(t, err)

	changed := bytes.Replace(body, []byte(`"amount":1999`), []byte(`"amount":5`), 1)
	require.NotEqual(t, body, changed)
	for _, b := range [][]byte{body, changed} {
		r := f.post(t, b, signed(b))
		assert.Equal(t, http.StatusOK, r.code)
		assert.Equal(t, "duplicate", r.body["status"])
	}
	assert.Equal(t, 0, f.broker.Depth(broker.MainQueue))
}

func TestInsecureModeAcceptsUnsignedRequests(t *testing.T) {
	t.Parallel()
	f := start(t, setup{insecure: true})
	body := sample(t, "evt_unsigned")
	r := f.post(t, body, map[string]string{"Content-Type": "application/json"})
	assert.Equal(t, http.StatusAccepted, r.code)
}

// blockingPublisher holds every publish until released.
type blockingPublisher struct{ entered, release chan struct{} }

func (p *blockingPublisher) Publish(ctx context.Context, _, _ string, _ amqp.Publishing) error {
	p.entered <- struct{}{}
	select {
	case <-p.release:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
func (p *blockingPublisher) Ready() bool { return true }

func TestInFlightLimitShedsWith503(t *testing.T) {
	t.Parallel()
	bp := &blockingPublisher{entered: make(chan struct{}, 2), release: make(chan struct{})}
	f := start(t, setup{publisher: bp, inFlight: 2})
	body := sample(t, "evt_busy")
	var wg sync.WaitGroup
	codes := make(chan int, 2)
	for i := 0; i < 2; i++ {
		wg.Go(func() { codes <- f.post(t, body, signed(body)).code })
	}
	<-bp.entered
	<-bp.entered
	// Both slots are taken: a third request is shed at once.
	r := f.post(t, body, signed(body))
	assert.Equal(t, http.StatusServiceUnavailable, r.code)
	assert.Equal(t, "overloaded", r.body["error"])
	assert.NotEmpty(t, r.header.Get("Retry-After"))
	close(bp.release)
	wg.Wait()
	close(codes)
	for c := range codes {
		assert.Equal(t, http.StatusAccepted, c)
	}
}

func TestHealthEndpoints(t *testing.T) {
	t.Parallel()
	f := start(t, setup{})
	for path, want := range map[string]int{"/health": 200, "/livez": 200, "/readyz": 200} {
		resp, err := client.Get(f.url + path)
		require.NoError(t, err)
		resp.Body.Close()
		assert.Equal(t, want, resp.StatusCode, path)
	}
	resp, err := client.Get(f.url + "/health")
	require.NoError(t, err)
	defer resp.Body.Close()
	var body map[string]string
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&body))
	assert.Equal(t, map[string]string{"status": "ok"}, body)
}

func TestReadyzIsNotReadyWithoutBroker(t *testing.T) {
	t.Parallel()
	f := start(t, setup{viaProxy: true})
	f.proxy.SetDown(true)
	require.Eventually(t, func() bool {
		resp, err := client.Get(f.url + "/readyz")
		require.NoError(t, err)
		resp.Body.Close()
		return resp.StatusCode == http.StatusServiceUnavailable
	}, 10*time.Second, 20*time.Millisecond)
}

// No log line carries a signing secret or a signature header value, whatever
// the request.
func TestLogsNeverCarrySecretsOrSignatures(t *testing.T) {
	t.Parallel()
	core, logs := observer.New(zap.DebugLevel)
	f := start(t, setup{logger: zap.New(core), dupCheck: true})
	body := sample(t, "evt_log_check")
	good := signed(body)
	wrong := map[string]string{"Content-Type": "application/json", webhook.StripeHeader: webhook.SignStripe("whsec_attacker", time.Now(), body)}
	require.Equal(t, http.StatusAccepted, f.post(t, body, good).code)
	require.Equal(t, http.StatusUnauthorized, f.post(t, body, wrong).code)
	require.Equal(t, http.StatusUnauthorized, f.post(t, []byte(`{}`), map[string]string{"Content-Type": "application/json", webhook.StripeHeader: "t=1,v1=" + secret}).code)
	require.NotZero(t, logs.Len())
	for _, e := range logs.All() {
		line := e.Message
		for k, v := range e.ContextMap() {
			line += fmt.Sprintf(" %s=%v", k, v)
		}
		for _, forbidden := range []string{secret, "whsec_attacker", good[webhook.StripeHeader], wrong[webhook.StripeHeader], "v1="} {
			assert.NotContains(t, line, forbidden)
		}
	}
}
