// Command flood measures what a flood of invalid webhook requests does to
// the valid ones: a steady stream of validly signed deliveries is sent to
// the real receiver binary (its own vhost on the local RabbitMQ) beside a
// bounded flood of requests with bad signatures, oversized bodies and
// bodies that trickle, and the valid stream's acceptance and latency are
// printed for each phase:
//
//	baseline        the valid stream alone
//	flood           the flood from other addresses, the default limits
//	flood, no limits  the same with RECEIVER_FAILURE_RATE=0 and the body
//	                timeout at the server's read timeout (30s)
//	flood, shared   the flood from the valid sender's own address (all
//	                traffic through one proxy that does not say who the
//	                client is), the default limits
//
//	go run ./pkg/internal/cmd/flood [-rate 100] [-for 10s] [-badsig 400] [-oversized 50] [-slow 200]
//
// The senders bind distinct loopback addresses (127.0.0.2 for the valid
// stream, 127.0.0.3 and up for the flood), which Linux routes to lo, so the
// receiver sees them as distinct clients. The flood is offered at a fixed
// rate (open loop, bounded in flight), the same in every phase, so that the
// phases compare what the receiver makes of the same flood: refused cheaply
// or read and verified. Every figure is measured, none is asserted (the
// machines are noisy; the load average is printed with each phase);
// docs/security.md records a run.
package main

import (
	"bufio"
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idempotent-events/idempotent-events/pkg/internal/event"
	"github.com/idempotent-events/idempotent-events/pkg/internal/harness"
	"github.com/idempotent-events/idempotent-events/pkg/internal/receiver"
	"github.com/idempotent-events/idempotent-events/pkg/internal/webhook"
)

type options struct {
	rate                     int
	dur                      time.Duration
	badsig, oversized, slow  int
	badsigBytes, maxBody     int
	secret                   string
	only                     string
	validAddr, floodAddrBase string
	receiverBin              string
}

func main() {
	var o options
	flag.IntVar(&o.rate, "rate", 100, "valid deliveries per second (open loop)")
	flag.DurationVar(&o.dur, "for", 10*time.Second, "length of each phase")
	flag.IntVar(&o.badsig, "badsig", 400, "flood: bodies signed with a wrong secret per second (open loop, at most 64 in flight)")
	flag.IntVar(&o.badsigBytes, "badsig-bytes", 64<<10, "flood: size of a bad-signature body")
	flag.IntVar(&o.oversized, "oversized", 50, "flood: bodies over WEBHOOK_MAX_BODY_BYTES per second, half with Content-Length, half chunked (open loop, at most 64 in flight)")
	flag.IntVar(&o.slow, "slow", 200, "flood: connections that trickle a body, a byte every 500ms")
	flag.StringVar(&o.only, "only", "", "run only the phases whose name contains this")
	flag.StringVar(&o.receiverBin, "receiver", "", "a receiver binary to measure (default: built from this tree)")
	flag.Parse()
	o.secret, o.maxBody = "whsec_flood", 1<<20
	o.validAddr, o.floodAddrBase = "127.0.0.2", "127.0.0.3"
	if err := run(o); err != nil {
		fmt.Fprintln(os.Stderr, "flood:", err)
		os.Exit(1)
	}
}

type phase struct {
	name string
	env  []string
	// shared sends the flood from the valid stream's address.
	shared, flood bool
}

func run(o options) error {
	ctx := context.Background()
	binDir, err := os.MkdirTemp("", "ie-flood")
	if err != nil {
		return err
	}
	defer os.RemoveAll(binDir)
	if o.receiverBin != "" {
		if err := os.Symlink(o.receiverBin, filepath.Join(binDir, "receiver")); err != nil {
			return err
		}
	} else {
		build := exec.Command("go", "build", "-trimpath", "-buildvcs=false", "-o", binDir+"/", "./cmd/receiver")
		build.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := build.CombinedOutput(); err != nil {
			return fmt.Errorf("build the receiver: %w\n%s", err, out)
		}
	}
	st, err := harness.NewStack(ctx, binDir, "flood")
	if err != nil {
		return err
	}
	defer st.Close()

	phases := []phase{
		{name: "baseline"},
		{name: "flood", flood: true},
		{name: "flood, no limits", flood: true, env: []string{"RECEIVER_FAILURE_RATE=0", "WEBHOOK_BODY_TIMEOUT=30s"}},
		{name: "flood, shared address", flood: true, shared: true},
	}
	fmt.Printf("flood: %s, %d CPUs (%s), valid stream %d/s, phases of %s; flood: %d/s bad signatures (%d KiB bodies), "+
		"%d/s oversized bodies, %d trickling connections\n\n", time.Now().UTC().Format("2006-01-02 15:04 MST"), runtime.NumCPU(),
		cpuModel(), o.rate, o.dur, o.badsig, o.badsigBytes>>10, o.oversized, o.slow)
	fmt.Printf("load average before: %s\n", loadAverage())
	fmt.Printf("%-22s %8s %9s %9s %9s %9s  %-28s %s\n", "phase", "valid", "accepted", "p50", "p99", "max", "valid answers", "flood answers")
	for _, ph := range phases {
		if o.only != "" && !strings.Contains(ph.name, o.only) {
			continue
		}
		r, err := runPhase(ctx, o, st, ph)
		if err != nil {
			return fmt.Errorf("%s: %w", ph.name, err)
		}
		fmt.Printf("%-22s %8d %8.2f%% %9s %9s %9s  %-28s %s\n", ph.name, r.valid.n, 100*float64(r.valid.codes[202])/float64(max(r.valid.n, 1)),
			r.valid.pct(0.5), r.valid.pct(0.99), r.valid.pct(1), r.valid.codeString(), r.floodString())
		fmt.Printf("%-22s receiver CPU %.1fs of %.1fs (%.0f%% of one core), peak RSS %d MiB; flood %s; load average %s\n", "", r.cpu,
			o.dur.Seconds(), 100*r.cpu/o.dur.Seconds(), r.peakRSS>>20, r.floodRate(o.dur), loadAverage())
	}
	return nil
}

// floodRate is the flood's requests sent per second, by kind.
func (r result) floodRate(d time.Duration) string {
	if len(r.flood) == 0 {
		return "none"
	}
	var parts []string
	for _, k := range []string{"badsig", "oversized", "slow"} {
		t := r.flood[k]
		parts = append(parts, fmt.Sprintf("%s %.0f/s", k, float64(t.n-t.codes[skipped])/d.Seconds()))
	}
	return strings.Join(parts, ", ")
}

// loadAverage is the machine's 1, 5 and 15 minute load averages: the
// figures mean little when other work shares the cores.
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	return strings.Join(strings.Fields(string(b))[:3], " ")
}

type result struct {
	valid   *tally
	flood   map[string]*tally
	cpu     float64
	peakRSS int64
}

func (r result) floodString() string {
	var parts []string
	for _, k := range []string{"badsig", "oversized", "slow"} {
		if t := r.flood[k]; t != nil {
			parts = append(parts, k+" "+t.codeString())
		}
	}
	return strings.Join(parts, "; ")
}

// tally counts answers by status code (0: no answer, the transport failed)
// and keeps latencies.
type tally struct {
	mu    sync.Mutex
	n     int
	codes map[int]int
	lat   []time.Duration
}

func newTally() *tally { return &tally{codes: map[int]int{}} }

func (t *tally) add(code int, d time.Duration) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.n++
	t.codes[code]++
	t.lat = append(t.lat, d)
}

func (t *tally) pct(p float64) string {
	if len(t.lat) == 0 {
		return "-"
	}
	sort.Slice(t.lat, func(i, j int) bool { return t.lat[i] < t.lat[j] })
	d := t.lat[int(p*float64(len(t.lat)-1))]
	return d.Round(10 * time.Microsecond).String()
}

func (t *tally) codeString() string {
	var codes []int
	for c := range t.codes {
		codes = append(codes, c)
	}
	sort.Ints(codes)
	var parts []string
	for _, c := range codes {
		name := strconv.Itoa(c)
		switch c {
		case 0:
			name = "err"
		case skipped:
			name = "skip"
		}
		parts = append(parts, fmt.Sprintf("%s:%d", name, t.codes[c]))
	}
	return strings.Join(parts, " ")
}

func runPhase(ctx context.Context, o options, st *harness.Stack, ph phase) (result, error) {
	httpAddr, metricsAddr := harness.FreeAddr(), harness.FreeAddr()
	env := st.Env(append([]string{"HTTP_ADDR=" + httpAddr, "METRICS_ADDR=" + metricsAddr, "WEBHOOK_SECRETS=" + o.secret,
		"DUPLICATE_CHECK=off", "LOG_LEVEL=warn", "WEBHOOK_MAX_BODY_BYTES=" + strconv.Itoa(o.maxBody)}, ph.env...)...)
	p, err := st.Start("receiver", "receiver", env)
	if err != nil {
		return result{}, err
	}
	defer p.Term(20 * time.Second)
	if err := harness.WaitHTTP("http://"+metricsAddr+"/readyz", 30*time.Second); err != nil {
		return result{}, fmt.Errorf("%w\n%s", err, p.Log())
	}
	url := "http://" + httpAddr + receiver.PaymentRoute
	floodFrom := o.floodAddrBase
	if ph.shared {
		floodFrom = o.validAddr
	}

	res := result{valid: newTally(), flood: map[string]*tally{}}
	phaseCtx, cancel := context.WithTimeout(ctx, o.dur)
	defer cancel()
	var wg sync.WaitGroup
	if ph.flood {
		res.flood["badsig"], res.flood["oversized"], res.flood["slow"] = newTally(), newTally(), newTally()
		floodBadSignatures(phaseCtx, &wg, url, floodFrom, o, res.flood["badsig"])
		floodOversized(phaseCtx, &wg, url, floodFrom, o, res.flood["oversized"])
		floodSlow(phaseCtx, &wg, httpAddr, floodFrom, o, res.flood["slow"])
	}
	cpu0 := procCPU(p.Pid())
	sendValid(phaseCtx, &wg, url, o, res.valid)
	<-phaseCtx.Done()
	res.cpu = procCPU(p.Pid()) - cpu0
	_, res.peakRSS = p.RSS()
	wg.Wait()
	return res, nil
}

// client is an HTTP client whose connections leave from the loopback
// address from.
func client(from string, conns int) *http.Client {
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}, Timeout: 5 * time.Second}
	return &http.Client{Timeout: 35 * time.Second, Transport: &http.Transport{DialContext: d.DialContext,
		MaxIdleConns: conns, MaxIdleConnsPerHost: conns, IdleConnTimeout: time.Minute}}
}

var seq atomic.Int64

// sendValid posts validly signed deliveries at o.rate a second until ctx is
// done, each on its own goroutine (an open loop: a slow answer does not
// lower the offered rate), and waits for the answers.
func sendValid(ctx context.Context, wg *sync.WaitGroup, url string, o options, t *tally) {
	c := client(o.validAddr, 256)
	tick := time.NewTicker(time.Second / time.Duration(o.rate))
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		wg.Go(func() {
			body := event.Example{ID: fmt.Sprintf("evt_flood_%d_%d", time.Now().UnixNano(), seq.Add(1)), Type: "payment_intent.succeeded",
				AmountCents: 100, Currency: "usd", Status: "succeeded"}.JSON()
			code, d := post(context.Background(), c, url, body, webhook.SignStripe(o.secret, time.Now(), body), int64(len(body)))
			t.add(code, d)
		})
	}
}

// floodBadSignatures offers o.badsig requests a second with a body of
// o.badsigBytes signed with a wrong secret at the phase's start (a fresh
// timestamp): each costs the receiver the body's read and an HMAC, unless
// it is refused first. The body and its signature are made once, so the
// load generator spends its CPU on sending.
func floodBadSignatures(ctx context.Context, wg *sync.WaitGroup, url, from string, o options, t *tally) {
	c := client(from, maxFloodInFlight)
	body := []byte(`{"id":"evt_forged","type":"payment_intent.succeeded","pad":"` + strings.Repeat("x", o.badsigBytes) + `"}`)
	sig := webhook.SignStripe("whsec_wrong", time.Now(), body)
	openLoop(ctx, wg, o.badsig, t, func(int) (int, time.Duration) { return post(ctx, c, url, body, sig, int64(len(body))) })
}

// floodOversized offers o.oversized requests a second with bodies twice
// WEBHOOK_MAX_BODY_BYTES: every other one declares its length (refused
// from the header), the others are sent chunked (refused once the limit is
// read).
func floodOversized(ctx context.Context, wg *sync.WaitGroup, url, from string, o options, t *tally) {
	c := client(from, maxFloodInFlight)
	body := []byte(strings.Repeat("y", 2*o.maxBody))
	sig := webhook.SignStripe("whsec_wrong", time.Now(), body)
	openLoop(ctx, wg, o.oversized, t, func(i int) (int, time.Duration) {
		length := int64(len(body))
		if i%2 == 1 {
			length = -1
		}
		return post(ctx, c, url, body, sig, length)
	})
}

// maxFloodInFlight bounds each flood kind's requests in flight: at the
// bound a tick sends nothing (counted as "skip").
const maxFloodInFlight = 64

// openLoop calls send rate times a second on its own goroutine until ctx
// is done, at most maxFloodInFlight at once, and tallies the answers.
func openLoop(ctx context.Context, wg *sync.WaitGroup, rate int, t *tally, send func(i int) (int, time.Duration)) {
	if rate <= 0 {
		return
	}
	wg.Go(func() {
		tick := time.NewTicker(time.Second / time.Duration(rate))
		defer tick.Stop()
		slots := make(chan struct{}, maxFloodInFlight)
		for i := 0; ; i++ {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			select {
			case slots <- struct{}{}:
			default:
				t.add(skipped, 0)
				continue
			}
			wg.Go(func() {
				defer func() { <-slots }()
				code, d := send(i)
				if ctx.Err() == nil {
					t.add(code, d)
				}
			})
		}
	})
}

// skipped is the tally code of a flood request not sent: its kind had
// maxFloodInFlight requests in flight already.
const skipped = -1

// floodSlow keeps o.slow connections that send their headers, then a byte
// of the body every 500ms, reconnecting when the receiver drops them (at
// most once a second each); a request's "latency" is how long the
// receiver let it trickle.
func floodSlow(ctx context.Context, wg *sync.WaitGroup, addr, from string, o options, t *tally) {
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}, Timeout: 5 * time.Second}
	for range o.slow {
		wg.Go(func() {
			for ctx.Err() == nil {
				conn, err := d.DialContext(ctx, "tcp", addr)
				if err != nil {
					continue
				}
				start := time.Now()
				code := trickle(ctx, conn)
				took := time.Since(start)
				if ctx.Err() == nil {
					t.add(code, took)
				}
				_ = conn.Close()
				if took < time.Second {
					// Refused at once (429): each connection tries again a
					// second later; a tight loop would measure the load
					// generator, not the receiver.
					time.Sleep(time.Second - took)
				}
			}
		})
	}
}

// trickle sends a request whose body never completes and returns the
// status the receiver answered it with, 0 for none.
func trickle(ctx context.Context, conn net.Conn) int {
	answered := make(chan int, 1)
	go func() {
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			answered <- 0
			return
		}
		resp.Body.Close()
		answered <- resp.StatusCode
	}()
	if _, err := fmt.Fprintf(conn, "POST %s HTTP/1.1\r\nHost: receiver\r\nContent-Type: application/json\r\n"+
		"Stripe-Signature: t=%d,v1=%064d\r\nContent-Length: 100000\r\n\r\n{", receiver.PaymentRoute, time.Now().Unix(), 0); err != nil {
		return 0
	}
	tick := time.NewTicker(500 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case code := <-answered:
			return code
		case <-ctx.Done():
			_ = conn.Close()
			return <-answered
		case <-tick.C:
			if _, err := conn.Write([]byte(" ")); err != nil {
				return <-answered
			}
		}
	}
}

// post sends body with the signature header; length -1 sends it chunked.
// It returns the status (0 when the transport failed) and the time taken.
func post(ctx context.Context, c *http.Client, url string, body []byte, sig string, length int64) (int, time.Duration) {
	var r io.Reader = bytes.NewReader(body)
	if length < 0 {
		r = io.MultiReader(r) // hides the length: sent chunked
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, r)
	if err != nil {
		return 0, 0
	}
	req.ContentLength = length
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(webhook.StripeHeader, sig)
	start := time.Now()
	resp, err := c.Do(req)
	if err != nil {
		return 0, time.Since(start)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, time.Since(start)
}

// procCPU is the CPU time, in seconds, process pid has used so far.
func procCPU(pid int) float64 {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return 0
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	utime, _ := strconv.ParseFloat(f[11], 64)
	stime, _ := strconv.ParseFloat(f[12], 64)
	return (utime + stime) / 100 // USER_HZ
}

func cpuModel() string {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return "unknown CPU"
	}
	for _, line := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return "unknown CPU"
}
