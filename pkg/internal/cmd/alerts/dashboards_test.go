package main

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestExpandSubstitutesEverySyntax(t *testing.T) {
	vals := map[string]string{"namespace": "prod"}
	got, unknown := expand(`sum(rate(x{namespace=~"$namespace",a="${namespace}",b="${namespace:regex}",c="[[namespace]]"}[$__rate_interval])) / $__interval_ms`,
		vals, time.Second, 4*time.Second, 5*time.Minute)
	assert.Equal(t, `sum(rate(x{namespace=~"prod",a="prod",b="prod",c="prod"}[4s])) / 1000`, got)
	assert.Empty(t, unknown)

	_, unknown = expand(`x{job="$job"}[$__range]`, vals, time.Second, 4*time.Second, time.Hour)
	assert.Equal(t, []string{"job"}, unknown)
}

func TestGrafanaInterval(t *testing.T) {
	i, r := grafanaInterval(time.Second, time.Second)
	assert.Equal(t, []time.Duration{time.Second, 4 * time.Second}, []time.Duration{i, r})
	i, r = grafanaInterval(30*time.Second, 15*time.Second)
	assert.Equal(t, []time.Duration{30 * time.Second, time.Minute}, []time.Duration{i, r})
}

func TestPromDurationAndSelection(t *testing.T) {
	assert.Equal(t, "1m30s", promDuration(90*time.Second))
	assert.Equal(t, "1d1h", promDuration(25*time.Hour))
	assert.Equal(t, "250ms", promDuration(250*time.Millisecond))
	assert.Equal(t, "a", selection([]string{"a"}))
	assert.Equal(t, `(a\.b|c)`, selection([]string{"c", "a.b"}))
}

func TestLoadShippedDashboards(t *testing.T) {
	files, err := filepath.Glob("../../../../charts/idempotent-events/dashboards/*.json")
	require.NoError(t, err)
	require.NotEmpty(t, files)
	for _, f := range files {
		d, err := loadDashboard(f)
		require.NoError(t, err, f)
		assert.NotEmpty(t, d.Title, f)
		for _, v := range d.Vars {
			if v.Type == "query" {
				_, _, ok := parseLabelValues(v.Query)
				assert.True(t, ok, "%s: variable %s: the suite resolves label_values(metric, label) queries only, got %q", f, v.Name, v.Query)
			}
		}
		for _, tg := range d.Targets {
			assert.NotEmpty(t, tg.Panel, "%s: panel %d has a title", f, tg.PanelID)
		}
	}
}
