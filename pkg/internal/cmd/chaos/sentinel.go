package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/idempotent-events/idempotent-events/pkg/internal/harness"
	"github.com/idempotent-events/idempotent-events/pkg/internal/redissentinel"
)

// sentinelMinDuration is the least the redis-sentinel scenario's
// deliveries span: the first kill at a third of them, its failover (a few
// seconds) and the old master's rejoin (the sentinels wait 8 s before they
// make it a replica) must leave room for the second kill while they flow.
const sentinelMinDuration = 30 * time.Second

// sentinelRun is the redis-sentinel scenario's Redis: a private master, its
// replica and three sentinels (redissentinel) on loopback ports, reached
// through REDIS_URL's failover form.
type sentinelRun struct {
	*redissentinel.Setup
	// notes say what the faults did, one line each.
	notes []string
	// marks are the fast path's counters at the start of the faults, at
	// each kill and at each failover's end.
	marks []mark
	// sampler has the counters every 200 ms from the start of the faults.
	sampler *sampler
}

// mark is the fast path's counters at one moment of the scenario.
type mark struct {
	what string
	at   time.Time
	fp   fastPath
	err  error
}

// startSentinel starts the Redis setup, before the scenario's processes
// start.
func startSentinel(ctx context.Context) *sentinelRun {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	started := time.Now()
	s, err := redissentinel.Start(ctx)
	check(err)
	return &sentinelRun{Setup: s, notes: []string{fmt.Sprintf(
		"master %s, replica %s, sentinels %s (quorum %d, down-after %s, failover-timeout %s), up in %s; no persistence",
		s.Addr(0), s.Addr(1), strings.Join(s.SentinelAddrs(), ", "), redissentinel.Quorum, redissentinel.DownAfter,
		redissentinel.FailoverTimeout, time.Since(started).Round(100*time.Millisecond))}}
}

// env is what every binary of the redis-sentinel scenario gets on top of
// its usual environment (system.privateEnv): the sentinels as REDIS_URL.
func (r *sentinelRun) env() []string {
	return []string{"REDIS_URL=" + r.URL()}
}

// killRedisMasters SIGKILLs the Redis master once a third of the
// deliveries were answered 2xx, waits until the sentinels have promoted
// the replica, restarts the old master and waits until the sentinels have
// made it the new master's replica and it has caught up. Then, once two
// thirds were answered, it does the same to the new master, unless the
// deliveries are done by then: a failover after them would test nothing
// of the fast path. It fails the scenario (system.faultErr) when a
// failover or a rejoin does not happen, or when the final master holds no
// key: the pipeline did not use it.
func killRedisMasters(sys *system, stop <-chan struct{}, o options) int {
	r := sys.sentinel
	deliveries := int64(3 * o.events * (1 + o.dups))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	// The workers serve their metrics a moment after the receiver is ready.
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(100 * time.Millisecond) {
		if _, err := sys.readFastPath(); err == nil || time.Now().After(deadline) {
			break
		}
	}
	r.mark(sys, "start")
	start := r.marks[0].at
	r.sampler = startSampler(sys)
	kills := 0
	for k := int64(1); k <= 2; k++ {
		answered := awaitAnswers(sys, stop, deliveries*k/3)
		sending := "while sending"
		select {
		case <-stop:
			if k > 1 {
				r.notes = append(r.notes, fmt.Sprintf("no kill %d: the deliveries were done before the first killed master had rejoined and two thirds of them were answered", k))
				r.finalKeys(ctx, sys)
				return kills
			}
			sending = "after the last delivery was answered"
		default:
		}
		old, err := r.Master(ctx)
		check(err)
		i := r.Server(old)
		lag := r.behind(ctx, i)
		r.mark(sys, fmt.Sprintf("kill %d", k))
		at := time.Since(start)
		check(r.Kill(i))
		killed := time.Now()
		kills++
		failover, err := r.failOver(ctx, sys, k, i, old, killed)
		r.notes = append(r.notes, fmt.Sprintf("kill %d: master %s SIGKILLed at %s (%d of %d deliveries answered 2xx) %s, its replica %s",
			k, old, at.Round(100*time.Millisecond), answered, deliveries, sending, lag),
			"  "+failover, "  fast path back after the kill: "+comeback(r.sampler.between(killed, time.Now())))
		if err != nil {
			sys.faultErr = fmt.Errorf("kill %d: %w\n%s", k, err, r.Logs(15))
			return kills
		}
	}
	r.finalKeys(ctx, sys)
	return kills
}

// failOver waits until the sentinels have failed over from server i, at
// old, killed at killed; restarts it and waits until it is the new
// master's replica and has caught up. It says what happened.
func (r *sentinelRun) failOver(ctx context.Context, sys *system, k int64, i int, old string, killed time.Time) (string, error) {
	next, err := r.AwaitFailover(ctx, old)
	if err != nil {
		return "no failover", err
	}
	failover := time.Since(killed)
	r.mark(sys, fmt.Sprintf("failover %d", k))
	check(r.Restart(ctx, i))
	restarted := time.Now()
	master, err := r.AwaitPair(ctx)
	rejoin := fmt.Sprintf("the new master's replica and caught up %s later", time.Since(restarted).Round(100*time.Millisecond))
	switch {
	case err != nil:
		rejoin = "not the new master's replica"
	case master != next:
		// A further failover, by the sentinels themselves: a fault the
		// fast path must survive too, not a failure of the run.
		rejoin = fmt.Sprintf("then the sentinels failed over again, to %s, and %s became its replica, caught up %s after the restart",
			master, next, time.Since(restarted).Round(100*time.Millisecond))
	}
	return fmt.Sprintf("%s the master %s after the kill (named by every sentinel, answering as master); %s restarted empty, %s",
		next, failover.Round(10*time.Millisecond), old, rejoin), err
}

// behind says how far the other server's replication was behind master i
// just before its kill: what the promoted replica may lack.
func (r *sentinelRun) behind(ctx context.Context, i int) string {
	m, err := r.Role(ctx, i)
	if err != nil {
		return "not known to be in sync (" + err.Error() + ")"
	}
	rep, err := r.Role(ctx, 1-i)
	if err != nil {
		return "not known to be in sync (" + err.Error() + ")"
	}
	return fmt.Sprintf("%d bytes of its stream behind", max(m.Offset-rep.Offset, 0))
}

// finalKeys notes how many keys the final master holds, and fails the
// scenario if it holds none: the workers vouch for the ledger's epoch in
// it every few seconds and write every commit's entries, so an empty
// master means the pipeline was not on it.
func (r *sentinelRun) finalKeys(ctx context.Context, sys *system) {
	master, err := r.Master(ctx)
	check(err)
	keys, err := r.Keys(ctx, r.Server(master))
	check(err)
	r.notes = append(r.notes, fmt.Sprintf("the final master %s holds %d keys", master, keys))
	if keys == 0 && sys.faultErr == nil {
		sys.faultErr = fmt.Errorf("the final master %s holds no key: the pipeline did not use the sentinels' master", master)
	}
}

// mark records the fast path's counters now.
func (r *sentinelRun) mark(sys *system, what string) {
	fps, err := sys.readFastPath()
	r.marks = append(r.marks, mark{what: what, at: time.Now(), fp: sum(fps), err: err})
}

// fastPath is what one process's Redis fast path counted up to a moment.
// A worker counts its lookups (one per event) and its post-commit writes
// (one per batch), and the duplicates it recognised in Redis and in the
// ledger; the receiver its failed duplicate checks and the duplicates it
// answered from Redis. The scenario kills none of these processes, so the
// counters span the whole run.
type fastPath struct {
	hit, miss, lookupErr float64
	writeOK, writeErr    float64
	dupRedis, dupLedger  float64
	recvErr, recvDup     float64
}

func (a fastPath) plus(b fastPath, sign float64) fastPath {
	return fastPath{a.hit + sign*b.hit, a.miss + sign*b.miss, a.lookupErr + sign*b.lookupErr, a.writeOK + sign*b.writeOK,
		a.writeErr + sign*b.writeErr, a.dupRedis + sign*b.dupRedis, a.dupLedger + sign*b.dupLedger,
		a.recvErr + sign*b.recvErr, a.recvDup + sign*b.recvDup}
}

func (a fastPath) minus(b fastPath) fastPath { return a.plus(b, -1) }

func sum(fps []fastPath) fastPath {
	var t fastPath
	for _, fp := range fps {
		t = t.plus(fp, 1)
	}
	return t
}

// answered is how many lookups got an answer from Redis: a hit or a miss
// at a worker, a duplicate answered from Redis at the receiver (which
// counts no other answer).
func (a fastPath) answered() float64 { return a.hit + a.miss + a.recvDup }

// failed is how many Redis calls failed.
func (a fastPath) failed() float64 { return a.lookupErr + a.writeErr + a.recvErr }

func (a fastPath) String() string {
	return fmt.Sprintf("lookups %.0f/%.0f/%.0f, writes %.0f/%.0f, duplicates %.0f/%.0f; receiver: %.0f failed, %.0f duplicates",
		a.hit, a.miss, a.lookupErr, a.writeOK, a.writeErr, a.dupRedis, a.dupLedger, a.recvErr, a.recvDup)
}

// readFastPath scrapes the counters of the receiver (first) and of each
// worker.
func (s *system) readFastPath() ([]fastPath, error) {
	s.mu.Lock()
	addrs := append([]string{s.receiverMetrics}, s.workerMetrics...)
	s.mu.Unlock()
	fps := make([]fastPath, len(addrs))
	for i, addr := range addrs {
		mfs, err := harness.Scrape(addr)
		if err != nil {
			return nil, fmt.Errorf("%s metrics: %w", processName(i), err)
		}
		fp := &fps[i]
		if i == 0 {
			fp.recvErr = counterWith(mfs, "idempotent_events_receiver_duplicate_check_errors_total", "layer", "redis")
			fp.recvDup = counterWith(mfs, "idempotent_events_receiver_duplicates_total", "layer", "redis")
			continue
		}
		const lookups, writes, dups = "idempotent_events_worker_redis_lookups_total", "idempotent_events_worker_redis_writes_total",
			"idempotent_events_worker_duplicates_total"
		fp.hit = counterWith(mfs, lookups, "result", "hit")
		fp.miss = counterWith(mfs, lookups, "result", "miss")
		fp.lookupErr = counterWith(mfs, lookups, "result", "error")
		fp.writeOK = counterWith(mfs, writes, "result", "ok")
		fp.writeErr = counterWith(mfs, writes, "result", "error")
		fp.dupRedis = counterWith(mfs, dups, "layer", "redis")
		fp.dupLedger = counterWith(mfs, dups, "layer", "postgres")
	}
	return fps, nil
}

// processName names readFastPath's i-th process.
func processName(i int) string {
	if i == 0 {
		return "receiver"
	}
	return fmt.Sprintf("worker %d", i)
}

// sampler scrapes the processes' fast-path counters every 200 ms, from the
// start of the faults until stop: when things happened between the marks.
type sampler struct {
	mu      sync.Mutex
	samples []sample
	quit    chan struct{}
	done    chan struct{}
}

// sample is the counters of the receiver and of each worker (readFastPath)
// at one moment.
type sample struct {
	at  time.Time
	fps []fastPath
}

func startSampler(sys *system) *sampler {
	s := &sampler{quit: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(s.done)
		t := time.NewTicker(200 * time.Millisecond)
		defer t.Stop()
		for {
			if fps, err := sys.readFastPath(); err == nil {
				s.mu.Lock()
				s.samples = append(s.samples, sample{at: time.Now(), fps: fps})
				s.mu.Unlock()
			}
			select {
			case <-s.quit:
				return
			case <-t.C:
			}
		}
	}()
	return s
}

// stop ends the sampling and returns every sample.
func (s *sampler) stop() []sample {
	close(s.quit)
	<-s.done
	return s.samples
}

// between returns the samples taken from from to to.
func (s *sampler) between(from, to time.Time) []sample {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []sample
	for _, x := range s.samples {
		if !x.at.Before(from) && !x.at.After(to) {
			out = append(out, x)
		}
	}
	return out
}

// comeback says, for each process, when its fast path first got an answer
// from Redis again after a kill and when it last failed, in the samples
// from the kill to the old master's rejoin: how long the failover lasted
// for the clients, who learn of the new master from the sentinels.
func comeback(samples []sample) string {
	if len(samples) < 2 {
		return "not known: no metrics"
	}
	killed := samples[0].at
	var parts []string
	for p := range samples[0].fps {
		var firstOK, lastErr time.Duration
		for k := 1; k < len(samples); k++ {
			prev, cur, at := samples[k-1].fps[p], samples[k].fps[p], samples[k].at.Sub(killed)
			if cur.answered() > prev.answered() && firstOK == 0 {
				firstOK = at
			}
			if cur.failed() > prev.failed() {
				lastErr = at
			}
		}
		ok, failed := "not seen", "none seen"
		if firstOK > 0 {
			ok = "at " + firstOK.Round(100*time.Millisecond).String()
		}
		if lastErr > 0 {
			failed = lastErr.Round(100 * time.Millisecond).String()
		}
		parts = append(parts, fmt.Sprintf("%s answered again %s (last failure %s)", processName(p), ok, failed))
	}
	return strings.Join(parts, ", ")
}

// failureSpells groups the samples in which Redis calls failed into spells
// (gaps under a second joined), with the errors in each, their times from
// start: the failovers' spells, and any other (timeouts of a loaded
// machine).
func failureSpells(samples []sample, start time.Time) string {
	type spell struct {
		from, to time.Duration
		failed   float64
	}
	var spells []spell
	for k := 1; k < len(samples); k++ {
		n := sum(samples[k].fps).failed() - sum(samples[k-1].fps).failed()
		if n <= 0 {
			continue
		}
		from, to := samples[k-1].at.Sub(start), samples[k].at.Sub(start)
		if last := len(spells) - 1; last >= 0 && from-spells[last].to < time.Second {
			spells[last].to = to
			spells[last].failed += n
			continue
		}
		spells = append(spells, spell{from, to, n})
	}
	if len(spells) == 0 {
		return "none"
	}
	// The largest eight, in their order.
	shown := slices.Clone(spells)
	slices.SortFunc(shown, func(a, b spell) int { return cmp.Compare(b.failed, a.failed) })
	shown = shown[:min(len(shown), 8)]
	slices.SortFunc(shown, func(a, b spell) int { return cmp.Compare(a.from, b.from) })
	var parts []string
	var rest float64
	for _, x := range spells {
		rest += x.failed
	}
	for _, x := range shown {
		parts = append(parts, fmt.Sprintf("%s–%s: %.0f", x.from.Round(100*time.Millisecond), x.to.Round(100*time.Millisecond), x.failed))
		rest -= x.failed
	}
	if len(spells) > len(shown) {
		parts = append(parts, fmt.Sprintf("and %d smaller spells with %.0f errors", len(spells)-len(shown), rest))
	}
	return strings.Join(parts, ", ")
}

// counterWith is the counter name's series whose label has value, 0 when
// there is none (a counter vector exports a series once it has counted).
func counterWith(mfs map[string]*dto.MetricFamily, name, label, value string) float64 {
	for _, m := range mfs[name].GetMetric() {
		for _, l := range m.GetLabel() {
			if l.GetName() == label && l.GetValue() == value {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}

// note is what the scenario prints under its line: the setup, the kills,
// what the fast path counted between them up to now (the drain is over),
// and when the Redis errors came.
func (r *sentinelRun) note(sys *system) string {
	lines := append([]string{}, r.notes...)
	r.mark(sys, "end")
	end := r.marks
	var samples []sample
	if r.sampler != nil {
		samples = r.sampler.stop()
	}
	lines = append(lines, "fast path, per phase: worker lookups hit/miss/error, post-commit writes ok/error, duplicates recognised in redis/the ledger; "+
		"the receiver's failed Redis checks and duplicates answered from Redis")
	for k := 1; k < len(end); k++ {
		from, to := end[k-1], end[k]
		phase := fmt.Sprintf("%s to %s, %s:", from.what, to.what, to.at.Sub(from.at).Round(100*time.Millisecond))
		if err := errors.Join(from.err, to.err); err != nil {
			lines = append(lines, fmt.Sprintf("  %-28s not known: %v", phase, err))
			continue
		}
		lines = append(lines, fmt.Sprintf("  %-28s %s", phase, to.fp.minus(from.fp)))
	}
	if first, last := end[0], end[len(end)-1]; first.err == nil && last.err == nil {
		t := last.fp.minus(first.fp)
		lines = append(lines, fmt.Sprintf("in all: %.0f Redis errors (%.0f worker lookups, %.0f post-commit writes, %.0f receiver checks); "+
			"%.0f of %.0f worker duplicates recognised by the ledger, not Redis",
			t.lookupErr+t.writeErr+t.recvErr, t.lookupErr, t.writeErr, t.recvErr, t.dupLedger, t.dupLedger+t.dupRedis))
	}
	lines = append(lines, "Redis errors, when (from the start of the faults, sampled every 200 ms): "+failureSpells(samples, end[0].at))
	for i := range lines {
		lines[i] = "  redis-sentinel: " + lines[i]
	}
	return strings.Join(lines, "\n")
}
