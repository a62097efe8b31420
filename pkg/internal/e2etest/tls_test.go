package e2etest_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotent-events/idempotent-events/pkg/internal/servicetest"
	"github.com/idempotent-events/idempotent-events/pkg/internal/tlsconfig/tlstest"
)

// The README's flow with the real binaries over mutual TLS to all three
// services: a private RabbitMQ, PostgreSQL and Redis that accept only TLS
// connections with a client certificate of a CA made for the test, the
// binaries given the CA, certificates and keys as files laid out as the
// kubelet mounts cert-manager's Secrets. An event is accepted (202), a
// resend is a duplicate (200) and the ledger has it once. Then every client
// certificate is renewed in place and every connection cut: the binaries
// reconnect with the renewed files, without a restart, and the next event
// goes through as the first did.
func TestBinariesOverMutualTLS(t *testing.T) {
	t.Parallel()
	ca := tlstest.NewCA(t, "e2e CA")
	rabbit := tlstest.StartRabbitMQ(t, ca)
	pg := tlstest.StartPostgres(t, ca)
	redis := tlstest.StartRedis(t, ca)
	dir := t.TempDir()
	secrets := map[string]*tlstest.Secret{}
	for _, svc := range []string{"AMQP", "REDIS", "DATABASE"} {
		secrets[svc] = tlstest.NewSecret(t, dir, ca.PEM, ca.Client(t, "postgres"))
	}
	httpAddr, rMetrics, wMetrics := servicetest.FreeAddr(), servicetest.FreeAddr(), servicetest.FreeAddr()
	vars := []string{"AMQP_URL=" + rabbit.URL("127.0.0.1"), "REDIS_URL=" + redis.URL("127.0.0.1"),
		"DATABASE_URL=" + pg.URL("127.0.0.1", "idempotent_events"), "REDIS_KEY_PREFIX=" + servicetest.RedisPrefix(t),
		"WEBHOOK_SECRETS=whsec_tls", "HTTP_ADDR=" + httpAddr, "LOG_LEVEL=debug", "SHUTDOWN_TIMEOUT=10s",
		// No management plugin on the private node; the receiver asks
		// Postgres too, so that it holds connections to all three.
		"RABBITMQ_MANAGEMENT_URL=off", "DUPLICATE_CHECK=postgres"}
	for svc, s := range secrets {
		vars = append(vars, svc+"_TLS_CA_FILE="+s.CAFile(), svc+"_TLS_CERT_FILE="+s.CertFile(), svc+"_TLS_KEY_FILE="+s.KeyFile())
	}
	env := cleanEnv(vars...)

	// A plaintext URL is refused while TLS is configured, and a missing
	// file stops the start, each naming its variable.
	code, _, stderr := run(t, "receiver", append(env, "AMQP_URL=amqp://guest:guest@127.0.0.1:5672/"), "--check-config")
	require.Equal(t, 2, code)
	require.Contains(t, stderr, "invalid configuration: AMQP_URL: an amqp:// URL is plaintext; use amqps://, but TLS is required (AMQP_TLS_CA_FILE is set)")
	code, _, stderr = run(t, "migrate", append(env, "DATABASE_TLS_CA_FILE="+dir+"/missing/ca.crt"))
	require.Equal(t, 2, code, stderr)
	require.Contains(t, stderr, "DATABASE_TLS_CA_FILE")

	code, _, stderr = run(t, "migrate", env)
	require.Equal(t, 0, code, stderr)
	receiver := startProc(t, "receiver", append(env, "METRICS_ADDR="+rMetrics))
	worker := startProc(t, "worker", append(env, "METRICS_ADDR="+wMetrics))
	waitReady(t, "http://"+rMetrics+"/readyz")
	waitReady(t, "http://"+wMetrics+"/readyz")

	send := func(id string) {
		t.Helper()
		// A 503 while a connection is being re-established is retried, as
		// the provider would.
		var code int
		var out, stderr string
		for deadline := time.Now().Add(30 * time.Second); ; {
			code, out, stderr = run(t, "eventsctl", env, "send", "--url", "http://"+httpAddr, "--id", id)
			if !strings.HasPrefix(out, "503 ") || time.Now().After(deadline) {
				break
			}
			time.Sleep(250 * time.Millisecond)
		}
		require.Equal(t, 0, code, "%s%s", out, stderr)
		require.Equal(t, `202 {"status":"accepted","event_id":"`+id+`"}`, strings.TrimSpace(out))
		code, out, stderr = run(t, "eventsctl", env, "verify", "--id", id, "--expect", "1", "--timeout", "30s")
		require.Equal(t, 0, code, "%s%s", out, stderr)
		// Committed: a resend is answered as a duplicate (Redis, else Postgres).
		code, out, _ = run(t, "eventsctl", env, "send", "--url", "http://"+httpAddr, "--id", id)
		require.Equal(t, 0, code)
		require.Equal(t, `200 {"status":"duplicate","event_id":"`+id+`"}`, strings.TrimSpace(out))
	}
	send("evt_tls_1")

	// cert-manager renews every client certificate; the kubelet swaps the
	// files in place. Every connection is cut, and the binaries reconnect
	// with the renewed files.
	for _, s := range secrets {
		s.Update(t, ca.PEM, ca.Client(t, "postgres"))
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, err := rabbit.Ctl(ctx, 0, "close_all_connections", "certificate rotation test")
	require.NoError(t, err)
	pg.TerminateClients()
	redis.KillClients()
	waitReady(t, "http://"+rMetrics+"/readyz")
	waitReady(t, "http://"+wMetrics+"/readyz")
	send("evt_tls_2")

	assert.Equal(t, 0, receiver.term(t, 15*time.Second), "receiver exits 0 on SIGTERM")
	assert.Equal(t, 0, worker.term(t, 15*time.Second), "worker exits 0 on SIGTERM")
	assert.NotContains(t, receiver.out.String()+worker.out.String(), "TLS: ", "no TLS failure was logged")
}
