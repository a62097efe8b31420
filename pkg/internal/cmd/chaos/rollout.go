package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"net/http"
	"net/url"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idempotent-events/idempotent-events/pkg/internal/harness"
)

// The rollout scenario: two worker binaries with different handler sets
// consume events.main together while the releases alternate, as rolling
// deploys and rollbacks run them (docs/effects.md, "Rollouts and
// rollbacks"). The old release is the stock worker (cmd/worker: the
// payment state only), the new one the examples' orders worker (the
// payment state and orders.create). The scenario switches rolloutSwitches
// times (the rollout, a rollback, the rollout again, ...), the k-th once
// k/(rolloutSwitches+1) of the events are in the ledger: a schedule by
// time would leave the later generations little to commit, since most
// events' first delivery comes early in the span. Each switch is what the
// chart does: the migration hook announces the release (the real migrate
// with WORKER_RELEASE), then a pod of it starts (a worker of the release
// is restarted: it registers at once; its other workers see their set
// current within the fence's poll). Then a worker of the release just
// replaced is restarted, an old pod coming back mid-rollout: it must say
// it is fenced (/readyz and idempotent_events_worker_fenced) and commit
// nothing. Meanwhile any worker is SIGKILLed at random and restarted as
// what it was.
//
// The fence is checked on the ledger afterwards, not trusted: every event
// must have been committed under a generation whose handler set was the
// current generation's set at its processed_at (current: the newest
// generation announced before it; announced_at is read once the fence's
// lock is granted, so every commit of another set is before it), and that
// set must have been registered then. An event committed by another set
// ran without the handlers it lacks: they are counted per handler
// (skipped). Every succeeded payment committed by a set with orders.create
// has exactly one orders row, and no other event has one; the downstream
// checks expect an email for each of those orders only. Events must have
// been committed while each generation was current: the switches came
// under load.
//
// The negative control, -rollout-unfenced, gives the old workers started
// after the first registration a private copy of handler_generations
// (their search_path finds it before the run's schema): their set stays
// current there, the fence's lock is another one, and they commit beside
// the new set as workers without a fence would. It must fail.

const (
	// releaseOld and releaseNew are the releases the scenario alternates
	// (WORKER_RELEASE, as the chart's <release>-<revision>).
	releaseOld = "chaos-old"
	releaseNew = "chaos-new"
	// rolloutSwitches is the number of switches: the rollout, a rollback,
	// the rollout again, a rollback again, the rollout again.
	rolloutSwitches = 5
	// rolloutMinDuration is the least the deliveries span: the switches
	// and their restarts take a second or so each, and all come before
	// the last sixth of the events' first deliveries (a third of the span).
	rolloutMinDuration = 15 * time.Second
	// rolloutPatience bounds the wait for the ledger to reach a switch's
	// share of the events: nobody committing is a failure, not a wait.
	rolloutPatience = 2 * time.Minute
	// fencedWithin bounds the wait for a restarted worker of the release
	// that is not current to say it is fenced (its start and registration).
	fencedWithin = 10 * time.Second
	// ordersHandler is the handler the new release has and the old lacks.
	ordersHandler = "orders.create"
)

// rolloutRun is the rollout scenario's state: which release each worker
// slot (system.workers) runs, and what the switches did.
type rolloutRun struct {
	sys *system
	// privateURL is the old workers' DATABASE_URL in the negative control
	// (handler_generations of their own), "" otherwise; dropPrivate
	// removes that copy.
	privateURL  string
	dropPrivate func()
	// mu serializes the kills and restarts of workers (a slot is never
	// started twice at once) and guards releases.
	mu       sync.Mutex
	releases []string
	// What the faults did, from began on, read by verify once they are
	// over.
	began                     time.Time
	switches, restarts, kills int
	fencedIn                  []time.Duration
	problems                  []string
	log                       []string
}

// startRollout announces the old release (the first install's hook) and
// starts o.workers old workers in the scenario's slots. In the negative
// control it then gives the old workers started later their private
// handler_generations, a copy taken once the first of them registered.
func startRollout(ctx context.Context, sys *system, o options) *rolloutRun {
	r := &rolloutRun{sys: sys}
	gen, err := r.announce(ctx, releaseOld)
	check(err)
	sys.mu.Lock()
	sys.workers, sys.workerMetrics = nil, nil
	sys.mu.Unlock()
	r.mu.Lock()
	defer r.mu.Unlock()
	for range o.workers {
		r.start(len(r.releases), releaseOld)
	}
	if o.rolloutUnfenced {
		check(r.awaitRegistered(ctx, gen))
		check(r.privateGenerations(ctx))
	}
	return r
}

// Close removes the negative control's copy of handler_generations.
func (r *rolloutRun) Close() {
	if r.dropPrivate != nil {
		r.dropPrivate()
	}
}

// announce runs the real migrate with WORKER_RELEASE=release, as the
// chart's pre-upgrade/pre-rollback hook does, and returns the generation
// it announced.
func (r *rolloutRun) announce(ctx context.Context, release string) (int64, error) {
	p, err := r.sys.stack.Start("migrate-"+release, "migrate", r.sys.stack.Env("WORKER_RELEASE="+release))
	if err != nil {
		return 0, err
	}
	select {
	case <-p.Exited():
	case <-time.After(2 * time.Minute):
		p.Kill()
		return 0, fmt.Errorf("announce %s: migrate still running after 2m:\n%s", release, lastLines(p.Log(), 10))
	}
	if p.ExitCode() != 0 {
		return 0, fmt.Errorf("announce %s: migrate exited %d:\n%s", release, p.ExitCode(), lastLines(p.Log(), 10))
	}
	var gen int64
	err = r.sys.stack.DB.QueryRow(ctx, `SELECT max(generation) FROM handler_generations WHERE release = $1`, release).Scan(&gen)
	if err != nil {
		return 0, fmt.Errorf("announce %s: read its generation: %w", release, err)
	}
	return gen, nil
}

// awaitRegistered waits until a worker registered its handler set for gen.
func (r *rolloutRun) awaitRegistered(ctx context.Context, gen int64) error {
	deadline := time.Now().Add(time.Minute)
	for {
		var set *string
		if err := r.sys.stack.DB.QueryRow(ctx, `SELECT set_id FROM handler_generations WHERE generation = $1`, gen).Scan(&set); err != nil {
			return fmt.Errorf("read generation %d: %w", gen, err)
		}
		if set != nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("no worker registered generation %d within 1m", gen)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// privateGenerations makes the negative control's copy of
// handler_generations, in a schema of its own that the old workers'
// search_path names before the run's.
func (r *rolloutRun) privateGenerations(ctx context.Context) error {
	u, err := url.Parse(r.sys.dbURL)
	if err != nil {
		return fmt.Errorf("the workers' DATABASE_URL: %w", err)
	}
	q := u.Query()
	schema := q.Get("search_path")
	if schema == "" {
		return fmt.Errorf("the workers' DATABASE_URL names no schema (search_path)")
	}
	private := schema + "_unfenced"
	db := r.sys.stack.DB
	qs, qp := pgx.Identifier{schema}.Sanitize(), pgx.Identifier{private}.Sanitize()
	if _, err := db.Exec(ctx, `CREATE SCHEMA `+qp+`;
		CREATE TABLE `+qp+`.handler_generations (LIKE `+qs+`.handler_generations INCLUDING ALL);
		INSERT INTO `+qp+`.handler_generations SELECT * FROM `+qs+`.handler_generations`); err != nil {
		return fmt.Errorf("copy handler_generations to %s: %w", private, err)
	}
	drop := func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, _ = db.Exec(ctx, `DROP SCHEMA IF EXISTS `+qp+` CASCADE`)
	}
	r.dropPrivate = drop
	onExit(drop)
	q.Set("search_path", private+","+schema)
	u.RawQuery = q.Encode()
	r.privateURL = u.String()
	return nil
}

// start starts the worker of slot i (a new slot when i is the number of
// slots) as a worker of release. Called with r.mu held.
func (r *rolloutRun) start(i int, release string) {
	sys := r.sys
	metrics := harness.FreeAddr()
	env := append(sys.workerEnv(metrics), "WORKER_RELEASE="+release)
	bin := "orders"
	if release == releaseOld {
		bin = "worker"
		if r.privateURL != "" {
			env = append(env, "DATABASE_URL="+r.privateURL)
		}
	}
	p, err := sys.stack.Start(fmt.Sprintf("worker-%d-%s", i, release), bin, append(env, sys.privateEnv()...))
	check(err)
	sys.mu.Lock()
	defer sys.mu.Unlock()
	if i == len(r.releases) {
		r.releases = append(r.releases, release)
		sys.workers, sys.workerMetrics = append(sys.workers, p), append(sys.workerMetrics, metrics)
		return
	}
	sys.workers[i], sys.workerMetrics[i] = p, metrics
}

// restart SIGKILLs the worker of slot i and starts it again after pause.
// Called with r.mu held.
func (r *rolloutRun) restart(i int, pause time.Duration) {
	r.sys.mu.Lock()
	w := r.sys.workers[i]
	r.sys.mu.Unlock()
	w.Kill()
	time.Sleep(pause)
	r.start(i, r.releases[i])
}

// slotOf returns a random slot running release, -1 when there is none.
// Called with r.mu held.
func (r *rolloutRun) slotOf(release string) int {
	var slots []int
	for i, rel := range r.releases {
		if rel == release {
			slots = append(slots, i)
		}
	}
	if len(slots) == 0 {
		return -1
	}
	return slots[rand.N(len(slots))]
}

// rollout is the scenario's fault source: rolloutSwitches switches, the
// k-th once k/(rolloutSwitches+1) of the events are in the ledger, and
// SIGKILLs of random workers all along, until the deliveries are done and
// the switches too.
func rollout(sys *system, stop <-chan struct{}, o options) int {
	r := sys.rollout
	r.began = time.Now()
	ctx := context.Background()
	killsDone := make(chan struct{})
	var kills atomic.Int64
	var wg sync.WaitGroup
	wg.Go(func() {
		kills.Store(int64(every(killsDone, o.pace, 500*time.Millisecond, 2*time.Second, func() {
			r.mu.Lock()
			defer r.mu.Unlock()
			r.restart(rand.N(len(r.releases)), rand.N(500*time.Millisecond))
		})))
	})
	events := 3 * o.events
	current := releaseOld
	for k := 1; k <= rolloutSwitches; k++ {
		if err := r.awaitCommitted(ctx, k*events/(rolloutSwitches+1)); err != nil {
			sys.faultErr = err
			break
		}
		next := releaseNew
		if current == releaseNew {
			next = releaseOld
		}
		if err := r.switchTo(ctx, next, current, o); err != nil {
			sys.faultErr = err
			break
		}
		current = next
	}
	<-stop
	close(killsDone)
	wg.Wait()
	r.kills = int(kills.Load())
	return r.switches + r.restarts + r.kills
}

// awaitCommitted waits until the ledger holds n events.
func (r *rolloutRun) awaitCommitted(ctx context.Context, n int) error {
	deadline := time.Now().Add(rolloutPatience)
	for {
		l, err := r.sys.stack.ReadLedger(ctx)
		if err != nil {
			return fmt.Errorf("read the ledger: %w", err)
		}
		if l.Processed >= n {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the ledger holds %d events after %s, short of the %d of the next switch: nobody commits", l.Processed, rolloutPatience, n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// switchTo makes release current as a deploy does: its announcement, then
// a pod of it (the first switch to the new release starts o.workers of
// them beside the old ones, a surge; later ones restart one). Then a
// worker of the release it replaced, from, is restarted: it must say it
// is fenced within fencedWithin.
func (r *rolloutRun) switchTo(ctx context.Context, release, from string, o options) error {
	gen, err := r.announce(ctx, release)
	if err != nil {
		return err
	}
	r.mu.Lock()
	if r.slotOf(release) < 0 {
		for range o.workers {
			r.start(len(r.releases), release)
		}
	} else {
		r.restart(r.slotOf(release), 0)
	}
	r.mu.Unlock()
	r.switches++
	r.log = append(r.log, fmt.Sprintf("%s announced (generation %d) %.1fs in", release, gen, time.Since(r.began).Seconds()))

	r.mu.Lock()
	i := r.slotOf(from)
	r.restart(i, 0)
	r.mu.Unlock()
	r.restarts++
	restarted := time.Now()
	if err := r.awaitFenced(i); err != nil {
		r.problems = append(r.problems, fmt.Sprintf("a %s worker restarted while %s was current: %v", from, release, err))
		return nil
	}
	r.fencedIn = append(r.fencedIn, time.Since(restarted))
	return nil
}

// awaitFenced waits until the worker in slot i says it is fenced: /readyz
// 503 with the reason "fenced: …" and idempotent_events_worker_fenced 1.
// The slot is read at every try: a random kill may restart it meanwhile.
func (r *rolloutRun) awaitFenced(i int) error {
	deadline := time.Now().Add(fencedWithin)
	last := "no answer"
	for time.Now().Before(deadline) {
		r.sys.mu.Lock()
		addr := r.sys.workerMetrics[i]
		r.sys.mu.Unlock()
		ready, fenced, err := fenceOf(addr)
		switch {
		case err != nil:
			last = err.Error()
		case strings.HasPrefix(ready, "fenced: ") && fenced == 1:
			return nil
		default:
			last = fmt.Sprintf("/readyz %q, idempotent_events_worker_fenced %v", ready, fenced)
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("not fenced within %s (last: %s)", fencedWithin, last)
}

// fenceOf reads a worker's /readyz reason ("" when ready) and its fenced
// gauge.
func fenceOf(metricsAddr string) (reason string, fenced float64, err error) {
	resp, err := http.Get("http://" + metricsAddr + "/readyz")
	if err != nil {
		return "", 0, err
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		return "", 0, err
	}
	var ready struct{ Status, Reason string }
	if err := json.Unmarshal(body, &ready); err != nil {
		return "", 0, fmt.Errorf("/readyz answered %s: %q", resp.Status, body)
	}
	mfs, err := harness.Scrape(metricsAddr)
	if err != nil {
		return "", 0, err
	}
	f := mfs["idempotent_events_worker_fenced"]
	if f == nil || len(f.GetMetric()) != 1 {
		return "", 0, fmt.Errorf("no idempotent_events_worker_fenced gauge")
	}
	return ready.Reason, f.GetMetric()[0].GetGauge().GetValue(), nil
}

// generationRow is a row of handler_generations.
type generationRow struct {
	gen         int64
	release     string
	setID       string // "" while announced and not registered
	handlers    []string
	announced   time.Time
	registered  *time.Time
	byOrdersSet bool // handlers include ordersHandler
}

// committedEvent is a row of processed_events.
type committedEvent struct {
	id, typ string
	gen     *int64
	at      time.Time
}

// ledgerView is what the rollout's checks read: the generations in order,
// the run's committed events, and the orders rows per event id.
type ledgerView struct {
	gens   []generationRow
	events []committedEvent
	orders map[string]int
}

// judgement is what the checks found in a ledgerView.
type judgement struct {
	// skipped counts, per handler of the sets, the events committed
	// without it while a set with it was current.
	skipped map[string]int
	// stale: committed by a set other than the current one; unregistered:
	// while the current generation had no set yet; ungenerated: without a
	// generation at all (no fence).
	stale, unregistered, ungenerated int
	// firstWrong describes the first of those.
	firstWrong string
	// perGen counts the events each generation committed, perCurrent
	// those committed while it was current.
	perGen, perCurrent map[int64]int
	// wantOrders is the succeeded payments committed by a set with
	// orders.create; missingOrders those without exactly one orders row;
	// strayOrders the orders rows of any other event.
	wantOrders, missingOrders, strayOrders int
}

// judge checks every committed event against the generation current when
// it committed, and the orders rows against the sets that committed the
// succeeded payments.
func judge(v ledgerView) judgement {
	j := judgement{skipped: map[string]int{}, perGen: map[int64]int{}, perCurrent: map[int64]int{}}
	byGen := map[int64]*generationRow{}
	for i := range v.gens {
		g := &v.gens[i]
		byGen[g.gen] = g
		for _, h := range g.handlers {
			j.skipped[h] += 0
		}
	}
	wrong := func(format string, args ...any) {
		if j.firstWrong == "" {
			j.firstWrong = fmt.Sprintf(format, args...)
		}
	}
	ordered := map[string]bool{}
	for _, e := range v.events {
		// The current generation: the newest announced before the commit.
		var cur *generationRow
		for i := range v.gens {
			if v.gens[i].announced.Before(e.at) {
				cur = &v.gens[i]
			}
		}
		if cur != nil {
			j.perCurrent[cur.gen]++
		}
		var g *generationRow
		if e.gen != nil {
			g = byGen[*e.gen]
			j.perGen[*e.gen]++
		}
		switch {
		case g == nil:
			j.ungenerated++
			wrong("%s committed at %s without a generation of handler_generations (%v)", e.id, e.at.Format(time.StampMicro), e.gen)
		case cur == nil:
			j.unregistered++
			wrong("%s committed at %s by generation %d before any generation was announced", e.id, e.at.Format(time.StampMicro), g.gen)
		case cur.setID == "" || cur.registered == nil || !cur.registered.Before(e.at):
			j.unregistered++
			wrong("%s committed at %s by generation %d (%s) while generation %d (%s) was announced and no worker of it had registered",
				e.id, e.at.Format(time.StampMicro), g.gen, g.release, cur.gen, cur.release)
		case cur.setID != g.setID:
			j.stale++
			wrong("%s committed at %s by generation %d (%s, set %s) while generation %d (%s, set %s) was current",
				e.id, e.at.Format(time.StampMicro), g.gen, g.release, g.setID, cur.gen, cur.release, cur.setID)
		}
		if g != nil && cur != nil {
			for _, h := range cur.handlers {
				if !slices.Contains(g.handlers, h) {
					j.skipped[h]++
				}
			}
		}
		if e.typ != "payment_intent.succeeded" || g == nil || !g.byOrdersSet {
			continue
		}
		ordered[e.id] = true
		j.wantOrders++
		if v.orders[e.id] != 1 {
			j.missingOrders++
		}
	}
	for id, n := range v.orders {
		if !ordered[id] {
			j.strayOrders += n
		}
	}
	return j
}

// readLedgerView reads the run's generations, the events of ids LIKE
// pattern and the orders rows.
func readLedgerView(ctx context.Context, sys *system, pattern string) (ledgerView, error) {
	db := sys.stack.DB
	v := ledgerView{orders: map[string]int{}}
	rows, err := db.Query(ctx, `SELECT generation, release, coalesce(set_id, ''), coalesce(handlers, '[]'::jsonb), announced_at, registered_at
		FROM handler_generations ORDER BY generation`)
	if err != nil {
		return v, fmt.Errorf("read handler_generations: %w", err)
	}
	v.gens, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (generationRow, error) {
		var g generationRow
		var handlers []struct{ Name string }
		err := row.Scan(&g.gen, &g.release, &g.setID, &handlers, &g.announced, &g.registered)
		for _, h := range handlers {
			g.handlers = append(g.handlers, h.Name)
		}
		g.byOrdersSet = slices.Contains(g.handlers, ordersHandler)
		return g, err
	})
	if err != nil {
		return v, fmt.Errorf("read handler_generations: %w", err)
	}
	rows, err = db.Query(ctx, `SELECT event_id, event_type, generation, processed_at FROM processed_events WHERE event_id LIKE $1`, pattern)
	if err != nil {
		return v, fmt.Errorf("read processed_events: %w", err)
	}
	v.events, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (committedEvent, error) {
		var e committedEvent
		return e, row.Scan(&e.id, &e.typ, &e.gen, &e.at)
	})
	if err != nil {
		return v, fmt.Errorf("read processed_events: %w", err)
	}
	rows, err = db.Query(ctx, `SELECT event_id, count(*) FROM orders GROUP BY event_id`)
	if err != nil {
		return v, fmt.Errorf("read orders: %w", err)
	}
	var id string
	var n int
	_, err = pgx.ForEachRow(rows, []any{&id, &n}, func() error { v.orders[id] = n; return nil })
	if err != nil {
		return v, fmt.Errorf("read orders: %w", err)
	}
	return v, nil
}

// rolloutVerdict is what verify found: the orders rows (and so emails)
// the downstream checks must expect, a note for under the scenario's
// line, and what is wrong.
type rolloutVerdict struct {
	wantOrders int
	note       string
	problems   []string
}

// verify reads the ledger once the system has drained and checks it
// (judge), and that the scenario did what it says.
func (r *rolloutRun) verify(ctx context.Context, pattern string) rolloutVerdict {
	v, err := readLedgerView(ctx, r.sys, pattern)
	check(err)
	j := judge(v)
	out := rolloutVerdict{wantOrders: j.wantOrders, problems: slices.Clone(r.problems)}
	problem := func(format string, args ...any) { out.problems = append(out.problems, fmt.Sprintf(format, args...)) }

	var gens []string
	for _, g := range v.gens {
		gens = append(gens, fmt.Sprintf("%d %s %d/%d", g.gen, g.release, j.perGen[g.gen], j.perCurrent[g.gen]))
	}
	handlers := make([]string, 0, len(j.skipped))
	for h := range j.skipped {
		handlers = append(handlers, h)
	}
	sort.Strings(handlers)
	var skipped []string
	skippedAny := 0
	for _, h := range handlers {
		skipped = append(skipped, fmt.Sprintf("%s %d", h, j.skipped[h]))
		skippedAny += j.skipped[h]
	}
	fenced := "none confirmed"
	if len(r.fencedIn) > 0 {
		fenced = fmt.Sprintf("%d fenced, in %s at most", len(r.fencedIn), slices.Max(r.fencedIn).Round(100*time.Millisecond))
	}
	// What the new release adds to the old one, from their registrations.
	added := map[string]bool{}
	for _, g := range v.gens {
		if g.release == releaseNew {
			for _, h := range g.handlers {
				added[h] = true
			}
		}
	}
	for _, g := range v.gens {
		if g.release == releaseOld {
			for _, h := range g.handlers {
				delete(added, h)
			}
		}
	}
	lines := []string{
		fmt.Sprintf("%s = cmd/worker, %s = examples/orders (+%s); %d switches (%s), %d restarts of the replaced release's worker (%s), %d SIGKILLs at random",
			releaseOld, releaseNew, strings.Join(slices.Sorted(maps.Keys(added)), ", "), r.switches, strings.Join(r.log, ", "), r.restarts, fenced, r.kills),
		"events committed by each generation / while it was current: " + strings.Join(gens, ", "),
		fmt.Sprintf("skipped per handler: %s; by a set not current %d, before the current set registered %d, without a generation %d",
			strings.Join(skipped, ", "), j.stale, j.unregistered, j.ungenerated),
		fmt.Sprintf("orders: %d succeeded payments committed by a set with %s, %d of them without exactly one orders row; %d orders rows of other events",
			j.wantOrders, ordersHandler, j.missingOrders, j.strayOrders),
	}
	for i := range lines {
		lines[i] = "  rollout: " + lines[i]
	}
	out.note = strings.Join(lines, "\n")

	if n := j.stale + j.unregistered + j.ungenerated; n > 0 || skippedAny > 0 {
		problem("%d events committed without the current handler set (skipped per handler: %s); the first: %s", n, strings.Join(skipped, ", "), j.firstWrong)
	}
	if j.missingOrders > 0 || j.strayOrders > 0 {
		problem("orders: %d of %d succeeded payments committed by a set with %s lack exactly one orders row; %d orders rows belong to no such payment",
			j.missingOrders, j.wantOrders, ordersHandler, j.strayOrders)
	}
	// Each switch came once a share of the events was committed, before
	// the rest: events must have been committed while each generation was
	// current.
	var idle []string
	for _, g := range v.gens {
		if j.perCurrent[g.gen] == 0 {
			idle = append(idle, fmt.Sprint(g.gen))
		}
	}
	if r.switches < rolloutSwitches || len(idle) > 0 {
		problem("the rollout did not happen while events flowed: %d switches (want %d), generations while which nothing was committed: %v",
			r.switches, rolloutSwitches, idle)
	}
	return out
}
