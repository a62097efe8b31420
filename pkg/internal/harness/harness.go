// Package harness runs the real idempotent-events binaries as separate
// processes against the local services, for the benchmark
// (pkg/internal/cmd/bench, make bench) and the chaos suite
// (pkg/internal/cmd/chaos, make chaos): it builds the binaries as the image
// does, gives a run its own vhost, schema and Redis prefix, starts, kills
// and measures processes, sends signed events, reads the ledger, and serves
// the provider's own record of events to a reconciler (StripeEvents).
//
// Like the …test packages, it is for development only: no product package
// imports it (pkg/internal/app/layers_test.go checks).
package harness

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/idempotent-events/idempotent-events/pkg/internal/migrate"
	"github.com/idempotent-events/idempotent-events/pkg/internal/servicetest"
	"github.com/idempotent-events/idempotent-events/pkg/internal/webhook"
)

// Build compiles the four binaries, the examples' (the orders worker and
// the confirmations consumer) and the bench's orders worker, into dir with
// the image's flags.
func Build(dir string) error { return build(".", dir) }

// build compiles the binaries of the checkout at src into dir.
func build(src, dir string) error {
	pkgs := []string{"./cmd/..."}
	for _, p := range []string{"examples", "pkg/internal/cmd/benchorders"} {
		if _, err := os.Stat(filepath.Join(src, p)); err == nil {
			pkgs = append(pkgs, "./"+p+"/...")
		}
	}
	cmd := exec.Command("go", append([]string{"build", "-trimpath", "-buildvcs=false", "-ldflags", "-s -w", "-o", dir + "/"}, pkgs...)...)
	cmd.Dir = src
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("go build in %s: %w\n%s", src, err, out)
	}
	return nil
}

// BuildRevision compiles the four binaries of git revision rev of this
// repository into dir, from a temporary worktree, for a comparison with
// another version of the code.
func BuildRevision(rev, dir string) error {
	src, err := os.MkdirTemp("", "ie-revision")
	if err != nil {
		return err
	}
	defer os.RemoveAll(src)
	if out, err := exec.Command("git", "worktree", "add", "--detach", src, rev).CombinedOutput(); err != nil {
		return fmt.Errorf("git worktree add %s: %w\n%s", rev, err, out)
	}
	defer func() { _ = exec.Command("git", "worktree", "remove", "--force", src).Run() }()
	return build(src, dir)
}

// Stack is one run's slice of the services.
type Stack struct {
	BinDir      string
	AMQPURL     string
	DatabaseURL string
	RedisURL    string
	RedisPrefix string
	DB          *pgxpool.Pool
	drops       []func()
}

// NewStack creates a vhost, a migrated schema and a Redis prefix.
func NewStack(ctx context.Context, binDir, name string) (*Stack, error) {
	s := &Stack{BinDir: binDir, RedisURL: servicetest.RedisURL, RedisPrefix: servicetest.Name(name) + ":"}
	var err error
	var drop func()
	if s.AMQPURL, drop, err = servicetest.NewVHost(name); err != nil {
		return nil, err
	}
	s.drops = append(s.drops, drop)
	if s.DatabaseURL, drop, err = servicetest.NewSchema(ctx, name); err != nil {
		s.Close()
		return nil, err
	}
	s.drops = append(s.drops, drop)
	if s.DB, err = pgxpool.New(ctx, s.DatabaseURL); err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

// NewStackOn is NewStack on a database of its own (a private cluster's,
// say) instead of a schema of the shared one: it creates a vhost and a
// Redis prefix, and the database if it does not exist, and migrates it.
func NewStackOn(ctx context.Context, binDir, name, databaseURL string) (*Stack, error) {
	s := &Stack{BinDir: binDir, RedisURL: servicetest.RedisURL, RedisPrefix: servicetest.Name(name) + ":", DatabaseURL: databaseURL}
	var err error
	var drop func()
	if s.AMQPURL, drop, err = servicetest.NewVHost(name); err != nil {
		return nil, err
	}
	s.drops = append(s.drops, drop)
	if _, err := migrate.Up(ctx, databaseURL, time.Minute); err != nil {
		s.Close()
		return nil, fmt.Errorf("migrate: %w", err)
	}
	if s.DB, err = pgxpool.New(ctx, s.DatabaseURL); err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

// Close removes everything the stack created.
func (s *Stack) Close() {
	if s.DB != nil {
		s.DB.Close()
	}
	_ = servicetest.DeleteKeys(s.RedisURL, s.RedisPrefix)
	for i := len(s.drops) - 1; i >= 0; i-- {
		s.drops[i]()
	}
}

// Env returns the environment for a binary of this stack: the machine's
// environment without any variable the binaries read, the stack's
// addresses, then extra (later entries win).
func (s *Stack) Env(extra ...string) []string {
	var env []string
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		if !configVar(name) {
			env = append(env, kv)
		}
	}
	env = append(env, "AMQP_URL="+s.AMQPURL, "DATABASE_URL="+s.DatabaseURL, "REDIS_URL="+s.RedisURL,
		"REDIS_KEY_PREFIX="+s.RedisPrefix, "LOG_FORMAT=json", "LOG_LEVEL=info")
	return append(env, extra...)
}

func configVar(name string) bool {
	for _, p := range []string{"AMQP_", "REDIS_", "DATABASE_", "LOG_", "QUEUE_", "RETRY_", "QUORUM_", "DEDUPE_", "HTTP_",
		"METRICS_", "WEBHOOK_", "INSECURE_", "PUBLISH_", "RECEIVER_", "DUPLICATE_", "SHUTDOWN_", "WORKER_", "DB_",
		"PROCESS_", "MIGRATE_", "RABBITMQ_", "ADMIN_", "STRIPE_", "RECONCILE_", "DURABILITY_"} {
		if strings.HasPrefix(name, p) {
			return true
		}
	}
	return false
}

// FreeAddr returns a 127.0.0.1 address nobody listens on right now.
func FreeAddr() string { return servicetest.FreeAddr() }

// Proc is a running binary.
type Proc struct {
	Name   string
	cmd    *exec.Cmd
	log    *tail
	exited chan struct{}
	err    error
}

// Start runs bin from the stack's BinDir with env and args.
func (s *Stack) Start(name, bin string, env []string, args ...string) (*Proc, error) {
	p := &Proc{Name: name, cmd: exec.Command(filepath.Join(s.BinDir, bin), args...), log: &tail{max: 200}, exited: make(chan struct{})}
	p.cmd.Env = env
	p.cmd.Stdout, p.cmd.Stderr = p.log, p.log
	if err := p.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	go func() { p.err = p.cmd.Wait(); close(p.exited) }()
	return p, nil
}

// Pid is the process id.
func (p *Proc) Pid() int { return p.cmd.Process.Pid }

// Kill sends SIGKILL and waits for the exit.
func (p *Proc) Kill() {
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.exited
}

// Exited is closed once the process has exited.
func (p *Proc) Exited() <-chan struct{} { return p.exited }

// ExitCode is the exit code once Exited is closed: -1 when a signal ended
// the process.
func (p *Proc) ExitCode() int { return p.cmd.ProcessState.ExitCode() }

// Term sends SIGTERM and returns the exit code, or -1 after timeout (the
// process is then killed).
func (p *Proc) Term(timeout time.Duration) int {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
		return p.cmd.ProcessState.ExitCode()
	case <-time.After(timeout):
		p.Kill()
		return -1
	}
}

// Log returns the last lines the process wrote.
func (p *Proc) Log() string { return p.log.String() }

// RSS returns the resident set size and its peak, in bytes, from /proc.
func (p *Proc) RSS() (cur, peak int64) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", p.Pid()))
	if err != nil {
		return 0, 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, _ := strings.Cut(sc.Text(), ":")
		kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		switch k {
		case "VmRSS":
			cur = kb << 10
		case "VmHWM":
			peak = kb << 10
		}
	}
	return cur, peak
}

// Scrape reads the metric families a process serves on metricsAddr.
func Scrape(metricsAddr string) (map[string]*dto.MetricFamily, error) {
	resp, err := http.Get("http://" + metricsAddr + "/metrics")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s/metrics: %s", metricsAddr, resp.Status)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	return parser.TextToMetricFamilies(resp.Body)
}

// WaitHTTP polls url until it answers 200 or timeout passes.
func WaitHTTP(url string, timeout time.Duration) error {
	return servicetest.AwaitHTTP(url, http.StatusOK, timeout)
}

// WaitHTTPEvery is WaitHTTP asking every interval.
func WaitHTTPEvery(url string, timeout, interval time.Duration) error {
	return servicetest.PollHTTP(url, http.StatusOK, timeout, interval)
}

// tail keeps the last max lines written to it.
type tail struct {
	mu    sync.Mutex
	max   int
	lines []string
	part  []byte
}

func (t *tail) Write(b []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.part = append(t.part, b...)
	for {
		i := bytes.IndexByte(t.part, '\n')
		if i < 0 {
			break
		}
		t.lines = append(t.lines, string(t.part[:i]))
		t.part = t.part[i+1:]
		if len(t.lines) > t.max {
			t.lines = t.lines[len(t.lines)-t.max:]
		}
	}
	return len(b), nil
}

func (t *tail) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return strings.Join(t.lines, "\n")
}

// Sender posts signed events to a receiver.
type Sender struct {
	URL    string
	Secret string
	Client *http.Client
}

// NewSender returns a sender with a keep-alive client sized for conc
// concurrent requests.
func NewSender(baseURL, secret string, conc int) *Sender {
	tr := &http.Transport{MaxIdleConns: conc * 2, MaxIdleConnsPerHost: conc * 2, IdleConnTimeout: time.Minute}
	return &Sender{URL: strings.TrimSuffix(baseURL, "/") + "/webhooks/payment", Secret: secret,
		Client: &http.Client{Transport: tr, Timeout: 30 * time.Second}}
}

// Body returns a Stripe payment event for id.
func Body(id string) []byte {
	return intentEvent(id, id, "payment_intent.succeeded", "succeeded", bodyEpoch, 4200)
}

// RetriedDebitBody returns the events of a payment whose first
// asynchronous debit failed and whose retry succeeded, as Stripe sends
// them, each about the PaymentIntent of id: for id+"_p" the
// payment_intent.processing event, for id+"_f" payment_failed (back to
// requires_payment_method) 10 s later, for id payment_intent.succeeded 10 s
// after that. processing and requires_payment_method follow each other
// both ways, so only the created times order them. In order they leave the
// PaymentIntent succeeded with 4200 received; WrongStates counts the
// payments that end otherwise.
func RetriedDebitBody(id string) []byte { return RetriedDebitBodyAt(id, bodyEpoch) }

// RetriedDebitBodyAt is RetriedDebitBody with the payment's succeeded
// event created at the unix time at (payment_failed 10 s and processing
// 20 s before it), for a run whose payments are created one after another.
func RetriedDebitBodyAt(id string, at int64) []byte {
	if base, ok := strings.CutSuffix(id, "_p"); ok {
		return intentEvent(id, base, "payment_intent.processing", "processing", at-20, 0)
	}
	if base, ok := strings.CutSuffix(id, "_f"); ok {
		return intentEvent(id, base, "payment_intent.payment_failed", "requires_payment_method", at-10, 0)
	}
	return intentEvent(id, id, "payment_intent.succeeded", "succeeded", at, 4200)
}

// intentEvent is a Stripe event id about the PaymentIntent of payment (its
// id with pi_ for evt_), created at the unix time at.
func intentEvent(id, payment, typ, status string, at, received int64) []byte {
	b, err := json.Marshal(map[string]any{"id": id, "object": "event", "api_version": "2024-06-20", "created": at,
		"livemode": false, "pending_webhooks": 1, "type": typ,
		"data": map[string]any{"object": map[string]any{"id": "pi_" + strings.TrimPrefix(payment, "evt_"), "object": "payment_intent",
			"amount": 4200, "amount_received": received, "currency": "usd", "status": status}}})
	if err != nil {
		panic(err) // maps of strings and numbers always marshal
	}
	return b
}

// bodyEpoch is the created time of the events Body and RetriedDebitBody
// make: one for the run, so that the order of a payment's events is fixed
// whenever they are sent.
var bodyEpoch = time.Now().Unix()

// WrongStates counts the payments among ids (RetriedDebitBody's, without a
// suffix) whose PaymentIntent is missing or not in the state their events
// give in order: succeeded, 4200 received, not needing a refresh.
func (s *Stack) WrongStates(ctx context.Context, ids []string) (int, error) {
	var n int
	err := s.DB.QueryRow(ctx, `SELECT count(*) FROM unnest($1::text[]) AS w(id)
		LEFT JOIN payment_intents p ON p.id = 'pi_' || substr(w.id, 5)
		WHERE p.id IS NULL OR p.status <> 'succeeded' OR p.amount_received <> 4200 OR p.needs_refresh`, ids).Scan(&n)
	return n, err
}

// Downstream is what the examples' downstream path holds: orders rows (the
// orders worker), outbox rows not yet published, and the confirmations
// consumer's emails (rows, and distinct PaymentIntents).
type Downstream struct {
	Orders, Unpublished, Emails, EmailedPayments int
}

// ReadDownstream reads it (the orders worker and the consumer create their
// tables when they start).
func (s *Stack) ReadDownstream(ctx context.Context) (Downstream, error) {
	var d Downstream
	err := s.DB.QueryRow(ctx, `SELECT
		(SELECT count(*) FROM outbox WHERE published_at IS NULL),
		(SELECT count(*) FROM orders),
		(SELECT count(*) FROM sent_emails),
		(SELECT count(DISTINCT payment_intent_id) FROM sent_emails)`).
		Scan(&d.Unpublished, &d.Orders, &d.Emails, &d.EmailedPayments)
	return d, err
}

// Send signs body now and posts it; it returns the status code (0 when the
// request failed at the transport) and the time it took.
func (s *Sender) Send(ctx context.Context, body []byte) (int, time.Duration) {
	start := time.Now()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.URL, bytes.NewReader(body))
	if err != nil {
		return 0, 0
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(webhook.StripeHeader, webhook.SignStripe(s.Secret, start, body))
	resp, err := s.Client.Do(req)
	if err != nil {
		return 0, time.Since(start)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, time.Since(start)
}

// Conn is one kept-alive HTTP/1.1 connection that posts signed events one
// at a time: the request is written by hand and the answer read with the
// standard library's response parser, without http.Client's pool and the
// goroutine hand-offs of each request. A load generator of Conns leaves
// more of the machine's cores to the receiver it measures.
type Conn struct {
	s    *Sender
	host string
	conn net.Conn
	r    *bufio.Reader
	w    *bufio.Writer
}

// Conn returns a connection of s; it dials on first use, and again after
// any failure.
func (s *Sender) Conn() *Conn {
	u, err := url.Parse(s.URL)
	if err != nil {
		panic(err)
	}
	return &Conn{s: s, host: u.Host}
}

// Close closes the connection.
func (c *Conn) Close() {
	if c.conn != nil {
		_ = c.conn.Close()
		c.conn = nil
	}
}

// Send signs body now and posts it; it returns the status code (0 when the
// request failed at the transport) and the time it took.
func (c *Conn) Send(body []byte) (int, time.Duration) {
	start := time.Now()
	code, err := c.send(start, body)
	if err != nil {
		c.Close()
		return 0, time.Since(start)
	}
	return code, time.Since(start)
}

func (c *Conn) send(now time.Time, body []byte) (int, error) {
	if c.conn == nil {
		conn, err := net.DialTimeout("tcp", c.host, 5*time.Second)
		if err != nil {
			return 0, err
		}
		c.conn, c.r, c.w = conn, bufio.NewReader(conn), bufio.NewWriterSize(conn, 8192)
	}
	if err := c.conn.SetDeadline(now.Add(30 * time.Second)); err != nil {
		return 0, err
	}
	path := strings.TrimPrefix(c.s.URL, "http://"+c.host)
	fmt.Fprintf(c.w, "POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\n%s: %s\r\nContent-Length: %d\r\n\r\n",
		path, c.host, webhook.StripeHeader, webhook.SignStripe(c.s.Secret, now, body), len(body))
	_, _ = c.w.Write(body)
	if err := c.w.Flush(); err != nil {
		return 0, err
	}
	resp, err := http.ReadResponse(c.r, nil)
	if err != nil {
		return 0, err
	}
	_, err = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if err != nil {
		return 0, err
	}
	if resp.Close {
		c.Close()
	}
	return resp.StatusCode, nil
}

// Ledger is what Postgres holds.
type Ledger struct {
	Payments, Processed, Doubled int
}

// ReadLedger counts payments, processed_events and event ids that appear
// more than once (the design's invariant query).
func (s *Stack) ReadLedger(ctx context.Context) (Ledger, error) {
	return ReadLedger(ctx, s.DB, "%")
}

// Querier is what ReadLedger needs of a pool or a connection.
type Querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// ReadLedger is Stack.ReadLedger over the event ids LIKE pattern, on any
// database (k8sload reads a release's ledger this way).
func ReadLedger(ctx context.Context, db Querier, pattern string) (Ledger, error) {
	var l Ledger
	err := db.QueryRow(ctx, `SELECT
		(SELECT count(*) FROM payments WHERE event_id LIKE $1),
		(SELECT count(*) FROM processed_events WHERE event_id LIKE $1),
		(SELECT count(*) FROM (SELECT event_id FROM processed_events WHERE event_id LIKE $1 GROUP BY event_id HAVING COUNT(*) > 1) d)
		+ (SELECT count(*) FROM (SELECT event_id FROM payments WHERE event_id LIKE $1 GROUP BY event_id HAVING COUNT(*) > 1) p)`, pattern).
		Scan(&l.Payments, &l.Processed, &l.Doubled)
	return l, err
}

// Missing returns the ids among want that have no payments row.
func (s *Stack) Missing(ctx context.Context, want []string) ([]string, error) {
	rows, err := s.DB.Query(ctx, `SELECT w.want FROM unnest($1::text[]) AS w(want)
		WHERE NOT EXISTS (SELECT 1 FROM payments p WHERE p.event_id = w.want)`, want)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			return nil, err
		}
		out = append(out, id)
	}
	return out, rows.Err()
}
