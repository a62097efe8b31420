package harness_test

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idempotent-events/idempotent-events/pkg/internal/harness"
	"github.com/idempotent-events/idempotent-events/pkg/internal/reconcile"
)

// The chaos suite's Stripe, read with the reconciler's own client: newest
// first with ties in a second broken later-created first, every event once
// across pages, and the filters.
func TestStripeEventsListsLikeStripe(t *testing.T) {
	api := harness.NewStripeEvents("rk_test_harness")
	t.Cleanup(api.Close)
	const base = 1_800_000_000
	var added []string // within a second, in creation order
	at := map[string]int64{}
	for i := range 10 {
		id := fmt.Sprintf("evt_h_%02d", i)
		succeeded := base + int64(i/3) // three payments a second
		for _, e := range []struct {
			id string
			at int64
		}{{id + "_p", succeeded - 20}, {id + "_f", succeeded - 10}, {id, succeeded}} {
			require.NoError(t, api.Add(harness.RetriedDebitBodyAt(e.id, succeeded)))
			added, at[e.id] = append(added, e.id), e.at
		}
	}
	require.Error(t, api.Add(harness.RetriedDebitBodyAt("evt_h_00", base)), "an id twice")
	api.Delivered("evt_h_04")

	log := reconcile.NewStripeLog(reconcile.StripeOptions{APIKey: "rk_test_harness", URL: api.URL(), Rate: 1000})
	list := func(q reconcile.PageQuery) (ids []string, pages int) {
		for {
			p, err := log.Page(context.Background(), q)
			require.NoError(t, err)
			pages++
			for _, e := range p.Events {
				ids = append(ids, e.ID)
			}
			if !p.HasMore {
				return ids, pages
			}
			q.After = p.Events[len(p.Events)-1].ID
		}
	}
	window := reconcile.PageQuery{From: time.Unix(base-100, 0), To: time.Unix(base+100, 0), Limit: 7}

	// Newest first: by created, then, within a second, the later created
	// first.
	want := slices.Clone(added)
	slices.Reverse(want)
	slices.SortStableFunc(want, func(a, b string) int { return cmp.Compare(at[b], at[a]) })
	ids, pages := list(window)
	require.Equal(t, want, ids)
	require.Equal(t, 5, pages)

	// created[gte]/[lte] bound the window, both included.
	only, _ := list(reconcile.PageQuery{From: time.Unix(base, 0), To: time.Unix(base, 0)})
	require.Equal(t, []string{"evt_h_02", "evt_h_01", "evt_h_00"}, only)

	// types[N] and delivery_success filter.
	failed, _ := list(reconcile.PageQuery{From: window.From, To: window.To, Types: []string{"payment_intent.payment_failed"}, Limit: 3})
	require.Len(t, failed, 10)
	undelivered, _ := list(reconcile.PageQuery{From: window.From, To: window.To, UndeliveredOnly: true, Limit: 100})
	require.Len(t, undelivered, len(added)-1)
	require.NotContains(t, undelivered, "evt_h_04")

	// A wrong key, and an unknown cursor, are refused.
	_, err := reconcile.NewStripeLog(reconcile.StripeOptions{APIKey: "rk_test_other", URL: api.URL()}).Page(context.Background(), window)
	require.Error(t, err)
	_, err = log.Page(context.Background(), reconcile.PageQuery{From: window.From, To: window.To, After: "evt_nope"})
	require.Error(t, err)
}
