package config_test

import (
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotent-events/idempotent-events/pkg/internal/config"
)

func TestWorkerDefaultsMatchTheDesign(t *testing.T) {
	cleanEnv(t)
	var c config.Worker
	require.NoError(t, config.Load(&c))
	assert.Equal(t, "amqp://guest:guest@127.0.0.1:5672/", c.AMQPURL)
	assert.Equal(t, "redis://127.0.0.1:6379/0", c.RedisURL)
	assert.Equal(t, "postgres://postgres@127.0.0.1:5432/idempotent_events?sslmode=disable", c.DatabaseURL)
	assert.Equal(t, ":9091", c.MetricsAddr)
	assert.Equal(t, "info", c.LogLevel)
	assert.Equal(t, "json", c.LogFormat)
	assert.Equal(t, config.Durations{5 * time.Second, 30 * time.Second, 2 * time.Minute, 10 * time.Minute, time.Hour}, c.RetryDelays)
	assert.Equal(t, "classic", c.QueueType)
}

func TestReceiverNeedsASecretOrTheExplicitInsecureSwitch(t *testing.T) {
	cleanEnv(t)
	var c config.Receiver
	err := config.Load(&c)
	requireProblem(t, err, "WEBHOOK_SECRETS")

	t.Setenv("INSECURE_SKIP_SIGNATURE_VERIFICATION", "true")
	require.NoError(t, config.Load(&c))
	assert.Equal(t, ":8080", c.HTTPAddr)
	assert.Equal(t, ":9090", c.MetricsAddr)
}

func TestSecretsListAndSeedRetryDelays(t *testing.T) {
	cleanEnv(t)
	t.Setenv("WEBHOOK_SECRETS", " whsec_new, whsec_old ,")
	t.Setenv("RETRY_DELAYS", "5s,5s,5s")
	var c config.Receiver
	require.NoError(t, config.Load(&c))
	assert.Equal(t, config.List{"whsec_new", "whsec_old"}, c.WebhookSecrets)
	assert.Equal(t, config.Durations{5 * time.Second, 5 * time.Second, 5 * time.Second}, c.RetryDelays)
}

func TestInvalidValuesNameTheVariable(t *testing.T) {
	cleanEnv(t)
	cases := map[string]string{
		"WORKER_PREFETCH":    "0",
		"WORKER_CONCURRENCY": "many",
		"WORKER_BATCH_WAIT":  "soon",
		"QUEUE_TYPE":         "stream",
		"RETRY_DELAYS":       "5s,x",
		"LOG_LEVEL":          "loud",
		"LOG_FORMAT":         "xml",
		"AMQP_URL":           "http://example",
		"REDIS_URL":          "mysql://x",
		"DATABASE_URL":       "postgres://host:notaport/db",
		"METRICS_ADDR":       "9091",
		"DEDUPE_TTL":         "0s",
	}
	requireEachNamed(t, cases)
}

// AMQP_URL may list a cluster's nodes; a bad one among them, or nodes that
// name different vhosts, is refused.
func TestAMQPURLListsClusterNodes(t *testing.T) {
	cleanEnv(t)
	t.Setenv("AMQP_URL", "amqp://u:p@rabbit-0:5672/payments, amqp://u:p@rabbit-1:5672/payments,amqp://u:p@rabbit-2:5672/payments")
	var w config.Worker
	require.NoError(t, config.Load(&w))
	for _, bad := range []string{"amqp://u:p@rabbit-0:5672/payments,http://rabbit-1", "amqp://u:p@rabbit-0:5672/payments,amqp://u:p@rabbit-1:5672/other"} {
		t.Setenv("AMQP_URL", bad)
		err := config.Load(&w)
		require.Error(t, err, bad)
		assert.Contains(t, err.Error(), "AMQP_URL", bad)
	}
}

func TestCredentialsAreNotEchoed(t *testing.T) {
	requireNotEchoed(t, "AMQP_URL", "ftp://user:s3cret@host/", "s3cret")
}

// cleanEnv unsets every variable the binaries read, so a developer's
// environment does not leak into the tests, and restores them afterwards.
func cleanEnv(t *testing.T) {
	for _, kv := range os.Environ() {
		name, value, _ := strings.Cut(kv, "=")
		if !known[name] {
			continue
		}
		t.Setenv(name, value) // registers the restore
		require.NoError(t, os.Unsetenv(name))
	}
}

var known = map[string]bool{}

func init() {
	for _, n := range strings.Fields(`METRICS_PPROF AMQP_URL REDIS_URL DATABASE_URL AMQP_RECONNECT_MAX_BACKOFF LOG_LEVEL LOG_FORMAT
		QUEUE_TYPE RETRY_DELAYS QUORUM_DELIVERY_LIMIT WEBHOOK_SOURCES REDIS_KEY_PREFIX DEDUPE_TTL HTTP_ADDR METRICS_ADDR WEBHOOK_SECRETS
		WEBHOOK_TOLERANCE WEBHOOK_MAX_BODY_BYTES INSECURE_SKIP_SIGNATURE_VERIFICATION PUBLISH_TIMEOUT PUBLISH_CHANNELS
		RECEIVER_MAX_IN_FLIGHT RECEIVER_RETRY_AFTER DUPLICATE_CHECK DUPLICATE_CHECK_TIMEOUT SHUTDOWN_TIMEOUT
		WORKER_PREFETCH WORKER_REPLAY_PREFETCH WORKER_CONCURRENCY WORKER_BATCH_SIZE WORKER_BATCH_WAIT WORKER_OUTAGE_MODE DB_MAX_CONNS PROCESS_TIMEOUT
		MIGRATE_LOCK_TIMEOUT MIGRATE_WAIT_TIMEOUT RABBITMQ_MANAGEMENT_URL QUEUE_STATS_INTERVAL
		ADMIN_ADDR ADMIN_TOKEN ADMIN_OPERATOR ADMIN_REPLAY_RATE ADMIN_DLQ_SCAN_LIMIT ADMIN_SESSION_TTL`) {
		known[n] = true
	}
}

// requireEachNamed loads a worker configuration with each bad value on its
// own and requires the error to name its variable.
func requireEachNamed(t *testing.T, cases map[string]string) {
	t.Helper()
	for name, value := range cases {
		t.Run(name, func(t *testing.T) {
			cleanEnv(t)
			t.Setenv(name, value)
			var c config.Worker
			requireProblem(t, config.Load(&c), name)
		})
	}
}

// requireNotEchoed sets a bad value holding secret and requires the error
// to name the variable without repeating the secret.
func requireNotEchoed(t *testing.T, name, value, secret string) {
	t.Helper()
	cleanEnv(t)
	t.Setenv(name, value)
	var c config.Worker
	err := config.Load(&c)
	requireProblem(t, err, name)
	assert.NotContains(t, err.Error(), secret)
}

func requireProblem(t *testing.T, err error, variable string) {
	t.Helper()
	var cerr *config.Error
	require.ErrorAs(t, err, &cerr)
	for _, p := range cerr.Problems {
		if p.Var == variable {
			assert.Contains(t, err.Error(), "invalid configuration: "+variable+": ")
			return
		}
	}
	t.Fatalf("no problem reported for %s in: %v", variable, err)
}

func TestWebhookSources(t *testing.T) {
	cleanEnv(t)
	t.Setenv("WEBHOOK_SECRETS", "whsec_stripe")
	t.Setenv("WEBHOOK_SOURCES", "acme:standard,gh-app:github")
	t.Setenv("WEBHOOK_SECRETS_ACME", "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
	t.Setenv("WEBHOOK_SECRETS_GH_APP", "s1,s2")
	var c config.Receiver
	require.NoError(t, config.Load(&c))
	require.Len(t, c.Sources, 2)
	assert.Equal(t, config.Source{Name: "gh-app", Scheme: "github", Secrets: []string{"s1", "s2"}, SecretsVar: "WEBHOOK_SECRETS_GH_APP"}, c.Sources[1])

	for value, variable := range map[string]string{
		"payment:stripe": "WEBHOOK_SOURCES",
		"Acme:github":    "WEBHOOK_SOURCES",
		"acme":           "WEBHOOK_SOURCES",
		"other:github":   "WEBHOOK_SECRETS_OTHER",
	} {
		t.Setenv("WEBHOOK_SOURCES", value)
		requireProblem(t, config.Load(&c), variable)
	}
	// A scheme's name and the form of its secrets are the webhook
	// package's to judge: see the app tests.
}

// Every bad variable is reported at once, one line each, whether it does
// not parse or parses to a value validation refuses: fixing them one start
// at a time would take as many starts as there are mistakes.
func TestEveryBadVariableIsReportedAtOnce(t *testing.T) {
	cleanEnv(t)
	t.Setenv("WORKER_BATCH_SIZE", "abc")
	t.Setenv("WORKER_CONCURRENCY", "x")
	t.Setenv("RETRY_DELAYS", "5s,soon")
	t.Setenv("WORKER_PREFETCH", "0")
	var w config.Worker
	err := config.Load(&w)
	var cerr *config.Error
	require.ErrorAs(t, err, &cerr)
	named := map[string]int{}
	for _, p := range cerr.Problems {
		named[p.Var]++
	}
	require.Equal(t, map[string]int{"WORKER_BATCH_SIZE": 1, "WORKER_CONCURRENCY": 1, "RETRY_DELAYS": 1, "WORKER_PREFETCH": 1}, named, err.Error())
	require.Len(t, strings.Split(err.Error(), "\n"), 4, "one line per bad variable")
	require.Contains(t, err.Error(), `invalid configuration: WORKER_BATCH_SIZE: "abc" is not a valid integer`)
	require.Contains(t, err.Error(), `invalid configuration: WORKER_CONCURRENCY: "x" is not a valid integer`)
	require.Contains(t, err.Error(), `invalid configuration: RETRY_DELAYS: "5s,soon" is not a valid comma-separated list of durations`)
	require.Contains(t, err.Error(), "invalid configuration: WORKER_PREFETCH: must be between 1 and 65535, got 0")

	// A variable fixed is no longer reported; the others still are.
	t.Setenv("WORKER_CONCURRENCY", "8")
	err = config.Load(&w)
	require.ErrorAs(t, err, &cerr)
	require.Len(t, cerr.Problems, 3, err.Error())
	require.NotContains(t, err.Error(), "WORKER_CONCURRENCY")
}
