package deploytest

import (
	"fmt"
	gomaps "maps"
	"strings"
	"testing"
)

// The outbox relay runs in the workers by default; with
// outbox.relay.mode=deployment it is a Deployment of its own running the
// worker binary with OUTBOX_RELAY=only, the workers get OUTBOX_RELAY=off,
// and every outbox value reaches both containers' environment (and, without
// -short, the worker binary accepts the relay's environment).
func TestOutboxRelayValuesReachTheContainers(t *testing.T) {
	def, err := renderChart(renderOpts{})
	if err != nil {
		t.Fatalf("render: %v", err)
	}
	if _, ok := def.find("Deployment", fullname+"-relay"); ok {
		t.Errorf("the default render has a relay Deployment; the relay runs in the workers by default")
	}
	env := envOf(t, def, "Deployment", fullname+"-worker", "worker")
	want := map[string]string{"OUTBOX_RELAY": "on", "OUTBOX_BATCH_SIZE": "100", "OUTBOX_POLL_INTERVAL": "1s",
		"OUTBOX_MAX_ATTEMPTS": "10", "OUTBOX_MAX_BACKOFF": "5m", "OUTBOX_RETENTION": "168h"}
	expectEnv(t, "default worker", env, want)

	set := map[string]any{
		"outbox": map[string]any{
			"relay":     map[string]any{"mode": "deployment", "batchSize": 250, "pollInterval": "2s", "maxAttempts": 7, "maxBackoff": "1m"},
			"retention": "72h",
			"deployment": map[string]any{"replicaCount": 2, "metricsPort": 9300,
				"extraEnv": []any{map[string]any{"name": "LOG_LEVEL", "value": "debug"}}, "podDisruptionBudget": map[string]any{"enabled": true}},
		},
		"networkPolicy": map[string]any{"enabled": true},
		"monitoring":    map[string]any{"serviceMonitor": map[string]any{"enabled": true}},
	}
	r, err := renderChart(renderOpts{set: set, apis: []string{apiMonitoring}})
	if err != nil {
		t.Fatalf("render: %v", err)
	}
	values := map[string]string{"OUTBOX_BATCH_SIZE": "250", "OUTBOX_POLL_INTERVAL": "2s", "OUTBOX_MAX_ATTEMPTS": "7",
		"OUTBOX_MAX_BACKOFF": "1m", "OUTBOX_RETENTION": "72h"}
	relay := envOf(t, r, "Deployment", fullname+"-relay", "relay")
	expectEnv(t, "relay", relay, mergeEnv(values, map[string]string{"OUTBOX_RELAY": "only", "METRICS_ADDR": ":9300", "LOG_LEVEL": "debug"}))
	expectEnv(t, "worker beside the relay", envOf(t, r, "Deployment", fullname+"-worker", "worker"), mergeEnv(values, map[string]string{"OUTBOX_RELAY": "off"}))

	d := r.mustFind(t, "Deployment", fullname+"-relay")
	if got := fmt.Sprint(dig(d.u.Object, "spec", "replicas")); got != "2" {
		t.Errorf("relay replicas %s, want 2", got)
	}
	svc := r.mustFind(t, "Service", fullname+"-relay-metrics")
	if got := fmt.Sprint(svc.u.Object["spec"].(map[string]any)["ports"].([]any)[0].(map[string]any)["port"]); got != "9300" {
		t.Errorf("relay metrics Service port %s, want 9300", got)
	}
	r.mustFind(t, "PodDisruptionBudget", fullname+"-relay")
	r.mustFind(t, "NetworkPolicy", fullname+"-relay")
	sm := r.mustFind(t, "ServiceMonitor", fullname)
	if got := fmt.Sprint(dig(sm.u.Object, "spec", "selector", "matchExpressions")); !strings.Contains(got, "relay") {
		t.Errorf("the ServiceMonitor does not select the relay's metrics Service: %s", got)
	}

	if testing.Short() {
		return
	}
	bin := buildCheckedBinaries(t)
	ran := runCheckConfig(t, r, bin, "outbox.relay.mode=deployment")
	if ran["worker"] != 2 {
		t.Errorf("worker --check-config ran for %d containers, want 2 (worker and relay)", ran["worker"])
	}
}

// envOf is the environment the kubelet would give container name of the
// workload kind/name in r.
func envOf(t *testing.T, r *rendering, kind, name, containerName string) map[string]string {
	t.Helper()
	o := r.mustFind(t, kind, name)
	tpl, _ := podTemplate(o)
	env, err := containerEnv(r, tpl, container(t, o, &tpl.Spec, containerName))
	if err != nil {
		t.Fatalf("%s container %s: %v", o, containerName, err)
	}
	return env
}

func expectEnv(t *testing.T, what string, env, want map[string]string) {
	t.Helper()
	for k, v := range want {
		if env[k] != v {
			t.Errorf("%s: %s=%q, want %q", what, k, env[k], v)
		}
	}
}

func mergeEnv(a, b map[string]string) map[string]string {
	m := gomaps.Clone(a)
	gomaps.Copy(m, b)
	return m
}
