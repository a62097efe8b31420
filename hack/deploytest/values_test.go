package deploytest

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"helm.sh/helm/v4/pkg/chart/common"
	"helm.sh/helm/v4/pkg/chart/common/util"
	chartutil "helm.sh/helm/v4/pkg/chart/v2/util"
	"helm.sh/helm/v4/pkg/engine"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
)

// TestSchemaRejectsBadValues: values.schema.json (and the subcharts' schemas)
// turn misspelled keys and wrong types into install errors.
func TestSchemaRejectsBadValues(t *testing.T) {
	cases := []struct {
		name string
		set  map[string]any
		want []string // all must appear in the error
	}{
		{"misspelled top-level key", map[string]any{"reciever": map[string]any{}}, []string{"reciever"}},
		{"misspelled nested key", map[string]any{"worker": map[string]any{"replicaCont": 3}}, []string{"replicaCont"}},
		{"misspelled autoscaling key", map[string]any{"worker": map[string]any{"autoscaling": map[string]any{"maxReplica": 3}}}, []string{"maxReplica"}},
		{"misspelled subchart key", map[string]any{"rabbitmq": map[string]any{"auth": map[string]any{"pasword": "x"}}}, []string{"pasword"}},
		{"wrong type: string for integer", map[string]any{"receiver": map[string]any{"replicaCount": "two"}}, []string{"replicaCount"}},
		{"wrong type: integer for boolean", map[string]any{"migration": map[string]any{"enabled": 1}}, []string{"enabled"}},
		{"wrong type: port out of range", map[string]any{"receiver": map[string]any{"port": 70000}}, []string{"port"}},
		{"invalid enum", map[string]any{"config": map[string]any{"queueType": "stream"}}, []string{"queueType"}},
		{"duplicate check as a boolean", map[string]any{"receiver": map[string]any{"config": map[string]any{"duplicateCheck": true}}}, []string{"duplicateCheck"}},
		{"invalid duration", map[string]any{"receiver": map[string]any{"config": map[string]any{"publishTimeout": "5 seconds"}}}, []string{"publishTimeout"}},
		{"invalid autoscaling mode", map[string]any{"worker": map[string]any{"autoscaling": map[string]any{"mode": "vpa"}}}, []string{"mode"}},
		{"URL-unsafe bundled password", map[string]any{"postgresql": map[string]any{"auth": map[string]any{"password": "p@ss/word"}}}, []string{"password"}},
		{"unknown key under admin", map[string]any{"admin": map[string]any{"tokn": "0123456789abcdef"}}, []string{"tokn"}},
		{"admin token shorter than 16", map[string]any{"admin": map[string]any{"enabled": true, "token": "short-token"}}, []string{"token"}},
		{"admin token with a trailing newline", map[string]any{"admin": map[string]any{"enabled": true, "token": "0123456789abcdef\n"}}, []string{"token"}},
		{"admin replay rate zero", map[string]any{"admin": map[string]any{"replayRate": 0}}, []string{"replayRate"}},
		{"admin session TTL not a duration", map[string]any{"admin": map[string]any{"sessionTtl": "8 hours"}}, []string{"sessionTtl"}},
		{"unknown admin service key", map[string]any{"admin": map[string]any{"service": map[string]any{"type": "LoadBalancer"}}}, []string{"type"}},
		{"bad webhook source scheme", withSources(map[string]any{"name": "shop", "scheme": "hmac", "secrets": []any{"s3cret"}}), []string{"scheme"}},
		{"webhook source named payment", withSources(map[string]any{"name": "payment", "scheme": "stripe", "secrets": []any{"whsec_x"}}), []string{"name"}},
		{"webhook source name with upper case", withSources(map[string]any{"name": "Shop_1", "scheme": "github", "secrets": []any{"s3cret"}}), []string{"name"}},
		{"unknown key in a webhook source", withSources(map[string]any{"name": "shop", "scheme": "github", "secret": "s3cret"}), []string{"secret"}},
		{"webhook source without secrets", withSources(map[string]any{"name": "shop", "scheme": "github"}), []string{"sources"}},
		{"webhook source secret with a comma", withSources(map[string]any{"name": "shop", "scheme": "github", "secrets": []any{"a,b"}}), []string{"secrets"}},
		{"standard source secret not base64", withSources(map[string]any{"name": "shop", "scheme": "standard", "secrets": []any{"whsec_not base64!"}}), []string{"secrets"}},
		{"paypal source secret not a webhook id", withSources(map[string]any{"name": "pp", "scheme": "paypal", "secrets": []any{"WH-not-an-id"}}), []string{"secrets"}},
		{"paypal cert host with a scheme", map[string]any{"webhook": map[string]any{"paypal": map[string]any{"certHosts": []any{"https://api.paypal.com"}}}}, []string{"certHosts"}},
		{"adminFrom not a list", map[string]any{"networkPolicy": map[string]any{"adminFrom": "ops"}}, []string{"adminFrom"}},
		{"Stripe key as a value", withReconcile(map[string]any{"stripe": map[string]any{"existingSecret": "s", "apiKey": "rk_live_x"}}), []string{"apiKey"}},
		{"more than 20 reconcile types", withReconcile(map[string]any{"types": manyTypes(21)}), []string{"types"}},
		{"reconcile type with a comma", withReconcile(map[string]any{"types": []any{"charge.succeeded,charge.refunded"}}), []string{"types"}},
		{"reconcile since not a duration", withReconcile(map[string]any{"since": "3 days"}), []string{"since"}},
		{"reconcile rate zero", withReconcile(map[string]any{"rate": 0}), []string{"rate"}},
		{"reconcile rate above Stripe's limit", withReconcile(map[string]any{"rate": 250}), []string{"rate"}},
		{"reconcile schedule of four fields", withReconcile(map[string]any{"schedule": "17 * * *"}), []string{"schedule"}},
		{"reconcile API URL without a scheme", withReconcile(map[string]any{"apiURL": "api.stripe.com"}), []string{"apiURL"}},
		{"reconcile startingDeadlineSeconds under 10", withReconcile(map[string]any{"startingDeadlineSeconds": 5}), []string{"startingDeadlineSeconds"}},
		{"reconcile undeliveredOnly as a string", withReconcile(map[string]any{"undeliveredOnly": "yes"}), []string{"undeliveredOnly"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := renderChart(renderOpts{set: c.set})
			if err == nil {
				t.Fatalf("values %v were accepted", c.set)
			}
			if !strings.Contains(err.Error(), "values don't meet the specifications of the schema") {
				t.Errorf("not a schema error: %v", err)
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error does not name %q: %v", w, err)
				}
			}
		})
	}
}

// TestTemplateRejectsInconsistentValues covers the checks that the schema
// cannot express, done by the chart's validate helper and required().
func TestTemplateRejectsInconsistentValues(t *testing.T) {
	cases := []struct {
		name string
		set  map[string]any
		apis []string
		want string
	}{
		{"min above max", map[string]any{"worker": map[string]any{"autoscaling": map[string]any{"enabled": true, "minReplicas": 5, "maxReplicas": 2}}}, nil, "minReplicas must not be greater"},
		{"hpa to zero", map[string]any{"worker": map[string]any{"autoscaling": map[string]any{"enabled": true, "minReplicas": 0}}}, nil, "at least 1 in hpa mode"},
		{"no database at all", map[string]any{"postgresql": map[string]any{"enabled": false}}, nil, "DATABASE_URL"},
		{"no broker at all", map[string]any{"rabbitmq": map[string]any{"enabled": false}}, nil, "AMQP_URL"},
		{"keda http without URL secret", map[string]any{
			"rabbitmq":         map[string]any{"enabled": false},
			"externalRabbitmq": map[string]any{"url": "amqp://x"},
			"worker":           map[string]any{"autoscaling": map[string]any{"enabled": true, "mode": "keda", "keda": map[string]any{"protocol": "http"}}},
		}, []string{apiKEDA}, "managementUrlSecret"},
		{"admin without a token", map[string]any{"admin": map[string]any{"enabled": true}}, nil, "admin.token"},
		{"admin on the metrics port", map[string]any{"admin": map[string]any{"enabled": true, "token": "0123456789abcdef", "port": 9091}}, nil, "admin.port must differ"},
		{"reconcile without a Secret for the Stripe key", withReconcile(map[string]any{"enabled": true}), nil, "reconcile.stripe.existingSecret"},
		{"webhook source listed twice", withSources(
			map[string]any{"name": "shop", "scheme": "github", "secrets": []any{"a"}},
			map[string]any{"name": "shop", "scheme": "standard", "existingSecret": "shop"},
		), nil, "listed twice"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := renderChart(renderOpts{set: c.set, apis: c.apis})
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("want an error containing %q, got %v", c.want, err)
			}
		})
	}
}

// TestStrictRenderCatchesMissingKeys shows the render is strict: a template
// that reads a key absent from values.yaml (a typo) fails instead of
// rendering an empty value, which `helm lint --strict` lets through.
func TestStrictRenderCatchesMissingKeys(t *testing.T) {
	ch, err := loadChart()
	if err != nil {
		t.Fatal(err)
	}
	ch.Templates = append(ch.Templates, &common.File{
		Name: "templates/typo.yaml",
		Data: []byte("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: typo\ndata:\n  x: {{ .Values.worker.replicaCont | quote }}\n"),
	})
	vals, err := readValues(nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := chartutil.ProcessDependencies(ch, vals); err != nil {
		t.Fatal(err)
	}
	top, err := util.ToRenderValues(ch, vals, common.ReleaseOptions{Name: releaseName, Namespace: namespace, IsInstall: true, Revision: 1}, capabilities(nil))
	if err != nil {
		t.Fatal(err)
	}
	_, err = engine.Engine{Strict: true}.Render(ch, top)
	if err == nil || !strings.Contains(err.Error(), "replicaCont") {
		t.Fatalf("want a missing-key error for replicaCont, got %v", err)
	}
}

// TestShutdownTimingFollowsValues: SHUTDOWN_TIMEOUT, the preStop sleep and
// terminationGracePeriodSeconds come from the same values and move together.
func TestShutdownTimingFollowsValues(t *testing.T) {
	for _, comp := range []string{"receiver", "worker"} {
		t.Run(comp, func(t *testing.T) {
			r, err := renderChart(renderOpts{set: map[string]any{comp: map[string]any{"shutdown": map[string]any{
				"timeoutSeconds": 45, "preStopSleepSeconds": 10, "graceMarginSeconds": 7,
			}}}})
			if err != nil {
				t.Fatal(err)
			}
			d := r.mustFind(t, "Deployment", fullname+"-"+comp).obj.(*appsv1.Deployment)
			c := d.Spec.Template.Spec.Containers[0]
			if v, _ := env(c, "SHUTDOWN_TIMEOUT"); v.Value != "45s" {
				t.Errorf("SHUTDOWN_TIMEOUT %q, want 45s", v.Value)
			}
			if c.Lifecycle == nil || c.Lifecycle.PreStop == nil || c.Lifecycle.PreStop.Sleep == nil || c.Lifecycle.PreStop.Sleep.Seconds != 10 {
				t.Errorf("preStop %+v, want sleep 10s", c.Lifecycle)
			}
			if g := d.Spec.Template.Spec.TerminationGracePeriodSeconds; g == nil || *g != 62 {
				t.Errorf("terminationGracePeriodSeconds %v, want 10+45+7=62", g)
			}
		})
	}
}

// TestMigrationHookOnUpgrade: with the bundled database the install-time
// migration Job is ordinary, and upgrades run it as a pre-upgrade hook.
func TestMigrationHookOnUpgrade(t *testing.T) {
	r, err := renderChart(renderOpts{upgrade: true})
	if err != nil {
		t.Fatal(err)
	}
	o := r.mustFind(t, "Job", fullname+"-migrate")
	if !isHook(o, "pre-upgrade") {
		t.Errorf("%s: not a pre-upgrade hook on upgrade", o)
	}
	if _, ok := r.find("Job", fullname+"-migrate-install"); ok {
		t.Error("install-time migration Job rendered on upgrade")
	}
}

// TestExternalURLSecret: URLs given as values land in the chart's Secret and
// the migration hook gets its own pre-install copy of DATABASE_URL.
func TestExternalURLSecret(t *testing.T) {
	r, err := renderChart(renderOpts{valueFiles: []string{filepath.Join(chartDir, "ci", "external-urls-values.yaml")}})
	if err != nil {
		t.Fatal(err)
	}
	s := r.mustFind(t, "Secret", fullname).obj.(*corev1.Secret)
	for _, k := range []string{"WEBHOOK_SECRETS", "AMQP_URL", "REDIS_URL", "DATABASE_URL"} {
		if s.StringData[k] == "" {
			t.Errorf("chart Secret has no %s", k)
		}
	}
	hs := r.mustFind(t, "Secret", fullname+"-migration")
	if !isHook(hs, "pre-install") || hs.obj.(*corev1.Secret).StringData["DATABASE_URL"] != s.StringData["DATABASE_URL"] {
		t.Errorf("%s: want a pre-install hook copy of DATABASE_URL", hs)
	}
	for _, sub := range []string{"rabbitmq", "redis", "postgresql"} {
		if _, ok := r.find("Secret", releaseName+"-"+sub); ok {
			t.Errorf("subchart %s rendered though disabled", sub)
		}
	}
}

// TestValuesDocumented: every key of values.yaml (this chart's and the
// subcharts') has a "# --" comment, helm-docs style; groups of documented
// keys may go without.
func TestValuesDocumented(t *testing.T) {
	files := []string{filepath.Join(chartDir, "values.yaml")}
	subs, _ := filepath.Glob(filepath.Join(chartDir, "charts", "*", "values.yaml"))
	files = append(files, subs...)
	keyRe := regexp.MustCompile(`^(\s*)([A-Za-z_][A-Za-z0-9_]*):(.*)$`)
	for _, f := range files {
		t.Run(filepath.Base(filepath.Dir(f)), func(t *testing.T) {
			fh, err := os.Open(f)
			if err != nil {
				t.Fatal(err)
			}
			defer fh.Close()
			var lines []string
			sc := bufio.NewScanner(fh)
			for sc.Scan() {
				lines = append(lines, sc.Text())
			}
			n := 0
			for i, l := range lines {
				m := keyRe.FindStringSubmatch(l)
				if m == nil {
					continue
				}
				indent, rest := m[1], strings.TrimSpace(m[3])
				// Keys inside a documented value (a default map or list) are data.
				if insideValue(lines, i, len(indent)) {
					continue
				}
				n++
				isGroup := rest == "" && i+1 < len(lines) && childIndent(lines[i+1]) > len(indent) && !strings.HasPrefix(strings.TrimSpace(lines[i+1]), "-")
				if isGroup {
					continue
				}
				if !documented(lines, i) {
					t.Errorf("%s:%d: key %q has no \"# --\" comment", filepath.Base(f), i+1, m[2])
				}
			}
			if n == 0 {
				t.Fatal("no keys found")
			}
			t.Logf("%d keys checked", n)
		})
	}
}

func childIndent(l string) int {
	return len(l) - len(strings.TrimLeft(l, " "))
}

// documented: the nearest comment block above line i contains "# --".
func documented(lines []string, i int) bool {
	for j := i - 1; j >= 0; j-- {
		l := strings.TrimSpace(lines[j])
		if !strings.HasPrefix(l, "#") {
			return false
		}
		if strings.HasPrefix(l, "# --") {
			return true
		}
	}
	return false
}

// insideValue: some ancestor key of line i is itself a documented leaf
// value (e.g. a default securityContext map), so line i is data.
func insideValue(lines []string, i, indent int) bool {
	for j := i - 1; j >= 0 && indent > 0; j-- {
		l := lines[j]
		if strings.TrimSpace(l) == "" || strings.HasPrefix(strings.TrimSpace(l), "#") {
			continue
		}
		ind := childIndent(l)
		if ind < indent {
			if strings.HasPrefix(strings.TrimSpace(l), "-") {
				return true // list item
			}
			if documented(lines, j) {
				return true
			}
			indent = ind
		}
	}
	return false
}

// withSources is the values that configure the given webhook.sources.
func withSources(sources ...map[string]any) map[string]any {
	list := make([]any, len(sources))
	for i, src := range sources {
		list[i] = src
	}
	return map[string]any{"webhook": map[string]any{"sources": list}}
}

// withReconcile is the values that set reconcile.* to r.
func withReconcile(r map[string]any) map[string]any {
	return map[string]any{"reconcile": r}
}

// manyTypes is n distinct Stripe-shaped event types.
func manyTypes(n int) []any {
	out := make([]any, n)
	for i := range out {
		out[i] = fmt.Sprintf("test.event_%d", i)
	}
	return out
}
