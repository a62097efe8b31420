package webhooksecrets_test

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/idempotent-events/idempotent-events/pkg/internal/webhook"
	"github.com/idempotent-events/idempotent-events/pkg/internal/webhooksecrets"
)

func TestParseSplitsOnCommasAndLines(t *testing.T) {
	assert.Equal(t, []string{"whsec_a", "whsec_b", "whsec_c"}, webhooksecrets.Parse([]byte(" whsec_a,whsec_b\r\n\nwhsec_c , \n")))
	assert.Empty(t, webhooksecrets.Parse([]byte(" \n,\n")))
}

// A file that cannot be used is an error naming the path and the cause,
// never quoting the content.
func TestReadErrorsNameThePathNotTheContent(t *testing.T) {
	dir := t.TempDir()
	_, err := webhooksecrets.Read(filepath.Join(dir, "missing"))
	require.Error(t, err)
	assert.Contains(t, err.Error(), filepath.Join(dir, "missing"))

	blank := filepath.Join(dir, "blank")
	require.NoError(t, os.WriteFile(blank, []byte(" \n"), 0o600))
	_, err = webhooksecrets.Read(blank)
	require.ErrorIs(t, err, webhooksecrets.ErrEmpty)

	const canary = "cnrybigfile0123456789"
	big := filepath.Join(dir, "big")
	require.NoError(t, os.WriteFile(big, []byte(strings.Repeat(canary+",", 5000)), 0o600))
	_, err = webhooksecrets.Read(big)
	require.Error(t, err)
	assert.NotContains(t, err.Error(), canary)
}

// mount is a directory laid out as the kubelet mounts a Secret: every key
// a symlink through ..data to a timestamped directory, and an update a new
// directory and an atomic swap of ..data.
type mount struct {
	t   *testing.T
	dir string
	n   int
}

func newMount(t *testing.T, key, value string) (*mount, string) {
	m := &mount{t: t, dir: t.TempDir()}
	m.update(key, value)
	require.NoError(t, os.Symlink(filepath.Join("..data", key), filepath.Join(m.dir, key)))
	return m, filepath.Join(m.dir, key)
}

func (m *mount) update(key, value string) {
	m.n++
	ts := fmt.Sprintf("..2026_01_01_00_00_%02d.%d", m.n, m.n)
	require.NoError(m.t, os.Mkdir(filepath.Join(m.dir, ts), 0o755))
	require.NoError(m.t, os.WriteFile(filepath.Join(m.dir, ts, key), []byte(value), 0o600))
	tmp := filepath.Join(m.dir, "..data_tmp")
	require.NoError(m.t, os.Symlink(ts, tmp))
	old, _ := os.Readlink(filepath.Join(m.dir, "..data"))
	require.NoError(m.t, os.Rename(tmp, filepath.Join(m.dir, "..data")))
	if old != "" {
		require.NoError(m.t, os.RemoveAll(filepath.Join(m.dir, old)))
	}
}

// recorder is a Verifier that accepts exactly the requests whose
// X-Secret header names one of its secrets.
type recorder struct{ secrets []string }

func (r recorder) Scheme() string { return "test" }
func (r recorder) Verify(h http.Header, _ []byte) (int, error) {
	for i, s := range r.secrets {
		if h.Get("X-Secret") == s {
			return i, nil
		}
	}
	return -1, &webhook.Error{Reason: webhook.ReasonMismatch, Detail: "no match"}
}

// The rotation as operators run it, on a kubelet-style mount: old, then
// old and new, then new. Each step is in force after one Check; a refused
// step (an empty file, a secret the scheme cannot use) keeps the secrets in
// force, and is counted and logged without the content.
func TestWatcherFollowsAKubeletMountedRotation(t *testing.T) {
	m, path := newMount(t, "WEBHOOK_SECRETS", "whsec_old\n")
	sw := webhooksecrets.NewVerifier(recorder{})
	reg := prometheus.NewRegistry()
	core, logs := observer.New(zap.DebugLevel)
	w, err := webhooksecrets.NewWatcher(webhooksecrets.Options{
		Files: []webhooksecrets.File{{Source: "stripe", Var: "WEBHOOK_SECRETS_FILE", Path: path, Apply: func(s []string) error {
			for i, v := range s {
				if strings.Contains(v, "unusable") {
					return fmt.Errorf("secret %d is not whsec_<base64>", i+1)
				}
			}
			sw.Set(recorder{secrets: s})
			return nil
		}}},
		Interval: time.Hour, Logger: zap.New(core), Metrics: webhooksecrets.NewMetrics(reg),
	})
	require.NoError(t, err)
	accepts := func(secret string) bool {
		_, err := sw.Verify(http.Header{"X-Secret": {secret}}, nil)
		return err == nil
	}
	gauge := func() float64 {
		return value(t, reg, "idempotent_events_receiver_webhook_secrets", map[string]string{"source": "stripe"})
	}
	assert.True(t, accepts("whsec_old"))
	assert.False(t, accepts("whsec_new"))
	assert.Equal(t, 1.0, gauge())

	m.update("WEBHOOK_SECRETS", "whsec_old,whsec_new")
	w.Check()
	assert.True(t, accepts("whsec_old"))
	assert.True(t, accepts("whsec_new"))
	assert.Equal(t, 2.0, gauge())

	for _, bad := range []string{"", " \n", "whsec_new,cnryunusable01234"} {
		m.update("WEBHOOK_SECRETS", bad)
		w.Check()
		assert.True(t, accepts("whsec_old"), "after %q", bad)
		assert.True(t, accepts("whsec_new"), "after %q", bad)
	}
	assert.Equal(t, 2.0, gauge())

	m.update("WEBHOOK_SECRETS", "whsec_new\n")
	w.Check()
	assert.False(t, accepts("whsec_old"))
	assert.True(t, accepts("whsec_new"))
	assert.Equal(t, 1.0, gauge())

	assert.Equal(t, 2.0, counter(t, reg, "stripe", webhooksecrets.ResultApplied))
	assert.Equal(t, 3.0, counter(t, reg, "stripe", webhooksecrets.ResultRefused))
	for _, e := range logs.All() {
		line := e.Message + fmt.Sprint(e.ContextMap())
		for _, secret := range []string{"whsec_old", "whsec_new", "cnryunusable01234"} {
			assert.NotContains(t, line, secret)
		}
	}
	assert.Equal(t, 3, logs.FilterMessage("webhook secrets file not applied; the secrets in force are kept").Len())
}

func counter(t *testing.T, reg *prometheus.Registry, source, result string) float64 {
	t.Helper()
	return value(t, reg, "idempotent_events_receiver_webhook_secrets_reloads_total", map[string]string{"source": source, "result": result})
}

func value(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) float64 {
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
				if labels[lp.GetName()] != lp.GetValue() {
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

// A file that cannot be put in force at the start is an error naming the
// variable: the receiver refuses to start as for any bad setting.
func TestNewWatcherNamesTheVariableOfABadFile(t *testing.T) {
	dir := t.TempDir()
	_, err := webhooksecrets.NewWatcher(webhooksecrets.Options{Interval: time.Second, Files: []webhooksecrets.File{
		{Source: "shop", Var: "WEBHOOK_SECRETS_SHOP_FILE", Path: filepath.Join(dir, "nope"), Apply: func([]string) error { return nil }},
	}})
	var ferr *webhooksecrets.Error
	require.ErrorAs(t, err, &ferr)
	assert.Equal(t, "WEBHOOK_SECRETS_SHOP_FILE", ferr.Var)
}

// Requests verified while the secrets are swapped see one set or the
// other, whole: a request signed with the secret both sets share never
// fails. Run with -race to check the swap itself.
func TestVerifierSwapIsAtomicUnderConcurrentRequests(t *testing.T) {
	body := []byte(`{"id":"evt_1"}`)
	tol := 5 * time.Minute
	sw := webhooksecrets.NewVerifier(webhook.NewStripeVerifier([]string{"whsec_a", "whsec_shared"}, tol))
	var failures atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for i := 0; i < 4; i++ {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				h := http.Header{webhook.StripeHeader: {webhook.SignStripe("whsec_shared", time.Now(), body)}}
				if _, err := sw.Verify(h, body); err != nil {
					failures.Add(1)
				}
			}
		})
	}
	for i := 0; i < 2000; i++ {
		if i%2 == 0 {
			sw.Set(webhook.NewStripeVerifier([]string{"whsec_shared", "whsec_b"}, tol))
		} else {
			sw.Set(webhook.NewStripeVerifier([]string{"whsec_a", "whsec_shared"}, tol))
		}
	}
	close(stop)
	wg.Wait()
	assert.Zero(t, failures.Load())
	assert.Equal(t, webhook.SchemeStripe, sw.Scheme())
}
