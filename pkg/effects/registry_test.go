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
	reg.Handle("stripe", "payment_intent.*", recorder{name: "pi", log: &log})
	reg.Handle("*", "*", batcher{recorder: recorder{name: "all", log: &log}, skip: map[string]bool{"e4": true}})
	reg.Handle("acme", "order.paid", recorder{name: "acme", log: &log, err: map[string]error{"e3": effects.Skip("not mine")}})

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
	reg.Handle("*", "*", recorder{name: "h", log: &log, err: map[string]error{"e2": effects.Permanent(boom)}})
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
	reg.OnTransitionFunc("payment_intent", "succeeded", func(_ context.Context, tr effects.Transition, _ effects.Tx, _ effects.Outbox) error {
		got = append(got, "succeeded:"+tr.Object.ID+":"+tr.From)
		return nil
	})
	reg.OnTransitionFunc("payment_intent", "*", func(_ context.Context, tr effects.Transition, _ effects.Tx, _ effects.Outbox) error {
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
