// Command bench measures idempotent-events on this machine and prints the
// figures the README quotes: receiver requests/s and latency, worker
// events/s, end-to-end latency at a fixed offered rate, memory of each
// process — beside the limits of the same services measured in the same
// run (raw confirmed publishes, raw consume with multiple acks, raw
// Postgres inserts of the same rows) and the worker configured as the seed
// (prefetch 1, one transaction per event). It prints the ratios.
//
//	go run ./pkg/internal/cmd/bench [-events 100000] [-dups 2] [-runs 3]
//
// Every figure is measured, none is asserted: the machines are noisy, so
// the harness reports medians over -runs runs.
package main

import (
	"context"
	"crypto/sha256"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	dto "github.com/prometheus/client_model/go"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idempotent-events/idempotent-events/pkg/effects"
	"github.com/idempotent-events/idempotent-events/pkg/internal/broker"
	"github.com/idempotent-events/idempotent-events/pkg/internal/event"
	"github.com/idempotent-events/idempotent-events/pkg/internal/harness"
	"github.com/idempotent-events/idempotent-events/pkg/internal/outbox"
	"github.com/idempotent-events/idempotent-events/pkg/internal/store"
	"github.com/idempotent-events/idempotent-events/pkg/payments"
)

type options struct {
	events, dups, conc, seedEvents, runs int
	rawMessages                          int
	rate                                 int
	rateFor                              time.Duration
	workerEnv, receiverEnv               string
	only, profileDir                     string
	// baseline is a git revision whose worker is timed beside ours;
	// baselineDir holds its binaries.
	baseline, baselineDir string
	baselineEvents        int
	pruneRows             int
	prunePause            time.Duration
}

func main() {
	var o options
	flag.IntVar(&o.events, "events", 100_000, "unique events in the main workload")
	flag.IntVar(&o.dups, "dups", 2, "extra deliveries of each event (duplicates)")
	flag.IntVar(&o.conc, "concurrency", 128, "concurrent HTTP clients against the receiver")
	flag.IntVar(&o.seedEvents, "seed-events", 10_000, "unique events for the seed-configuration comparison (each sent 1+dups times)")
	flag.IntVar(&o.runs, "runs", 3, "runs; figures are medians over runs")
	flag.IntVar(&o.rawMessages, "raw-messages", 0, "messages of the raw broker limits (default: as many as the main workload delivers)")
	flag.IntVar(&o.rate, "rate", 1000, "offered events/s for the end-to-end latency phase")
	flag.DurationVar(&o.rateFor, "rate-duration", 20*time.Second, "length of the end-to-end latency phase")
	flag.StringVar(&o.workerEnv, "worker-env", "", "extra worker settings for our configuration, e.g. WORKER_BATCH_SIZE=128,WORKER_PREFETCH=512")
	flag.StringVar(&o.receiverEnv, "receiver-env", "", "extra receiver settings, e.g. PUBLISH_CHANNELS=8")
	flag.StringVar(&o.only, "only", "", "run only one phase: raw, main, seed, baseline, outbox, downstream, e2e (for profiling; prints that phase's lines), or prune (the drain beside eventsctl prune on a ledger of -prune-rows; not part of a full run)")
	flag.StringVar(&o.profileDir, "profile", "", "write 10 s CPU profiles of the receiver, the workers and the relay under load to this directory")
	flag.StringVar(&o.baseline, "baseline", "", "a git revision: also time its worker on the same backlog as ours, in the same run, and print both")
	flag.DurationVar(&o.prunePause, "prune-pause", 250*time.Millisecond, "eventsctl prune -pause of the prune phase: the wait between two batches (eventsctl's default)")
	flag.IntVar(&o.pruneRows, "prune-rows", 10_000_000, "ledger rows of the prune phase (-only prune), half of them older than the retention")
	flag.IntVar(&o.baselineEvents, "baseline-events", 30_000, "unique events of the baseline comparison (each sent 1+dups times)")
	flag.Parse()
	if o.rawMessages <= 0 {
		o.rawMessages = o.events * (1 + o.dups)
	}
	if o.profileDir != "" {
		check(os.MkdirAll(o.profileDir, 0o755))
		o.receiverEnv = strings.Trim(o.receiverEnv+",METRICS_PPROF=true", ",")
		o.workerEnv = strings.Trim(o.workerEnv+",METRICS_PPROF=true", ",")
	}
	profileDir = o.profileDir

	binDir, err := os.MkdirTemp("", "ie-bench-bin")
	check(err)
	defer os.RemoveAll(binDir)
	fmt.Println("building binaries …")
	check(harness.Build(binDir))
	if o.baseline != "" {
		dir, err := os.MkdirTemp("", "ie-bench-baseline")
		check(err)
		defer os.RemoveAll(dir)
		fmt.Printf("building the binaries of %s …\n", o.baseline)
		check(harness.BuildRevision(o.baseline, dir))
		o.baselineDir = dir
	}

	var all []figures
	for r := 1; r <= o.runs; r++ {
		fmt.Printf("\n=== run %d of %d ===\n", r, o.runs)
		f := run(context.Background(), binDir, o)
		if o.only != "" {
			continue // a phase prints its own lines
		}
		f.ratios()
		f.print(fmt.Sprintf("run %d", r))
		all = append(all, f)
	}
	if o.only == "" {
		median(all).print(fmt.Sprintf("MEDIAN of %d runs", len(all)), all...)
	}
}

// profileDir, when set, receives CPU profiles taken under load; profiles
// numbers the workers' profiles in the order they were taken.
var (
	profileDir string
	profiles   atomic.Int64
)

// profile fetches a CPU profile of the process serving metricsAddr in the
// background; wait for the returned channel before stopping the process.
func profile(name, metricsAddr string) <-chan struct{} {
	done := make(chan struct{})
	if profileDir == "" {
		close(done)
		return done
	}
	go func() {
		defer close(done)
		resp, err := http.Get("http://" + metricsAddr + "/debug/pprof/profile?seconds=10")
		if err != nil {
			fmt.Fprintln(os.Stderr, "profile:", err)
			return
		}
		defer resp.Body.Close()
		f, err := os.Create(filepath.Join(profileDir, name+".pprof"))
		check(err)
		defer f.Close()
		_, _ = io.Copy(f, resp.Body)
	}()
	return done
}

func check(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

// figures are one run's measurements. Rates are per second, latencies in
// milliseconds, memory in MiB.
type figures struct {
	rawPublish, rawConsume, pgOne, pgBatch         float64
	receiverRPS, receiverP50, receiverP99          float64
	receiverRSS                                    float64
	worker, workerUnique, workerRSS                float64
	seed, oursSmall                                float64
	baseline, oursVsBaseline, rBaseline            float64
	outboxOff, outboxOn, rOutbox                   float64
	outboxApart, relayBehind, rOutboxApart         float64
	stockWorker, ordersExample                     float64
	downP50, downP99, downCommitP50, downCommitP99 float64
	e2eP50, e2eP99, e2eHTTPP99, e2eAchieved, e2eN  float64
	e2eOffered                                     float64
	e2eReceiverRSS, e2eWorkerRSS                   float64
	rReceiver, rWorker, rSeed                      float64
}

// ratios sets the run's ratios, each taken within the run.
func (f *figures) ratios() {
	div := func(a, b float64) float64 {
		if b == 0 {
			return 0
		}
		return a / b
	}
	f.rReceiver = div(f.receiverRPS, f.rawPublish)
	f.rWorker = div(f.worker, min(f.pgBatch, f.rawConsume))
	f.rSeed = div(f.oursSmall, f.seed)
	f.rBaseline = div(f.oursVsBaseline, f.baseline)
	f.rOutbox = div(f.outboxOn, f.outboxOff)
	f.rOutboxApart = div(f.outboxApart, f.outboxOff)
}

// print prints one run's figures, or with runs the medians of several:
// every figure, and every ratio, is then the median of the runs' values,
// the ratios followed by the value of each run.
func (f figures) print(title string, runs ...figures) {
	each := func(r func(figures) float64) string {
		if len(runs) < 2 {
			return ""
		}
		var v []string
		for _, run := range runs {
			v = append(v, fmt.Sprintf("%.2f", r(run)))
		}
		return " [runs: " + strings.Join(v, " ") + "]"
	}
	limit := min(f.pgBatch, f.rawConsume)
	fmt.Printf("\n--- %s ---\n", title)
	fmt.Printf("limits of this machine (same services, same run)\n")
	fmt.Printf("  raw RabbitMQ confirmed publishes     %9.0f msg/s  (256 in flight, one channel)\n", f.rawPublish)
	fmt.Printf("  raw RabbitMQ consume, multiple acks  %9.0f msg/s  (prefetch 1024, ack every 128)\n", f.rawConsume)
	fmt.Printf("  raw Postgres, one row per tx         %9.0f rows/s (1 client, ledger+payment row)\n", f.pgOne)
	fmt.Printf("  raw Postgres, 100 rows per tx        %9.0f rows/s (8 clients)\n", f.pgBatch)
	fmt.Printf("receiver\n")
	fmt.Printf("  requests/s                           %9.0f\n", f.receiverRPS)
	fmt.Printf("  vs raw confirmed publishes           %9.2f        (target >= 0.50)%s\n", f.rReceiver, each(func(r figures) float64 { return r.rReceiver }))
	fmt.Printf("  latency p50 / p99                    %9.1f / %.1f ms\n", f.receiverP50, f.receiverP99)
	fmt.Printf("  peak RSS                             %9.1f MiB\n", f.receiverRSS)
	fmt.Printf("worker (ours)\n")
	fmt.Printf("  deliveries/s                         %9.0f        (%.0f unique events/s)\n", f.worker, f.workerUnique)
	fmt.Printf("  vs lower raw limit (%.0f/s)          %9.2f        (target >= 0.70)%s\n", limit, f.rWorker, each(func(r figures) float64 { return r.rWorker }))
	fmt.Printf("  peak RSS                             %9.1f MiB\n", f.workerRSS)
	fmt.Printf("worker, seed configuration (prefetch 1, batch 1, concurrency 1)\n")
	fmt.Printf("  deliveries/s                         %9.0f        (ours on the same workload: %.0f/s)\n", f.seed, f.oursSmall)
	fmt.Printf("  ours / seed configuration            %9.2f        (target >= 10)%s\n", f.rSeed, each(func(r figures) float64 { return r.rSeed }))
	if f.baseline > 0 {
		fmt.Printf("worker, baseline %s (same backlog, same run)\n", baselineName)
		fmt.Printf("  deliveries/s                         %9.0f        (ours: %.0f/s)\n", f.baseline, f.oursVsBaseline)
		fmt.Printf("  ours / baseline                      %9.2f        (target >= 0.90)%s\n", f.rBaseline, each(func(r figures) float64 { return r.rBaseline }))
	}
	if f.outboxOn > 0 {
		fmt.Printf("worker with the outbox on (benchorders: payment state, an orders row per payment, and with the outbox an email message per payment, relay inside)\n")
		fmt.Printf("  deliveries/s                         %9.0f        (the same worker, outbox off: %.0f/s)\n", f.outboxOn, f.outboxOff)
		fmt.Printf("  outbox on / off                      %9.2f        (target >= 0.80)%s\n", f.rOutbox, each(func(r figures) float64 { return r.rOutbox }))
		fmt.Printf("  relay apart: drain with OUTBOX_RELAY=off %5.0f       (beside a relay process with OUTBOX_RELAY=only; it was done %.1f s after the drain)\n", f.outboxApart, f.relayBehind)
		fmt.Printf("  relay apart / off                    %9.2f        (target >= 0.80)%s\n", f.rOutboxApart, each(func(r figures) float64 { return r.rOutboxApart }))
		fmt.Printf("  stock worker / examples/orders       %9.0f / %.0f deliveries/s (one orders statement per payment)\n", f.stockWorker, f.ordersExample)
	}
	if f.downP50 > 0 {
		fmt.Printf("downstream at %.0f events/s offered: received -> email sent by the consumer (examples/confirmations)\n", f.e2eOffered)
		fmt.Printf("  p50 / p99                            %9.1f / %.1f ms (received -> committed in the same run: %.1f / %.1f ms)\n",
			f.downP50, f.downP99, f.downCommitP50, f.downCommitP99)
	}
	fmt.Printf("end to end at %.0f events/s offered (%.0f achieved, %.0f events)\n", f.e2eOffered, f.e2eAchieved, f.e2eN)
	fmt.Printf("  received -> committed p50 / p99      %9.1f / %.1f ms (target p99 < 100 ms)\n", f.e2eP50, f.e2eP99)
	fmt.Printf("  HTTP answer p99                      %9.1f ms\n", f.e2eHTTPP99)
	fmt.Printf("  peak RSS receiver / worker           %9.1f / %.1f MiB (target < 100 each)\n", f.e2eReceiverRSS, f.e2eWorkerRSS)
}

func median(all []figures) figures {
	var out figures
	fields := func(f *figures) []*float64 {
		return []*float64{&f.rawPublish, &f.rawConsume, &f.pgOne, &f.pgBatch, &f.receiverRPS, &f.receiverP50, &f.receiverP99,
			&f.receiverRSS, &f.worker, &f.workerUnique, &f.workerRSS, &f.seed, &f.oursSmall, &f.e2eP50, &f.e2eP99,
			&f.e2eHTTPP99, &f.e2eAchieved, &f.e2eN, &f.e2eReceiverRSS, &f.e2eWorkerRSS, &f.e2eOffered,
			&f.rReceiver, &f.rWorker, &f.rSeed, &f.baseline, &f.oursVsBaseline, &f.rBaseline,
			&f.outboxOff, &f.outboxOn, &f.rOutbox, &f.outboxApart, &f.relayBehind, &f.rOutboxApart, &f.stockWorker, &f.ordersExample, &f.downP50, &f.downP99, &f.downCommitP50, &f.downCommitP99}
	}
	dst := fields(&out)
	for i := range dst {
		var vals []float64
		for j := range all {
			vals = append(vals, *fields(&all[j])[i])
		}
		sort.Float64s(vals)
		*dst[i] = vals[len(vals)/2]
	}
	return out
}

func mib(b int64) float64 { return float64(b) / (1 << 20) }

func run(ctx context.Context, binDir string, o options) figures {
	var f figures
	switch o.only {
	case "main":
		mainWorkload(ctx, binDir, o)
		return f
	case "seed":
		f.seed = workerOnly(ctx, binDir, o.seedEvents, o.dups, "WORKER_PREFETCH=1", "WORKER_BATCH_SIZE=1", "WORKER_CONCURRENCY=1")
		f.oursSmall = workerOnly(ctx, binDir, o.seedEvents, o.dups, splitEnv(o.workerEnv)...)
		fmt.Printf("worker on %d deliveries: seed config %.0f/s, ours %.0f/s\n", o.seedEvents*(1+o.dups), f.seed, f.oursSmall)
		return f
	case "e2e":
		endToEnd(ctx, binDir, o)
		return f
	case "baseline":
		f.baseline, f.oursVsBaseline = vsBaseline(ctx, binDir, o)
		return f
	case "outbox":
		f.outboxOff, f.outboxOn, f.outboxApart, f.relayBehind, f.stockWorker, f.ordersExample = vsOutbox(ctx, binDir, o)
		return f
	case "downstream":
		f.downP50, f.downP99, f.downCommitP50, f.downCommitP99 = downstream(ctx, binDir, o)
		return f
	case "prune":
		vsPrune(ctx, binDir, o)
		return f
	}
	f.rawPublish, f.rawConsume = rawBroker(ctx, binDir, o.rawMessages)
	f.pgOne, f.pgBatch = rawPostgres(ctx, binDir)
	if o.only == "raw" {
		fmt.Printf("raw: publish %.0f/s, consume %.0f/s, pg one-per-tx %.0f rows/s, pg batched %.0f rows/s\n", f.rawPublish, f.rawConsume, f.pgOne, f.pgBatch)
		return f
	}
	fmt.Printf("raw: publish %.0f/s, consume %.0f/s, pg one-per-tx %.0f rows/s, pg batched %.0f rows/s\n", f.rawPublish, f.rawConsume, f.pgOne, f.pgBatch)

	f.receiverRPS, f.receiverP50, f.receiverP99, f.receiverRSS, f.worker, f.workerUnique, f.workerRSS = mainWorkload(ctx, binDir, o)
	f.seed = workerOnly(ctx, binDir, o.seedEvents, o.dups, "WORKER_PREFETCH=1", "WORKER_BATCH_SIZE=1", "WORKER_CONCURRENCY=1")
	f.oursSmall = workerOnly(ctx, binDir, o.seedEvents, o.dups, splitEnv(o.workerEnv)...)
	fmt.Printf("worker on %d deliveries: seed config %.0f/s, ours %.0f/s\n", o.seedEvents*(1+o.dups), f.seed, f.oursSmall)
	if o.baselineDir != "" {
		f.baseline, f.oursVsBaseline = vsBaseline(ctx, binDir, o)
	}
	f.outboxOff, f.outboxOn, f.outboxApart, f.relayBehind, f.stockWorker, f.ordersExample = vsOutbox(ctx, binDir, o)
	f.downP50, f.downP99, f.downCommitP50, f.downCommitP99 = downstream(ctx, binDir, o)
	f.e2eP50, f.e2eP99, f.e2eHTTPP99, f.e2eAchieved, f.e2eN, f.e2eReceiverRSS, f.e2eWorkerRSS = endToEnd(ctx, binDir, o)
	f.e2eOffered = float64(o.rate)
	return f
}

// vsOutbox times the bench's orders worker (benchorders: the payment
// effect and an orders row per payment) with the outbox off and on (an
// email message per payment, published by its relay), then with the relay
// apart, then, for context, the stock worker and the examples' orders
// worker, each on a backlog of the same size, one after the other.
func vsOutbox(ctx context.Context, binDir string, o options) (off, on, apart, behind, stock, example float64) {
	env := splitEnv(o.workerEnv)
	off = drainBacklog(ctx, binDir, "benchorders", o.baselineEvents, o.dups, append([]string{"BENCH_OUTBOX=off"}, env...)...)
	on = drainBacklog(ctx, binDir, "benchorders", o.baselineEvents, o.dups, append([]string{"BENCH_OUTBOX=on"}, env...)...)
	apart, behind = relayApart(ctx, binDir, o.baselineEvents, o.dups, env)
	stock = drainBacklog(ctx, binDir, "worker", o.baselineEvents, o.dups, env...)
	example = drainBacklog(ctx, binDir, "orders", o.baselineEvents, o.dups, env...)
	fmt.Printf("worker on %d deliveries: outbox off %.0f/s, on %.0f/s, on with the relay apart %.0f/s (the relay done %.1f s after the drain); stock worker %.0f/s, examples/orders %.0f/s\n",
		o.baselineEvents*(1+o.dups), off, on, apart, behind, stock, example)
	return off, on, apart, behind, stock, example
}

// relayApart drains the backlog with the outbox on as the chart's
// outbox.relay.mode=deployment runs it: the draining worker with
// OUTBOX_RELAY=off and, at the same time, a relay process of its own
// (OUTBOX_RELAY=only, consuming nothing) on the same machine, broker and
// database. It returns the drain's deliveries/s and how many seconds after
// the drain the relay had published every message.
func relayApart(ctx context.Context, binDir string, unique, dups int, env []string) (drain, behind float64) {
	s := newStack(ctx, binDir)
	defer s.Close()
	publishBacklog(ctx, s, "small", unique, dups)
	relayAddr := harness.FreeAddr()
	r, err := s.Start("relay", "benchorders", s.Env(append([]string{"METRICS_ADDR=" + relayAddr, "BENCH_OUTBOX=on", "OUTBOX_RELAY=only"}, env...)...))
	check(err)
	defer r.Term(30 * time.Second)
	check(harness.WaitHTTPEvery("http://"+relayAddr+"/readyz", 20*time.Second, time.Millisecond))
	profiled := profile("relay", relayAddr)
	defer func() { <-profiled }()
	drain, _, _ = drainWith(ctx, s, "benchorders", unique*(1+dups), unique, append([]string{"BENCH_OUTBOX=on", "OUTBOX_RELAY=off"}, env...)...)
	drained := time.Now()
	for ; ; time.Sleep(10 * time.Millisecond) {
		if time.Since(drained) > 10*time.Minute {
			check(fmt.Errorf("relay apart: the relay did not publish %d messages in 10 minutes after the drain\nlog:\n%s", unique, r.Log()))
		}
		if mfs, err := harness.Scrape(relayAddr); err == nil && int(sum(mfs, "idempotent_events_outbox_published_total")) >= unique {
			break
		}
	}
	behind = time.Since(drained).Seconds()
	var waiting int
	check(s.DB.QueryRow(ctx, `SELECT count(*) FROM outbox WHERE published_at IS NULL`).Scan(&waiting))
	if waiting != 0 {
		check(fmt.Errorf("relay apart: %d messages unpublished after the relay counted %d", waiting, unique))
	}
	return drain, behind
}

// downstream offers o.rate events/s for o.rateFor to the receiver, with the
// examples' orders worker and confirmations consumer running, and reads
// received -> email sent (sent_emails.sent_at) and received -> committed.
func downstream(ctx context.Context, binDir string, o options) (p50, p99, commitP50, commitP99 float64) {
	s := newStack(ctx, binDir)
	defer s.Close()
	httpAddr, rcv, wrk := startPipeline(s, o, "orders")
	defer rcv.Term(30 * time.Second)
	defer wrk.Term(30 * time.Second)
	con, err := s.Start("consumer", "confirmations", s.Env())
	check(err)
	defer con.Term(30 * time.Second)

	total := int(float64(o.rate) * o.rateFor.Seconds())
	list := ids("down", total)
	sender := harness.NewSender("http://"+httpAddr, "whsec_bench", 256)
	openLoop(o.rate, total, func(i int) {
		// Retried on 503 as a provider would; the latency is measured
		// from the acceptance (received_at) to the email.
		for wait := 50 * time.Millisecond; ; wait = min(2*wait, time.Second) {
			code, _ := sender.Send(ctx, harness.Body(list[i]))
			if code == 202 {
				return
			}
			if code != 503 && code != 0 {
				check(fmt.Errorf("downstream phase: an answer was %d", code))
			}
			time.Sleep(wait)
		}
	})
	deadline := time.Now().Add(2 * time.Minute)
	for {
		d, err := s.ReadDownstream(ctx)
		check(err)
		if d.EmailedPayments == total && d.Emails == total {
			break
		}
		if time.Now().After(deadline) {
			check(fmt.Errorf("downstream: %d of %d emails sent (%d rows)", d.EmailedPayments, total, d.Emails))
		}
		time.Sleep(50 * time.Millisecond)
	}
	check(s.DB.QueryRow(ctx, `SELECT
		1000 * extract(epoch FROM percentile_cont(0.5) WITHIN GROUP (ORDER BY m.sent_at - p.received_at)),
		1000 * extract(epoch FROM percentile_cont(0.99) WITHIN GROUP (ORDER BY m.sent_at - p.received_at)),
		1000 * extract(epoch FROM percentile_cont(0.5) WITHIN GROUP (ORDER BY p.processed_at - p.received_at)),
		1000 * extract(epoch FROM percentile_cont(0.99) WITHIN GROUP (ORDER BY p.processed_at - p.received_at))
		FROM sent_emails m JOIN processed_events p ON p.event_id = m.event_id`).Scan(&p50, &p99, &commitP50, &commitP99))
	fmt.Printf("downstream: %d events, received->email sent p50 %.1f ms p99 %.1f ms (received->committed p50 %.1f p99 %.1f)\n",
		total, p50, p99, commitP50, commitP99)
	var relayP50, consumerP50 float64
	check(s.DB.QueryRow(ctx, `SELECT
		1000 * extract(epoch FROM percentile_cont(0.5) WITHIN GROUP (ORDER BY o.published_at - o.created_at)),
		1000 * extract(epoch FROM percentile_cont(0.5) WITHIN GROUP (ORDER BY m.sent_at - o.published_at))
		FROM sent_emails m JOIN outbox o ON o.idempotency_key = m.message_id`).Scan(&relayP50, &consumerP50))
	fmt.Printf("  of which committed->published p50 %.1f ms, published->sent p50 %.1f ms\n", relayP50, consumerP50)
	return p50, p99, commitP50, commitP99
}

// startPipeline starts a receiver and the worker binary (worker, or the
// examples' orders worker) on s, waits until the receiver is ready, and
// returns its address and the two processes (the caller stops them).
func startPipeline(s *harness.Stack, o options, workerBinary string) (httpAddr string, rcv, wrk *harness.Proc) {
	httpAddr = harness.FreeAddr()
	var err error
	rcv, err = s.Start("receiver", "receiver", s.Env(append([]string{"WEBHOOK_SECRETS=whsec_bench", "HTTP_ADDR=" + httpAddr,
		"METRICS_ADDR=" + harness.FreeAddr()}, splitEnv(o.receiverEnv)...)...))
	check(err)
	wrk, err = s.Start("worker", workerBinary, s.Env(append([]string{"METRICS_ADDR=" + harness.FreeAddr()}, splitEnv(o.workerEnv)...)...))
	check(err)
	check(harness.WaitHTTP("http://"+httpAddr+"/readyz", 20*time.Second))
	return httpAddr, rcv, wrk
}

// openLoop runs send(0) … send(total-1) on a schedule of rate per second,
// each on its own goroutine, whatever the answers' latency (an open loop,
// as webhooks arrive), and waits for them all.
func openLoop(rate, total int, send func(i int)) {
	var wg sync.WaitGroup
	interval := time.Second / time.Duration(rate)
	start := time.Now()
	for i := 0; i < total; i++ {
		if d := time.Until(start.Add(time.Duration(i) * interval)); d > 0 {
			time.Sleep(d)
		}
		wg.Go(func() { send(i) })
	}
	wg.Wait()
}

// baselineName is the revision the baseline phase compares with.
var baselineName string

// vsBaseline times the baseline's worker and ours, one after the other, on
// backlogs of the same size, each on its own stack (the baseline's migrate
// makes its schema).
func vsBaseline(ctx context.Context, binDir string, o options) (baseline, ours float64) {
	if o.baselineDir == "" {
		check(errors.New("-only baseline needs -baseline REV"))
	}
	baselineName = o.baseline
	baseline = workerOnly(ctx, o.baselineDir, o.baselineEvents, o.dups, splitEnv(o.workerEnv)...)
	ours = workerOnly(ctx, binDir, o.baselineEvents, o.dups, splitEnv(o.workerEnv)...)
	fmt.Printf("worker on %d deliveries: baseline %s %.0f/s, ours %.0f/s\n", o.baselineEvents*(1+o.dups), o.baseline, baseline, ours)
	return baseline, ours
}

func splitEnv(s string) []string {
	if s == "" {
		return nil
	}
	return strings.Split(s, ",")
}

func newStack(ctx context.Context, binDir string) *harness.Stack {
	s, err := harness.NewStack(ctx, binDir, "ie_bench")
	check(err)
	return s
}

// rawBroker publishes n messages shaped like the receiver's (same body
// size, properties and headers) with publisher confirms, 256 in flight on
// one channel, into a queue that grows as long as the main workload's
// (a classic queue publishes slower as it grows), then consumes them with the worker's prefetch (1024) and a
// multiple ack every 128 deliveries (the worker's batch size).
func rawBroker(ctx context.Context, binDir string, n int) (publish, consume float64) {
	s := newStack(ctx, binDir)
	defer s.Close()
	conn, err := amqp.Dial(s.AMQPURL)
	check(err)
	defer conn.Close()
	ch, err := conn.Channel()
	check(err)
	_, err = ch.QueueDeclare("bench.raw", true, false, false, false, nil)
	check(err)
	check(ch.Confirm(false))
	body := harness.Body("evt_raw_benchmark_body_00000000")
	ev, err := event.Decode(body)
	check(err)
	window := make(chan *amqp.DeferredConfirmation, 256)
	var failed atomic.Int64
	done := make(chan struct{})
	const short = 50_000
	var shortDone time.Time // when the first 50,000 were confirmed
	go func() {
		defer close(done)
		confirmed := 0
		for dc := range window {
			if ok, _ := dc.WaitContext(ctx); !ok {
				failed.Add(1)
			}
			if confirmed++; confirmed == short {
				shortDone = time.Now()
			}
		}
	}()
	cpu := harness.ReadCPU("bench")
	start := time.Now()
	for i := 0; i < n; i++ {
		// The same properties and headers as the receiver's messages.
		dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", "bench.raw", true, false, amqp.Publishing{
			DeliveryMode: amqp.Persistent, ContentType: "application/json", Body: body, MessageId: "evt_raw_benchmark_body_00000000",
			Type: "payment_intent.succeeded", Timestamp: time.Now(), CorrelationId: strconv.FormatInt(int64(i), 36),
			Headers: amqp.Table{broker.HeaderSource: "stripe", broker.HeaderDigest: ev.DigestHex(), broker.HeaderReceivedAt: time.Now().UnixMilli()},
		})
		check(err)
		window <- dc
	}
	close(window)
	<-done
	publish = float64(n) / time.Since(start).Seconds()
	if failed.Load() > 0 {
		check(fmt.Errorf("raw publish: %d nacks", failed.Load()))
	}
	fmt.Printf("raw publish: %d messages at %.0f/s", n, publish)
	if n > short {
		fmt.Printf(" (the first %d, while the queue was short: %.0f/s)", short, short/shortDone.Sub(start).Seconds())
	}
	fmt.Printf("\n  cores: %s\n", harness.ReadCPU("bench").Since(cpu))

	cch, err := conn.Channel()
	check(err)
	// The worker's default prefetch, and a multiple ack per worker batch.
	check(cch.Qos(1024, 0, false))
	deliveries, err := cch.Consume("bench.raw", "", false, false, false, false, nil)
	check(err)
	cpu = harness.ReadCPU("bench")
	start = time.Now()
	for i := 1; i <= n; i++ {
		d := <-deliveries
		if i%128 == 0 || i == n {
			check(d.Ack(true))
		}
	}
	consume = float64(n) / time.Since(start).Seconds()
	fmt.Printf("raw consume: %d messages at %.0f/s\n  cores: %s\n", n, consume, harness.ReadCPU("bench").Since(cpu))
	return publish, consume
}

// rawPostgres writes the rows the worker writes (one processed_events and
// one payments row per event) through the same SQL: one event per
// transaction from one client, and 100 per transaction from 8 clients.
func rawPostgres(ctx context.Context, binDir string) (one, batched float64) {
	s := newStack(ctx, binDir)
	defer s.Close()
	st, err := store.Open(ctx, s.DatabaseURL, 16)
	check(err)
	defer st.Close()
	bodies := map[string][]byte{}
	rec := func(id string) store.Record {
		body := harness.Body(id)
		ev, err := event.Decode(body)
		check(err)
		bodies[id] = body
		sum := sha256.Sum256(body)
		return store.Record{Event: ev, Source: "stripe", PayloadSHA256: sum[:], ReceivedAt: time.Now(), Attempt: 1}
	}
	// The worker's effects: the built-in payment effect on the public API.
	fx := payments.Effects()
	apply := func(recs []store.Record) store.Apply {
		return func(ctx context.Context, tx store.Tx, fresh []int) ([]bool, error) {
			evs := make([]effects.Event, len(fresh))
			for j, i := range fresh {
				ev := recs[i].Event
				evs[j] = effects.Event{Source: "stripe", ID: ev.ID, Key: ev.ID, Type: ev.Type, Created: ev.Created,
					Object: effects.Object{Type: ev.Object.Type, ID: ev.Object.ID}, Raw: bodies[ev.ID], Attempt: 1, Origin: effects.OriginWebhook}
			}
			return fx.Apply(ctx, evs, tx, effects.NoOutbox{})
		}
	}
	const nOne = 3000
	recs := make([]store.Record, nOne)
	for i := range recs {
		recs[i] = rec(fmt.Sprintf("evt_pg_one_%07d", i))
	}
	start := time.Now()
	for i := range recs {
		_, err := st.Commit(ctx, recs[i:i+1], apply(recs[i:i+1]))
		check(err)
	}
	one = nOne / time.Since(start).Seconds()

	const clients, per, batches = 8, 100, 125 // 100,000 rows
	all := make([][]store.Record, clients*batches)
	for b := range all {
		all[b] = make([]store.Record, per)
		for i := range all[b] {
			all[b][i] = rec(fmt.Sprintf("evt_pg_batch_%04d_%03d", b, i))
		}
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	start = time.Now()
	for c := 0; c < clients; c++ {
		wg.Go(func() {
			for {
				b := next.Add(1) - 1
				if b >= int64(len(all)) {
					return
				}
				_, err := st.Commit(ctx, all[b], apply(all[b]))
				check(err)
			}
		})
	}
	wg.Wait()
	batched = float64(clients*batches*per) / time.Since(start).Seconds()
	return one, batched
}

// ids returns n event ids with a run-unique prefix.
func ids(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("evt_%s_%08d", prefix, i)
	}
	return out
}

// deliveries returns each id 1+dups times, in an order where copies of an
// event are spread out.
func deliveries(ids []string, dups int) []string {
	out := make([]string, 0, len(ids)*(1+dups))
	for d := 0; d <= dups; d++ {
		out = append(out, ids...)
	}
	return out
}

// send posts every body over conc connections, one request at a time on
// each, and returns the answers' codes and latencies.
func send(sender *harness.Sender, bodies [][]byte, conc int) (codes map[int]int, lat []time.Duration, elapsed time.Duration) {
	lat = make([]time.Duration, len(bodies))
	code := make([]int, len(bodies))
	var next atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for c := 0; c < conc; c++ {
		wg.Go(func() {
			conn := sender.Conn()
			defer conn.Close()
			for {
				i := next.Add(1) - 1
				if i >= int64(len(bodies)) {
					return
				}
				code[i], lat[i] = conn.Send(bodies[i])
			}
		})
	}
	wg.Wait()
	elapsed = time.Since(start)
	codes = map[int]int{}
	for _, c := range code {
		codes[c]++
	}
	return codes, lat, elapsed
}

func percentile(d []time.Duration, p float64) float64 {
	s := append([]time.Duration(nil), d...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	if len(s) == 0 {
		return 0
	}
	return float64(s[int(p*float64(len(s)-1))].Microseconds()) / 1000
}

// mainWorkload sends events×(1+dups) signed requests to a receiver with no
// worker running, then starts a worker and times how long it takes to
// settle everything.
func mainWorkload(ctx context.Context, binDir string, o options) (rps, p50, p99, rRSS, wRate, wUnique, wRSS float64) {
	s := newStack(ctx, binDir)
	defer s.Close()
	httpAddr, metricsAddr := harness.FreeAddr(), harness.FreeAddr()
	rcv, err := s.Start("receiver", "receiver", s.Env(append([]string{"WEBHOOK_SECRETS=whsec_bench", "HTTP_ADDR=" + httpAddr,
		"METRICS_ADDR=" + metricsAddr}, splitEnv(o.receiverEnv)...)...))
	check(err)
	defer rcv.Term(30 * time.Second)
	check(harness.WaitHTTP("http://"+httpAddr+"/readyz", 20*time.Second))
	profiled := profile("receiver", metricsAddr)
	defer func() { <-profiled }()

	list := deliveries(ids("main", o.events), o.dups)
	bodies := make([][]byte, len(list))
	for i, id := range list {
		bodies[i] = harness.Body(id)
	}
	sender := harness.NewSender("http://"+httpAddr, "whsec_bench", o.conc)
	cpu := harness.ReadCPU("bench")
	codes, lat, elapsed := send(sender, bodies, o.conc)
	cores := harness.ReadCPU("bench").Since(cpu)
	rps = float64(len(bodies)) / elapsed.Seconds()
	p50, p99 = percentile(lat, .50), percentile(lat, .99)
	_, peak := rcv.RSS()
	rRSS = mib(peak)
	fmt.Printf("receiver: %d requests in %s = %.0f/s, p50 %.1f ms, p99 %.1f ms, answers %v, peak RSS %.1f MiB\n  cores: %s\n",
		len(bodies), elapsed.Round(time.Millisecond), rps, p50, p99, codes, rRSS, cores)
	if codes[202]+codes[200] != len(bodies) {
		check(fmt.Errorf("receiver answered %v: not every request was accepted", codes))
	}
	accepted := codes[202]

	wRate, wUnique, wRSS = drainWith(ctx, s, "worker", accepted, o.events, splitEnv(o.workerEnv)...)
	fmt.Printf("worker: %d deliveries settled at %.0f/s (%.0f unique/s), peak RSS %.1f MiB\n", accepted, wRate, wUnique, wRSS)
	return rps, p50, p99, rRSS, wRate, wUnique, wRSS
}

// drainWith starts a worker with env and times it until it has settled
// every delivery, then checks that the ledger holds unique events, none
// twice, and the queue is empty; it returns deliveries/s, unique events/s
// and the worker's peak RSS.
//
// The clock stops on what costs the cores it shares with the worker
// least: the queue's ready count until it is zero, then the worker's own
// settled count, which it reaches a prefetch later. Polling the ledger
// instead (counting and grouping its rows every few milliseconds) cost
// Postgres more CPU than the worker's writes, and scraping the worker all
// along cost it several percent of a core.
func drainWith(ctx context.Context, s *harness.Stack, binary string, delivered, unique int, env ...string) (rate, uniqueRate, rss float64) {
	return drainPattern(ctx, s, binary, "%", delivered, unique, env...)
}

// drainPattern is drainWith checking only the ledger rows whose event ids
// are LIKE pattern.
func drainPattern(ctx context.Context, s *harness.Stack, binary, pattern string, delivered, unique int, env ...string) (rate, uniqueRate, rss float64) {
	conn, err := amqp.Dial(s.AMQPURL)
	check(err)
	defer conn.Close()
	ch, err := conn.Channel()
	check(err)
	metricsAddr := harness.FreeAddr()
	w, err := s.Start("worker", binary, s.Env(append([]string{"METRICS_ADDR=" + metricsAddr}, env...)...))
	check(err)
	defer w.Term(30 * time.Second)
	// The clock starts when the worker reports that it consumes: its
	// start-up (process, connections, topology) is the same for every
	// configuration and is not throughput. Readiness is polled every
	// millisecond so the clock starts close to it.
	check(harness.WaitHTTPEvery("http://"+metricsAddr+"/readyz", 20*time.Second, time.Millisecond))
	cpu := harness.ReadCPU("bench")
	start := time.Now()
	if delivered > 50_000 {
		profiled := profile(fmt.Sprintf("worker-%d-%s", profiles.Add(1), binary), metricsAddr)
		defer func() { <-profiled }()
	}
	for emptied := false; ; time.Sleep(10 * time.Millisecond) {
		if time.Since(start) > 30*time.Minute {
			check(fmt.Errorf("worker did not finish in 30 minutes\nworker log:\n%s", w.Log()))
		}
		if !emptied {
			q, err := ch.QueueDeclarePassive(broker.MainQueue, true, false, false, false, nil)
			check(err)
			emptied = q.Messages == 0
			continue
		}
		if mfs, err := harness.Scrape(metricsAddr); err == nil && int(sum(mfs, "idempotent_events_worker_events_total")) >= delivered {
			break
		}
	}
	elapsed := time.Since(start).Seconds()
	cores := harness.ReadCPU("bench").Since(cpu)
	_, peak := w.RSS()
	checkDrained(ctx, s, ch, pattern, unique)
	printWorkerShape(metricsAddr)
	fmt.Printf("  cores: %s\n", cores)
	return float64(delivered) / elapsed, float64(unique) / elapsed, mib(peak)
}

// checkDrained fails the run unless the ledger holds unique events, none
// twice, and nothing is left in events.main.
func checkDrained(ctx context.Context, s *harness.Stack, ch *amqp.Channel, pattern string, unique int) {
	q, err := ch.QueueDeclarePassive(broker.MainQueue, true, false, false, false, nil)
	check(err)
	l, err := harness.ReadLedger(ctx, s.DB, pattern)
	check(err)
	if l.Payments != unique || l.Processed != unique || l.Doubled != 0 || q.Messages != 0 {
		check(fmt.Errorf("after the worker settled every delivery: ledger %+v (want %d events, none doubled), %d left in %s",
			l, unique, q.Messages, broker.MainQueue))
	}
}

// sum adds up every series of the counter name.
func sum(mfs map[string]*dto.MetricFamily, name string) float64 {
	var total float64
	for _, m := range mfs[name].GetMetric() {
		total += m.GetCounter().GetValue()
	}
	return total
}

// printWorkerShape prints the mean batch size, batch time and transaction
// time the worker reports, which explain its throughput.
func printWorkerShape(metricsAddr string) {
	mfs, err := harness.Scrape(metricsAddr)
	if err != nil {
		return
	}
	mean := func(name string) (float64, uint64) {
		mf := mfs[name]
		if mf == nil || len(mf.GetMetric()) == 0 {
			return 0, 0
		}
		h := mf.GetMetric()[0].GetHistogram()
		if h.GetSampleCount() == 0 {
			return 0, 0
		}
		return h.GetSampleSum() / float64(h.GetSampleCount()), h.GetSampleCount()
	}
	size, batches := mean("idempotent_events_worker_batch_size")
	batchTime, _ := mean("idempotent_events_worker_batch_duration_seconds")
	txTime, txs := mean("idempotent_events_worker_postgres_transaction_seconds")
	fmt.Printf("  worker shape: %d batches of %.1f deliveries on average, %.1f ms per batch, %d transactions of %.1f ms\n",
		batches, size, 1000*batchTime, txs, 1000*txTime)
}

// workerOnly publishes unique×(1+dups) events straight to the exchange, as
// the receiver publishes them, then times a worker started with env
// draining them.
func workerOnly(ctx context.Context, binDir string, unique, dups int, env ...string) float64 {
	return drainBacklog(ctx, binDir, "worker", unique, dups, env...)
}

// drainBacklog publishes unique events, each 1+dups times, as the receiver
// publishes them, then times the worker binary (worker, or the examples'
// orders worker) draining them.
func drainBacklog(ctx context.Context, binDir, binary string, unique, dups int, env ...string) float64 {
	s := newStack(ctx, binDir)
	defer s.Close()
	publishBacklog(ctx, s, "small", unique, dups)
	rate, _, _ := drainWith(ctx, s, binary, unique*(1+dups), unique, env...)
	return rate
}

// publishBacklog publishes unique events with ids prefix_…, each 1+dups
// times, shuffled, as the receiver publishes them.
func publishBacklog(ctx context.Context, s *harness.Stack, prefix string, unique, dups int) {
	// The topology is the workers'; declare it before publishing.
	conn, err := amqp.Dial(s.AMQPURL)
	check(err)
	defer conn.Close()
	check(broker.Topology{QueueType: broker.QueueClassic, RetryDelays: []time.Duration{5 * time.Second, 30 * time.Second, 2 * time.Minute, 10 * time.Minute, time.Hour}, DeliveryLimit: 1000}.DeclareOn(conn))
	// A downstream queue for the outbox's messages (the orders workers'
	// emails), as a service would bind it: without one every publish
	// comes back unroutable and the relay backs off and parks instead of
	// publishing.
	dch, err := conn.Channel()
	check(err)
	check(dch.ExchangeDeclare(outbox.Exchange, "topic", true, false, false, false, nil))
	_, err = dch.QueueDeclare("bench.downstream", true, false, false, false, nil)
	check(err)
	check(dch.QueueBind("bench.downstream", "email.*", outbox.Exchange, false, nil))
	check(dch.Close())
	cc, err := broker.OpenConfirmChannel(conn)
	check(err)
	list := deliveries(ids(prefix, unique), dups)
	var wg sync.WaitGroup
	var next atomic.Int64
	for c := 0; c < 64; c++ {
		wg.Go(func() {
			for {
				i := next.Add(1) - 1
				if i >= int64(len(list)) {
					return
				}
				body := harness.Body(list[i])
				ev, err := event.Decode(body)
				check(err)
				check(cc.Publish(ctx, broker.Exchange, broker.RoutingKey, amqp.Publishing{
					ContentType: "application/json", MessageId: list[i], Timestamp: time.Now(), Body: body,
					Headers: amqp.Table{broker.HeaderSource: "stripe", broker.HeaderDigest: ev.DigestHex(), broker.HeaderReceivedAt: time.Now().UnixMilli()},
				}))
			}
		})
	}
	wg.Wait()
	_ = cc.Close()
}

// endToEnd runs receiver and worker together, offers o.rate unique events/s
// for o.rateFor, and reads received -> committed latency from the ledger.
func endToEnd(ctx context.Context, binDir string, o options) (p50, p99, httpP99, achieved, n, rRSS, wRSS float64) {
	s := newStack(ctx, binDir)
	defer s.Close()
	httpAddr, rcv, wrk := startPipeline(s, o, "worker")
	defer rcv.Term(30 * time.Second)
	defer wrk.Term(30 * time.Second)

	total := int(float64(o.rate) * o.rateFor.Seconds())
	list := ids("e2e", total)
	sender := harness.NewSender("http://"+httpAddr, "whsec_bench", 256)
	lat := make([]time.Duration, total)
	codes := make([]int, total)
	start := time.Now()
	openLoop(o.rate, total, func(i int) { codes[i], lat[i] = sender.Send(ctx, harness.Body(list[i])) })
	achieved = float64(total) / time.Since(start).Seconds()
	for _, c := range codes {
		if c != 202 {
			check(fmt.Errorf("end-to-end phase: an answer was %d", c))
		}
	}
	deadline := time.Now().Add(2 * time.Minute)
	for {
		l, err := s.ReadLedger(ctx)
		check(err)
		if l.Payments == total {
			break
		}
		if time.Now().After(deadline) {
			check(fmt.Errorf("end-to-end: only %d of %d committed", l.Payments, total))
		}
		time.Sleep(50 * time.Millisecond)
	}
	check(s.DB.QueryRow(ctx, `SELECT
		1000 * extract(epoch FROM percentile_cont(0.5) WITHIN GROUP (ORDER BY processed_at - received_at)),
		1000 * extract(epoch FROM percentile_cont(0.99) WITHIN GROUP (ORDER BY processed_at - received_at))
		FROM processed_events`).Scan(&p50, &p99))
	_, rp := rcv.RSS()
	_, wp := wrk.RSS()
	fmt.Printf("end to end: %d events at %.0f/s, received->committed p50 %.1f ms p99 %.1f ms, HTTP p99 %.1f ms\n",
		total, achieved, p50, p99, percentile(lat, .99))
	return p50, p99, percentile(lat, .99), achieved, float64(total), mib(rp), mib(wp)
}
