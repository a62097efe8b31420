package main

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A timeline of the rollout's checks: the old release (generation 1) is
// current, the new one (2) is announced at t(10) and registers at t(12),
// the old one is announced again at t(20) (3) and registers at t(21).
func rolloutTimeline() []generationRow {
	t := func(s int) *time.Time { at := t0.Add(time.Duration(s) * time.Second); return &at }
	old, nu := []string{"payments.state"}, []string{"payments.state", ordersHandler}
	return []generationRow{
		{gen: 1, release: releaseOld, setID: "old", handlers: old, announced: *t(0), registered: t(1)},
		{gen: 2, release: releaseNew, setID: "new", handlers: nu, announced: *t(10), registered: t(12), byOrdersSet: true},
		{gen: 3, release: releaseOld, setID: "old", handlers: old, announced: *t(20), registered: t(21)},
	}
}

var t0 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

func committedAt(id, typ string, gen int64, s float64) committedEvent {
	return committedEvent{id: id, typ: typ, gen: &gen, at: t0.Add(time.Duration(s * float64(time.Second)))}
}

func TestJudgeAcceptsEachEventCommittedByTheCurrentSet(t *testing.T) {
	j := judge(ledgerView{gens: rolloutTimeline(), events: []committedEvent{
		committedAt("evt_a", "payment_intent.succeeded", 1, 5),
		committedAt("evt_b", "payment_intent.succeeded", 2, 13),
		committedAt("evt_b_p", "payment_intent.processing", 2, 14),
		// A worker of the old set that kept generation 1's registration
		// commits while generation 3, of the same set, is current.
		committedAt("evt_c", "payment_intent.succeeded", 1, 22),
		committedAt("evt_d", "payment_intent.succeeded", 3, 23),
	}, orders: map[string]int{"evt_b": 1}})

	require.Equal(t, map[string]int{"payments.state": 0, ordersHandler: 0}, j.skipped)
	require.Zero(t, j.stale+j.unregistered+j.ungenerated, j.firstWrong)
	require.Equal(t, 1, j.wantOrders)
	require.Zero(t, j.missingOrders+j.strayOrders)
	require.Equal(t, map[int64]int{1: 2, 2: 2, 3: 1}, j.perGen)
	require.Equal(t, map[int64]int{1: 1, 2: 2, 3: 2}, j.perCurrent)
}

func TestJudgeCountsACommitOfTheOldSetAfterTheAnnouncementAsSkipped(t *testing.T) {
	j := judge(ledgerView{gens: rolloutTimeline(), events: []committedEvent{
		committedAt("evt_late", "payment_intent.succeeded", 1, 15),
	}, orders: map[string]int{}})

	require.Equal(t, 1, j.stale)
	require.Equal(t, 1, j.skipped[ordersHandler])
	require.Contains(t, j.firstWrong, "evt_late")
	// It has no orders row, and none is expected of the old set's commit:
	// only the timeline shows what it skipped.
	require.Zero(t, j.wantOrders+j.missingOrders)
}

func TestJudgeRefusesACommitBeforeTheAnnouncedReleaseRegistered(t *testing.T) {
	j := judge(ledgerView{gens: rolloutTimeline(), events: []committedEvent{
		committedAt("evt_early", "payment_intent.processing", 2, 11),
		committedAt("evt_between", "payment_intent.processing", 1, 20.5),
	}, orders: map[string]int{}})

	require.Equal(t, 2, j.unregistered)
	require.Contains(t, j.firstWrong, "evt_early")
}

func TestJudgeRefusesACommitWithoutAGeneration(t *testing.T) {
	j := judge(ledgerView{gens: rolloutTimeline(), events: []committedEvent{
		{id: "evt_unfenced", typ: "payment_intent.succeeded", at: t0.Add(5 * time.Second)},
	}, orders: map[string]int{}})

	require.Equal(t, 1, j.ungenerated)
}

func TestJudgeCountsOrdersMissingDoubledAndStray(t *testing.T) {
	j := judge(ledgerView{gens: rolloutTimeline(), events: []committedEvent{
		committedAt("evt_none", "payment_intent.succeeded", 2, 13),
		committedAt("evt_two", "payment_intent.succeeded", 2, 13),
		committedAt("evt_one", "payment_intent.succeeded", 2, 13),
		committedAt("evt_old", "payment_intent.succeeded", 1, 5),
	}, orders: map[string]int{"evt_two": 2, "evt_one": 1, "evt_old": 1, "evt_unknown": 1}})

	require.Equal(t, 3, j.wantOrders)
	require.Equal(t, 2, j.missingOrders)
	require.Equal(t, 2, j.strayOrders)
}
