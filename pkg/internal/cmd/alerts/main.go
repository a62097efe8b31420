// Command alerts proves the operator-facing observability live: a real
// Prometheus and a real Alertmanager (pinned in hack/tools/prometheus and
// hack/tools/alertmanager, built by hack/tools/build.sh) watch the real
// binaries of this tree running
// against the machine's RabbitMQ, PostgreSQL and Redis (a vhost, a schema
// and a Redis prefix of their own), and
//
//   - every alert of the shipped rule file is brought about by its real
//     condition (a poison message, a worker cut from RabbitMQ, a stopped
//     relay, Postgres refusing the worker, a reconcile that finds a missing
//     event, …), reaches Alertmanager's webhook (an HTTP server in this
//     process), and resolves once the cause is removed; a table prints
//     how long each took;
//   - every panel query of every dashboard, its variables substituted as
//     Grafana does, returns data from that Prometheus.
//
// Outages are made with TCP proxies (faulttest) in front of the services,
// never by stopping the machine's services. Prometheus scrapes and
// evaluates every second and loads the rule file with only its "for:"
// durations divided by -for-scale (60: 5m waits 5s); the expressions,
// thresholds and windows are the shipped ones, which the run checks (the
// copy differs from the file in "for:" lines only, and Prometheus reports
// every rule healthy with the scaled duration). Four thresholds are ages
// the suite cannot wait out (a day without a reconcile, two without a
// prune, a message 5 and an outbox row 10 minutes old): there the state is
// made by the real path (real runs, rows and messages) and its time moved
// back; the table says so. An alert that cannot be induced here says why
// (notInduced, and docs/runbook.md under the alert).
//
// The stack: the receiver, the examples' orders worker, a relay apart
// (OUTBOX_RELAY=only) and the confirmations consumer (system.go); for the
// ledger's replication, a private primary and standby (ledger.go). The
// scenarios are in scenarios.go, the steps that group them in run below.
//
// The suite can fail, and shows it: -break NAME loads the rules with that
// alert's expression pointing at metric names nobody exports, runs only
// the scenarios of that alert, and must report it FAILED (exit 1):
//
//	go run ./pkg/internal/cmd/alerts                                          # hack/check-observability.sh
//	go run ./pkg/internal/cmd/alerts -break IdempotentEventsDLQNotEmpty       # the negative control
//
// Grafana itself is not run (see docs/development.md): the panel check
// resolves the dashboard's variables through Prometheus's label API and
// runs each target's expression through Prometheus's query_range API with
// the step and $__rate_interval Grafana would use.
package main

import (
	"cmp"
	"context"
	"flag"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/idempotent-events/idempotent-events/pkg/internal/harness"
)

// forScale divides every "for:" of the loaded rules by default.
const forScale = 60

// namespace is the namespace label of every target, as the chart's
// ServiceMonitor gives it.
const namespace = "alerts"

type options struct {
	rules, dashboards, tools, binDir, breakAlert string
	scale                                        int
	every                                        time.Duration
	buildOnly                                    bool
}

func main() {
	var o options
	flag.StringVar(&o.rules, "rules", "charts/idempotent-events/rules/idempotent-events.rules.yaml", "the rule file")
	flag.StringVar(&o.dashboards, "dashboards", "charts/idempotent-events/dashboards/*.json", "the dashboards (a glob)")
	flag.StringVar(&o.tools, "tools", "", "the folder holding prometheus and alertmanager (default: hack/tools/build.sh --dir, built there when missing)")
	flag.StringVar(&o.binDir, "bin", "", "the idempotent-events binaries: built into this folder when it has none, used as they are when it has (default: a temporary folder)")
	flag.StringVar(&o.breakAlert, "break", "", "negative control: load the rules with this alert's expression broken and run only its scenarios; the run must fail")
	flag.BoolVar(&o.buildOnly, "build-only", false, "build the binaries into -bin and exit")
	flag.IntVar(&o.scale, "for-scale", forScale, "divide every alert's for: by this")
	flag.DurationVar(&o.every, "interval", time.Second, "Prometheus's scrape and evaluation interval")
	flag.Parse()
	if o.buildOnly {
		if o.binDir == "" {
			fmt.Fprintln(os.Stderr, "alerts: -build-only needs -bin")
			os.Exit(2)
		}
		if err := harness.Build(o.binDir); err != nil {
			fmt.Fprintln(os.Stderr, "alerts:", err)
			os.Exit(2)
		}
		return
	}
	ok, err := run(context.Background(), o)
	if err != nil {
		fmt.Fprintln(os.Stderr, "alerts:", err)
		os.Exit(2)
	}
	if !ok {
		os.Exit(1)
	}
}

// row is the outcome of one expected alert.
type row struct {
	exp                 expectation
	scenario, removal   string
	background          bool
	shippedFor, loaded  time.Duration
	fired, resolved     time.Duration
	firedOK, resolvedOK bool
	problem             string
}

func (r row) ok() bool { return r.firedOK && r.resolvedOK && r.problem == "" }

func run(ctx context.Context, o options) (bool, error) {
	t0 := time.Now()
	text, err := os.ReadFile(o.rules)
	if err != nil {
		return false, err
	}
	rules, err := parseRules(string(text))
	if err != nil {
		return false, fmt.Errorf("%s: %w", o.rules, err)
	}
	loaded, err := scaleFor(string(text), o.scale)
	if err != nil {
		return false, err
	}
	if err := onlyForDiffers(string(text), loaded); err != nil {
		return false, err
	}
	if o.breakAlert != "" {
		if loaded, err = breakExpr(loaded, o.breakAlert); err != nil {
			return false, err
		}
	}

	var ledger *replicatedLedger
	// The steps run one after another, the scenarios of a step at once
	// (they fail different things). A background scenario's resolution is
	// awaited beside the later steps, which must leave the processes it
	// watches running. Redis's alert takes 5 minutes to resolve whatever
	// happens, so it starts early, after the one step that stops the
	// worker.
	steps := []step{
		{scenarios: []*scenario{componentDown("worker", "worker", "relay")}},
		{scenarios: []*scenario{redisDown()}},
		{scenarios: []*scenario{receiverFaults()}},
		{scenarios: []*scenario{componentDown("receiver", "receiver"), managementDown(), staleRuns(), ledgerAsync(&ledger)}},
		{scenarios: []*scenario{poison(), outboxParked(), reconcileMissing()}},
		{scenarios: []*scenario{workerBroker(), noRelay()}},
		{scenarios: []*scenario{postgresDown()}},
		{scenarios: []*scenario{outboxStalled()}},
		{scenarios: []*scenario{rollout()}},
	}
	// Every alert has a scenario or a reason; every scenario's alert is
	// in the file.
	covered := map[string]bool{}
	for _, st := range steps {
		for _, sc := range st.scenarios {
			for _, e := range sc.expect {
				covered[e.alert] = true
			}
		}
	}
	byName := map[string]rule{}
	var uncovered []string
	for _, r := range rules {
		byName[r.Name] = r
		if !covered[r.Name] && notInduced[r.Name] == "" {
			uncovered = append(uncovered, r.Name)
		}
	}
	for name := range covered {
		if _, ok := byName[name]; !ok {
			return false, fmt.Errorf("a scenario expects %s, which %s does not define", name, o.rules)
		}
	}
	if o.breakAlert != "" {
		if !covered[o.breakAlert] {
			return false, fmt.Errorf("-break %s: no scenario induces it", o.breakAlert)
		}
		steps = only(steps, o.breakAlert)
	}

	tools, err := toolsDir(o.tools)
	if err != nil {
		return false, err
	}
	dir, err := os.MkdirTemp("", "ie-alerts")
	if err != nil {
		return false, err
	}
	defer os.RemoveAll(dir)
	binDir := cmp.Or(o.binDir, filepath.Join(dir, "bin"))
	if _, err := os.Stat(filepath.Join(binDir, "worker")); err != nil {
		tb := time.Now()
		if err := harness.Build(binDir); err != nil {
			return false, err
		}
		fmt.Printf("built the binaries of this tree in %s\n", time.Since(tb).Round(100*time.Millisecond))
	}
	mon, err := startMonitor(ctx, dir, tools, loaded, namespace, o.every)
	if err != nil {
		return false, err
	}
	defer mon.close()
	if err := checkLoaded(ctx, mon, rules, o); err != nil {
		return false, err
	}
	fmt.Printf("prometheus and alertmanager (%s) up; %d alerts loaded, for: divided by %d, scrape and evaluation every %s\n",
		tools, len(rules), o.scale, o.every)
	if o.breakAlert != "" {
		fmt.Printf("NEGATIVE CONTROL: the expression of %s is broken (its metric names renamed idempotent_events_broken_*)\n", o.breakAlert)
	}

	sys, err := newSystem(ctx, mon, binDir)
	if err != nil {
		return false, err
	}
	defer sys.close()
	// The replicated ledger (a private cluster: seconds to build) starts
	// in the background after the steps that need no worker but the
	// stack's, and is waited for before the step that needs it.
	has := func(st step, name string) bool {
		return slices.ContainsFunc(st.scenarios, func(sc *scenario) bool { return sc.name == name })
	}
	needLedger := slices.ContainsFunc(steps, func(st step) bool { return has(st, "ledger async") })
	var ledgerErr error
	var ledgerWG sync.WaitGroup
	launched := false
	launchLedger := func() {
		if needLedger && !launched {
			launched = true
			ledgerWG.Go(func() { ledger, ledgerErr = startReplicatedLedger(ctx, binDir, mon) })
		}
	}
	defer func() {
		ledgerWG.Wait()
		if ledger != nil {
			ledger.close()
		}
	}()
	for _, c := range []struct {
		name  string
		ready bool
	}{{"consumer", false}, {"receiver", true}, {"worker", true}, {"relay", false}} {
		if err := sys.start(ctx, c.name, c.ready); err != nil {
			return false, err
		}
	}
	// Prometheus ran before the stack did: ComponentDown fired for the
	// seconds it took to start. The baseline begins once nothing is
	// pending or firing any more.
	if err := waitFor(ctx, 60*time.Second, "the alerts of the stack's start resolved", func() (bool, error) {
		active, err := mon.active(ctx)
		return err == nil && len(active) == 0, err
	}); err != nil {
		return false, err
	}
	runStart := time.Now()
	if err := baseline(ctx, sys); err != nil {
		return false, fmt.Errorf("baseline: %w\n%s", err, sys.logs(10))
	}
	good := true
	if active, err := quiet(ctx, mon, 5*o.every, runStart); err != nil {
		return false, err
	} else if len(active) > 0 {
		fmt.Printf("FAIL: alerts active in the healthy baseline: %s\n", strings.Join(active, ", "))
		good = false
	} else {
		fmt.Printf("baseline: traffic, duplicates and retries; no alert pending or firing\n")
	}

	var rows []row
	var bg background
	var windows []window
	for i, st := range steps {
		if !has(st, "no worker") {
			launchLedger() // its worker would be a worker still running
		}
		if has(st, "ledger async") {
			ledgerWG.Wait()
			if ledgerErr != nil {
				return false, fmt.Errorf("replicated ledger: %w", ledgerErr)
			}
		}
		ts := time.Now()
		rows = append(rows, runStep(ctx, sys, mon, st.scenarios, byName, &bg)...)
		var names []string
		w := window{start: ts, end: time.Now(), expected: map[string]bool{}}
		for _, sc := range st.scenarios {
			names = append(names, sc.name)
			for _, e := range sc.expect {
				w.expected[e.alert] = true
			}
		}
		w.name = strings.Join(names, ", ")
		windows = append(windows, w)
		fmt.Printf("step %d (%s): %s\n", i+1, w.name, w.end.Sub(ts).Round(100*time.Millisecond))
		if has(st, "ledger async") && ledger != nil {
			ledger.close() // its worker's build_info and handler set would mask the later scenarios
			ledger = nil
		}
	}
	tw := time.Now()
	rows = append(rows, bg.wait()...)
	if d := time.Since(tw); d > time.Second {
		fmt.Printf("waited %s more for the background scenarios to resolve\n", d.Round(100*time.Millisecond))
	}
	runEnd := time.Now()

	fmt.Println()
	printRows(rows, rules, byName, notInduced, uncovered, o)
	printSideEffects(mon.hook.all(), runStart, windows, rows)
	for _, r := range rows {
		good = good && r.ok()
	}
	if len(uncovered) > 0 {
		good = false
	}
	if o.breakAlert == "" {
		ok, err := checkDashboards(ctx, mon, o.dashboards, o.rules, runStart, runEnd, o.every)
		if err != nil {
			return false, err
		}
		good = good && ok
	}
	fmt.Printf("\nalerts: %s in %s\n", map[bool]string{true: "every alert fired and resolved", false: "FAILED"}[good], time.Since(t0).Round(time.Second))
	if !good {
		fmt.Println("--- last lines of the components:\n" + sys.logs(8))
	}
	return good, nil
}

// only keeps the scenarios that expect alert.
func only(steps []step, alert string) []step {
	var out []step
	for _, st := range steps {
		var keep []*scenario
		for _, sc := range st.scenarios {
			if slices.ContainsFunc(sc.expect, func(e expectation) bool { return e.alert == alert }) {
				keep = append(keep, sc)
			}
		}
		if len(keep) > 0 {
			out = append(out, step{scenarios: keep})
		}
	}
	return out
}

// step is scenarios run at once.
type step struct {
	scenarios []*scenario
}

// background collects the rows of the scenarios whose resolution is
// awaited beside the later steps.
type background struct {
	wg   sync.WaitGroup
	mu   sync.Mutex
	rows []row
}

// wait returns the rows of every background scenario once all are done.
func (b *background) wait() []row {
	b.wg.Wait()
	b.mu.Lock()
	defer b.mu.Unlock()
	out := b.rows
	b.rows = nil
	return out
}

// toolsDir is where prometheus and alertmanager are, built by
// hack/tools/build.sh when not given.
func toolsDir(dir string) (string, error) {
	if dir != "" {
		return dir, nil
	}
	out, err := exec.Command("hack/tools/build.sh", "--dir").Output()
	if err != nil {
		return "", fmt.Errorf("hack/tools/build.sh --dir (run from the repository root): %w", err)
	}
	dir = strings.TrimSpace(string(out))
	build := exec.Command("hack/tools/build.sh", "prometheus", "alertmanager")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		return "", fmt.Errorf("hack/tools/build.sh prometheus alertmanager: %w", err)
	}
	return dir, nil
}

// checkLoaded verifies that Prometheus runs every alert of the file,
// healthy, with the scaled "for:".
func checkLoaded(ctx context.Context, mon *monitor, rules []rule, o options) error {
	var got []loadedRule
	err := waitFor(ctx, 30*time.Second, "prometheus loaded the rules", func() (bool, error) {
		var err error
		got, err = mon.rules(ctx)
		return err == nil && len(got) == len(rules), err
	})
	if err != nil {
		return fmt.Errorf("%w (%d of %d loaded):\n%s", err, len(got), len(rules), mon.prom.tail(20))
	}
	want := map[string]time.Duration{}
	for _, r := range rules {
		want[r.Name] = scaledFor(r.For, o.scale)
	}
	for _, r := range got {
		d, ok := want[r.Name]
		if !ok {
			return fmt.Errorf("prometheus runs an alert %s that the file does not define", r.Name)
		}
		if time.Duration(r.Duration*float64(time.Second)) != d {
			return fmt.Errorf("alert %s loaded with for %gs, want %s", r.Name, r.Duration, d)
		}
		if r.Health == "err" {
			return fmt.Errorf("alert %s: %s", r.Name, r.Error)
		}
	}
	return nil
}

// baseline gives the healthy stack what the panels show in normal
// operation: payments, provider retries of committed events (duplicates at
// the receiver and, redelivered, at the worker), and a lock that makes the
// worker's transactions time out into a retry tier.
func baseline(ctx context.Context, s *system) error {
	if got := s.send(ctx, s.good, "base", 100, 8); got[202] != 100 {
		return fmt.Errorf("100 deliveries answered %v", got)
	}
	if err := waitFor(ctx, 60*time.Second, "100 events committed", func() (bool, error) {
		n, err := s.count1(ctx, `SELECT count(*) FROM processed_events WHERE event_id LIKE 'evt_base_%'`)
		return n == 100, err
	}); err != nil {
		return err
	}
	// A provider's retries of committed events: the receiver's duplicate
	// check answers them 200; redelivered to the worker (as after a lost
	// ack), the ledger makes them duplicates.
	var again []string
	for i := 1; i <= 10; i++ {
		again = append(again, fmt.Sprintf("evt_base_%d", i))
	}
	if got := s.resend(ctx, again); got[200] == 0 {
		return fmt.Errorf("resending committed events answered %v, want 200s", got)
	}
	for _, id := range again[:5] {
		if err := s.publish(ctx, id, harness.Body(id), time.Now()); err != nil {
			return err
		}
	}
	// A migration holds a lock on the orders table: the worker's
	// transactions wait out lock_timeout and take a retry tier. The lock is
	// held until the worker has counted a retry.
	if err := holdLock(ctx, s, func() error {
		if got := s.send(ctx, s.good, "locked", 5, 5); got[202] != 5 {
			return fmt.Errorf("5 deliveries answered %v", got)
		}
		return waitFor(ctx, 30*time.Second, "a retry while orders is locked", func() (bool, error) {
			n, err := s.metric("worker", "idempotent_events_worker_retries_total")
			return n > 0, err
		})
	}); err != nil {
		return err
	}
	return waitFor(ctx, 60*time.Second, "the events sent while orders was locked committed", func() (bool, error) {
		n, err := s.count1(ctx, `SELECT count(*) FROM processed_events WHERE event_id LIKE 'evt_locked_%'`)
		return n == 5, err
	})
}

// holdLock runs f while a transaction holds an exclusive lock on orders.
func holdLock(ctx context.Context, s *system, f func() error) error {
	tx, err := s.stack.DB.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, `LOCK TABLE orders IN ACCESS EXCLUSIVE MODE`); err != nil {
		return err
	}
	if err := f(); err != nil {
		return err
	}
	return tx.Commit(ctx)
}

// quiet waits d and returns the alerts Prometheus has pending or firing,
// and those Alertmanager notified as firing since since.
func quiet(ctx context.Context, mon *monitor, d time.Duration, since time.Time) ([]string, error) {
	time.Sleep(d)
	active, err := mon.active(ctx)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, a := range active {
		out = append(out, a.Labels["alertname"]+labelString(a.Labels)+" "+a.State)
	}
	for _, n := range mon.hook.all() {
		if n.Status == "firing" && !n.At.Before(since) {
			out = append(out, n.Labels["alertname"]+labelString(n.Labels)+" notified firing")
		}
	}
	return out, nil
}

// runStep runs a step's scenarios at once and returns a row per expected
// alert; a background scenario's rows go to bg once it resolves (the step
// waits for its removal only).
func runStep(ctx context.Context, s *system, mon *monitor, scenarios []*scenario, byName map[string]rule, bg *background) []row {
	results := make([][]row, len(scenarios))
	var wg sync.WaitGroup
	for i, sc := range scenarios {
		removed := make(chan struct{})
		if sc.background {
			bg.wg.Go(func() {
				r := runScenario(ctx, s, mon, sc, byName, removed)
				bg.mu.Lock()
				bg.rows = append(bg.rows, r...)
				bg.mu.Unlock()
			})
			wg.Go(func() { <-removed })
			continue
		}
		wg.Go(func() { results[i] = runScenario(ctx, s, mon, sc, byName, removed) })
	}
	wg.Wait()
	var out []row
	for _, r := range results {
		out = append(out, r...)
	}
	return out
}

// resolveTimeout bounds the wait for a resolved notification after the
// cause is removed.
const resolveTimeout = 90 * time.Second

// runScenario induces, waits for the firing notifications, removes the
// cause (closing removed then), and waits for the resolved ones.
func runScenario(ctx context.Context, s *system, mon *monitor, sc *scenario, byName map[string]rule, removed chan<- struct{}) []row {
	var once sync.Once
	markRemoved := func() { once.Do(func() { close(removed) }) }
	defer markRemoved()
	rows := make([]row, len(sc.expect))
	var longest time.Duration
	for i, e := range sc.expect {
		r := byName[e.alert]
		rows[i] = row{exp: e, scenario: sc.name, removal: sc.removal, background: sc.background, shippedFor: r.For, loaded: scaledForOf(mon, r)}
		longest = max(longest, rows[i].loaded)
	}
	fail := func(format string, a ...any) []row {
		msg := fmt.Sprintf(format, a...)
		for i := range rows {
			if rows[i].problem == "" {
				rows[i].problem = msg
			}
		}
		return rows
	}
	if active, err := mon.active(ctx); err == nil {
		for i, e := range sc.expect {
			for _, a := range active {
				if a.Labels["alertname"] == e.alert && matches(a.Labels, e.labels) {
					rows[i].problem = "already " + a.State + " before the induction"
				}
			}
		}
	}
	// The condition needs a few scrapes to show, then "for:" to pass;
	// the replicated ledger's worker reads its settings every 30 s.
	fireTimeout := longest + 60*time.Second
	if sc.name == "ledger async" {
		fireTimeout += 30 * time.Second
	}
	resolveWithin := cmp.Or(sc.resolveWithin, resolveTimeout)
	t0 := time.Now()
	if err := sc.induce(ctx, s); err != nil {
		return fail("induce: %v", err)
	}
	pending := waitNotes(ctx, mon, rows, "firing", t0, fireTimeout)
	t1 := time.Now()
	if err := sc.remove(ctx, s); err != nil {
		return fail("remove the cause: %v", err)
	}
	markRemoved()
	if pending < len(rows) {
		waitNotes(ctx, mon, rows, "resolved", t1, resolveWithin)
	}
	for i := range rows {
		switch {
		case !rows[i].firedOK && rows[i].problem == "":
			rows[i].problem = fmt.Sprintf("no firing notification within %s of the induction", fireTimeout)
		case rows[i].firedOK && rows[i].fired < rows[i].loaded:
			rows[i].problem = fmt.Sprintf("fired %s after the induction, before its for: %s passed: the condition held before", rows[i].fired, rows[i].loaded)
		case rows[i].firedOK && !rows[i].resolvedOK && rows[i].problem == "":
			rows[i].problem = fmt.Sprintf("no resolved notification within %s of the removal", resolveWithin)
		}
	}
	return rows
}

// scaledForOf is the for: Prometheus runs r with.
func scaledForOf(mon *monitor, r rule) time.Duration {
	rules, err := mon.rules(context.Background())
	if err == nil {
		for _, l := range rules {
			if l.Name == r.Name {
				return time.Duration(l.Duration * float64(time.Second))
			}
		}
	}
	return -1
}

// waitNotes waits until every row has a notification of status since t0
// (recording when), or timeout; it returns how many rows still wait.
func waitNotes(ctx context.Context, mon *monitor, rows []row, status string, t0 time.Time, timeout time.Duration) int {
	deadline := t0.Add(timeout)
	for {
		waiting := 0
		for i := range rows {
			done := &rows[i].firedOK
			at := &rows[i].fired
			if status == "resolved" {
				done, at = &rows[i].resolvedOK, &rows[i].resolved
				if !rows[i].firedOK {
					continue
				}
			}
			if *done {
				continue
			}
			want := map[string]string{"alertname": rows[i].exp.alert}
			for k, v := range rows[i].exp.labels {
				want[k] = v
			}
			if n, ok := mon.hook.first(status, want, t0); ok {
				*done, *at = true, n.At.Sub(t0)
				continue
			}
			waiting++
		}
		if waiting == 0 || time.Now().After(deadline) || ctx.Err() != nil {
			return waiting
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func printRows(rows []row, rules []rule, byName map[string]rule, notInduced map[string]string, uncovered []string, o options) {
	order := map[string]int{}
	for i, r := range rules {
		order[r.Name] = i
	}
	sort.SliceStable(rows, func(i, j int) bool { return order[rows[i].exp.alert] < order[rows[j].exp.alert] })
	fmt.Printf("%-62s %-9s %-7s %-9s %-7s  %s\n", "alert", "for", "loaded", "fired", "resolved", "result: induced by -> removed by")
	dur := func(ok bool, d time.Duration) string {
		if !ok {
			return "-"
		}
		return d.Round(100 * time.Millisecond).String()
	}
	for _, r := range rows {
		result := "ok"
		if !r.ok() {
			result = "FAILED (" + r.problem + ")"
		}
		fmt.Printf("%-62s %-9s %-7s %-9s %-7s  %s: %s -> %s\n", r.exp.alert+labelString(r.exp.labels), promDuration(r.shippedFor), promDuration(r.loaded),
			dur(r.firedOK, r.fired), dur(r.resolvedOK, r.resolved), result, r.exp.cause, r.removal)
	}
	var names []string
	for name := range notInduced {
		if _, ok := byName[name]; ok {
			names = append(names, name)
		}
	}
	sort.Strings(names)
	for _, name := range names {
		if o.breakAlert == "" {
			fmt.Printf("%-62s %-9s %-7s %-9s %-7s  not induced: %s\n", name, promDuration(byName[name].For), "-", "-", "-", notInduced[name])
		}
	}
	for _, name := range uncovered {
		fmt.Printf("%-62s %-9s %-7s %-9s %-7s  FAILED (no scenario in pkg/internal/cmd/alerts and no reason in notInduced)\n",
			name, promDuration(byName[name].For), "-", "-", "-")
	}
}

// window is when a step ran and the alerts its scenarios expect.
type window struct {
	name       string
	start, end time.Time
	expected   map[string]bool
}

// printSideEffects lists the alerts that fired during a step that does not
// expect them (a worker cut from RabbitMQ is also a worker whose queue
// statistics say no consumer, say): not failures, but what an operator
// would have been paged for too. Background scenarios' alerts are expected
// throughout.
func printSideEffects(notes []notification, since time.Time, windows []window, rows []row) {
	anywhere := map[string]bool{}
	for _, r := range rows {
		if r.background {
			anywhere[r.exp.alert] = true
		}
	}
	seen := map[string]bool{}
	var lines []string
	for _, n := range notes {
		name := n.Labels["alertname"]
		if n.Status != "firing" || anywhere[name] || n.At.Before(since) {
			continue
		}
		where := "the baseline or between steps"
		for _, w := range windows {
			if !n.At.Before(w.start) && !n.At.After(w.end) {
				where = "step " + w.name
				if w.expected[name] {
					where = ""
				}
				break
			}
		}
		line := fmt.Sprintf("  %s%s during %s", name, labelString(n.Labels), where)
		if where != "" && !seen[line] {
			seen[line] = true
			lines = append(lines, line)
		}
	}
	if len(lines) > 0 {
		fmt.Println("\nalso fired (side effects of the steps, not failures):")
		fmt.Println(strings.Join(lines, "\n"))
	}
}

// checkDashboards runs every panel query of every dashboard over the run
// and prints per dashboard what each returned.
func checkDashboards(ctx context.Context, mon *monitor, glob, rulesPath string, start, end time.Time, scrape time.Duration) (bool, error) {
	files, err := filepath.Glob(glob)
	if err != nil {
		return false, err
	}
	if len(files) == 0 {
		return false, fmt.Errorf("no dashboard matches %s", glob)
	}
	step := time.Second
	interval, rateInterval := grafanaInterval(step, scrape)
	good := true
	mentioned := map[string]bool{}
	for _, f := range files {
		d, err := loadDashboard(f)
		if err != nil {
			return false, err
		}
		values := map[string]string{}
		var shown []string
		for _, v := range d.Vars {
			switch v.Type {
			case "datasource", "interval", "textbox", "constant", "custom", "adhoc":
				continue
			case "query":
			default:
				return false, fmt.Errorf("%s: variable %s of type %s: the panel check does not resolve it", f, v.Name, v.Type)
			}
			match, label, ok := parseLabelValues(v.Query)
			if !ok {
				return false, fmt.Errorf("%s: variable %s: query %q is not label_values(metric, label)", f, v.Name, v.Query)
			}
			opts, err := mon.labelValues(ctx, label, match, start, end)
			if err != nil {
				return false, err
			}
			if len(opts) == 0 {
				fmt.Printf("FAIL: %s: variable %s (%s) offers no value\n", f, v.Name, v.Query)
				good = false
				continue
			}
			// One real option selected: every series a panel shows must carry
			// the label the variable filters on ("All", .*, would match
			// series without it too).
			values[v.Name] = selection(opts[:1])
			shown = append(shown, fmt.Sprintf("%s=%q (of %v)", v.Name, values[v.Name], opts))
		}
		fmt.Printf("\ndashboard %q (%s): %d queries; %s; $__rate_interval=%s, step %s over the run's %s\n",
			d.Title, f, len(d.Targets), strings.Join(shown, ", "), promDuration(rateInterval), step, end.Sub(start).Round(time.Second))
		fmt.Printf("  %-4s %-52s %-4s %7s %7s  %s\n", "id", "panel", "ref", "series", "points", "result")
		for _, t := range d.Targets {
			expr, unknown := expand(t.Expr, values, interval, rateInterval, end.Sub(start))
			for _, m := range metricRef.FindAllString(t.Expr, -1) {
				mentioned[baseMetric(m)] = true
			}
			result := "ok"
			var nSeries, points int
			if len(unknown) > 0 {
				result = "FAILED (unknown variables " + strings.Join(unknown, ", ") + ")"
			} else {
				ss, err := mon.queryRange(ctx, expr, start, end, step)
				if err != nil {
					result = "FAILED (" + err.Error() + ")"
				}
				nSeries = len(ss)
				for _, s := range ss {
					for _, v := range s.Values {
						if !math.IsNaN(v) {
							points++
						}
					}
				}
				if err == nil && points == 0 {
					result = "FAILED (no data)"
					if why, ok := mayBeEmpty[t.Panel+"/"+t.RefID]; ok {
						result = "no data, as expected: " + why
					}
				}
			}
			if strings.HasPrefix(result, "FAILED") {
				good = false
			}
			kind := ""
			if t.Instant {
				kind = " (instant)"
			}
			fmt.Printf("  %-4d %-52s %-4s %7d %7d  %s\n", t.PanelID, trim(t.Panel+kind, 52), t.RefID, nSeries, points, result)
		}
	}
	// Every metric the dashboards and the rules name was scraped.
	rulesText, err := os.ReadFile(rulesPath)
	if err != nil {
		return false, err
	}
	for _, m := range exprMetrics(string(rulesText)) {
		mentioned[baseMetric(m)] = true
	}
	var names []string
	for m := range mentioned {
		names = append(names, m)
	}
	sort.Strings(names)
	var never []string
	for _, m := range names {
		n, err := mon.seriesCount(ctx, m, start, end)
		if err != nil {
			return false, err
		}
		if n == 0 {
			never = append(never, m)
		}
	}
	if len(never) > 0 {
		fmt.Printf("FAIL: metrics the dashboards or rules name that no process exported during the run: %s\n", strings.Join(never, ", "))
		good = false
	} else {
		fmt.Printf("\nevery one of the %d idempotent_events_* metrics the dashboards and rules name was scraped during the run\n", len(names))
	}
	return good, nil
}

// mayBeEmpty are the panel targets (title/refId) that legitimately show no
// data in any state the suite produces, and why.
var mayBeEmpty = map[string]string{}

// baseMetric folds a histogram's series names onto the histogram (no
// other metric of ours ends in _bucket, _sum or _count).
func baseMetric(name string) string {
	for _, suf := range []string{"_bucket", "_sum", "_count"} {
		if b, ok := strings.CutSuffix(name, suf); ok {
			return b
		}
	}
	return name
}

func trim(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n-1] + "…"
}
