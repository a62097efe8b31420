package app_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap/zaptest"

	"github.com/idempotent-events/idempotent-events/pkg/internal/app"
	"github.com/idempotent-events/idempotent-events/pkg/internal/config"
	"github.com/idempotent-events/idempotent-events/pkg/internal/event"
	"github.com/idempotent-events/idempotent-events/pkg/internal/receiver"
	"github.com/idempotent-events/idempotent-events/pkg/internal/servicetest"
	"github.com/idempotent-events/idempotent-events/pkg/internal/webhook"
)

// secretMount is a directory laid out as the kubelet mounts a Secret: the
// key a symlink through ..data to a timestamped directory, and an update a
// new directory and an atomic rename of ..data, the old one then removed.
type secretMount struct {
	t        *testing.T
	dir, key string
	n        int
}

func newSecretMount(t *testing.T, key, value string) *secretMount {
	m := &secretMount{t: t, dir: t.TempDir(), key: key}
	m.write(value)
	require.NoError(t, os.Symlink(filepath.Join("..data", key), filepath.Join(m.dir, key)))
	return m
}

func (m *secretMount) path() string { return filepath.Join(m.dir, m.key) }

func (m *secretMount) write(value string) {
	m.n++
	ts := fmt.Sprintf("..2026_01_01_00_00_%02d.%d", m.n, m.n)
	require.NoError(m.t, os.Mkdir(filepath.Join(m.dir, ts), 0o755))
	require.NoError(m.t, os.WriteFile(filepath.Join(m.dir, ts, m.key), []byte(value), 0o600))
	tmp := filepath.Join(m.dir, "..data_tmp")
	require.NoError(m.t, os.Symlink(ts, tmp))
	old, _ := os.Readlink(filepath.Join(m.dir, "..data"))
	require.NoError(m.t, os.Rename(tmp, filepath.Join(m.dir, "..data")))
	if old != "" {
		require.NoError(m.t, os.RemoveAll(filepath.Join(m.dir, old)))
	}
}

// The documented rotation under load, with the secrets in a mounted Secret
// (WEBHOOK_SECRETS_FILE) and no restart: a steady stream of validly signed
// deliveries runs while the file goes old -> old,new -> (the sender signs
// with new) -> new. Not one delivery is refused. Before the new secret is
// added it is refused, and once the old one is removed that one is: each
// step is really applied.
func TestWebhookSecretRotationUnderLoadWithoutARestart(t *testing.T) {
	const oldSecret, newSecret = "whsec_rotation_old", "whsec_rotation_new"
	mount := newSecretMount(t, "WEBHOOK_SECRETS", oldSecret+"\n")
	httpAddr, metricsAddr := servicetest.FreeAddr(), servicetest.FreeAddr()
	for k, v := range map[string]string{
		"AMQP_URL": servicetest.VHost(t), "DUPLICATE_CHECK": "off", "HTTP_ADDR": httpAddr, "METRICS_ADDR": metricsAddr,
		"WEBHOOK_SECRETS_FILE": mount.path(), "WEBHOOK_SECRETS_RELOAD_INTERVAL": "100ms",
	} {
		t.Setenv(k, v)
	}
	var cfg config.Receiver
	require.NoError(t, config.Load(&cfg))
	reg := prometheus.NewRegistry()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- app.RunReceiver(ctx, cfg, zaptest.NewLogger(t), reg) }()
	t.Cleanup(func() { cancel(); require.NoError(t, <-done) })
	require.NoError(t, servicetest.AwaitHTTP("http://"+httpAddr+"/readyz", http.StatusOK, 20*time.Second))

	url := "http://" + httpAddr + receiver.PaymentRoute
	client := &http.Client{Timeout: 10 * time.Second}
	defer client.CloseIdleConnections()
	var seq atomic.Int64
	send := func(secret string) (int, time.Duration) {
		body := event.Example{ID: fmt.Sprintf("evt_rot_%d_%d", time.Now().UnixNano(), seq.Add(1)), Type: "payment_intent.succeeded",
			AmountCents: 100, Currency: "usd", Status: "succeeded"}.JSON()
		req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(string(body)))
		if err != nil {
			return -1, 0 // counted as an answer that is not 202
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set(webhook.StripeHeader, webhook.SignStripe(secret, time.Now(), body))
		start := time.Now()
		resp, err := client.Do(req)
		if err != nil {
			return 0, time.Since(start)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode, time.Since(start)
	}
	gauge := func() float64 {
		return metricValue(t, reg, "idempotent_events_receiver_webhook_secrets", map[string]string{"source": event.DefaultSource})
	}
	awaitSecrets := func(n float64) time.Duration {
		start := time.Now()
		require.Eventually(t, func() bool { return gauge() == n }, 10*time.Second, 10*time.Millisecond, "the file's %v secrets were not put in force", n)
		return time.Since(start)
	}
	code, _ := send(newSecret)
	require.Equal(t, http.StatusUnauthorized, code, "the new secret is refused before it is added")

	// The load: senders at a steady pace, signing with the secret the
	// provider currently uses.
	var signing atomic.Value
	signing.Store(oldSecret)
	const senders, pace = 4, 10 * time.Millisecond // about 400 deliveries a second
	var (
		mu        sync.Mutex
		codes     = map[int]int{}
		latencies []time.Duration
	)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range senders {
		wg.Go(func() {
			tick := time.NewTicker(pace)
			defer tick.Stop()
			for {
				select {
				case <-stop:
					return
				case <-tick.C:
				}
				code, d := send(signing.Load().(string))
				mu.Lock()
				codes[code]++
				latencies = append(latencies, d)
				mu.Unlock()
			}
		})
	}
	start := time.Now()
	hold := func() { time.Sleep(time.Second) } // load at each step, not a wait for a condition

	hold()
	mount.write(oldSecret + "\n" + newSecret + "\n") // 1. add the new secret
	added := awaitSecrets(2)
	hold()
	signing.Store(newSecret) // 2. the provider switches to it
	hold()
	mount.write(newSecret + "\n") // 3. remove the old one
	removed := awaitSecrets(1)
	hold()
	close(stop)
	wg.Wait()
	elapsed := time.Since(start)

	code, _ = send(oldSecret)
	assert.Equal(t, http.StatusUnauthorized, code, "the old secret is refused once removed")

	total := 0
	for _, n := range codes {
		total += n
	}
	sort.Slice(latencies, func(i, j int) bool { return latencies[i] < latencies[j] })
	pct := func(p float64) time.Duration { return latencies[int(p*float64(len(latencies)-1))] }
	t.Logf("rotation under load: %d deliveries in %s (%.0f/s), answers %v, p50 %s, p99 %s; new secret in force %s after the file changed, old one gone %s after",
		total, elapsed.Round(time.Millisecond), float64(total)/elapsed.Seconds(), codes, pct(0.5).Round(time.Microsecond),
		pct(0.99).Round(time.Microsecond), added.Round(time.Millisecond), removed.Round(time.Millisecond))
	require.Greater(t, total, 200, "too little load to say anything")
	assert.Equal(t, map[int]int{http.StatusAccepted: total}, codes, "every validly signed delivery is accepted across the rotation")
	assert.Positive(t, metricValue(t, reg, "idempotent_events_receiver_signature_secret_matches_total",
		map[string]string{"source": event.DefaultSource, "secret_index": "1"}), "the new secret, second in the file, verified deliveries during the rotation")
}

// metricValue is the value of the counter or gauge name with labels.
func metricValue(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) float64 {
	t.Helper()
	families, err := reg.Gather()
	require.NoError(t, err)
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
	metrics:
		for _, m := range f.GetMetric() {
			for _, lp := range m.GetLabel() {
				if want, ok := labels[lp.GetName()]; ok && want != lp.GetValue() {
					continue metrics
				}
			}
			if m.GetGauge() != nil {
				return m.GetGauge().GetValue()
			}
			return m.GetCounter().GetValue()
		}
	}
	return 0
}
