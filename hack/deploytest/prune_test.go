package deploytest

import (
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// The prune CronJob is on by default; every prune value reaches its
// container, and a retention under the floor is caught by the contract
// check (eventsctl prune -check-config) though the schema's pattern lets it
// through.
func TestPruneValuesReachTheContainer(t *testing.T) {
	set := map[string]any{"prune": map[string]any{"schedule": "5 1 * * *", "ledgerRetention": "40d", "auditRetention": "400d", "archiveRetention": "20d",
		"batch": 777, "pause": "1500ms", "activeDeadlineSeconds": 999, "backoffLimit": 4}}
	r, err := renderChart(renderOpts{set: set})
	if err != nil {
		t.Fatalf("render: %v", err)
	}
	o := r.mustFind(t, "CronJob", fullname+"-prune")
	tpl, _ := podTemplate(o)
	c := container(t, o, &tpl.Spec, "prune")
	for _, want := range []string{"-ledger-retention=40d", "-audit-retention=400d", "-archive-retention=20d", "-batch=777", "-pause=1500ms"} {
		if !slices.Contains(c.Args, want) {
			t.Errorf("args %q lack %s", c.Args, want)
		}
	}
	spec := o.u.Object
	if got := dig(spec, "spec", "schedule"); got != "5 1 * * *" {
		t.Errorf("schedule %v", got)
	}
	if got := fmt.Sprint(dig(spec, "spec", "jobTemplate", "spec", "activeDeadlineSeconds")); got != "999" {
		t.Errorf("activeDeadlineSeconds %v", got)
	}
	if got := fmt.Sprint(dig(spec, "spec", "jobTemplate", "spec", "backoffLimit")); got != "4" {
		t.Errorf("backoffLimit %v", got)
	}
	if got := dig(spec, "spec", "concurrencyPolicy"); got != "Forbid" {
		t.Errorf("concurrencyPolicy %v", got)
	}

	// The default paces the prune (docs/performance.md: a full-rate drain
	// beside it kept 0.91 of its rate with 250ms, 0.68 without pause).
	def, err := renderChart(renderOpts{})
	if err != nil {
		t.Fatalf("render: %v", err)
	}
	dcj := def.mustFind(t, "CronJob", fullname+"-prune")
	dtpl, _ := podTemplate(dcj)
	if dc := container(t, dcj, &dtpl.Spec, "prune"); !slices.Contains(dc.Args, "-pause=250ms") {
		t.Errorf("default args %q lack -pause=250ms", dc.Args)
	}

	off, err := renderChart(renderOpts{set: map[string]any{"prune": map[string]any{"enabled": false}}})
	if err != nil {
		t.Fatalf("render: %v", err)
	}
	for _, cj := range off.ofKind("CronJob") {
		if strings.HasSuffix(cj.name(), "-prune") {
			t.Errorf("prune.enabled=false rendered %s", cj.name())
		}
	}

	if testing.Short() {
		return
	}
	bin := buildCheckedBinaries(t)
	short, err := renderChart(renderOpts{set: map[string]any{"prune": map[string]any{"ledgerRetention": "3d"}}})
	if err != nil {
		t.Fatalf("render: %v", err)
	}
	o = short.mustFind(t, "CronJob", fullname+"-prune")
	tpl, _ = podTemplate(o)
	c = container(t, o, &tpl.Spec, "prune")
	env, err := containerEnv(short, tpl, c)
	if err != nil {
		t.Fatal(err)
	}
	b, argv, _, err := binaryOf(short, c, env)
	if err != nil {
		t.Fatal(err)
	}
	code, stderr := checkConfig(t, filepath.Join(bin, strings.Fields(b)[0]), argv, env)
	if code != 2 || !strings.Contains(stderr, "Ledger") {
		t.Errorf("eventsctl prune -ledger-retention=3d -check-config: exit %d, stderr %q; want 2 naming Ledger", code, stderr)
	}
}
