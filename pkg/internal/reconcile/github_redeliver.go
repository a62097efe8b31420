package reconcile

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/zap"

	"github.com/idempotent-events/idempotent-events/pkg/internal/event"
	"github.com/idempotent-events/idempotent-events/pkg/internal/options"
)

// GitHubOptions configures a GitHub run (RunGitHub).
type GitHubOptions struct {
	// Source is the name of the GitHub source (its name:github entry in
	// WEBHOOK_SOURCES): the ledger key of a delivery is "<Source>:<guid>".
	Source string
	Hook   Hook
	DB     *pgxpool.Pool
	// Since is how far back the window starts, at most GitHubMaxWindow.
	Since time.Duration
	// DryRun lists and compares, and redelivers and records nothing.
	DryRun bool
	Logger *zap.Logger
	Now    func() time.Time
}

func (o *GitHubOptions) validate() error {
	p := options.Check("reconcile github")
	p.Need(o.Source != "" && o.Source != event.DefaultSource && o.Source != "payment", "Source",
		"must name a GitHub source of WEBHOOK_SOURCES (not the default Stripe source)")
	p.Need(o.Hook != nil, "Hook", "is required")
	p.Need(o.DB != nil, "DB", "is required")
	p.Need(o.Since > 0 && o.Since <= GitHubMaxWindow, "Since", "must be more than 0 and at most 72h (GitHub keeps 3 days of deliveries)")
	return p.Err()
}

// GitHubReport says what a GitHub run found and did. Every delivered
// event of the window is counted once, under its GUID, in exactly one of
// Present, Accepted and Failed.
type GitHubReport struct {
	RunID  int64     `json:"run_id,omitempty"`
	Source string    `json:"source"`
	DryRun bool      `json:"dry_run"`
	From   time.Time `json:"window_start"`
	To     time.Time `json:"window_end"`
	Pages  int       `json:"pages"`
	// Listed counts the deliveries (attempts) listed, OutsideWindow those
	// of them older than the window.
	Listed        int `json:"listed_deliveries"`
	OutsideWindow int `json:"outside_window"`
	// GUIDs counts the distinct events with an attempt in the window.
	GUIDs   int `json:"distinct_guids"`
	Present int `json:"in_ledger"`
	// Accepted were answered 2xx at least once and are not in the ledger
	// yet: on their way through the pipeline, or (if they stay) lost
	// after the receiver accepted them. They are not redelivered.
	Accepted int `json:"succeeded_not_in_ledger"`
	// Failed had no successful attempt and are not in the ledger: each is
	// redelivered once (in a dry run, would be).
	Failed          int `json:"failed"`
	Redelivered     int `json:"redelivered"`
	RedeliverFailed int `json:"redeliver_failed"`
	// AcceptedGUIDs and FailedGUIDs list those events, oldest first.
	AcceptedGUIDs []string            `json:"succeeded_not_in_ledger_guids,omitempty"`
	FailedGUIDs   []string            `json:"failed_guids,omitempty"`
	Failures      []RedeliveryFailure `json:"redeliver_failures,omitempty"`
}

// RedeliveryFailure is a redelivery GitHub refused.
type RedeliveryFailure struct {
	GUID       string `json:"guid"`
	DeliveryID int64  `json:"delivery_id"`
	Error      string `json:"error"`
}

// RunGitHub reconciles a GitHub hook's deliveries of the last Since with
// the ledger. GitHub keeps a hook's deliveries for 3 days and never
// retries a failed one by itself; it can be asked to send one again, under
// the same GUID, so a run redelivers instead of injecting:
//
//   - it lists the window's deliveries, newest first, and groups the
//     attempts by GUID (an attempt older than the window on the last page
//     still counts towards its GUID's success);
//   - a GUID whose "<Source>:<guid>" is in the ledger is done;
//   - else, one with a 2xx attempt was accepted by the receiver and is on
//     its way (or was lost after it: reported, never redelivered);
//   - else the GUID's latest attempt is redelivered, once per run, oldest
//     event first. GitHub then posts it to the receiver as a webhook.
//
// A redelivery GitHub refuses for that delivery alone (404, 410, 422) is
// reported and the run goes on; a refused token, a missing permission, or
// a rate limit or outage outlasting the hook's MaxWait ends the run. A
// finished run (not a dry run) is recorded in reconcile_runs as done, with
// listed = distinct GUIDs, missing = failed ones and injected =
// redelivered, for the reconcile metrics. A redelivery that reaches the
// receiver while an earlier attempt is still on its way is a duplicate to
// the worker, so its effect is still once.
//
// One run per source at a time, as for Run: the same advisory lock.
func RunGitHub(ctx context.Context, o GitHubOptions) (GitHubReport, error) {
	if err := o.validate(); err != nil {
		return GitHubReport{}, err
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Logger == nil {
		o.Logger = zap.NewNop()
	}
	release, err := lockSource(ctx, o.DB, o.Source)
	if err != nil {
		return GitHubReport{}, err
	}
	defer release()

	now := o.Now().UTC().Truncate(time.Second)
	rep := GitHubReport{Source: o.Source, DryRun: o.DryRun, From: now.Add(-o.Since), To: now}
	events, err := listGitHub(ctx, o.Hook, &rep)
	if err != nil {
		return rep, err
	}
	rep.GUIDs = len(events)
	keys := make([]string, len(events))
	for i, e := range events {
		keys[i] = event.Key(o.Source, e.guid)
	}
	present, err := inLedger(ctx, o.DB, keys)
	if err != nil {
		return rep, err
	}
	var failed []*gitHubEvent
	for i, e := range events {
		switch {
		case present[keys[i]]:
			rep.Present++
		case e.succeeded:
			rep.Accepted++
			rep.AcceptedGUIDs = append(rep.AcceptedGUIDs, e.guid)
		default:
			rep.Failed++
			rep.FailedGUIDs = append(rep.FailedGUIDs, e.guid)
			failed = append(failed, e)
		}
	}
	if o.DryRun {
		return rep, nil
	}
	for _, e := range failed {
		err := o.Hook.Redeliver(ctx, e.latest.ID)
		switch {
		case err == nil:
			rep.Redelivered++
			o.Logger.Info("redelivery requested", zap.String("guid", e.guid), zap.Int64("delivery_id", e.latest.ID),
				zap.String("github_event", e.latest.Event), zap.Int("last_status_code", e.latest.StatusCode))
		case perDelivery(err):
			rep.RedeliverFailed++
			rep.Failures = append(rep.Failures, RedeliveryFailure{GUID: e.guid, DeliveryID: e.latest.ID, Error: err.Error()})
			o.Logger.Warn("redelivery refused", zap.String("guid", e.guid), zap.Int64("delivery_id", e.latest.ID), zap.Error(err))
		default:
			return rep, fmt.Errorf("reconcile github: redeliver %s (delivery %d): %w", e.guid, e.latest.ID, err)
		}
	}
	if err := o.DB.QueryRow(ctx, `INSERT INTO reconcile_runs (source, window_start, window_end, state, pages, listed, present, missing, injected, finished_at)
		VALUES ($1, $2, $3, 'done', $4, $5, $6, $7, $8, now()) RETURNING id`,
		o.Source, rep.From, rep.To, rep.Pages, rep.GUIDs, rep.Present, rep.Failed, rep.Redelivered).Scan(&rep.RunID); err != nil {
		return rep, fmt.Errorf("reconcile github: record the run: %w", err)
	}
	return rep, nil
}

// gitHubEvent is one GUID's attempts as far as a run needs them.
type gitHubEvent struct {
	guid      string
	first     time.Time // its oldest attempt's, for the order of redeliveries
	latest    Delivery
	succeeded bool
	inWindow  bool
}

// listGitHub pages the hook's deliveries back to the window's start and
// returns the GUIDs with an attempt in the window, oldest first.
func listGitHub(ctx context.Context, hook Hook, rep *GitHubReport) ([]*gitHubEvent, error) {
	byGUID := map[string]*gitHubEvent{}
	cursor := ""
	for {
		page, err := hook.Deliveries(ctx, cursor)
		if err != nil {
			return nil, fmt.Errorf("reconcile github: list deliveries (page %d): %w", rep.Pages+1, err)
		}
		rep.Pages++
		rep.Listed += len(page.Deliveries)
		reachedStart := false
		for _, d := range page.Deliveries {
			if d.GUID == "" {
				return nil, fmt.Errorf("reconcile github: delivery %d has no guid", d.ID)
			}
			e := byGUID[d.GUID]
			if e == nil {
				e = &gitHubEvent{guid: d.GUID, first: d.DeliveredAt, latest: d}
				byGUID[d.GUID] = e
			}
			if d.DeliveredAt.Before(e.first) {
				e.first = d.DeliveredAt
			}
			if d.DeliveredAt.After(e.latest.DeliveredAt) || (d.DeliveredAt.Equal(e.latest.DeliveredAt) && d.ID > e.latest.ID) {
				e.latest = d
			}
			e.succeeded = e.succeeded || d.Succeeded()
			if d.DeliveredAt.Before(rep.From) {
				rep.OutsideWindow++
				reachedStart = true
			} else {
				e.inWindow = true
			}
		}
		// Newest first: a page that reaches back past the window's start
		// is the last one needed.
		if page.Next == "" || reachedStart || len(page.Deliveries) == 0 {
			break
		}
		cursor = page.Next
	}
	var out []*gitHubEvent
	for _, e := range byGUID {
		if e.inWindow {
			out = append(out, e)
		}
	}
	slices.SortFunc(out, func(a, b *gitHubEvent) int {
		return cmp.Or(a.first.Compare(b.first), cmp.Compare(a.guid, b.guid))
	})
	return out, nil
}

// inLedger returns which of keys the ledger holds (both providers' runs).
func inLedger(ctx context.Context, db *pgxpool.Pool, keys []string) (map[string]bool, error) {
	present := map[string]bool{}
	for chunk := range slices.Chunk(keys, 1000) {
		rows, err := db.Query(ctx, `SELECT event_id FROM processed_events WHERE event_id = ANY($1)`, chunk)
		if err != nil {
			return nil, fmt.Errorf("reconcile: look up the ledger: %w", err)
		}
		var key string
		if _, err := pgx.ForEachRow(rows, []any{&key}, func() error { present[key] = true; return nil }); err != nil {
			return nil, fmt.Errorf("reconcile: look up the ledger: %w", err)
		}
	}
	return present, nil
}

// lockSource takes the source's run lock (Run's and RunGitHub's) on a
// connection of its own and returns the function that releases it, or
// ErrLocked.
func lockSource(ctx context.Context, db *pgxpool.Pool, source string) (func(), error) {
	conn, err := db.Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("reconcile: %w", err)
	}
	var locked bool
	if err := conn.QueryRow(ctx, `SELECT pg_try_advisory_lock(hashtextextended($1 || current_schema(), 0))`, lockName(source)).Scan(&locked); err != nil {
		conn.Release()
		return nil, fmt.Errorf("reconcile: take the lock: %w", err)
	}
	if !locked {
		conn.Release()
		return nil, ErrLocked
	}
	return func() {
		defer conn.Release()
		uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if _, err := conn.Exec(uctx, `SELECT pg_advisory_unlock(hashtextextended($1 || current_schema(), 0))`, lockName(source)); err != nil {
			// A lock that cannot be released goes with its session.
			_ = conn.Conn().Close(uctx)
		}
	}, nil
}
