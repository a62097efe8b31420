package effects_test

import (
	"context"
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotent-events/idempotent-events/pkg/effects"
)

// recorder is a handler that records the keys it was given.
type recorder struct {
	name string
	log  *[]string
	err  map[string]error
}

func (r recorder) Handle(_ context.Context, ev effects.Event, _ effects.Tx, _ effects.Outbox) error {
	*r.log = append(*r.log, r.name+":"+ev.Key)
	return r.err[ev.Key]
}

// batcher is a BatchHandler that records its batches.
type batcher struct {
	recorder
	skip map[string]bool
}

func (b batcher) HandleBatch(_ context.Context, evs []effects.Event, _ effects.Tx, _ effects.Outbox) ([]bool, error) {
	skipped := make([]bool, len(evs))
	var keys string
	for i, ev := range evs {
		keys += ev.Key + ","
		skipped[i] = b.skip[ev.Key]
	}
	*b.log = append(*b.log, b.name+"["+keys+"]")
	return skipped, nil
}

func ev(source, typ, key string) effects.Event {
	return effects.Event{Source: source, Type: typ, Key: key, ID: key}
}

// Routing by source and type (exact, prefix.*, *), handlers in
// registration order, batch handlers given their events at once, and an
// event is applied when one handler did not skip it.
func TestApplyRoutesRunsInOrderAndReportsWhatWasApplied(t *testing.T) {
	var log []string
	reg := effects.NewRegistry()
	reg.Handle("pi", "stripe", "payment_intent.*", recorder{name: "pi", log: &log})
	reg.Handle("all", "*", "*", batcher{recorder: recorder{name: "all", log: &log}, skip: map[string]bool{"e4": true}})
	reg.Handle("acme", "acme", "order.paid", recorder{name: "acme", log: &log, err: map[string]error{"e3": effects.Skip("not mine")}})

	evs := []effects.Event{
		ev("stripe", "payment_intent.succeeded", "e1"),
		ev("stripe", "charge.succeeded", "e2"),
		ev("acme", "order.paid", "e3"),
		ev("github", "push", "e4"),
	}
	applied, err := reg.Apply(context.Background(), evs, nil, effects.NoOutbox{})
	require.NoError(t, err)
	assert.Equal(t, []string{"pi:e1", "all[e1,e2,e3,e4,]", "acme:e3"}, log)
	assert.Equal(t, []bool{true, true, true, false}, applied, "e3 is applied by all even though acme skipped it; e4 only by a handler that skipped it")
	assert.Empty(t, reg.Handlers(ev("github", "push", "x"))[1:], "only the catch-all takes a push")
}

// A handler's error stops Apply and names the event; Permanent, RetryAfter
// and Skip keep their meaning through the wrapping.
func TestApplyStopsAtTheFirstErrorAndKeepsItsKind(t *testing.T) {
	var log []string
	boom := errors.New("boom")
	reg := effects.NewRegistry()
	reg.Handle("h", "*", "*", recorder{name: "h", log: &log, err: map[string]error{"e2": effects.Permanent(boom)}})
	_, err := reg.Apply(context.Background(), []effects.Event{ev("s", "t", "e1"), ev("s", "t", "e2"), ev("s", "t", "e3")}, nil, nil)
	require.Error(t, err)
	assert.Equal(t, []string{"h:e1", "h:e2"}, log)
	require.ErrorContains(t, err, "event e2")
	var pe *effects.PermanentError
	require.ErrorAs(t, err, &pe)
	assert.ErrorIs(t, err, boom)
}

// Transition handlers run for their object type and target state, in
// registration order.
func TestTransitionsReachTheirHandlers(t *testing.T) {
	var got []string
	reg := effects.NewRegistry()
	reg.OnTransitionFunc("pi.succeeded", "payment_intent", "succeeded", func(_ context.Context, tr effects.Transition, _ effects.Tx, _ effects.Outbox) error {
		got = append(got, "succeeded:"+tr.Object.ID+":"+tr.From)
		return nil
	})
	reg.OnTransitionFunc("pi.any", "payment_intent", "*", func(_ context.Context, tr effects.Transition, _ effects.Tx, _ effects.Outbox) error {
		got = append(got, "any:"+tr.To)
		return nil
	})
	pi := effects.Object{Type: "payment_intent", ID: "pi_1"}
	require.NoError(t, reg.Transition(context.Background(), effects.Transition{Object: pi, From: "processing", To: "succeeded"}, nil, nil))
	require.NoError(t, reg.Transition(context.Background(), effects.Transition{Object: pi, From: "", To: "processing"}, nil, nil))
	require.NoError(t, reg.Transition(context.Background(), effects.Transition{Object: effects.Object{Type: "charge", ID: "ch_1"}, To: "succeeded"}, nil, nil))
	assert.Equal(t, []string{"succeeded:pi_1:processing", "any:succeeded", "any:processing"}, got)
}

func TestNoOutboxRefusesRatherThanDrops(t *testing.T) {
	require.ErrorIs(t, effects.NoOutbox{}.Enqueue(context.Background(), effects.Event{}, effects.Message{}), effects.ErrNoOutbox)
}

// A registry's identity is the set of its handlers' names and routes: the
// same whatever the order of registration, different when a handler is
// added, renamed or routed elsewhere. Names are checked and unique.
func TestTheHandlerSetIsTheNamesAndRoutesNotTheOrder(t *testing.T) {
	nop := func(context.Context, effects.Event, effects.Tx, effects.Outbox) error { return nil }
	tnop := func(context.Context, effects.Transition, effects.Tx, effects.Outbox) error { return nil }
	build := func(steps ...func(*effects.Registry)) effects.Set {
		reg := effects.NewRegistry()
		for _, s := range steps {
			s(reg)
		}
		return reg.Set()
	}
	orders := func(r *effects.Registry) { r.HandleFunc("orders.create", "stripe", "payment_intent.succeeded", nop) }
	receipts := func(r *effects.Registry) { r.OnTransitionFunc("receipts", "payment_intent", "succeeded", tnop) }

	a := build(orders, receipts)
	require.Len(t, a.ID, 16)
	require.Equal(t, a, build(receipts, orders), "order of registration")
	require.Equal(t, []string{"orders.create", "receipts"}, []string{a.Handlers[0].Name, a.Handlers[1].Name})
	require.True(t, a.Has("receipts"))
	require.False(t, a.Has("audit"))

	for name, other := range map[string]effects.Set{
		"a handler fewer": build(orders),
		"renamed":         build(receipts, func(r *effects.Registry) { r.HandleFunc("orders.new", "stripe", "payment_intent.succeeded", nop) }),
		"routed elsewhere": build(receipts, func(r *effects.Registry) {
			r.HandleFunc("orders.create", "stripe", "payment_intent.*", nop)
		}),
	} {
		require.NotEqual(t, a.ID, other.ID, name)
	}

	reg := effects.NewRegistry()
	reg.HandleFunc("orders.create", "stripe", "*", nop)
	require.PanicsWithValue(t, `effects: OnTransition("orders.create", "payment_intent", "*"): a handler named "orders.create" is already registered`,
		func() { reg.OnTransitionFunc("orders.create", "payment_intent", "*", tnop) })
	require.Panics(t, func() { reg.HandleFunc("Orders", "stripe", "*", nop) }, "upper case")
	require.Panics(t, func() { reg.HandleFunc("", "stripe", "*", nop) }, "empty")
}
