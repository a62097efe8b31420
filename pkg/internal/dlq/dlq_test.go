package dlq_test

import (
	"context"
	"errors"
	"net/url"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"go.uber.org/zap/zaptest"

	"github.com/idempotent-events/idempotent-events/pkg/internal/broker"
	"github.com/idempotent-events/idempotent-events/pkg/internal/dlq"
	"github.com/idempotent-events/idempotent-events/pkg/internal/faulttest"
	"github.com/idempotent-events/idempotent-events/pkg/internal/pipelinetest"
	"github.com/idempotent-events/idempotent-events/pkg/internal/servicetest"
)

// Every goroutine a test starts must be stopped by the time it ends.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

type option func(*dlq.Options)

func scanLimit(n int) option       { return func(o *dlq.Options) { o.ScanLimit = n } }
func replayRate(r float64) option  { return func(o *dlq.Options) { o.Rate = r } }
func hooks(h dlq.Hooks) option     { return func(o *dlq.Options) { o.Hooks = h } }
func amqpURL(u string) option      { return func(o *dlq.Options) { o.Dialer.URL = u } }
func withoutAudit() option         { return func(o *dlq.Options) { o.Audit = nil } }
func alice() dlq.Actor             { return dlq.Actor{Operator: "alice", Via: "cli", Client: "test"} }
func ids(ids ...string) dlq.Filter { return dlq.Filter{IDs: ids} }

func client(t *testing.T, p *pipelinetest.Pipeline, opts ...option) *dlq.Client {
	t.Helper()
	o := dlq.Options{
		Dialer: broker.Dialer{URL: p.AMQPURL, Name: t.Name()},
		Audit:  dlq.NewAudit(p.DB), Rate: 1000, PublishTimeout: 5 * time.Second,
		Logger: zaptest.NewLogger(t),
	}
	for _, opt := range opts {
		opt(&o)
	}
	return dlq.New(o)
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return c
}

func listIDs(l dlq.Listing) []string {
	out := make([]string, len(l.Messages))
	for i, m := range l.Messages {
		out[i] = m.ID
	}
	return out
}

// List and Show return what is in the DLQ and leave every message there,
// in the same order, with the same ids.
func TestListAndShowLeaveEveryMessageInPlace(t *testing.T) {
	t.Parallel()
	p := pipelinetest.New(t)
	now := time.Now()
	a := p.PutInDLQ("evt_a", "rejected_by_database", p.Event("evt_a"), now.Add(-3*time.Hour))
	bodyB := p.Event("evt_b")
	b := p.PutInDLQ("evt_b", "retries_exhausted", bodyB, now.Add(-10*time.Minute))
	c := p.PutInDLQ("", "invalid_payload", []byte(`{"id":"evt_c"}`), now.Add(-time.Minute))
	cl := client(t, p)

	all, err := cl.List(ctx(t), dlq.Filter{}, 0)
	require.NoError(t, err)
	assert.Equal(t, []string{a, b, c}, listIDs(all))
	assert.Equal(t, 3, all.Depth)
	assert.Equal(t, 3, all.Scanned)
	assert.True(t, all.Complete)
	assert.Equal(t, "evt_c", all.Messages[2].EventID, "no message id: the body's id")
	assert.Equal(t, 3, all.Messages[0].Attempts)
	assert.Equal(t, "last failure", all.Messages[0].LastError)

	old, err := cl.List(ctx(t), dlq.Filter{OlderThan: time.Hour}, 0)
	require.NoError(t, err)
	assert.Equal(t, []string{a}, listIDs(old))
	byReason, err := cl.List(ctx(t), dlq.Filter{Reason: "retries_exhausted", Source: "stripe"}, 0)
	require.NoError(t, err)
	assert.Equal(t, []string{b}, listIDs(byReason))
	limited, err := cl.List(ctx(t), dlq.Filter{}, 1)
	require.NoError(t, err)
	assert.Equal(t, 3, limited.Matched)
	assert.Equal(t, []string{a}, listIDs(limited))

	m, err := cl.Show(ctx(t), b)
	require.NoError(t, err)
	assert.Equal(t, "evt_b", m.EventID)
	assert.Equal(t, bodyB, m.Body)
	assert.Equal(t, "retries_exhausted", m.Headers[broker.HeaderDLQReason])
	_, err = cl.Show(ctx(t), "ffffffffffffffff")
	require.ErrorIs(t, err, dlq.ErrNotFound)

	short, err := client(t, p, scanLimit(2)).List(ctx(t), dlq.Filter{}, 0)
	require.NoError(t, err)
	assert.False(t, short.Complete, "two of three scanned")
	assert.Equal(t, 2, short.Scanned)

	again, err := cl.List(ctx(t), dlq.Filter{}, 0)
	require.NoError(t, err)
	assert.Equal(t, []string{a, b, c}, listIDs(again), "every browse returned the messages in place")
	assert.Equal(t, 3, p.Depth(broker.DLQ))
	assert.Empty(t, p.Audit(), "reading is not audited")
}

// A replay publishes the copy to events.replay, is confirmed, and only then
// removes the message; the audit says who and when.
func TestReplayConfirmsTheCopyThenRemovesTheMessage(t *testing.T) {
	t.Parallel()
	p := pipelinetest.New(t)
	bodyA := p.Event("evt_a")
	a := p.PutInDLQ("evt_a", "rejected_by_database", bodyA, time.Now())
	b := p.PutInDLQ("evt_b", "rejected_by_database", p.Event("evt_b"), time.Now())

	rep, err := client(t, p).Replay(ctx(t), dlq.Request{Filter: ids(a), Actor: alice()})
	require.NoError(t, err)
	require.Len(t, rep.Items, 1)
	assert.Equal(t, dlq.OutcomeReplayed, rep.Items[0].Outcome)
	assert.Equal(t, a, rep.Items[0].Message.ID)
	assert.Empty(t, rep.NotFound)
	assert.Equal(t, 1, p.Depth(broker.DLQ))
	require.Equal(t, 1, p.Depth(broker.ReplayQueue))

	copyOf, ok := p.Broker.Get(broker.ReplayQueue)
	require.True(t, ok)
	assert.Equal(t, "evt_a", copyOf.MessageId)
	assert.Equal(t, bodyA, copyOf.Body)
	assert.Equal(t, int64(1), copyOf.Headers[broker.HeaderAttempt])
	assert.Equal(t, "alice", copyOf.Headers[broker.HeaderReplayedBy])
	assert.Equal(t, a, copyOf.Headers[broker.HeaderReplayOf])
	assert.Equal(t, "stripe", copyOf.Headers[broker.HeaderSource])
	assert.NotContains(t, copyOf.Headers, broker.HeaderDLQID)
	assert.NotContains(t, copyOf.Headers, broker.HeaderDLQReason)

	left, err := client(t, p).List(ctx(t), dlq.Filter{}, 0)
	require.NoError(t, err)
	assert.Equal(t, []string{b}, listIDs(left))
	audit := p.Audit()
	require.Len(t, audit, 1)
	assert.Equal(t, pipelinetest.AuditRow{Operator: "alice", Via: "cli", Action: "replay", DLQID: a, EventID: "evt_a",
		Reason: "rejected_by_database", Outcome: "replayed"}, audit[0])
}

// --dry-run says what would happen to each message and changes nothing
// (beyond the audit rows that record the dry run).
func TestDryRunSaysWhatWouldHappenAndChangesNothing(t *testing.T) {
	t.Parallel()
	p := pipelinetest.New(t)
	a := p.PutInDLQ("evt_a", "rejected_by_database", p.Event("evt_a"), time.Now())
	b := p.PutInDLQ("evt_b", "panic", p.Event("evt_b"), time.Now())
	cl := client(t, p)

	rep, err := cl.Replay(ctx(t), dlq.Request{Filter: dlq.Filter{All: true}, DryRun: true, Actor: alice()})
	require.NoError(t, err)
	require.Len(t, rep.Items, 2)
	assert.Equal(t, dlq.OutcomeWouldReplay, rep.Items[0].Outcome)
	assert.Equal(t, dlq.OutcomeWouldReplay, rep.Items[1].Outcome)
	rep, err = cl.Discard(ctx(t), dlq.Request{Filter: dlq.Filter{Reason: "panic"}, DryRun: true, Actor: alice()})
	require.NoError(t, err)
	require.Len(t, rep.Items, 1)
	assert.Equal(t, b, rep.Items[0].Message.ID)
	assert.Equal(t, dlq.OutcomeWouldDiscard, rep.Items[0].Outcome)

	assert.Equal(t, 2, p.Depth(broker.DLQ))
	assert.Equal(t, 0, p.Depth(broker.ReplayQueue))
	audit := p.Audit()
	require.Len(t, audit, 3)
	for _, row := range audit {
		assert.True(t, row.DryRun)
	}
	assert.Equal(t, []string{a, b, b}, []string{audit[0].DLQID, audit[1].DLQID, audit[2].DLQID})
}

// A discard is recorded (with the message) and committed before the
// message leaves the DLQ; a crash between the two leaves both.
func TestDiscardIsRecordedBeforeTheMessageLeaves(t *testing.T) {
	t.Parallel()
	p := pipelinetest.New(t)
	poison := []byte(`{"id":"evt_poison","type":42}`)
	a := p.PutInDLQ("", "invalid_payload", poison, time.Now())
	b := p.PutInDLQ("evt_b", "invalid_payload", p.Event("evt_b"), time.Now())

	crashing := client(t, p, hooks(dlq.Hooks{AfterAudit: func(dlq.Message) error { return errors.New("killed") }}))
	rep, err := crashing.Discard(ctx(t), dlq.Request{Filter: ids(a), Actor: alice()})
	require.Error(t, err)
	require.Len(t, rep.Items, 1)
	p.Eventually(func() bool { return p.Depth(broker.DLQ) == 2 }, "the crashed discard left the message in the DLQ")
	require.Len(t, p.Audit(), 1, "and its audit row")

	rep, err = client(t, p).Discard(ctx(t), dlq.Request{Filter: dlq.Filter{EventID: "evt_poison"}, Actor: alice()})
	require.NoError(t, err)
	require.Len(t, rep.Items, 1)
	assert.Equal(t, dlq.OutcomeDiscarded, rep.Items[0].Outcome)
	assert.Equal(t, 1, p.Depth(broker.DLQ))
	left, err := client(t, p).List(ctx(t), dlq.Filter{}, 0)
	require.NoError(t, err)
	assert.Equal(t, []string{b}, listIDs(left))

	audit := p.Audit()
	require.Len(t, audit, 2)
	for _, row := range audit {
		assert.Equal(t, "discard", row.Action)
		assert.Equal(t, "discarded", row.Outcome)
		assert.Equal(t, a, row.DLQID)
		assert.Equal(t, poison, row.Payload, "the discarded message is kept")
	}
	var props map[string]any
	require.NoError(t, p.DB.QueryRow(context.Background(), `SELECT properties FROM dlq_audit ORDER BY id DESC LIMIT 1`).Scan(&props))
	assert.Equal(t, "invalid_payload", props["headers"].(map[string]any)[broker.HeaderDLQReason])
}

func TestMutationsNeedASelectionAnOperatorAndTheAudit(t *testing.T) {
	t.Parallel()
	p := pipelinetest.New(t)
	p.PutInDLQ("evt_a", "panic", p.Event("evt_a"), time.Now())
	_, err := client(t, p).Replay(ctx(t), dlq.Request{Actor: alice()})
	require.ErrorIs(t, err, dlq.ErrNoSelection)
	_, err = client(t, p).Discard(ctx(t), dlq.Request{Filter: dlq.Filter{All: true}})
	require.ErrorIs(t, err, dlq.ErrNoOperator)
	_, err = client(t, p, withoutAudit()).Discard(ctx(t), dlq.Request{Filter: dlq.Filter{All: true}, Actor: alice()})
	require.ErrorIs(t, err, dlq.ErrNoAudit)
	_, err = client(t, p).Replay(ctx(t), dlq.Request{Filter: dlq.Filter{OlderThan: 2 * time.Hour, NewerThan: time.Hour}, Actor: alice()})
	require.ErrorIs(t, err, dlq.ErrInvalidFilter)
	rep, err := client(t, p).Replay(ctx(t), dlq.Request{Filter: ids("0000000000000000"), Actor: alice()})
	require.NoError(t, err)
	assert.Equal(t, []string{"0000000000000000"}, rep.NotFound)
	assert.Equal(t, 1, p.Depth(broker.DLQ))
}

// A publish the broker does not confirm (here: events.replay is gone, so
// the mandatory publish is returned) removes nothing.
func TestAnUnconfirmedReplayLeavesTheMessageInTheDLQ(t *testing.T) {
	t.Parallel()
	p := pipelinetest.New(t)
	a := p.PutInDLQ("evt_a", "retries_exhausted", p.Event("evt_a"), time.Now())
	conn, err := amqp.Dial(p.AMQPURL)
	require.NoError(t, err)
	defer conn.Close()
	ch, err := conn.Channel()
	require.NoError(t, err)
	_, err = ch.QueueDelete(broker.ReplayQueue, false, false, false)
	require.NoError(t, err)

	rep, err := client(t, p).Replay(ctx(t), dlq.Request{Filter: ids(a), Actor: alice()})
	require.ErrorIs(t, err, broker.ErrReturned)
	require.Len(t, rep.Items, 1)
	assert.Equal(t, dlq.OutcomeFailed, rep.Items[0].Outcome)
	p.Eventually(func() bool { return p.Depth(broker.DLQ) == 1 }, "the message is back in the DLQ")
	audit := p.Audit()
	require.Len(t, audit, 1)
	assert.Equal(t, "failed", audit[0].Outcome)
}

// Passes reach messages beyond the scan limit once the ones in front were
// acted on; matches hidden behind a full scan of non-matching messages are
// reported as not reached.
func TestScanLimitAndRepeatedPasses(t *testing.T) {
	t.Parallel()
	p := pipelinetest.New(t)
	for i := 0; i < 12; i++ {
		p.PutInDLQ("", "panic", []byte(`{"n":1}`), time.Now())
	}
	for i := 0; i < 3; i++ {
		p.PutInDLQ("", "retries_exhausted", []byte(`{"n":2}`), time.Now())
	}
	rep, err := client(t, p, scanLimit(10)).Replay(ctx(t), dlq.Request{Filter: dlq.Filter{Reason: "retries_exhausted"}, Actor: alice()})
	require.NoError(t, err)
	assert.Empty(t, rep.Items, "the three are behind ten that do not match")
	assert.False(t, rep.Complete)
	assert.Equal(t, 15, p.Depth(broker.DLQ))

	rep, err = client(t, p, scanLimit(10)).Replay(ctx(t), dlq.Request{Filter: dlq.Filter{All: true}, Actor: alice()})
	require.NoError(t, err)
	assert.Equal(t, 15, rep.Count(dlq.OutcomeReplayed), "two passes of ten reach all fifteen")
	assert.Equal(t, 0, p.Depth(broker.DLQ))
	assert.Equal(t, 15, p.Depth(broker.ReplayQueue))
}

// Operators acting at the same time never act on a message twice: a
// message one of them holds is invisible to the others.
func TestConcurrentOperatorsActOnEachMessageOnce(t *testing.T) {
	t.Parallel()
	p := pipelinetest.New(t)
	const n = 30
	for i := 0; i < n; i++ {
		p.PutInDLQ("", "panic", []byte(`{}`), time.Now())
	}
	var wg sync.WaitGroup
	var replayed atomic.Int64
	for i := 0; i < 3; i++ {
		wg.Go(func() {
			rep, err := client(t, p, scanLimit(7)).Replay(ctx(t), dlq.Request{Filter: dlq.Filter{All: true}, Actor: alice()})
			assert.NoError(t, err) //nolint:testifylint // on a goroutine of wg.Go: require (FailNow) must not run here
			replayed.Add(int64(rep.Count(dlq.OutcomeReplayed)))
		})
	}
	wg.Wait()
	// An operator that found the queue empty while others held everything
	// may stop early; whatever is left is replayed once by a last run.
	rep, err := client(t, p).Replay(ctx(t), dlq.Request{Filter: dlq.Filter{All: true}, Actor: alice()})
	require.NoError(t, err)
	replayed.Add(int64(rep.Count(dlq.OutcomeReplayed)))

	assert.Equal(t, int64(n), replayed.Load())
	assert.Equal(t, n, p.Depth(broker.ReplayQueue))
	assert.Equal(t, 0, p.Depth(broker.DLQ))
	seen := map[string]bool{}
	for _, row := range p.Audit() {
		assert.False(t, seen[row.DLQID], "%s replayed twice", row.DLQID)
		seen[row.DLQID] = true
	}
	assert.Len(t, seen, n)
}

// The rate limit spaces replays out (this is a lower bound, not a timing
// benchmark): 6 replays at 10/s take at least 5 intervals.
func TestReplaysAreRateLimited(t *testing.T) {
	t.Parallel()
	p := pipelinetest.New(t)
	for i := 0; i < 6; i++ {
		p.PutInDLQ("", "panic", []byte(`{}`), time.Now())
	}
	start := time.Now()
	rep, err := client(t, p, replayRate(10)).Replay(ctx(t), dlq.Request{Filter: dlq.Filter{All: true}, Actor: alice()})
	require.NoError(t, err)
	assert.Equal(t, 6, rep.Count(dlq.OutcomeReplayed))
	assert.GreaterOrEqual(t, time.Since(start), 450*time.Millisecond)
}

// The scenario of the issue, against a real worker: events Postgres rejects
// land in the DLQ; once the cause is fixed, a replay processes each exactly
// once; replaying an event that was processed is a duplicate.
func TestReplayAfterTheFixProcessesEachEventExactlyOnce(t *testing.T) {
	t.Parallel()
	p := pipelinetest.New(t)
	p.StartWorker("")
	p.Block("evt_r1", "evt_r2")
	for _, id := range []string{"evt_r1", "evt_r2", "evt_ok"} {
		p.PublishEvent(id)
	}
	p.Eventually(func() bool { return p.Depth(broker.DLQ) == 2 && p.Outcomes("processed") == 1 }, "two rejected events in the DLQ")
	l, err := client(t, p).List(ctx(t), dlq.Filter{}, 0)
	require.NoError(t, err)
	for _, m := range l.Messages {
		assert.Equal(t, broker.ReasonRejectedByDatabase, m.Reason)
		assert.Contains(t, m.LastError, "rejected by the test")
	}

	p.Unblock()
	rep, err := client(t, p).Replay(ctx(t), dlq.Request{Filter: dlq.Filter{Reason: "rejected_by_database"}, Actor: alice()})
	require.NoError(t, err)
	assert.Equal(t, 2, rep.Count(dlq.OutcomeReplayed))
	p.Eventually(func() bool { return p.Outcomes("processed") == 3 }, "both replays processed")
	for _, id := range []string{"evt_r1", "evt_r2", "evt_ok"} {
		payments, ledger := p.Rows(id)
		assert.Equal(t, 1, payments, id)
		assert.Equal(t, 1, ledger, id)
	}

	// A stale DLQ copy of an event that was processed: its replay is a
	// duplicate, never a second payment.
	stale := p.PutInDLQ("evt_r1", "rejected_by_database", p.Event("evt_r1"), time.Now())
	rep, err = client(t, p).Replay(ctx(t), dlq.Request{Filter: ids(stale), Actor: alice()})
	require.NoError(t, err)
	assert.Equal(t, 1, rep.Count(dlq.OutcomeReplayed))
	p.Eventually(func() bool { return p.Outcomes("duplicate") == 1 }, "the replay of a processed event is a duplicate")
	payments, _ := p.Rows("evt_r1")
	assert.Equal(t, 1, payments)
	assert.Equal(t, 0, p.Depth(broker.DLQ))
	p.Invariant()
}

// A replayed poison message fails again and comes back to the DLQ under a
// new id; the replay that sent it does not pick it up again.
func TestAReplayedPoisonMessageComesBackOnceAndIsNotReplayedInALoop(t *testing.T) {
	t.Parallel()
	p := pipelinetest.New(t)
	p.StartWorker("")
	p.Publish("", "", []byte(`{"id":"evt_bad"}`))
	p.Eventually(func() bool { return p.Depth(broker.DLQ) == 1 }, "the poison is in the DLQ")
	first, err := client(t, p).List(ctx(t), dlq.Filter{}, 0)
	require.NoError(t, err)
	require.Len(t, first.Messages, 1)

	// A small scan limit makes the replay take several passes, and a slow
	// rate keeps it open while the worker sends the messages back: the
	// later passes see the returned copies and must leave them alone.
	for i := 0; i < 5; i++ {
		p.PutInDLQ("", "panic", []byte(`{}`), time.Now().Add(-time.Hour))
	}
	rep, err := client(t, p, replayRate(5), scanLimit(2)).Replay(ctx(t), dlq.Request{Filter: dlq.Filter{All: true}, Actor: alice()})
	require.NoError(t, err)
	assert.Equal(t, 6, rep.Count(dlq.OutcomeReplayed), "each message once")
	p.Eventually(func() bool { return p.Depth(broker.DLQ) == 6 }, "all six failed again and are back")
	again, err := client(t, p).List(ctx(t), dlq.Filter{EventID: "evt_bad"}, 0)
	require.NoError(t, err)
	require.Len(t, again.Messages, 1)
	assert.NotEqual(t, first.Messages[0].ID, again.Messages[0].ID, "a new DLQ copy")
	assert.Equal(t, first.Messages[0].ID, again.Messages[0].ReplayOf)
	assert.Equal(t, 1, again.Messages[0].ReplayCount)
	assert.Equal(t, broker.ReasonInvalidPayload, again.Messages[0].Reason)
}

// A crash after the broker confirmed the replayed copy and before the DLQ
// message was acked: the copy is processed once, the message is still in
// the DLQ, and replaying it again is a duplicate. Nothing is lost, nothing
// doubled.
func TestACrashBetweenConfirmAndAckLosesNothing(t *testing.T) {
	t.Parallel()
	p := pipelinetest.New(t)
	p.StartWorker("")
	p.Block("evt_crash")
	p.PublishEvent("evt_crash")
	p.Eventually(func() bool { return p.Depth(broker.DLQ) == 1 }, "the rejected event is in the DLQ")
	p.Unblock()

	crashing := client(t, p, hooks(dlq.Hooks{AfterConfirm: func(dlq.Message) error { return errors.New("operator's process killed") }}))
	rep, err := crashing.Replay(ctx(t), dlq.Request{Filter: dlq.Filter{EventID: "evt_crash"}, Actor: alice()})
	require.Error(t, err)
	require.Len(t, rep.Items, 1)
	assert.Equal(t, dlq.OutcomePending, rep.Items[0].Outcome)

	p.Eventually(func() bool { payments, _ := p.Rows("evt_crash"); return payments == 1 }, "the confirmed copy was processed")
	p.Eventually(func() bool { return p.Depth(broker.DLQ) == 1 }, "the unacked DLQ message is back: replayed and still there, never neither")
	audit := p.Audit()
	require.Len(t, audit, 1)
	assert.Equal(t, "pending", audit[0].Outcome, "the audit shows the replay was cut")

	rep, err = client(t, p).Replay(ctx(t), dlq.Request{Filter: dlq.Filter{EventID: "evt_crash"}, Actor: alice()})
	require.NoError(t, err)
	assert.Equal(t, 1, rep.Count(dlq.OutcomeReplayed))
	p.Eventually(func() bool { return p.Outcomes("duplicate") == 1 }, "the second replay is a duplicate")
	payments, ledger := p.Rows("evt_crash")
	assert.Equal(t, 1, payments)
	assert.Equal(t, 1, ledger)
	assert.Equal(t, 0, p.Depth(broker.DLQ))
	p.Invariant()
}

// The same with the network: the operator's connection to RabbitMQ is cut
// right after the confirm. The message ends replayed, or replayed and still
// in the DLQ; a cleanup replay is harmless.
func TestCuttingTheConnectionMidReplayLosesNothing(t *testing.T) {
	t.Parallel()
	p := pipelinetest.New(t)
	p.StartWorker("")
	p.Block("evt_cut1", "evt_cut2")
	p.PublishEvent("evt_cut1")
	p.PublishEvent("evt_cut2")
	p.Eventually(func() bool { return p.Depth(broker.DLQ) == 2 }, "both rejected events are in the DLQ")
	p.Unblock()

	u, err := url.Parse(p.AMQPURL)
	require.NoError(t, err)
	proxy, err := faulttest.Start(u.Host)
	require.NoError(t, err)
	t.Cleanup(proxy.Close)
	var cuts atomic.Int32
	var cutAfter atomic.Value
	cutting := client(t, p, amqpURL(servicetest.ReplaceHost(p.AMQPURL, proxy.Addr())), hooks(dlq.Hooks{AfterConfirm: func(m dlq.Message) error {
		cuts.Add(1)
		cutAfter.Store(m.EventID)
		proxy.Cut()
		return nil
	}}))
	_, err = cutting.Replay(ctx(t), dlq.Request{Filter: dlq.Filter{All: true}, Actor: alice()})
	require.Error(t, err, "the connection died under the replay")
	require.Equal(t, int32(1), cuts.Load())
	replayed := cutAfter.Load().(string)
	other := map[string]string{"evt_cut1": "evt_cut2", "evt_cut2": "evt_cut1"}[replayed]
	require.NotEmpty(t, other)

	p.Eventually(func() bool { payments, _ := p.Rows(replayed); return payments == 1 }, "the confirmed copy was processed")
	p.Eventually(func() bool { return p.Depth(broker.DLQ) >= 1 }, "what was not acked is back in the DLQ")
	payments, _ := p.Rows(other)
	assert.Zero(t, payments, "the second message was never replayed")

	rep, err := client(t, p).Replay(ctx(t), dlq.Request{Filter: dlq.Filter{All: true}, Actor: alice()})
	require.NoError(t, err)
	assert.NotZero(t, rep.Count(dlq.OutcomeReplayed))
	p.Eventually(func() bool {
		a, _ := p.Rows("evt_cut1")
		b, _ := p.Rows("evt_cut2")
		return a == 1 && b == 1
	}, "both events processed")
	p.Eventually(func() bool {
		return p.Outcomes("processed")+p.Outcomes("duplicate") == float64(1+rep.Count(dlq.OutcomeReplayed))
	}, "every replay settled")
	payments, _ = p.Rows(replayed)
	assert.Equal(t, 1, payments, "never doubled")
	assert.Equal(t, 0, p.Depth(broker.DLQ))
	p.Invariant()
}

// RabbitMQ itself dead-letters a message beyond a quorum queue's delivery
// limit. It has no x-ie-dlq-id: it is listed under a stable derived id with
// reason delivery_limit and can be replayed by it.
func TestMessagesRabbitMQDeadLetteredAreListedAndReplayable(t *testing.T) {
	t.Parallel()
	vhost := servicetest.VHost(t)
	topo := broker.Topology{QueueType: broker.QueueQuorum, RetryDelays: []time.Duration{time.Second}, DeliveryLimit: 1}
	b := servicetest.NewBroker(t, vhost, topo)
	b.PublishEvent([]byte(`{"id":"evt_limit","type":"payment_intent.succeeded"}`), nil)
	conn, err := amqp.Dial(vhost)
	require.NoError(t, err)
	defer conn.Close()
	ch, err := conn.Channel()
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		if d, ok, err := ch.Get(broker.MainQueue, false); err == nil && ok {
			require.NoError(t, d.Nack(false, true))
		}
		return b.Depth(broker.DLQ) == 1
	}, 20*time.Second, 50*time.Millisecond, "the delivery limit dead-letters the message")

	p := &pipelinetest.Pipeline{T: t, AMQPURL: vhost, DBURL: servicetest.Schema(t)}
	p.DB = dbPool(t, p.DBURL)
	cl := client(t, p)
	first, err := cl.List(ctx(t), dlq.Filter{}, 0)
	require.NoError(t, err)
	require.Len(t, first.Messages, 1)
	m := first.Messages[0]
	assert.True(t, m.DerivedID)
	assert.Equal(t, broker.ReasonDeliveryLimit, m.Reason)
	assert.Equal(t, "evt_limit", m.EventID)
	assert.False(t, m.DeadLetteredAt.IsZero())
	second, err := cl.List(ctx(t), dlq.Filter{Reason: broker.ReasonDeliveryLimit}, 0)
	require.NoError(t, err)
	assert.Equal(t, []string{m.ID}, listIDs(second), "the derived id is stable across browses")

	rep, err := cl.Replay(ctx(t), dlq.Request{Filter: ids(m.ID), Actor: alice()})
	require.NoError(t, err)
	assert.Equal(t, 1, rep.Count(dlq.OutcomeReplayed))
	copyOf, ok := b.Get(broker.ReplayQueue)
	require.True(t, ok)
	assert.NotContains(t, copyOf.Headers, "x-death", "RabbitMQ's bookkeeping is not carried into the replay")
	assert.Equal(t, 0, b.Depth(broker.DLQ))
}

func dbPool(t *testing.T, dbURL string) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), dbURL)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}
