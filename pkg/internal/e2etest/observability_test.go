package e2etest_test

import (
	"encoding/json"
	"os"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotent-events/idempotent-events/pkg/internal/admin"
	"github.com/idempotent-events/idempotent-events/pkg/internal/dlq"
	"github.com/idempotent-events/idempotent-events/pkg/internal/httpserver"
	"github.com/idempotent-events/idempotent-events/pkg/internal/outbox"
	"github.com/idempotent-events/idempotent-events/pkg/internal/queuestats"
	"github.com/idempotent-events/idempotent-events/pkg/internal/receiver"
	"github.com/idempotent-events/idempotent-events/pkg/internal/reconcile"
	"github.com/idempotent-events/idempotent-events/pkg/internal/retention"
	"github.com/idempotent-events/idempotent-events/pkg/internal/telemetry"
	"github.com/idempotent-events/idempotent-events/pkg/internal/webhooksecrets"
	"github.com/idempotent-events/idempotent-events/pkg/internal/worker"
)

// describer is a Registerer that only records what is registered on it.
type describer struct{ names map[string]bool }

var fqName = regexp.MustCompile(`fqName: "([^"]+)"`)

func (d *describer) Register(c prometheus.Collector) error {
	ch := make(chan *prometheus.Desc, 64)
	go func() { c.Describe(ch); close(ch) }()
	for desc := range ch {
		if m := fqName.FindStringSubmatch(desc.String()); m != nil {
			d.names[m[1]] = true
		}
	}
	return nil
}

func (d *describer) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		_ = d.Register(c)
	}
}

func (d *describer) Unregister(prometheus.Collector) bool { return false }

// exported returns every idempotent_events_* metric name the code registers.
func exported(t *testing.T) map[string]bool {
	t.Helper()
	d := &describer{names: map[string]bool{}}
	receiver.NewMetrics(d)
	httpserver.NewGuardMetrics(d, "receiver")
	webhooksecrets.NewMetrics(d)
	worker.NewMetrics(d)
	dlq.NewMetrics(d)
	admin.NewMetrics(d)
	outbox.NewMetrics(d)
	client, err := queuestats.New("http://127.0.0.1:1", "/")
	require.NoError(t, err)
	_, err = queuestats.NewCollector(queuestats.CollectorOptions{Registerer: d, Client: client, Interval: time.Minute})
	require.NoError(t, err)
	_ = d.Register(reconcile.NewCollector(nil, nil)) // Describe reads neither
	_ = d.Register(retention.NewCollector(nil, nil))
	_ = d.Register(telemetry.NewRegistry("test"))
	out := map[string]bool{}
	for n := range d.names {
		if strings.HasPrefix(n, telemetry.Namespace+"_") {
			out[n] = true
		}
	}
	require.NotEmpty(t, out)
	return out
}

var metricRef = regexp.MustCompile(`\bidempotent_events_[a-z_]+`)

// referenced returns the base metric names mentioned in text; histogram
// series suffixes are folded onto their metric.
func referenced(text string, known map[string]bool) map[string]bool {
	out := map[string]bool{}
	for _, m := range metricRef.FindAllString(text, -1) {
		for _, suffix := range []string{"_bucket", "_sum", "_count"} {
			if base := strings.TrimSuffix(m, suffix); base != m && known[base] {
				m = base
			}
		}
		out[m] = true
	}
	return out
}

// Every query of the dashboard and every alert names a metric the code
// really exports.
func TestDashboardAndAlertsUseOnlyExportedMetrics(t *testing.T) {
	t.Parallel()
	known := exported(t)

	raw, err := os.ReadFile("../../../charts/idempotent-events/dashboards/idempotent-events.json")
	require.NoError(t, err)
	var dash struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	require.NoError(t, json.Unmarshal(raw, &dash))
	queries := 0
	for _, p := range dash.Panels {
		for _, target := range p.Targets {
			queries++
			refs := referenced(target.Expr, known)
			assert.NotEmpty(t, refs, "panel %q: query names no idempotent_events metric: %s", p.Title, target.Expr)
			for m := range refs {
				assert.True(t, known[m], "panel %q uses %s, which the code does not export", p.Title, m)
			}
		}
	}
	assert.Greater(t, queries, 20)

	rules, err := os.ReadFile("../../../charts/idempotent-events/rules/idempotent-events.rules.yaml")
	require.NoError(t, err)
	var body []string
	for _, line := range strings.Split(string(rules), "\n") {
		if !strings.HasPrefix(strings.TrimSpace(line), "#") {
			body = append(body, line)
		}
	}
	for m := range referenced(strings.Join(body, "\n"), known) {
		assert.True(t, known[m], "alert rules use %s, which the code does not export", m)
	}
}

// hack/dashboardcheck/metrics.txt (used by the offline observability
// checks) lists exactly the metrics the code exports.
func TestMetricListMatchesTheCode(t *testing.T) {
	t.Parallel()
	raw, err := os.ReadFile("../../../hack/dashboardcheck/metrics.txt")
	require.NoError(t, err)
	var listed []string
	for _, line := range strings.Split(string(raw), "\n") {
		if f := strings.Fields(line); len(f) > 0 && !strings.HasPrefix(f[0], "#") {
			listed = append(listed, f[0])
		}
	}
	var code []string
	for n := range exported(t) {
		code = append(code, n)
	}
	sort.Strings(listed)
	sort.Strings(code)
	assert.Equal(t, code, listed)
}
