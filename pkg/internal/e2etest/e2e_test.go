// Package e2e_test runs the real binaries, built as the image builds them,
// as separate processes against the services on 127.0.0.1.
package e2etest_test

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotent-events/idempotent-events/pkg/internal/servicetest"
)

var binDir string

func TestMain(m *testing.M) {
	flag.Parse()
	if testing.Short() {
		fmt.Println("e2etest: skipped in -short mode (make check); make test runs it")
		os.Exit(0)
	}
	dir, err := os.MkdirTemp("", "ie-e2e-bin")
	if err != nil {
		panic(err)
	}
	build := exec.Command("go", "build", "-trimpath", "-buildvcs=false",
		"-ldflags", "-s -w -X github.com/idempotent-events/idempotent-events/pkg/internal/telemetry.Version=e2e",
		"-o", dir+"/", "../../../cmd/...")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "build binaries: %v\n%s", err, out)
		os.Exit(1)
	}
	binDir = dir
	code := m.Run()
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

// cleanEnv is the environment of a child process: the machine's, minus
// every variable the binaries read, plus vars.
func cleanEnv(vars ...string) []string {
	var out []string
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(name, "TEST_") || !isConfigVar(name) {
			out = append(out, kv)
		}
	}
	return append(out, vars...)
}

func isConfigVar(name string) bool {
	for _, p := range []string{"AMQP_", "REDIS_", "DATABASE_", "LOG_", "QUEUE_", "RETRY_", "QUORUM_", "DEDUPE_", "HTTP_",
		"METRICS_", "WEBHOOK_", "INSECURE_", "PUBLISH_", "RECEIVER_", "DUPLICATE_", "SHUTDOWN_", "WORKER_", "DB_", "PROCESS_", "MIGRATE_", "ADMIN_"} {
		if strings.HasPrefix(name, p) {
			return true
		}
	}
	return false
}

func run(t *testing.T, bin string, env []string, args ...string) (int, string, string) {
	t.Helper()
	cmd := exec.Command(filepath.Join(binDir, bin), args...)
	cmd.Env = env
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	code := 0
	if ee := (*exec.ExitError)(nil); errors.As(err, &ee) {
		code = ee.ExitCode()
	} else {
		require.NoError(t, err)
	}
	return code, stdout.String(), stderr.String()
}

func TestInvalidConfigurationExitsTwoNamingTheVariable(t *testing.T) {
	t.Parallel()
	cases := []struct {
		bin, variable, value string
	}{
		{"receiver", "WEBHOOK_SECRETS", ""},
		{"receiver", "HTTP_ADDR", "8080"},
		{"receiver", "WEBHOOK_TOLERANCE", "five minutes"},
		{"worker", "WORKER_PREFETCH", "-1"},
		{"worker", "QUEUE_TYPE", "stream"},
		{"worker", "RETRY_DELAYS", "5s,soon"},
		{"worker", "DATABASE_URL", "postgres://h:port/db"},
		{"migrate", "LOG_LEVEL", "chatty"},
	}
	for _, c := range cases {
		t.Run(c.bin+"/"+c.variable, func(t *testing.T) {
			t.Parallel()
			env := cleanEnv(c.variable + "=" + c.value)
			if c.variable != "WEBHOOK_SECRETS" && c.bin == "receiver" {
				env = append(env, "WEBHOOK_SECRETS=whsec_x")
			}
			code, _, stderr := run(t, c.bin, env)
			assert.Equal(t, 2, code, "stderr: %s", stderr)
			lines := strings.Split(strings.TrimSpace(stderr), "\n")
			require.Len(t, lines, 1, "one line: %q", stderr)
			assert.True(t, strings.HasPrefix(lines[0], "invalid configuration: "+c.variable+": "), lines[0])
		})
	}
}

// --check-config validates exactly as a start does and touches no service:
// the services' addresses point at a closed port, yet a valid configuration
// exits 0 and an invalid one 2, naming the variable.
func TestCheckConfigValidatesWithoutStarting(t *testing.T) {
	t.Parallel()
	unreachable := []string{"AMQP_URL=amqp://guest:guest@127.0.0.1:1/", "REDIS_URL=redis://127.0.0.1:1/0",
		"DATABASE_URL=postgres://postgres@127.0.0.1:1/x?sslmode=disable"}
	for _, bin := range []string{"receiver", "worker", "migrate"} {
		// The version the build stamped (-X …/telemetry.Version, as the
		// Makefile, Dockerfile and Tiltfile do) reaches the binary.
		// (The worker's next lines describe its build: pkg/service.)
		code, stdout, _ := run(t, bin, cleanEnv(), "--version")
		require.Equal(t, 0, code)
		require.Equal(t, bin+" e2e", strings.SplitN(stdout, "\n", 2)[0])
		code, stdout, stderr := run(t, bin, cleanEnv(append(unreachable, "WEBHOOK_SECRETS=whsec_x")...), "--check-config")
		require.Equal(t, 0, code, "%s stderr: %s", bin, stderr)
		require.Equal(t, bin+": configuration ok\n", stdout)
	}
	code, _, stderr := run(t, "receiver", cleanEnv(append(unreachable, "WEBHOOK_SECRETS=whsec_x", "DUPLICATE_CHECK=true")...), "--check-config")
	require.Equal(t, 2, code)
	require.True(t, strings.HasPrefix(stderr, "invalid configuration: DUPLICATE_CHECK: "), stderr)
}

type proc struct {
	cmd    *exec.Cmd
	out    *bytes.Buffer
	exited chan error
}

func startProc(t *testing.T, bin string, env []string) *proc {
	t.Helper()
	p := &proc{cmd: exec.Command(filepath.Join(binDir, bin)), out: &bytes.Buffer{}, exited: make(chan error, 1)}
	p.cmd.Env = env
	p.cmd.Stdout, p.cmd.Stderr = p.out, p.out
	require.NoError(t, p.cmd.Start())
	go func() { p.exited <- p.cmd.Wait() }()
	t.Cleanup(func() {
		_ = p.cmd.Process.Kill()
		if t.Failed() {
			t.Logf("%s output:\n%s", bin, p.out)
		}
	})
	return p
}

// term sends SIGTERM and returns the exit code, failing after timeout.
func (p *proc) term(t *testing.T, timeout time.Duration) int {
	t.Helper()
	require.NoError(t, p.cmd.Process.Signal(syscall.SIGTERM))
	select {
	case err := <-p.exited:
		if err != nil && !errors.As(err, new(*exec.ExitError)) {
			t.Fatalf("wait for the process: %v", err)
		}
		return p.cmd.ProcessState.ExitCode()
	case <-time.After(timeout):
		t.Fatalf("did not exit within %s after SIGTERM", timeout)
		return -1
	}
}

func waitReady(t *testing.T, url string) {
	t.Helper()
	require.NoError(t, servicetest.AwaitHTTP(url, http.StatusOK, 20*time.Second))
}

// The README's flow with the real binaries: migrate, receiver, worker,
// eventsctl send three times, eventsctl verify, SIGTERM both.
func TestBinariesEndToEnd(t *testing.T) {
	t.Parallel()
	amqpURL := servicetest.VHost(t)
	schema := servicetest.Name("t_e2e")
	dbURL := servicetest.WithSearchPath(servicetest.DatabaseURL, schema)
	conn := servicetest.Conn(t, servicetest.DatabaseURL)
	_, err := conn.Exec(context.Background(), "CREATE SCHEMA "+schema)
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = conn.Exec(context.Background(), "DROP SCHEMA "+schema+" CASCADE") })

	httpAddr, rMetrics, wMetrics := servicetest.FreeAddr(), servicetest.FreeAddr(), servicetest.FreeAddr()
	env := cleanEnv("AMQP_URL="+amqpURL, "DATABASE_URL="+dbURL, "REDIS_URL="+servicetest.RedisURL,
		"REDIS_KEY_PREFIX="+servicetest.RedisPrefix(t), "WEBHOOK_SECRETS=whsec_e2e,whsec_old",
		"HTTP_ADDR="+httpAddr, "LOG_LEVEL=debug", "SHUTDOWN_TIMEOUT=10s")

	code, _, stderr := run(t, "migrate", append(env, "MIGRATE_WAIT_TIMEOUT=3s"), "wait")
	require.Equal(t, 1, code, "wait gives up on an empty schema: %s", stderr)
	code, _, stderr = run(t, "migrate", env)
	require.Equal(t, 0, code, stderr)
	code, _, stderr = run(t, "migrate", env, "wait")
	require.Equal(t, 0, code, stderr)

	receiver := startProc(t, "receiver", append(env, "METRICS_ADDR="+rMetrics))
	worker := startProc(t, "worker", append(env, "METRICS_ADDR="+wMetrics))
	waitReady(t, "http://"+httpAddr+"/readyz")
	waitReady(t, "http://"+wMetrics+"/readyz")

	code, out, stderr := run(t, "eventsctl", env, "send", "--url", "http://"+httpAddr, "--id", "evt_e2e_1", "--times", "3")
	require.Equal(t, 0, code, stderr)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	require.Len(t, lines, 3)
	for _, l := range lines {
		assert.Regexp(t, `^(202 \{"status":"accepted","event_id":"evt_e2e_1"\}|200 \{"status":"duplicate","event_id":"evt_e2e_1"\})$`, l)
	}
	code, out, stderr = run(t, "eventsctl", env, "verify", "--id", "evt_e2e_1", "--expect", "1", "--timeout", "20s")
	require.Equal(t, 0, code, "%s%s", out, stderr)

	// Once processed, the receiver answers a redelivery as a duplicate.
	code, out, _ = run(t, "eventsctl", env, "send", "--url", "http://"+httpAddr, "--id", "evt_e2e_1")
	require.Equal(t, 0, code)
	assert.Equal(t, `200 {"status":"duplicate","event_id":"evt_e2e_1"}`, strings.TrimSpace(out))

	code, out, _ = run(t, "eventsctl", env, "send", "--url", "http://"+httpAddr, "--secret", "whsec_wrong")
	assert.Equal(t, 1, code)
	assert.Contains(t, out, "401 ")

	assert.Equal(t, 0, receiver.term(t, 15*time.Second), "receiver exits 0 on SIGTERM")
	assert.Equal(t, 0, worker.term(t, 15*time.Second), "worker exits 0 on SIGTERM")
	assert.Contains(t, worker.out.String(), "drained in-flight deliveries")
}
