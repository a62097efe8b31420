package reconcile_test

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap/zaptest"

	"github.com/idempotent-events/idempotent-events/pkg/internal/event"
	"github.com/idempotent-events/idempotent-events/pkg/internal/reconcile"
	"github.com/idempotent-events/idempotent-events/pkg/internal/servicetest"
)

const ghSource = "gh"

// ghWorld is a GitHub hook's deliveries over the last 60 hours and a
// ledger (its own schema) holding the events the receiver took in, for a
// 48-hour window:
//
//   - fillers events delivered once, answered 200 and in the ledger;
//   - "accepted": failed (503) 40 h ago, its redelivery answered 200 an
//     hour ago, not in the ledger yet: on its way, never redelivered;
//   - "failed-twice": no answer 30 h ago, 502 to a redelivery 2 h ago:
//     redelivered, from its latest attempt;
//   - "failed-once": 500 20 h ago: redelivered;
//   - "straddles": 500 49 h ago (before the window), 500 to a redelivery
//     5 h ago: redelivered, from the latest;
//   - "in-ledger": 500 10 h ago, yet in the ledger (an earlier
//     reconciliation, a retry that GitHub did not list): untouched;
//   - old events of 50 to 60 h ago, failed or not: outside the window,
//     never looked at past the page that reaches the window's start.
//
// The attempts of one event lie on different pages of 100.
type ghWorld struct {
	t      *testing.T
	gh     *fakeGitHub
	db     *pgxpool.Pool
	now    time.Time
	latest map[string]int64 // the latest attempt of each event to redeliver
}

const ghFillers = 220

func newGHWorld(t *testing.T) *ghWorld {
	ctx := context.Background()
	db, err := pgxpool.New(ctx, servicetest.Schema(t))
	require.NoError(t, err)
	t.Cleanup(db.Close)
	w := &ghWorld{t: t, gh: newFakeGitHub(t), db: db, now: time.Now().UTC(), latest: map[string]int64{}}
	ago := func(h float64) time.Time { return w.now.Add(-time.Duration(h * float64(time.Hour))) }
	for i := range ghFillers {
		guid := fmt.Sprintf("fill-%03d", i)
		w.gh.add(guid, ago(47*float64(ghFillers-i)/ghFillers), 200, false)
		w.ledger(guid)
	}
	w.gh.add("accepted", ago(40), 503, false)
	w.gh.add("accepted", ago(1), 200, true)
	w.gh.add("failed-twice", ago(30), 0, false)
	w.latest["failed-twice"] = w.gh.add("failed-twice", ago(2), 502, true)
	w.latest["failed-once"] = w.gh.add("failed-once", ago(20), 500, false)
	w.gh.add("straddles", ago(49), 500, false)
	w.latest["straddles"] = w.gh.add("straddles", ago(5), 500, true)
	w.gh.add("in-ledger", ago(10), 500, false)
	w.ledger("in-ledger")
	for i := range 150 {
		code := 200
		if i%3 == 0 {
			code = 500
		}
		w.gh.add(fmt.Sprintf("old-%03d", i), ago(50+10*float64(i)/150), code, false)
	}
	return w
}

// ledger records guid as processed, as the worker does for a delivery the
// receiver took in from the GitHub source.
func (w *ghWorld) ledger(guid string) {
	_, err := w.db.Exec(context.Background(), `INSERT INTO processed_events (event_id, source, event_type, payload_sha256) VALUES ($1, $2, 'push', '\x00')`,
		event.Key(ghSource, guid), ghSource)
	require.NoError(w.t, err)
}

func (w *ghWorld) hook(o reconcile.GitHubHookOptions) *reconcile.GitHubHook {
	if o.Token == "" {
		o.Token = fakeGitHubToken
	}
	o.URL, o.Repo, o.HookID = w.gh.srv.URL, "acme/shop", 42
	if o.Rate == 0 {
		o.Rate = 1000
	}
	if o.MaxWait == 0 {
		o.MaxWait = 10 * time.Second
	}
	o.FirstBackoff = 5 * time.Millisecond
	h, err := reconcile.NewGitHubHook(o)
	require.NoError(w.t, err)
	return h
}

func (w *ghWorld) options(h reconcile.Hook) reconcile.GitHubOptions {
	return reconcile.GitHubOptions{Source: ghSource, Hook: h, DB: w.db, Since: 48 * time.Hour, Logger: zaptest.NewLogger(w.t),
		Now: func() time.Time { return w.now }}
}

func (w *ghWorld) runs() int {
	var n int
	require.NoError(w.t, w.db.QueryRow(context.Background(), `SELECT count(*) FROM reconcile_runs WHERE source = $1`, ghSource).Scan(&n))
	return n
}

// The first run redelivers each event that only ever failed once, from its
// latest attempt, oldest first; GitHub's redeliveries then reach the
// ledger, and the next run finds nothing to do.
func TestGitHubRedeliversEachFailedEventOnce(t *testing.T) {
	t.Parallel()
	w := newGHWorld(t)
	w.gh.onRedeliver = w.ledger
	rep, err := reconcile.RunGitHub(context.Background(), w.options(w.hook(reconcile.GitHubHookOptions{})))
	require.NoError(t, err)

	// 227 attempts in the window, then the page that reaches past its
	// start: three pages of 100, the fourth and fifth never asked for.
	assert.Equal(t, 3, rep.Pages)
	assert.Equal(t, 300, rep.Listed)
	assert.Equal(t, 73, rep.OutsideWindow)
	assert.Equal(t, ghFillers+5, rep.GUIDs)
	assert.Equal(t, ghFillers+1, rep.Present)
	assert.Equal(t, 1, rep.Accepted)
	assert.Equal(t, []string{"accepted"}, rep.AcceptedGUIDs)
	assert.Equal(t, 3, rep.Failed)
	assert.Equal(t, []string{"straddles", "failed-twice", "failed-once"}, rep.FailedGUIDs, "oldest first")
	assert.Equal(t, 3, rep.Redelivered)
	assert.Zero(t, rep.RedeliverFailed)
	assert.Equal(t, w.now.Add(-48*time.Hour).Truncate(time.Second), rep.From)

	requests, lists, redelivered, _ := w.gh.calls()
	assert.Equal(t, 3, lists)
	assert.Equal(t, 3+3, requests, "one request a page and one a redelivery")
	assert.Equal(t, []int64{w.latest["straddles"], w.latest["failed-twice"], w.latest["failed-once"]}, redelivered)

	var listed, present, missing, injected int
	require.NoError(t, w.db.QueryRow(context.Background(), `SELECT listed, present, missing, injected FROM reconcile_runs
		WHERE id = $1 AND source = $2 AND state = 'done' AND finished_at IS NOT NULL`, rep.RunID, ghSource).Scan(&listed, &present, &missing, &injected))
	assert.Equal(t, [4]int{ghFillers + 5, ghFillers + 1, 3, 3}, [4]int{listed, present, missing, injected})

	rep, err = reconcile.RunGitHub(context.Background(), w.options(w.hook(reconcile.GitHubHookOptions{})))
	require.NoError(t, err)
	assert.Equal(t, ghFillers+4, rep.Present)
	assert.Equal(t, 1, rep.Accepted)
	assert.Zero(t, rep.Failed)
	assert.Zero(t, rep.Redelivered)
	_, _, redelivered, _ = w.gh.calls()
	assert.Len(t, redelivered, 3, "nothing redelivered twice")
	assert.Equal(t, 2, w.runs())
}

// A redelivery that failed again is redelivered by the next run, once
// more, from the new attempt.
func TestGitHubRedeliversAgainWhatFailedAgain(t *testing.T) {
	t.Parallel()
	w := newGHWorld(t)
	w.gh.redeliveryStatus = 503
	_, err := reconcile.RunGitHub(context.Background(), w.options(w.hook(reconcile.GitHubHookOptions{})))
	require.NoError(t, err)
	rep, err := reconcile.RunGitHub(context.Background(), w.options(w.hook(reconcile.GitHubHookOptions{})))
	require.NoError(t, err)
	assert.Equal(t, 3, rep.Redelivered)
	_, _, redelivered, _ := w.gh.calls()
	require.Len(t, redelivered, 6)
	for _, id := range redelivered[3:] {
		assert.Greater(t, id, redelivered[2], "the second run redelivers the first run's new attempts")
	}
}

func TestGitHubDryRunRedeliversNothing(t *testing.T) {
	t.Parallel()
	w := newGHWorld(t)
	o := w.options(w.hook(reconcile.GitHubHookOptions{}))
	o.DryRun = true
	rep, err := reconcile.RunGitHub(context.Background(), o)
	require.NoError(t, err)
	assert.True(t, rep.DryRun)
	assert.Equal(t, 3, rep.Failed)
	assert.ElementsMatch(t, []string{"straddles", "failed-twice", "failed-once"}, rep.FailedGUIDs)
	assert.Zero(t, rep.Redelivered)
	requests, _, redelivered, _ := w.gh.calls()
	assert.Equal(t, 3, requests, "the pages only")
	assert.Empty(t, redelivered)
	assert.Zero(t, w.runs(), "a dry run records nothing")
}

// A rate limit is waited out until GitHub says it resets, not retried
// before; one that resets later than MaxWait ends the run at once.
func TestGitHubWaitsOutRateLimits(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name      string
		secondary bool
	}{{"primary 403 until x-ratelimit-reset", false}, {"secondary 429 with retry-after", true}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			w := newGHWorld(t)
			w.gh.limitOn, w.gh.limitFor, w.gh.limit429 = 2, time.Second, tc.secondary
			h := w.hook(reconcile.GitHubHookOptions{})
			start := time.Now()
			rep, err := reconcile.RunGitHub(context.Background(), w.options(h))
			require.NoError(t, err)
			assert.Equal(t, 3, rep.Redelivered)
			assert.GreaterOrEqual(t, time.Since(start), time.Second, "the limit is waited out")
			_, lists, _, throttled := w.gh.calls()
			assert.Equal(t, 1, throttled, "no request while the limit lasts")
			assert.Equal(t, 1, h.Throttled)
			assert.Equal(t, 3, lists)
		})
	}
	t.Run("resetting past MaxWait", func(t *testing.T) {
		t.Parallel()
		w := newGHWorld(t)
		w.gh.limitOn, w.gh.limitFor = 2, time.Hour
		start := time.Now()
		_, err := reconcile.RunGitHub(context.Background(), w.options(w.hook(reconcile.GitHubHookOptions{MaxWait: 5 * time.Second})))
		require.ErrorContains(t, err, "giving up")
		require.ErrorContains(t, err, "API rate limit exceeded")
		assert.Less(t, time.Since(start), 5*time.Second, "no wait that is bound to fail")
		_, _, redelivered, _ := w.gh.calls()
		assert.Empty(t, redelivered)
		assert.Zero(t, w.runs(), "a run that stopped is not recorded as done")
	})
}

// GitHub refusing one delivery's redelivery is reported and the run goes
// on; refusing the token's permission ends it.
func TestGitHubRedeliveryRefusals(t *testing.T) {
	t.Parallel()
	t.Run("one delivery", func(t *testing.T) {
		t.Parallel()
		w := newGHWorld(t)
		w.gh.refuse[w.latest["failed-twice"]] = http.StatusUnprocessableEntity
		rep, err := reconcile.RunGitHub(context.Background(), w.options(w.hook(reconcile.GitHubHookOptions{})))
		require.NoError(t, err)
		assert.Equal(t, 2, rep.Redelivered)
		assert.Equal(t, 1, rep.RedeliverFailed)
		require.Len(t, rep.Failures, 1)
		assert.Equal(t, "failed-twice", rep.Failures[0].GUID)
		assert.Equal(t, w.latest["failed-twice"], rep.Failures[0].DeliveryID)
		assert.Contains(t, rep.Failures[0].Error, "422")
		assert.Equal(t, 1, w.runs())
	})
	t.Run("no write permission", func(t *testing.T) {
		t.Parallel()
		w := newGHWorld(t)
		w.gh.refuse[w.latest["straddles"]] = http.StatusForbidden
		rep, err := reconcile.RunGitHub(context.Background(), w.options(w.hook(reconcile.GitHubHookOptions{})))
		require.ErrorContains(t, err, "403")
		assert.Zero(t, rep.Redelivered)
		_, _, redelivered, _ := w.gh.calls()
		assert.Empty(t, redelivered, "the run stops at the first refusal")
		assert.Zero(t, w.runs())
	})
	t.Run("bad token", func(t *testing.T) {
		t.Parallel()
		w := newGHWorld(t)
		_, err := reconcile.RunGitHub(context.Background(), w.options(w.hook(reconcile.GitHubHookOptions{Token: "ghp_wrong"})))
		require.ErrorContains(t, err, "Bad credentials")
	})
}

// lockedHook runs a second reconciliation of the source from inside the
// first one's listing.
type lockedHook struct {
	reconcile.Hook
	second func() error
	err    error
	done   bool
}

func (h *lockedHook) Deliveries(ctx context.Context, cursor string) (reconcile.DeliveryPage, error) {
	if !h.done {
		h.done, h.err = true, h.second()
	}
	return h.Hook.Deliveries(ctx, cursor)
}

func TestGitHubOneRunPerSourceAtATime(t *testing.T) {
	t.Parallel()
	w := newGHWorld(t)
	h := &lockedHook{Hook: w.hook(reconcile.GitHubHookOptions{})}
	h.second = func() error {
		_, err := reconcile.RunGitHub(context.Background(), w.options(w.hook(reconcile.GitHubHookOptions{})))
		return err
	}
	_, err := reconcile.RunGitHub(context.Background(), w.options(h))
	require.NoError(t, err)
	require.ErrorIs(t, h.err, reconcile.ErrLocked)
	_, err = reconcile.RunGitHub(context.Background(), w.options(w.hook(reconcile.GitHubHookOptions{})))
	require.NoError(t, err, "once the first has finished, the next goes ahead")
}

func TestGitHubBadOptionsNameTheField(t *testing.T) {
	_, err := reconcile.RunGitHub(context.Background(), reconcile.GitHubOptions{Source: "stripe", Since: 96 * time.Hour})
	require.Error(t, err)
	for _, want := range []string{"Source", "Hook", "DB", "Since"} {
		require.ErrorContains(t, err, want)
	}
	_, err = reconcile.NewGitHubHook(reconcile.GitHubHookOptions{Repo: "acme", Org: "acme"})
	require.Error(t, err)
	for _, want := range []string{"Token", "Repo/Org", "Repo must be owner/name", "HookID"} {
		require.ErrorContains(t, err, want)
	}
}

// An organization hook is read and redelivered under /orgs/{org}/hooks.
func TestGitHubOrgHookPaths(t *testing.T) {
	t.Parallel()
	var paths []string
	srv := newRecordingServer(t, &paths)
	h, err := reconcile.NewGitHubHook(reconcile.GitHubHookOptions{Token: "t", URL: srv + "/api/v3/", Org: "acme", HookID: 7, Rate: 1000})
	require.NoError(t, err)
	page, err := h.Deliveries(context.Background(), "")
	require.NoError(t, err)
	assert.Empty(t, page.Next)
	require.NoError(t, h.Redeliver(context.Background(), 99))
	assert.Equal(t, []string{"GET /api/v3/orgs/acme/hooks/7/deliveries?per_page=100", "POST /api/v3/orgs/acme/hooks/7/deliveries/99/attempts"}, paths)
}
