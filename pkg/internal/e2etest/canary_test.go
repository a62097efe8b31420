package e2etest_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotent-events/idempotent-events/pkg/internal/broker"
	"github.com/idempotent-events/idempotent-events/pkg/internal/config"
	"github.com/idempotent-events/idempotent-events/pkg/internal/event"
	"github.com/idempotent-events/idempotent-events/pkg/internal/faulttest"
	"github.com/idempotent-events/idempotent-events/pkg/internal/outbox"
	"github.com/idempotent-events/idempotent-events/pkg/internal/servicetest"
	"github.com/idempotent-events/idempotent-events/pkg/internal/webhook"
)

// Secrets never leave the process (DESIGN.md, rule 7): a distinct canary is
// set in every secret-bearing setting — each URL's password, the webhook
// secrets of every source (from a variable and from a file), the admin
// token, the reconciler's API keys — and every output path is driven: the
// start and --check-config of each binary with each setting malformed,
// debug logs through normal processing of every source, outages and
// reconnects of each service, Go's stack dump, /metrics, /readyz, the admin
// API and page, every eventsctl command (with -h, with its errors, against
// the real services), and the headers of DLQ and outbox messages. The
// canary, raw or in base64, is found nowhere.
//
// The canaries are really in use, or the test would prove nothing: the
// RabbitMQ and Redis users exist only with their canary passwords, the
// management API user too, events signed with each source's canary secret
// are accepted, the admin API answers the canary token, and the fake
// Stripe and GitHub APIs receive the canary keys.
func TestSecretsNeverLeaveTheProcess(t *testing.T) {
	t.Parallel()
	s := newCanaryScene(t)
	t.Run("every secret-bearing setting has a canary", s.coverage)
	t.Run("malformed settings", s.malformed)
	t.Run("running", s.running)
	t.Run("eventsctl", s.eventsctl)
	t.Run("outage from the start", s.outageFromTheStart)
}

// canaryScene is one run's canaries, services and outputs.
type canaryScene struct {
	canary map[string]string // setting -> its canary
	forms  map[string]string // a searched form (raw, base64) -> setting

	vhost, amqpUser, mgmtUser, redisUser string
	amqpAdminURL                         string // the test's own guest access to the vhost
	dbURL                                string // the schema, without a password
	redisPrefix                          string
	ghFile                               string
	stripeAPI, githubAPI                 *apiRecorder

	dlqIDs []string // x-ie-dlq-id of the messages dead-lettered while running

	mu      sync.Mutex
	checked int // outputs checked, to show the test looked at something
}

// Settings with a canary. The test fails when the product gains a
// sensitive setting (config's sensitive:"true", a secret-looking variable
// eventsctl reads) that is not here.
const (
	cAMQP       = "AMQP_URL"
	cRedis      = "REDIS_URL"
	cDB         = "DATABASE_URL"
	cMgmt       = "RABBITMQ_MANAGEMENT_URL"
	cWebhook    = "WEBHOOK_SECRETS"
	cWebhookOld = "WEBHOOK_SECRETS (second)"
	cShop       = "WEBHOOK_SECRETS_SHOP"
	cShopKey    = "WEBHOOK_SECRETS_SHOP (decoded key)"
	cGH         = "WEBHOOK_SECRETS_GH_FILE (content)"
	cAdmin      = "ADMIN_TOKEN"
	cStripeKey  = "STRIPE_API_KEY"
	cGitHubTok  = "GITHUB_TOKEN"
)

func newCanaryScene(t *testing.T) *canaryScene {
	s := &canaryScene{canary: map[string]string{}, forms: map[string]string{}}
	random := func(tag string) string {
		var b [8]byte
		_, _ = rand.Read(b[:])
		// Letters and digits only: no encoding (URL, JSON, shell) changes it.
		return "cnry" + tag + hex.EncodeToString(b[:])
	}
	shopKey := random("shopkey")
	for setting, value := range map[string]string{
		cAMQP: random("amqp"), cRedis: random("redis"), cDB: random("db"), cMgmt: random("mgmt"),
		cWebhook: "whsec_" + random("stripe"), cWebhookOld: "whsec_" + random("stripeold"),
		cShop: "whsec_" + base64.StdEncoding.EncodeToString([]byte(shopKey)), cShopKey: shopKey,
		cGH: random("github"), cAdmin: random("admin"), cStripeKey: "rk_test_" + random("stripekey"), cGitHubTok: "ghp_" + random("ghtoken"),
	} {
		s.canary[setting] = value
		for _, f := range searchForms(value) {
			s.forms[f] = setting
		}
	}

	// The services' users exist only with their canary passwords.
	ctx := context.Background()
	s.amqpAdminURL = servicetest.VHost(t)
	au, err := url.Parse(s.amqpAdminURL)
	require.NoError(t, err)
	s.vhost = strings.TrimPrefix(au.Path, "/")
	s.amqpUser, s.mgmtUser = servicetest.Name("cnry_amqp"), servicetest.Name("cnry_mgmt")
	rabbitUser(t, s.amqpUser, s.canary[cAMQP], "", s.vhost)
	rabbitUser(t, s.mgmtUser, s.canary[cMgmt], "monitoring", s.vhost)

	s.redisPrefix = servicetest.RedisPrefix(t)
	s.redisUser = servicetest.Name("cnry_redis")
	rc := redis.NewClient(mustRedisOptions(t, servicetest.RedisURL))
	t.Cleanup(func() { _ = rc.Close() })
	require.NoError(t, rc.Do(ctx, "ACL", "SETUSER", s.redisUser, "on", ">"+s.canary[cRedis], "~"+s.redisPrefix+"*", "&*", "+@all").Err())
	t.Cleanup(func() { _ = rc.Do(context.Background(), "ACL", "DELUSER", s.redisUser).Err() })

	s.dbURL = servicetest.Schema(t)
	s.ghFile = filepath.Join(t.TempDir(), "gh-secrets")
	require.NoError(t, os.WriteFile(s.ghFile, []byte(s.canary[cGH]+"\n"), 0o600))
	s.stripeAPI, s.githubAPI = newAPIRecorder(t), newAPIRecorder(t)
	return s
}

// searchForms are the strings a leak of v would show: v, and v in base64
// (standard and URL alphabets) at each of the three alignments it can
// have inside a longer encoded string, such as a Basic auth header.
func searchForms(v string) []string {
	forms := []string{v}
	for pad := 0; pad < 3; pad++ {
		for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.URLEncoding} {
			e := enc.EncodeToString([]byte(strings.Repeat("\x00", pad) + v))
			// Drop the characters that depend on what surrounds v.
			start, end := (pad*4+2)/3+1, len(e)-4
			if end-start >= 12 {
				forms = append(forms, e[start:end])
			}
		}
	}
	return forms
}

// check fails t if text holds a canary in any form; where names the output.
func (s *canaryScene) check(t *testing.T, where, text string) {
	t.Helper()
	s.mu.Lock()
	s.checked++
	s.mu.Unlock()
	for form, setting := range s.forms {
		if i := strings.Index(text, form); i >= 0 {
			lo, hi := max(0, i-120), min(len(text), i+len(form)+40)
			t.Errorf("%s: the canary of %s is printed: …%s…", where, setting, strings.ReplaceAll(text[lo:hi], form, "<CANARY>"))
		}
	}
}

// coverage: every variable config marks sensitive, and every variable
// eventsctl reads whose name says key, token, secret, password or URL, is
// one this test sets a canary in (or is listed as carrying none).
func (s *canaryScene) coverage(t *testing.T) {
	covered := map[string]bool{cAMQP: true, cRedis: true, cDB: true, cMgmt: true, cWebhook: true, cAdmin: true,
		cStripeKey: true, cGitHubTok: true, "WEBHOOK_SECRETS_FILE": true}
	// Variables that name no secret: addresses without credentials.
	notSecret := map[string]string{
		"RECEIVER_URL":   "the receiver's own address, which eventsctl send posts to",
		"STRIPE_API_URL": "Stripe's API address; the key goes in a header",
		"GITHUB_API_URL": "GitHub's API address; the token goes in a header",
	}
	for _, spec := range []any{config.Receiver{}, config.Worker{}, config.Migrate{}} {
		for _, name := range sensitiveVars(reflect.TypeOf(spec)) {
			assert.True(t, covered[name], "config marks %s sensitive but this test sets no canary in it", name)
		}
	}
	secretish := regexp.MustCompile(`(?i)(key|token|secret|password|url)`)
	files, err := filepath.Glob("../eventsctl/*.go")
	require.NoError(t, err)
	fset := token.NewFileSet()
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		file, err := parser.ParseFile(fset, f, nil, 0)
		require.NoError(t, err)
		ast.Inspect(file, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok || len(call.Args) != 1 {
				return true
			}
			if fn, ok := call.Fun.(*ast.Ident); !ok || fn.Name != "env" {
				return true
			}
			lit, ok := call.Args[0].(*ast.BasicLit)
			if !ok || lit.Kind != token.STRING {
				return true
			}
			name, _ := strconv.Unquote(lit.Value)
			if secretish.MatchString(name) && !covered[name] && notSecret[name] == "" {
				t.Errorf("%s: eventsctl reads %s, which may carry a secret, but this test sets no canary in it", fset.Position(lit.Pos()), name)
			}
			return true
		})
	}
}

func sensitiveVars(t reflect.Type) []string {
	var out []string
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		if f.Anonymous && f.Type.Kind() == reflect.Struct {
			out = append(out, sensitiveVars(f.Type)...)
			continue
		}
		if f.Tag.Get("sensitive") == "true" {
			out = append(out, f.Tag.Get("envconfig"))
		}
	}
	return out
}

// urls are the connection settings with their canary passwords, pointing
// at the given addresses (proxies in front of the services, or a closed
// port).
func (s *canaryScene) urls(amqpAddr, redisAddr, dbAddr string) []string {
	db, err := url.Parse(s.dbURL)
	if err != nil {
		panic(err)
	}
	db.User = url.UserPassword(db.User.Username(), s.canary[cDB])
	db.Host = dbAddr
	return []string{
		"AMQP_URL=amqp://" + s.amqpUser + ":" + s.canary[cAMQP] + "@" + amqpAddr + "/" + s.vhost,
		"REDIS_URL=redis://" + s.redisUser + ":" + s.canary[cRedis] + "@" + redisAddr + "/0",
		"DATABASE_URL=" + db.String(),
		"RABBITMQ_MANAGEMENT_URL=http://" + s.mgmtUser + ":" + s.canary[cMgmt] + "@127.0.0.1:15672",
	}
}

// secrets are the other secret settings.
func (s *canaryScene) secrets() []string {
	return []string{
		"WEBHOOK_SECRETS=" + s.canary[cWebhook] + "," + s.canary[cWebhookOld],
		"WEBHOOK_SOURCES=shop:standard,gh:github",
		"WEBHOOK_SECRETS_SHOP=" + s.canary[cShop],
		"WEBHOOK_SECRETS_GH_FILE=" + s.ghFile,
		"ADMIN_TOKEN=" + s.canary[cAdmin],
		"STRIPE_API_KEY=" + s.canary[cStripeKey], "STRIPE_API_URL=" + s.stripeAPI.URL,
		"GITHUB_TOKEN=" + s.canary[cGitHubTok], "GITHUB_API_URL=" + s.githubAPI.URL,
	}
}

const closed = "127.0.0.1:1" // nobody listens there

// malformed: each binary, started and with --check-config, with one
// setting malformed at a time (the others valid but unreachable) exits 2
// naming it, and prints no canary.
func (s *canaryScene) malformed(t *testing.T) {
	t.Parallel()
	base := append(s.urls(closed, closed, closed), s.secrets()...)
	base = append(base, "DUPLICATE_CHECK=postgres") // the receiver checks DATABASE_URL too
	bigFile := filepath.Join(t.TempDir(), "big")
	require.NoError(t, os.WriteFile(bigFile, []byte(strings.Repeat(s.canary[cGH]+",", 4000)), 0o600))
	notBase64File := filepath.Join(t.TempDir(), "shop")
	require.NoError(t, os.WriteFile(notBase64File, []byte(s.canary[cShopKey]+"!\n"), 0o600))
	type variant struct{ variable, value string }
	var variants []variant
	userinfo := func(user, pass string) []string {
		// The mistakes the issue names (an unencoded '@' or '/'), and the
		// others that make a URL fail to parse around its user info.
		return []string{
			user + ":" + pass + "/x@h:5672", user + ":" + pass + "@x/y@h", user + ":" + pass + "#x@h",
			user + ":" + pass + "?x@h", user + ":" + pass + "%zz@h", user + ":" + pass + "@h:port", user + ":" + pass + "@h:99999",
			user + ":" + pass + "@[::1", user + ":" + pass + " x@h", user + ":" + pass + "@h:5672:1",
		}
	}
	for _, ui := range userinfo("u", s.canary[cAMQP]) {
		variants = append(variants, variant{"AMQP_URL", "amqp://" + ui + "/v"}, variant{"AMQP_URL", "amqp://ok:ok@h/v,amqps://" + ui + "/v"})
	}
	for _, ui := range userinfo("u", s.canary[cRedis]) {
		variants = append(variants, variant{"REDIS_URL", "redis://" + ui + "/0"}, variant{"REDIS_URL", "rediss://" + ui + "/0?master_name=m"},
			variant{"REDIS_URL", "redis://" + ui + "/0?addr=h2:6379"})
	}
	variants = append(variants, variant{"REDIS_URL", "redis://u:" + s.canary[cRedis] + "@h:6379/notadb"},
		variant{"REDIS_URL", "redis://u:" + s.canary[cRedis] + "@h:6379/0?dial_timeout=soon"})
	for _, ui := range userinfo("u", s.canary[cDB]) {
		variants = append(variants, variant{"DATABASE_URL", "postgres://" + ui + "/db"})
	}
	variants = append(variants, variant{"DATABASE_URL", "postgres://u:" + s.canary[cDB] + "@h/db?sslmode=sometimes"},
		variant{"DATABASE_URL", "host=h port=x user=u password=" + s.canary[cDB]},
		variant{"DATABASE_URL", "host=h user=u password='" + s.canary[cDB] + " sslmode=bogus"},
		variant{"DATABASE_URL", "postgres://h/db?password=" + s.canary[cDB] + "&connect_timeout=x"})
	for _, ui := range userinfo("u", s.canary[cMgmt]) {
		variants = append(variants, variant{"RABBITMQ_MANAGEMENT_URL", "http://" + ui + "/"})
	}
	variants = append(variants, variant{"RABBITMQ_MANAGEMENT_URL", "ftp://u:" + s.canary[cMgmt] + "@h/"},
		variant{"ADMIN_TOKEN", s.canary[cAdmin][:12]}, variant{"ADMIN_TOKEN", " " + s.canary[cAdmin] + "\n"},
		variant{"WEBHOOK_SECRETS_SHOP", s.canary[cShopKey] + "!"}, // not whsec_<base64>
		variant{"WEBHOOK_SECRETS_SHOP", s.canary[cShop] + "," + s.canary[cShopKey] + "="},
		variant{"WEBHOOK_SECRETS_GH_FILE", filepath.Join(t.TempDir(), "missing")},
		variant{"WEBHOOK_SECRETS_GH_FILE", bigFile},         // its content is not quoted
		variant{"WEBHOOK_SECRETS_SHOP_FILE", notBase64File}, // nor a refused secret's
		variant{"WEBHOOK_SOURCES", "shop:soap,gh:github"},   // an unknown scheme, the secrets set
		variant{"WEBHOOK_SECRETS_FILE", s.ghFile},           // set beside WEBHOOK_SECRETS
		variant{"INSECURE_SKIP_SIGNATURE_VERIFICATION", "true"},
	)
	binsOf := map[string][]string{"AMQP_URL": {"receiver", "worker"}, "REDIS_URL": {"receiver", "worker"},
		"DATABASE_URL": {"receiver", "worker", "migrate"}, "RABBITMQ_MANAGEMENT_URL": {"worker"}, "ADMIN_TOKEN": {"worker"}}
	sem := make(chan struct{}, 4)
	var wg sync.WaitGroup
	for _, v := range variants {
		bins := binsOf[v.variable]
		if bins == nil {
			bins = []string{"receiver"}
		}
		for _, bin := range bins {
			wg.Go(func() {
				sem <- struct{}{}
				defer func() { <-sem }()
				env := cleanEnv(append(append([]string{}, base...), v.variable+"="+v.value)...)
				where := fmt.Sprintf("%s with %s malformed (%s)", bin, v.variable, v.value)
				code, out := runFor(t, bin, env, 0, "--check-config")
				s.check(t, where+", --check-config", out)
				// A start: at once refused like --check-config, or (a value
				// the parsers take, such as a port out of range) run against
				// it for a moment, with what that prints.
				_, started := runFor(t, bin, env, 2*time.Second)
				s.check(t, where+", started", started)
				if code != 0 {
					assert.Equal(t, 2, code, "%s: %s", where, out)
					assert.True(t, strings.HasPrefix(out, "invalid configuration: "), "%s: %s", where, out)
				}
			})
		}
	}
	wg.Wait()
}

// runFor runs bin with env and args, and returns its exit status and
// output. A process still running after limit (0: 20s, a failure) gets
// SIGTERM, then SIGKILL; its status is then -1.
func runFor(t *testing.T, bin string, env []string, limit time.Duration, args ...string) (int, string) {
	t.Helper()
	fail := limit == 0
	if fail {
		limit = 20 * time.Second
	}
	p := startWatched(t, bin, env, args...)
	select {
	case <-p.exited:
		return p.cmd.ProcessState.ExitCode(), p.out.String()
	case <-time.After(limit):
	}
	if fail {
		t.Errorf("%s %v did not exit within %s", bin, args, limit)
	}
	p.stop(syscall.SIGTERM)
	return -1, p.out.String()
}

// watched is a running binary whose output can be read while it runs.
type watched struct {
	cmd    *exec.Cmd
	out    *syncBuffer
	exited chan struct{}
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

func startWatched(t *testing.T, bin string, env []string, args ...string) *watched {
	t.Helper()
	p := &watched{cmd: exec.Command(filepath.Join(binDir, bin), args...), out: &syncBuffer{}, exited: make(chan struct{})}
	p.cmd.Env = env
	p.cmd.Stdout, p.cmd.Stderr = p.out, p.out
	require.NoError(t, p.cmd.Start())
	go func() { _ = p.cmd.Wait(); close(p.exited) }()
	t.Cleanup(func() { p.stop(syscall.SIGKILL) })
	return p
}

// stop sends sig, waits up to 15s for the exit (then kills), and returns
// the exit status (-1 after a signal).
func (p *watched) stop(sig syscall.Signal) int {
	select {
	case <-p.exited:
		return p.cmd.ProcessState.ExitCode()
	default:
	}
	_ = p.cmd.Process.Signal(sig)
	select {
	case <-p.exited:
	case <-time.After(15 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.exited
	}
	return p.cmd.ProcessState.ExitCode()
}

// running: the pipeline with every canary set, through normal processing,
// a poison message and a retried one dead-lettered during a database
// outage, outages and reconnects of RabbitMQ and Redis, the admin API and
// page, scrapes of every endpoint, then SIGTERM; every log line and answer
// is checked.
func (s *canaryScene) running(t *testing.T) {
	ctx := context.Background()
	rabbitHost, redisHost := "127.0.0.1:5672", hostOf(t, servicetest.RedisURL)
	dbHost := hostOf(t, s.dbURL)
	proxies := map[string]*faulttest.Proxy{}
	for name, target := range map[string]string{"amqp": rabbitHost, "redis": redisHost, "db": dbHost} {
		p, err := faulttest.Start(target)
		require.NoError(t, err)
		t.Cleanup(p.Close)
		proxies[name] = p
	}
	httpAddr, rMetrics, wMetrics, adminAddr := servicetest.FreeAddr(), servicetest.FreeAddr(), servicetest.FreeAddr(), servicetest.FreeAddr()
	env := cleanEnv(append(append(s.urls(proxies["amqp"].Addr(), proxies["redis"].Addr(), proxies["db"].Addr()), s.secrets()...),
		"REDIS_KEY_PREFIX="+s.redisPrefix, "HTTP_ADDR="+httpAddr, "ADMIN_ADDR="+adminAddr, "LOG_LEVEL=debug", "SHUTDOWN_TIMEOUT=5s",
		"DUPLICATE_CHECK=postgres", "WORKER_OUTAGE_MODE=retry", "RETRY_DELAYS=100ms,100ms", "QUEUE_STATS_INTERVAL=1s",
		"AMQP_RECONNECT_MAX_BACKOFF=200ms", "OUTBOX_POLL_INTERVAL=100ms", "OUTBOX_MAX_BACKOFF=1s")...)

	for _, args := range [][]string{nil, {"wait"}, {"--check-config"}} {
		code, stdout, stderr := run(t, "migrate", env, args...)
		require.Equal(t, 0, code, stderr)
		s.check(t, fmt.Sprintf("migrate %v", args), stdout+stderr)
	}
	for _, bin := range []string{"receiver", "worker"} {
		code, stdout, stderr := run(t, bin, env, "--check-config")
		require.Equal(t, 0, code, stderr)
		s.check(t, bin+" --check-config", stdout+stderr)
		for _, arg := range []string{"--help", "--version"} {
			_, stdout, stderr := run(t, bin, env, arg)
			s.check(t, bin+" "+arg, stdout+stderr)
		}
	}
	receiverProc := startWatched(t, "receiver", append(env, "METRICS_ADDR="+rMetrics))
	workerProc := startWatched(t, "worker", append(env, "METRICS_ADDR="+wMetrics))
	waitReady(t, "http://"+httpAddr+"/readyz")
	waitReady(t, "http://"+wMetrics+"/readyz")
	t.Cleanup(func() {
		s.check(t, "receiver output", receiverProc.out.String())
		s.check(t, "worker output", workerProc.out.String())
	})

	// Every source's canary secret is in use: their events are accepted.
	http1 := &http.Client{Timeout: 10 * time.Second}
	ids := map[string]string{}
	for _, src := range []string{"stripe", "shop", "gh"} {
		id, code, answer := s.sendSigned(t, http1, httpAddr, src)
		require.Equal(t, http.StatusAccepted, code, "%s: %s", src, answer)
		s.check(t, src+" answer", answer)
		ids[src] = id
	}
	code, stdout, stderr := run(t, "eventsctl", env, "send", "--url", "http://"+httpAddr, "--id", "evt_canary_send")
	require.Equal(t, 0, code, stderr)
	s.check(t, "eventsctl send", stdout+stderr)
	code, stdout, stderr = run(t, "eventsctl", env, "verify", "--id", "evt_canary_send", "--timeout", "20s")
	require.Equal(t, 0, code, "%s%s", stdout, stderr)
	s.check(t, "eventsctl verify", stdout+stderr)
	_, _, answer := s.sendSignedID(t, http1, httpAddr, "stripe", "evt_canary_send") // a duplicate
	s.check(t, "duplicate answer", answer)
	for _, bad := range []string{"wrong", "stale", "missing"} {
		s.check(t, "refused "+bad, s.sendBad(t, http1, httpAddr, bad))
	}

	// A poison message goes to the DLQ with its reason.
	b := servicetest.NewBroker(t, s.amqpAdminURL, broker.Topology{QueueType: "classic", RetryDelays: config.Durations{100 * time.Millisecond, 100 * time.Millisecond}})
	b.PublishEvent([]byte(`{"id":"evt_canary_poison","type":`), amqp.Table{broker.HeaderSource: "stripe"})
	// A delivery that fails on a database outage is retried, then
	// dead-lettered with the errors in its headers.
	proxies["db"].SetDown(true)
	id, code, answer := s.sendSigned(t, http1, httpAddr, "stripe")
	require.Equal(t, http.StatusAccepted, code, answer)
	s.check(t, "answer during a database outage", answer)
	require.Eventually(t, func() bool { return b.Depth(broker.DLQ) >= 2 }, 30*time.Second, 50*time.Millisecond,
		"the poison message and %s are not both in %s", id, broker.DLQ)
	s.scrape(t, "during a database outage", "http://"+rMetrics, "http://"+wMetrics)
	proxies["db"].SetDown(false)
	waitReady(t, "http://"+wMetrics+"/readyz")

	// Outages and reconnects of RabbitMQ and Redis.
	proxies["redis"].SetDown(true)
	_, _, answer = s.sendSigned(t, http1, httpAddr, "stripe")
	s.check(t, "answer during a Redis outage", answer)
	s.scrape(t, "during a Redis outage", "http://"+rMetrics, "http://"+wMetrics)
	proxies["redis"].SetDown(false)
	proxies["amqp"].SetDown(true)
	_, _, answer = s.sendSigned(t, http1, httpAddr, "stripe")
	s.check(t, "answer during a RabbitMQ outage", answer)
	s.scrape(t, "during a RabbitMQ outage", "http://"+rMetrics, "http://"+wMetrics)
	proxies["amqp"].SetDown(false)
	waitReady(t, "http://"+httpAddr+"/readyz")
	waitReady(t, "http://"+wMetrics+"/readyz")

	// The outbox relay's messages (a row as a handler enqueues it) and a
	// row it cannot publish (its routing key reaches no queue: returned),
	// then what eventsctl shows of them.
	downstream := s.bindDownstream(t)
	conn := servicetest.Conn(t, s.dbURL)
	_, err := conn.Exec(ctx, `INSERT INTO outbox (idempotency_key, event_id, effect, object_id, seq, exchange, routing_key, headers, body)
		VALUES ('evt_canary_out/email', 'evt_canary_out', 'email', 'pi_canary_out', 1, $1, 'email.sent', '{"x-team":"a"}', 'hello'),
		       ('evt_canary_lost/email', 'evt_canary_lost', 'email', 'pi_canary_lost', 1, $1, 'routed.nowhere', '{}', 'lost')`, outbox.Exchange)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return b.Depth(downstream) == 1 }, 20*time.Second, 50*time.Millisecond, "the relay did not publish")
	for _, d := range b.Drain(downstream) {
		s.check(t, "outbox message", fmt.Sprintf("%+v", d))
	}
	require.Eventually(t, func() bool {
		var errs int
		_ = conn.QueryRow(ctx, `SELECT count(*) FROM outbox WHERE last_error <> ''`).Scan(&errs)
		return errs > 0
	}, 20*time.Second, 50*time.Millisecond, "the relay recorded no error for the unpublishable row")

	// The DLQ's messages, as RabbitMQ holds them.
	s.checkDLQ(t, b)
	s.admin(t, "http://"+adminAddr)
	s.scrape(t, "after the outages", "http://"+rMetrics, "http://"+wMetrics, "http://"+httpAddr)

	// The stack dump of a panic (Go prints every goroutine's frames).
	dump := startWatched(t, "receiver", cleanEnv(append(append(s.urls(proxies["amqp"].Addr(), proxies["redis"].Addr(), proxies["db"].Addr()),
		s.secrets()...), "HTTP_ADDR="+servicetest.FreeAddr(), "METRICS_ADDR="+servicetest.FreeAddr(), "LOG_LEVEL=debug", "GOTRACEBACK=all")...))
	require.Eventually(t, func() bool { return strings.Contains(dump.out.String(), "receiver listening") }, 20*time.Second, 20*time.Millisecond)
	dump.stop(syscall.SIGQUIT)
	require.Contains(t, dump.out.String(), "goroutine ", "SIGQUIT printed the stacks")
	s.check(t, "the receiver's stack dump", dump.out.String())

	s.eventsctlAgainst(t, env, "http://"+httpAddr, "http://"+wMetrics+"/metrics", ids)
	assert.Equal(t, 0, receiverProc.stop(syscall.SIGTERM))
	assert.Equal(t, 0, workerProc.stop(syscall.SIGTERM))
}

// sendSigned posts a new event of src signed with its canary secret and
// returns its id, the status and the answer's headers and body.
func (s *canaryScene) sendSigned(t *testing.T, c *http.Client, addr, src string) (string, int, string) {
	t.Helper()
	return s.sendSignedID(t, c, addr, src, eventsctlID())
}

func eventsctlID() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return "evt_canary_" + hex.EncodeToString(b[:])
}

func (s *canaryScene) sendSignedID(t *testing.T, c *http.Client, addr, src, id string) (string, int, string) {
	t.Helper()
	body := event.Example{ID: id, Type: "payment_intent.succeeded", AmountCents: 100, Currency: "usd", Status: "succeeded"}.JSON()
	route := "/webhooks/" + src
	h := http.Header{"Content-Type": {"application/json"}}
	now := time.Now()
	switch src {
	case "stripe":
		route = "/webhooks/payment"
		h.Set(webhook.StripeHeader, webhook.SignStripe(s.canary[cWebhook], now, body))
	case "shop":
		body = []byte(`{"type":"invoice.paid","data":{"id":"` + id + `"}}`)
		ts := strconv.FormatInt(now.Unix(), 10)
		h.Set(webhook.StandardIDHeader, id)
		h.Set(webhook.StandardTimestampHeader, ts)
		h.Set(webhook.StandardSignatureHeader, "v1,"+standardMAC(s.canary[cShopKey], id, ts, body))
	case "gh":
		body = []byte(`{"action":"opened","zen":"` + id + `"}`)
		h.Set(webhook.GitHubSignatureHeader, webhook.SignGitHub(s.canary[cGH], body))
		h.Set(webhook.GitHubDeliveryHeader, id)
		h.Set(webhook.GitHubEventHeader, "issues")
	}
	req, err := http.NewRequest(http.MethodPost, "http://"+addr+route, bytes.NewReader(body))
	require.NoError(t, err)
	req.Header = h
	resp, err := c.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	return id, resp.StatusCode, dumpResponse(resp)
}

func (s *canaryScene) sendBad(t *testing.T, c *http.Client, addr, how string) string {
	t.Helper()
	body := event.Example{ID: eventsctlID(), Type: "payment_intent.succeeded", AmountCents: 1, Currency: "usd", Status: "succeeded"}.JSON()
	req, err := http.NewRequest(http.MethodPost, "http://"+addr+"/webhooks/payment", bytes.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	switch how {
	case "wrong":
		req.Header.Set(webhook.StripeHeader, webhook.SignStripe("whsec_not_ours", time.Now(), body))
	case "stale":
		req.Header.Set(webhook.StripeHeader, webhook.SignStripe(s.canary[cWebhook], time.Now().Add(-time.Hour), body))
	}
	resp, err := c.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusUnauthorized, resp.StatusCode)
	return dumpResponse(resp)
}

// standardMAC is a Standard Webhooks signature under the raw key.
func standardMAC(key, id, ts string, body []byte) string {
	h := webhook.SignGitHub // HMAC-SHA256, hex; Standard Webhooks wants base64 of the same MAC
	raw, _ := hex.DecodeString(strings.TrimPrefix(h(key, []byte(id+"."+ts+"."+string(body))), "sha256="))
	return base64.StdEncoding.EncodeToString(raw)
}

func dumpResponse(resp *http.Response) string {
	body, _ := io.ReadAll(resp.Body)
	var b strings.Builder
	fmt.Fprintf(&b, "%s\n", resp.Status)
	keys := make([]string, 0, len(resp.Header))
	for k := range resp.Header {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		fmt.Fprintf(&b, "%s: %s\n", k, strings.Join(resp.Header[k], ", "))
	}
	b.Write(body)
	return b.String()
}

// scrape reads every GET endpoint of the services at bases.
func (s *canaryScene) scrape(t *testing.T, when string, bases ...string) {
	t.Helper()
	for _, base := range bases {
		for _, path := range []string{"/metrics", "/readyz", "/livez", "/health"} {
			resp, err := http.Get(base + path)
			if err != nil {
				continue
			}
			s.check(t, fmt.Sprintf("GET %s%s %s", base, path, when), dumpResponse(resp))
			resp.Body.Close()
		}
	}
}

// bindDownstream binds a queue of the test's to the outbox exchange.
func (s *canaryScene) bindDownstream(t *testing.T) string {
	t.Helper()
	conn, err := amqp.Dial(s.amqpAdminURL)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	ch, err := conn.Channel()
	require.NoError(t, err)
	require.NoError(t, ch.ExchangeDeclare(outbox.Exchange, "topic", true, false, false, false, nil))
	_, err = ch.QueueDeclare("canary_downstream", true, false, false, false, nil)
	require.NoError(t, err)
	require.NoError(t, ch.QueueBind("canary_downstream", "email.#", outbox.Exchange, false, nil))
	return "canary_downstream"
}

// checkDLQ reads every DLQ message (and puts it back) and checks its
// properties and headers.
func (s *canaryScene) checkDLQ(t *testing.T, b *servicetest.Broker) {
	t.Helper()
	conn, err := amqp.Dial(s.amqpAdminURL)
	require.NoError(t, err)
	defer conn.Close()
	ch, err := conn.Channel()
	require.NoError(t, err)
	var ds []amqp.Delivery
	for {
		d, ok, err := ch.Get(broker.DLQ, false)
		require.NoError(t, err)
		if !ok {
			break
		}
		ds = append(ds, d)
	}
	require.GreaterOrEqual(t, len(ds), 2)
	reasons := map[string]bool{}
	for _, d := range ds {
		s.check(t, "DLQ message "+d.MessageId, fmt.Sprintf("%+v %s", d.Headers, d.Body))
		reasons[broker.String(d.Headers, broker.HeaderDLQReason)] = true
		s.dlqIDs = append(s.dlqIDs, broker.String(d.Headers, broker.HeaderDLQID))
		_, hasErr := d.Headers[broker.HeaderLastError]
		if broker.String(d.Headers, broker.HeaderDLQReason) == string(broker.ReasonRetriesExhausted) {
			assert.True(t, hasErr, "a retried message carries its last error")
		}
	}
	require.NoError(t, ch.Nack(ds[len(ds)-1].DeliveryTag, true, true))
	assert.True(t, reasons[string(broker.ReasonRetriesExhausted)], "dead-lettered after the retries: %v", reasons)
}

// admin drives the admin API (with the canary token, and a wrong one) and
// the page (login, list, a message, a confirmation), checking every answer.
func (s *canaryScene) admin(t *testing.T, base string) {
	t.Helper()
	c := &http.Client{Timeout: 10 * time.Second, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	do := func(method, path, token string, body io.Reader, header ...string) (int, string) {
		req, err := http.NewRequest(method, base+path, body)
		require.NoError(t, err)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		for i := 0; i+1 < len(header); i += 2 {
			req.Header.Set(header[i], header[i+1])
		}
		resp, err := c.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		out := dumpResponse(resp)
		s.check(t, method+" "+path, out)
		return resp.StatusCode, out
	}
	code, list := do("GET", "/api/dlq", s.canary[cAdmin], nil)
	require.Equal(t, http.StatusOK, code, list)
	if m := regexp.MustCompile(`"id":\s*"([^"]+)"`).FindStringSubmatch(list); assert.NotNil(t, m, "no DLQ message listed: %s", list) {
		id := m[1]
		do("GET", "/api/dlq/"+id, s.canary[cAdmin], nil)
		do("GET", "/ui/dlq/"+id+"/replay", "", nil)
		do("POST", "/api/dlq/"+id+"/replay", s.canary[cAdmin], strings.NewReader(`{"reason":"canary"}`), "Content-Type", "application/json")
	}
	do("GET", "/api/audit", s.canary[cAdmin], nil)
	code, _ = do("GET", "/api/dlq", "not-the-token-at-all", nil)
	assert.Equal(t, http.StatusUnauthorized, code)
	do("GET", "/api/dlq", "", nil)
	do("GET", "/ui/login", "", nil)
	do("POST", "/ui/login", "", strings.NewReader(url.Values{"operator": {"ops"}, "token": {"wrong-token-0123456789"}}.Encode()),
		"Content-Type", "application/x-www-form-urlencoded")
	code, login := do("POST", "/ui/login", "", strings.NewReader(url.Values{"operator": {"ops"}, "token": {s.canary[cAdmin]}}.Encode()),
		"Content-Type", "application/x-www-form-urlencoded")
	require.Equal(t, http.StatusSeeOther, code, login)
	cookie := regexp.MustCompile(`(?m)^Set-Cookie: ([^;]+)`).FindStringSubmatch(login)
	require.NotNil(t, cookie, login)
	code, page := do("GET", "/ui/dlq", "", nil, "Cookie", cookie[1])
	assert.Equal(t, http.StatusOK, code, page)
	do("GET", "/ui/style.css", "", nil)
}

// eventsctl: every command (found in the usage texts, so a new one is
// covered) with -h and with no argument, every environment set; then with
// every URL pointing at a closed port.
func (s *canaryScene) eventsctl(t *testing.T) {
	t.Parallel()
	full := cleanEnv(append(s.urls(closed, closed, closed), s.secrets()...)...)
	cmds := eventsctlCommands(t, full)
	require.Greater(t, len(cmds), 10, "the usage texts list the commands")
	for _, cmd := range cmds {
		for _, extra := range [][]string{{"-h"}, {"--help"}, nil, {"-no-such-flag"}} {
			_, out := runFor(t, "eventsctl", full, eventsctlLimit, append(append([]string{}, cmd...), extra...)...)
			s.check(t, fmt.Sprintf("eventsctl %s %v (services at a closed port)", strings.Join(cmd, " "), extra), out)
		}
	}
	// The URLs malformed, as in malformed: what each command says of them.
	for _, v := range []string{
		"AMQP_URL=amqp://u:" + s.canary[cAMQP] + "/x@h/v", "DATABASE_URL=postgres://u:" + s.canary[cDB] + "/x@h/db",
		"RABBITMQ_MANAGEMENT_URL=http://u:" + s.canary[cMgmt] + "/x@h/", "REDIS_URL=redis://u:" + s.canary[cRedis] + "/x@h/0",
	} {
		env := cleanEnv(append(append(s.urls(closed, closed, closed), s.secrets()...), v)...)
		for _, cmd := range cmds {
			_, out := runFor(t, "eventsctl", env, eventsctlLimit, cmd...)
			s.check(t, fmt.Sprintf("eventsctl %s with %s malformed", strings.Join(cmd, " "), strings.SplitN(v, "=", 2)[0]), out)
		}
	}
}

// eventsctlLimit bounds one eventsctl run: a command that waits longer
// (a backfill waiting for workers) is stopped, and what it printed checked.
const eventsctlLimit = 10 * time.Second

// eventsctlCommands lists eventsctl's commands and subcommands from its
// usage texts: "eventsctl <word>" lines, and "eventsctl <word> <command>"
// ones whose word has a usage of its own (dlq, outbox, effects).
func eventsctlCommands(t *testing.T, env []string) [][]string {
	t.Helper()
	_, stdout, _ := run(t, "eventsctl", env, "help")
	word := regexp.MustCompile(`(?m)^\s+eventsctl ([a-z]+)`)
	var cmds [][]string
	for _, m := range word.FindAllStringSubmatch(stdout, -1) {
		cmd := m[1]
		_, sub, subErr := run(t, "eventsctl", env, cmd, "-h")
		subs := regexp.MustCompile(`(?m)^\s+(?:eventsctl )?`+cmd+` ([a-z]+)`).FindAllStringSubmatch(sub+subErr, -1)
		seen := map[string]bool{}
		for _, sm := range subs {
			if !seen[sm[1]] {
				seen[sm[1]] = true
				cmds = append(cmds, []string{cmd, sm[1]})
			}
		}
		if len(seen) == 0 {
			cmds = append(cmds, []string{cmd})
		}
	}
	return cmds
}

// eventsctlAgainst runs eventsctl's commands against the real services
// with the canary credentials: status (management API and all), the DLQ
// and outbox tools, reconcile against fake Stripe and GitHub APIs that
// record the keys they are sent and refuse them, prune, the backfill
// tools, and the error paths of send and verify.
func (s *canaryScene) eventsctlAgainst(t *testing.T, env []string, receiverURL, workerMetrics string, ids map[string]string) {
	t.Helper()
	require.NotEmpty(t, s.dlqIDs)
	dlqID := s.dlqIDs[0]
	runs := [][]string{
		{"status", "--worker-metrics", workerMetrics, "--window", "200ms"}, {"status", "--management-url", "auto", "--worker-metrics", ""},
		{"dlq", "list"}, {"dlq", "list", "--json"}, {"dlq", "show", dlqID}, {"dlq", "show", "--json", dlqID},
		{"dlq", "replay", "--dry-run", "--all", "--operator", "canary"}, {"dlq", "replay", "--reason", "retries_exhausted", "--operator", "canary"},
		{"dlq", "discard", "--reason", "invalid_payload", "--operator", "canary"}, {"dlq", "audit"}, {"dlq", "audit", "--json"},
		{"outbox", "list", "--all"}, {"outbox", "list", "--all", "--json"}, {"outbox", "show", "evt_canary_lost/email"},
		{"outbox", "show", "--json", "evt_canary_out/email"}, {"outbox", "retry", "evt_canary_lost/email", "--operator", "canary"},
		{"events", "show", "-id", ids["stripe"]}, {"events", "show", "-json", "-id", "evt_canary_never"}, {"events", "object", "-id", "pi_canary_send"},
		{"reconcile", "--dry-run", "--since", "1h"}, {"reconcile", "--check-config"},
		{"reconcile", "--source", "gh", "--repo", "o/r", "--hook-id", "7", "--since", "1h", "--max-wait", "1s"},
		{"prune", "--dry-run"}, {"prune", "--check-config"},
		{"effects", "status", "--id", "1"}, {"effects", "cancel", "--id", "1"},
		{"effects", "backfill", "--handler", "payments.record", "--since", "1h", "--dry-run"},
		{"verify", "--id", "evt_canary_never", "--timeout", "300ms"}, {"verify", "--id", ids["stripe"]},
		{"send", "--url", "http://" + closed}, {"send", "--url", receiverURL, "--secret", "whsec_wrong"},
		{"sign"}, {"sign", "--file", "/nonexistent"},
	}
	for _, args := range runs {
		_, out := runFor(t, "eventsctl", env, eventsctlLimit, args...)
		s.check(t, "eventsctl "+strings.Join(args, " "), out)
	}
	assert.True(t, s.stripeAPI.saw(s.canary[cStripeKey]), "eventsctl reconcile sent the Stripe key: %v", s.stripeAPI.auths())
	assert.True(t, s.githubAPI.saw(s.canary[cGitHubTok]), "eventsctl reconcile sent the GitHub token: %v", s.githubAPI.auths())
}

// outageFromTheStart: the receiver and the worker started with every
// service unreachable keep trying (or give up) and say why, the receiver's
// /readyz says what is down, and nothing they print holds a canary.
func (s *canaryScene) outageFromTheStart(t *testing.T) {
	t.Parallel()
	httpAddr, rMetrics, wMetrics := servicetest.FreeAddr(), servicetest.FreeAddr(), servicetest.FreeAddr()
	env := cleanEnv(append(append(s.urls(closed, closed, closed), s.secrets()...), "LOG_LEVEL=debug", "HTTP_ADDR="+httpAddr,
		"AMQP_RECONNECT_MAX_BACKOFF=100ms", "ADMIN_ADDR="+servicetest.FreeAddr(), "DUPLICATE_CHECK=postgres")...)
	r := startWatched(t, "receiver", append(env, "METRICS_ADDR="+rMetrics))
	w := startWatched(t, "worker", append(env, "METRICS_ADDR="+wMetrics))
	require.Eventually(t, func() bool {
		resp, err := http.Get("http://" + rMetrics + "/readyz")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		s.check(t, "the receiver's /readyz with RabbitMQ down", dumpResponse(resp))
		return resp.StatusCode == http.StatusServiceUnavailable
	}, 20*time.Second, 50*time.Millisecond)
	require.Eventually(t, func() bool { return strings.Count(r.out.String(), "\n") > 3 }, 20*time.Second, 50*time.Millisecond,
		"the receiver logs its reconnects")
	select {
	case <-w.exited: // it gives up on a database it cannot reach
	case <-time.After(5 * time.Second):
		w.stop(syscall.SIGTERM)
	}
	r.stop(syscall.SIGQUIT)
	s.check(t, "receiver with every service down, then its stack dump", r.out.String())
	s.check(t, "worker with every service down", w.out.String())
	s.mu.Lock()
	defer s.mu.Unlock()
	assert.Greater(t, s.checked, 10)
}

// apiRecorder is a fake provider API that records the credentials it is
// sent and refuses them, as an API refuses a revoked key.
type apiRecorder struct {
	*httptest.Server
	mu   sync.Mutex
	seen []string
}

func newAPIRecorder(t *testing.T) *apiRecorder {
	a := &apiRecorder{}
	a.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		a.mu.Lock()
		a.seen = append(a.seen, r.Header.Get("Authorization"))
		a.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusUnauthorized)
		_, _ = io.WriteString(w, `{"error":{"type":"invalid_request_error","message":"Invalid API Key provided"},"message":"Bad credentials"}`)
	}))
	t.Cleanup(a.Close)
	return a
}

func (a *apiRecorder) saw(secret string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, h := range a.seen {
		if strings.Contains(h, secret) {
			return true
		}
		if _, b64, ok := strings.Cut(h, "Basic "); ok {
			if raw, err := base64.StdEncoding.DecodeString(b64); err == nil && strings.Contains(string(raw), secret) {
				return true
			}
		}
	}
	return false
}

func (a *apiRecorder) auths() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.seen)
}

// rabbitUser creates a RabbitMQ user with password and tags, with every
// permission on vhost, through the management API; it is deleted when t
// ends.
func rabbitUser(t *testing.T, name, password, tags, vhost string) {
	t.Helper()
	body, _ := json.Marshal(map[string]string{"password": password, "tags": tags})
	require.NoError(t, rabbitAPI(http.MethodPut, "/api/users/"+url.PathEscape(name), body))
	t.Cleanup(func() { _ = rabbitAPI(http.MethodDelete, "/api/users/"+url.PathEscape(name), nil) })
	perm := []byte(`{"configure":".*","write":".*","read":".*"}`)
	require.NoError(t, rabbitAPI(http.MethodPut, "/api/permissions/"+url.PathEscape(vhost)+"/"+url.PathEscape(name), perm))
}

func rabbitAPI(method, path string, body []byte) error {
	u, err := url.Parse(servicetest.RabbitAPI)
	if err != nil {
		return err
	}
	user := u.User
	u.User = nil
	req, err := http.NewRequest(method, strings.TrimSuffix(u.String(), "/")+path, bytes.NewReader(body))
	if err != nil {
		return err
	}
	if user != nil {
		pw, _ := user.Password()
		req.SetBasicAuth(user.Username(), pw)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode >= 300 {
		return fmt.Errorf("%s %s: %s", method, path, resp.Status)
	}
	return nil
}

func mustRedisOptions(t *testing.T, raw string) *redis.Options {
	t.Helper()
	o, err := redis.ParseURL(raw)
	require.NoError(t, err)
	return o
}

// hostOf is the host:port of a URL (Postgres defaults to 5432).
func hostOf(t *testing.T, raw string) string {
	t.Helper()
	u, err := url.Parse(raw)
	require.NoError(t, err)
	if _, _, err := net.SplitHostPort(u.Host); err != nil {
		return u.Host + ":5432"
	}
	return u.Host
}
