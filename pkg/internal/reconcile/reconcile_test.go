package reconcile_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap/zaptest"

	"github.com/idempotent-events/idempotent-events/pkg/internal/broker"
	"github.com/idempotent-events/idempotent-events/pkg/internal/pipelinetest"
	"github.com/idempotent-events/idempotent-events/pkg/internal/reconcile"
	"github.com/idempotent-events/idempotent-events/pkg/internal/servicetest"
)

// countingPublisher publishes on a confirm channel and counts the
// confirmed publishes of each message id; failAfter, when positive, makes
// every publish after that many fail, as a broker gone mid-run would.
type countingPublisher struct {
	ch        *broker.ConfirmChannel
	mu        sync.Mutex
	published map[string]int
	origins   map[string]string
	failAfter int
	total     int
	order     []string
}

func newPublisher(t *testing.T, p *pipelinetest.Pipeline) *countingPublisher {
	conn, err := amqp.Dial(p.AMQPURL)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	ch, err := broker.OpenConfirmChannel(conn)
	require.NoError(t, err)
	t.Cleanup(func() { _ = ch.Close() })
	return &countingPublisher{ch: ch, published: map[string]int{}, origins: map[string]string{}}
}

func (c *countingPublisher) Publish(ctx context.Context, exchange, key string, msg amqp.Publishing) error {
	c.mu.Lock()
	if c.failAfter > 0 && c.total >= c.failAfter {
		c.mu.Unlock()
		return errors.New("test: broker gone")
	}
	c.mu.Unlock()
	if err := c.ch.Publish(ctx, exchange, key, msg); err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.total++
	c.order = append(c.order, msg.MessageId)
	c.published[msg.MessageId]++
	c.origins[msg.MessageId] = broker.String(msg.Headers, broker.HeaderOrigin)
	return nil
}

func (c *countingPublisher) count(id string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.published[id]
}

// world is a pipeline with a worker, a fake Stripe and a window of events,
// some of them delivered by webhook and processed, the others missing.
type world struct {
	t       *testing.T
	p       *pipelinetest.Pipeline
	stripe  *fakeStripe
	pub     *countingPublisher
	present []string
	missing []string
	now     time.Time
}

// newWorld creates n events over the last 48 hours, every one with
// probability pPresent delivered (published as the receiver does, with
// compact JSON unlike the API's indented JSON) and processed; the rest are
// missing, in runs as an outage makes them and alone.
func newWorld(t *testing.T, n int, pPresent float64) *world {
	w := &world{t: t, p: pipelinetest.New(t), now: time.Now().UTC()}
	w.stripe = newFakeStripe(t)
	w.p.StartWorker("")
	w.pub = newPublisher(t, w.p)
	rng := rand.New(rand.NewPCG(uint64(n), 7))
	outage := false
	for i := 0; i < n; i++ {
		id := fmt.Sprintf("evt_rc_%s_%05d", t.Name()[4:10], i)
		created := w.now.Add(-48 * time.Hour).Add(time.Duration(i) * 48 * time.Hour / time.Duration(n))
		if rng.Float64() < 0.05 {
			outage = !outage
		}
		delivered := !outage && rng.Float64() < pPresent
		body := w.stripe.add(id, created, delivered)
		if !delivered {
			w.missing = append(w.missing, id)
			continue
		}
		var v any
		require.NoError(t, json.Unmarshal(body, &v))
		compact, err := json.Marshal(v)
		require.NoError(t, err)
		w.p.Publish(id, "payment_intent.succeeded", compact)
		w.present = append(w.present, id)
	}
	w.p.Eventually(func() bool { return w.p.LedgerRows() == len(w.present) }, "the delivered events are processed")
	return w
}

func (w *world) options() reconcile.Options {
	return reconcile.Options{
		Source: "stripe", DB: w.p.DB, Publisher: w.pub, Since: 72 * time.Hour, Settle: time.Minute,
		PublishTimeout: 5 * time.Second, Logger: zaptest.NewLogger(w.t),
		Log: reconcile.NewStripeLog(reconcile.StripeOptions{APIKey: "rk_test_reconcile", URL: w.stripe.srv.URL, Rate: 1000,
			FirstBackoff: 5 * time.Millisecond, MaxWait: 10 * time.Second}),
	}
}

// processedOnce waits until every event of the window is in the ledger,
// then checks none is there twice and each has its one payments row.
func (w *world) processedOnce() {
	w.t.Helper()
	all := len(w.present) + len(w.missing)
	w.p.Eventually(func() bool { return w.p.LedgerRows() == all }, "every event of the window is processed")
	w.p.Invariant()
	for _, id := range append(append([]string{}, w.present...), w.missing...) {
		payments, ledger := w.p.Rows(id)
		require.Equal(w.t, [2]int{1, 1}, [2]int{payments, ledger}, "payments and ledger rows of %s", id)
	}
}

// ledgerDigest returns the hex payload digest and processed_at of id.
func (w *world) ledgerRow(id string) (digest string, processedAt time.Time) {
	w.t.Helper()
	require.NoError(w.t, w.p.DB.QueryRow(context.Background(),
		`SELECT encode(payload_sha256, 'hex'), processed_at FROM processed_events WHERE event_id = $1`, id).Scan(&digest, &processedAt))
	return digest, processedAt
}

func TestEveryMissingEventIsInjectedOnceAndPresentOnesAreUntouched(t *testing.T) {
	t.Parallel()
	w := newWorld(t, 1000, 0.7)
	require.NotEmpty(t, w.missing)
	w.stripe.set(func(f *fakeStripe) { f.throttleEvery = 4 })
	before := map[string]time.Time{}
	for _, id := range w.present {
		_, at := w.ledgerRow(id)
		before[id] = at
	}

	rep, err := reconcile.Run(context.Background(), w.options())
	require.NoError(t, err)
	t.Logf("report: %+v", rep)
	assert.False(t, rep.Resumed)
	assert.Equal(t, 1000, rep.Listed)
	assert.Equal(t, len(w.present), rep.Present)
	assert.Equal(t, len(w.missing), rep.Missing)
	assert.Equal(t, len(w.missing), rep.Injected)
	assert.Zero(t, rep.Arrived+rep.Invalid)
	assert.Equal(t, 10, rep.Pages, "1,000 events in pages of 100")
	calls, throttled := w.stripe.calls()
	assert.Positive(t, throttled, "the fake answered 429s")
	assert.Equal(t, rep.Pages+throttled, calls, "every 429 was retried, nothing else was asked twice")

	for _, id := range w.missing {
		assert.Equal(t, 1, w.pub.count(id), "%s is injected once", id)
		assert.Equal(t, "reconcile", w.pub.origins[id])
	}
	for _, id := range w.present {
		assert.Zero(t, w.pub.count(id), "%s was delivered; it is not injected", id)
	}
	w.processedOnce()
	for _, id := range w.present {
		digest, at := w.ledgerRow(id)
		assert.True(t, at.Equal(before[id]), "%s's ledger row is untouched", id)
		assert.NotEqual(t, "0000000000000000000000000000000000000000000000000000000000000000", digest)
	}

	// w.missing is in the order the events were created.
	assert.Equal(t, w.missing, w.pub.order, "injected oldest first")

	// A second run finds nothing missing and injects nothing.
	rep2, err := reconcile.Run(context.Background(), w.options())
	require.NoError(t, err)
	assert.Equal(t, [3]int{1000, 1000, 0}, [3]int{rep2.Listed, rep2.Present, rep2.Missing})
	assert.NotEqual(t, rep.RunID, rep2.RunID)

	// The worker exports the runs the table records.
	metric := func(name string) float64 {
		return servicetest.Metric(w.p.Reg, "idempotent_events_reconcile_"+name, "source", "stripe")
	}
	assert.Equal(t, float64(len(w.missing)), metric("missing_events_total"))
	assert.Equal(t, float64(len(w.missing)), metric("injected_events_total"))
	assert.Zero(t, metric("last_run_missing"), "the second run found nothing missing")
	assert.Zero(t, metric("unfinished_runs"))
	assert.InDelta(t, float64(time.Now().Unix()), metric("last_success_timestamp_seconds"), 120)
}

// A late webhook of an event the reconciler injected is a duplicate, not a
// conflict, though its bytes differ from the API's.
func TestALateWebhookOfAReconciledEventIsADuplicate(t *testing.T) {
	t.Parallel()
	w := newWorld(t, 40, 0.5)
	_, err := reconcile.Run(context.Background(), w.options())
	require.NoError(t, err)
	w.processedOnce()
	for _, id := range w.missing {
		digest, _ := w.ledgerRow(id)
		require.Equal(t, "0000000000000000000000000000000000000000000000000000000000000000", digest)
		w.p.Publish(id, "payment_intent.succeeded", w.p.Event(id))
	}
	w.p.Eventually(func() bool { return w.p.Outcomes("duplicate") >= float64(len(w.missing)) }, "the late webhooks are duplicates")
	var conflicts int
	require.NoError(t, w.p.DB.QueryRow(context.Background(), `SELECT count(*) FROM event_conflicts`).Scan(&conflicts))
	assert.Zero(t, conflicts)
	w.processedOnce()
}

// Events found missing whose webhook comes in before the injection are
// not injected.
func TestEventsThatArriveWhileTheRunListsAreNotInjected(t *testing.T) {
	t.Parallel()
	w := newWorld(t, 300, 0.6)
	late := w.missing[:len(w.missing)/2]
	o := w.options()
	delivered := false
	o.AfterPage = func(r reconcile.Report) error {
		if r.Listed == 300 && !delivered {
			// The listing is kept; the webhooks of half the missing events
			// come in now.
			delivered = true
			for _, id := range late {
				w.p.PublishEvent(id)
			}
			w.p.Eventually(func() bool { return w.p.LedgerRows() == len(w.present)+len(late) }, "the late webhooks are processed")
		}
		return nil
	}
	rep, err := reconcile.Run(context.Background(), o)
	require.NoError(t, err)
	require.True(t, delivered)
	assert.Equal(t, len(late), rep.Arrived)
	assert.Equal(t, len(w.missing)-len(late), rep.Injected)
	for _, id := range late {
		assert.Zero(t, w.pub.count(id), "%s arrived by webhook", id)
	}
	w.processedOnce()
}

// A run killed after any page or batch resumes from its checkpoint: the
// window is listed once in all, and every missing event is injected once.
func TestAKilledRunResumesFromItsCheckpoint(t *testing.T) {
	t.Parallel()
	w := newWorld(t, 1200, 0.5)
	rng := rand.New(rand.NewPCG(3, 4))
	kills, runs := 0, 0
	var last reconcile.Report
	var runID int64
	for {
		runs++
		require.Less(t, runs, 40, "the run never finished")
		o := w.options()
		killAt := rng.IntN(4) + 1
		steps := 0
		o.AfterPage = func(reconcile.Report) error {
			steps++
			if steps == killAt {
				kills++
				return errors.New("test: killed")
			}
			return nil
		}
		rep, err := reconcile.Run(context.Background(), o)
		if runID == 0 {
			runID = rep.RunID
		}
		assert.Equal(t, runID, rep.RunID, "every run resumes the first")
		if err == nil {
			last = rep
			break
		}
		require.ErrorContains(t, err, "test: killed")
	}
	t.Logf("%d kills, last report %+v", kills, last)
	assert.GreaterOrEqual(t, kills, 5)
	assert.True(t, last.Resumed)
	assert.Equal(t, 1200, last.Listed, "listed once in all")
	assert.Equal(t, len(w.missing), last.Missing)
	assert.Equal(t, len(w.missing), last.Injected)
	calls, _ := w.stripe.calls()
	assert.Equal(t, 12, calls, "each page asked once")
	for _, id := range w.missing {
		assert.Equal(t, 1, w.pub.count(id), "%s injected once", id)
	}
	w.processedOnce()
}

// A run that dies between a publish and its record publishes that event
// again on resume unless the ledger has it by then: at least once into the
// pipeline, once in the ledger.
func TestARunDeadMidBatchLosesNothing(t *testing.T) {
	t.Parallel()
	w := newWorld(t, 400, 0.3)
	w.pub.failAfter = 37
	_, err := reconcile.Run(context.Background(), w.options())
	require.ErrorContains(t, err, "broker gone")
	w.pub.mu.Lock()
	w.pub.failAfter = 0
	w.pub.mu.Unlock()
	rep, err := reconcile.Run(context.Background(), w.options())
	require.NoError(t, err)
	assert.True(t, rep.Resumed)
	assert.Equal(t, len(w.missing), rep.Injected+rep.Arrived)
	for _, id := range w.missing {
		assert.GreaterOrEqual(t, w.pub.count(id), 1, "%s reached the pipeline", id)
		assert.LessOrEqual(t, w.pub.count(id), 2, "%s published at most once more", id)
	}
	w.processedOnce()
}

func TestOneRunPerSourceAtATime(t *testing.T) {
	t.Parallel()
	w := newWorld(t, 250, 0.5)
	o := w.options()
	var second error
	var once sync.Once
	o.AfterPage = func(reconcile.Report) error {
		once.Do(func() { _, second = reconcile.Run(context.Background(), w.options()) })
		return nil
	}
	_, err := reconcile.Run(context.Background(), o)
	require.NoError(t, err)
	require.ErrorIs(t, second, reconcile.ErrLocked)
	// Once it has finished, the next run goes ahead.
	_, err = reconcile.Run(context.Background(), w.options())
	require.NoError(t, err)
	w.processedOnce()
}

func TestADryRunReportsAndChangesNothing(t *testing.T) {
	t.Parallel()
	w := newWorld(t, 150, 0.5)
	o := w.options()
	o.DryRun, o.Publisher = true, nil
	rep, err := reconcile.Run(context.Background(), o)
	require.NoError(t, err)
	assert.Equal(t, len(w.missing), rep.Missing)
	assert.ElementsMatch(t, w.missing, rep.MissingIDs)
	var runs int
	require.NoError(t, w.p.DB.QueryRow(context.Background(), `SELECT count(*) FROM reconcile_runs`).Scan(&runs))
	assert.Zero(t, runs)
	assert.Equal(t, len(w.present), w.p.LedgerRows())
}

func TestBadOptionsNameTheField(t *testing.T) {
	_, err := reconcile.Run(context.Background(), reconcile.Options{Source: "stripe", Since: 800 * time.Hour})
	require.Error(t, err)
	for _, want := range []string{"Log", "DB", "Publisher", "Since"} {
		assert.ErrorContains(t, err, want)
	}
}

// An object the payment effect marked needs_refresh (two events of the same
// second whose states cannot be ordered) is fetched by the next run and
// its state applied as the latest; the mark is cleared, no payments row is
// written for it, and an object that cannot be fetched is counted, not
// fatal.
func TestObjectsMarkedNeedsRefreshAreFetchedAndApplied(t *testing.T) {
	t.Parallel()
	w := newWorld(t, 10, 1)
	ctx := context.Background()
	second := time.Now().Add(-time.Hour).Unix()
	intent := func(id, status string) map[string]any {
		return map[string]any{"id": id, "object": "payment_intent", "amount": 4200, "currency": "usd", "status": status, "amount_received": 0}
	}
	for _, pi := range []string{"pi_refresh_one", "pi_refresh_gone"} {
		for i, status := range []string{"processing", "requires_payment_method"} {
			id := fmt.Sprintf("evt_%s_%d", pi, i)
			body, err := json.Marshal(map[string]any{"id": id, "object": "event", "type": "payment_intent." + status, "created": second,
				"data": map[string]any{"object": intent(pi, status)}})
			require.NoError(t, err)
			w.p.Publish(id, "payment_intent."+status, body)
			w.present = append(w.present, id)
		}
	}
	w.p.Eventually(func() bool {
		var n int
		require.NoError(t, w.p.DB.QueryRow(ctx, `SELECT count(*) FROM payment_intents WHERE needs_refresh`).Scan(&n))
		return n == 2
	}, "both PaymentIntents are marked needs_refresh")
	fetched, err := json.Marshal(intent("pi_refresh_one", "requires_payment_method"))
	require.NoError(t, err)
	w.stripe.set(func(f *fakeStripe) { f.objects = map[string][]byte{"/v1/payment_intents/pi_refresh_one": fetched} })
	paymentsBefore := w.paymentRows()

	rep, err := reconcile.Run(ctx, w.options())
	require.NoError(t, err)
	assert.Equal(t, 1, rep.Refreshed)
	assert.Equal(t, 1, rep.RefreshFailed, "pi_refresh_gone is not served")
	w.p.Eventually(func() bool {
		var status string
		var refresh bool
		require.NoError(t, w.p.DB.QueryRow(ctx, `SELECT status, needs_refresh FROM payment_intents WHERE id = 'pi_refresh_one'`).Scan(&status, &refresh))
		return status == "requires_payment_method" && !refresh
	}, "the fetched state is applied and the mark cleared")
	var outcome string
	require.NoError(t, w.p.DB.QueryRow(ctx, `SELECT outcome FROM payment_events WHERE object_id = 'pi_refresh_one' AND event_type = $1`,
		"idempotent_events.object_refreshed").Scan(&outcome))
	assert.Equal(t, "applied", outcome)
	assert.Equal(t, paymentsBefore, w.paymentRows(), "a refresh writes no payments row")
	var stillMarked bool
	require.NoError(t, w.p.DB.QueryRow(ctx, `SELECT needs_refresh FROM payment_intents WHERE id = 'pi_refresh_gone'`).Scan(&stillMarked))
	assert.True(t, stillMarked, "what could not be fetched stays marked for the next run")
}

func (w *world) paymentRows() int {
	w.t.Helper()
	var n int
	require.NoError(w.t, w.p.DB.QueryRow(context.Background(), `SELECT count(*) FROM payments`).Scan(&n))
	return n
}
