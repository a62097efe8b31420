package deploytest

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// The worker's admin server (DLQ API and page, values admin.*) and the
// receiver's extra webhook sources (webhook.sources): property checks run on
// every scenario by checkRendering, and tests of the cases no scenario shows.

const adminScenario = "admin-sources-values.yaml"

// num reads a number from values: float64 from YAML files, int from the
// tests' Go maps.
func num(v any) float64 {
	switch n := v.(type) {
	case float64:
		return n
	case int:
		return float64(n)
	case int64:
		return float64(n)
	}
	panic(fmt.Sprintf("not a number: %T %v", v, v))
}

// webhookSource is one item of webhook.sources.
type webhookSource struct {
	name, scheme                      string
	secrets                           []string
	existingSecret, existingSecretKey string
}

// secretsVar is the variable pkg/config reads the source's secrets from.
func (s webhookSource) secretsVar() string {
	return "WEBHOOK_SECRETS_" + strings.ToUpper(strings.ReplaceAll(s.name, "-", "_"))
}

func webhookSources(r *rendering) []webhookSource {
	items, _ := dig(r.values, "webhook", "sources").([]any)
	out := make([]webhookSource, 0, len(items))
	for _, it := range items {
		m := valuesMap(it)
		s := webhookSource{}
		s.name, _ = m["name"].(string)
		s.scheme, _ = m["scheme"].(string)
		s.existingSecret, _ = m["existingSecret"].(string)
		s.existingSecretKey, _ = m["existingSecretKey"].(string)
		if list, ok := m["secrets"].([]any); ok {
			for _, x := range list {
				s.secrets = append(s.secrets, fmt.Sprint(x))
			}
		}
		if list, ok := m["secrets"].([]string); ok {
			s.secrets = list
		}
		out = append(out, s)
	}
	return out
}

// chartSecret is the chart's own Secret, if rendered.
func chartSecret(r *rendering) (*corev1.Secret, bool) {
	o, ok := r.find("Secret", fullname)
	if !ok {
		return nil, false
	}
	return o.obj.(*corev1.Secret), true
}

// notInPlainSight: a secret value appears in no ConfigMap (key or value) and
// in no literal env value of any container of the release; and no ConfigMap
// has a key named like the variable that should carry it.
func notInPlainSight(t *testing.T, r *rendering, what, varName, value string) {
	t.Helper()
	for _, o := range r.ofKind("ConfigMap") {
		cm := o.obj.(*corev1.ConfigMap)
		for k, v := range cm.Data {
			if k == varName {
				t.Errorf("%s: ConfigMap key %s (%s must come from a Secret)", o, k, what)
			}
			if value != "" && strings.Contains(v, value) {
				t.Errorf("%s: key %s holds %s", o, k, what)
			}
		}
		if _, ok := cm.BinaryData[varName]; ok {
			t.Errorf("%s: binaryData key %s (%s must come from a Secret)", o, varName, what)
		}
	}
	for _, o := range r.objects {
		tpl, _ := podTemplate(o)
		if tpl == nil {
			continue
		}
		for _, c := range append(slices.Clone(tpl.Spec.InitContainers), tpl.Spec.Containers...) {
			for _, e := range c.Env {
				if value != "" && strings.Contains(e.Value, value) {
					t.Errorf("%s container %s: env %s holds %s as a literal value", o, c.Name, e.Name, what)
				}
			}
		}
	}
}

// portCovers: a NetworkPolicy port list (empty = all ports) admits the
// container port name/number.
func portCovers(ports []networkingv1.NetworkPolicyPort, name string, number int32) bool {
	if len(ports) == 0 {
		return true
	}
	for _, p := range ports {
		if p.Port == nil {
			return true
		}
		if p.Port.StrVal == name || (p.Port.StrVal == "" && p.Port.IntVal == number) {
			return true
		}
	}
	return false
}

// checkAdmin: with admin.enabled the worker runs the admin server with every
// ADMIN_* variable from the values and ADMIN_TOKEN from a Secret, exposes it
// on a port named admin behind a ClusterIP Service that no Ingress routes to,
// and the NetworkPolicy admits that port only from networkPolicy.adminFrom;
// without it none of that exists. The token is never in a ConfigMap.
func checkAdmin(t *testing.T, r *rendering) {
	t.Helper()
	adm := valuesMap(dig(r.values, "admin"))
	enabled := adm["enabled"] == true
	token, _ := adm["token"].(string)
	existing, _ := adm["existingSecret"].(string)
	notInPlainSight(t, r, "the admin token", "ADMIN_TOKEN", token)

	wo := r.mustFind(t, "Deployment", fullname+"-worker")
	wd := wo.obj.(*appsv1.Deployment)
	wc := container(t, wo, &wd.Spec.Template.Spec, "worker")
	ro := r.mustFind(t, "Deployment", fullname+"-receiver")
	rc := container(t, ro, &ro.obj.(*appsv1.Deployment).Spec.Template.Spec, "receiver")
	for _, e := range rc.Env {
		if strings.HasPrefix(e.Name, "ADMIN_") {
			t.Errorf("%s: env %s (the admin server runs in the worker)", ro, e.Name)
		}
	}
	svc, hasSvc := r.find("Service", fullname+"-worker-admin")
	sec, hasSec := chartSecret(r)

	if !enabled {
		for _, e := range wc.Env {
			if strings.HasPrefix(e.Name, "ADMIN_") {
				t.Errorf("%s: env %s though admin.enabled is false", wo, e.Name)
			}
		}
		if hasNamedPort(&wd.Spec.Template, "admin") {
			t.Errorf("%s: admin port though admin.enabled is false", wo)
		}
		if hasSvc {
			t.Errorf("%s rendered though admin.enabled is false", svc)
		}
		if hasSec && secretKeys(r.mustFind(t, "Secret", fullname))["ADMIN_TOKEN"] {
			t.Errorf("chart Secret has ADMIN_TOKEN though admin.enabled is false")
		}
		return
	}

	// ADMIN_TOKEN: a secretKeyRef to the existing Secret or the chart's own.
	te, ok := env(wc, "ADMIN_TOKEN")
	switch {
	case !ok:
		t.Errorf("%s: no ADMIN_TOKEN (the admin server would be off)", wo)
	case te.Value != "" || te.ValueFrom == nil || te.ValueFrom.SecretKeyRef == nil:
		t.Errorf("%s: ADMIN_TOKEN must come from a secretKeyRef, got %+v", wo, te)
	case existing != "":
		ref := te.ValueFrom.SecretKeyRef
		if ref.Name != existing || ref.Key != adm["existingSecretKey"] {
			t.Errorf("%s: ADMIN_TOKEN from %s/%s, want admin.existingSecret %s/%v", wo, ref.Name, ref.Key, existing, adm["existingSecretKey"])
		}
		if hasSec && secretKeys(r.mustFind(t, "Secret", fullname))["ADMIN_TOKEN"] {
			t.Errorf("chart Secret has ADMIN_TOKEN though admin.existingSecret is set")
		}
	default:
		ref := te.ValueFrom.SecretKeyRef
		if ref.Name != fullname || ref.Key != "ADMIN_TOKEN" {
			t.Errorf("%s: ADMIN_TOKEN from %s/%s, want the chart's Secret", wo, ref.Name, ref.Key)
		}
		if !hasSec || sec.StringData["ADMIN_TOKEN"] != token {
			t.Errorf("chart Secret does not hold admin.token as ADMIN_TOKEN")
		}
	}
	if len(token) > 0 && len(token) < 16 {
		t.Errorf("admin.token shorter than 16 characters was accepted")
	}

	// The other ADMIN_* variables follow the values (and pass pkg/config's ranges).
	port := int32(num(adm["port"]))
	want := map[string]string{
		"ADMIN_ADDR":           fmt.Sprintf(":%d", port),
		"ADMIN_OPERATOR":       fmt.Sprint(adm["operator"]),
		"ADMIN_DLQ_SCAN_LIMIT": strconv.Itoa(int(num(adm["dlqScanLimit"]))),
		"ADMIN_SESSION_TTL":    fmt.Sprint(adm["sessionTtl"]),
	}
	for k, v := range want {
		if e, ok := env(wc, k); !ok || e.Value != v {
			t.Errorf("%s: %s = %q, want %q", wo, k, e.Value, v)
		}
	}
	if e, _ := env(wc, "ADMIN_REPLAY_RATE"); e.Value == "" {
		t.Errorf("%s: no ADMIN_REPLAY_RATE", wo)
	} else if f, err := strconv.ParseFloat(e.Value, 64); err != nil || f != num(adm["replayRate"]) || f <= 0 || f > 10000 {
		t.Errorf("%s: ADMIN_REPLAY_RATE %q, want %v", wo, e.Value, adm["replayRate"])
	}
	if e, _ := env(wc, "ADMIN_SESSION_TTL"); e.Value != "" {
		if d, err := time.ParseDuration(e.Value); err != nil || d < time.Minute || d > 168*time.Hour {
			t.Errorf("%s: ADMIN_SESSION_TTL %q is not a duration between 1m and 168h", wo, e.Value)
		}
	}
	var adminPort *corev1.ContainerPort
	for i, p := range wc.Ports {
		if p.Name == "admin" {
			adminPort = &wc.Ports[i]
		}
	}
	if adminPort == nil || adminPort.ContainerPort != port || adminPort.Protocol != corev1.ProtocolTCP {
		t.Errorf("%s: want container port admin = %d/TCP, got %v", wo, port, wc.Ports)
	}

	// The Service: ClusterIP, port admin -> the worker's container port admin.
	if !hasSvc {
		t.Fatalf("no admin Service %s-worker-admin rendered; have %s", fullname, r.summary())
	}
	s := svc.obj.(*corev1.Service)
	if s.Spec.Type != corev1.ServiceTypeClusterIP {
		t.Errorf("%s: type %s, want ClusterIP (never exposed outside the cluster)", svc, s.Spec.Type)
	}
	if len(s.Spec.Ports) != 1 || s.Spec.Ports[0].Name != "admin" || s.Spec.Ports[0].TargetPort.StrVal != "admin" ||
		float64(s.Spec.Ports[0].Port) != num(dig(r.values, "admin", "service", "port")) || s.Spec.Ports[0].NodePort != 0 {
		t.Errorf("%s: ports %+v, want one port admin targeting the container port admin", svc, s.Spec.Ports)
	}
	if !labels.SelectorFromSet(s.Spec.Selector).Matches(labels.Set(wd.Spec.Template.Labels)) {
		t.Errorf("%s: selector %v does not select the worker pods", svc, s.Spec.Selector)
	}
	for _, ing := range r.ofKind("Ingress") {
		for _, rule := range ing.obj.(*networkingv1.Ingress).Spec.Rules {
			for _, p := range rule.HTTP.Paths {
				if p.Backend.Service != nil && (p.Backend.Service.Name == s.Name || p.Backend.Service.Port.Name == "admin") {
					t.Errorf("%s: path %s exposes the admin server", ing, p.Path)
				}
			}
		}
		if b := ing.obj.(*networkingv1.Ingress).Spec.DefaultBackend; b != nil && b.Service != nil && b.Service.Name == s.Name {
			t.Errorf("%s: default backend is the admin server", ing)
		}
	}

	// NetworkPolicy: the admin port only from networkPolicy.adminFrom; with
	// no peers, from nowhere.
	if dig(r.values, "networkPolicy", "enabled") == true {
		np := r.mustFind(t, "NetworkPolicy", fullname+"-worker").obj.(*networkingv1.NetworkPolicy)
		var wantFrom []networkingv1.NetworkPolicyPeer
		raw, err := json.Marshal(dig(r.values, "networkPolicy", "adminFrom"))
		if err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(raw, &wantFrom); err != nil {
			t.Fatalf("networkPolicy.adminFrom: %v", err)
		}
		admitted := 0
		for _, rule := range np.Spec.Ingress {
			if !portCovers(rule.Ports, "admin", port) {
				continue
			}
			admitted++
			if len(rule.From) == 0 {
				t.Errorf("NetworkPolicy %s admits the admin port from everyone: %+v", np.Name, rule)
			} else if !reflect.DeepEqual(rule.From, wantFrom) {
				t.Errorf("NetworkPolicy %s admits the admin port from %+v, want networkPolicy.adminFrom %+v", np.Name, rule.From, wantFrom)
			}
		}
		if len(wantFrom) > 0 && admitted != 1 {
			t.Errorf("NetworkPolicy %s: %d rules admit the admin port, want 1 (from networkPolicy.adminFrom)", np.Name, admitted)
		}
		if len(wantFrom) == 0 && admitted != 0 {
			t.Errorf("NetworkPolicy %s admits the admin port though networkPolicy.adminFrom is empty", np.Name)
		}
	}
	if !strings.Contains(r.notes, fullname+"-worker-admin") {
		t.Errorf("NOTES.txt does not say how to reach the admin Service")
	}
}

var sourceNameRe = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,31}$`)

// checkWebhookSources: webhook.sources become WEBHOOK_SOURCES on the receiver
// and one WEBHOOK_SECRETS_<NAME> per source from a secretKeyRef, to the
// source's existingSecret or to the chart's Secret, which then holds the
// secrets comma-separated. The secrets are never in a ConfigMap.
func checkWebhookSources(t *testing.T, r *rendering) {
	t.Helper()
	ro := r.mustFind(t, "Deployment", fullname+"-receiver")
	rc := container(t, ro, &ro.obj.(*appsv1.Deployment).Spec.Template.Spec, "receiver")
	wo := r.mustFind(t, "Deployment", fullname+"-worker")
	wc := container(t, wo, &wo.obj.(*appsv1.Deployment).Spec.Template.Spec, "worker")
	for _, e := range wc.Env {
		if strings.HasPrefix(e.Name, "WEBHOOK_") {
			t.Errorf("%s: env %s (webhook settings belong to the receiver)", wo, e.Name)
		}
	}
	sources := webhookSources(r)
	if len(sources) == 0 {
		for _, e := range rc.Env {
			if e.Name == "WEBHOOK_SOURCES" || strings.HasPrefix(e.Name, "WEBHOOK_SECRETS_") {
				t.Errorf("%s: env %s though webhook.sources is empty", ro, e.Name)
			}
		}
		return
	}
	var items []string
	vars := map[string]bool{}
	for _, s := range sources {
		items = append(items, s.name+":"+s.scheme)
		if !sourceNameRe.MatchString(s.name) || s.name == "payment" || s.name == "stripe" {
			t.Errorf("source name %q passed the schema but pkg/config refuses it", s.name)
		}
		if !slices.Contains([]string{"stripe", "standard", "github", "paypal"}, s.scheme) {
			t.Errorf("source %s: scheme %q passed the schema", s.name, s.scheme)
		}
		if vars[s.secretsVar()] {
			t.Errorf("two sources read %s", s.secretsVar())
		}
		vars[s.secretsVar()] = true
	}
	if e, ok := env(rc, "WEBHOOK_SOURCES"); !ok || e.Value != strings.Join(items, ",") {
		t.Errorf("%s: WEBHOOK_SOURCES = %q, want %q", ro, e.Value, strings.Join(items, ","))
	}
	sec, hasSec := chartSecret(r)
	for _, s := range sources {
		v := s.secretsVar()
		for _, x := range s.secrets {
			notInPlainSight(t, r, "a signing secret of source "+s.name, v, x)
		}
		ref, ok := secretRefOf(&ro.obj.(*appsv1.Deployment).Spec.Template.Spec, rc, v)
		if !ok {
			t.Errorf("%s: %s must come from a secretKeyRef (or a file of one)", ro, v)
			continue
		}
		if s.existingSecret != "" {
			key := s.existingSecretKey
			if key == "" {
				key = v
			}
			if ref.Name != s.existingSecret || ref.Key != key {
				t.Errorf("%s: %s from %s/%s, want %s/%s", ro, v, ref.Name, ref.Key, s.existingSecret, key)
			}
			if hasSec && secretKeys(r.mustFind(t, "Secret", fullname))[v] {
				t.Errorf("chart Secret holds %s though source %s has an existingSecret", v, s.name)
			}
			continue
		}
		if ref.Name != fullname || ref.Key != v {
			t.Errorf("%s: %s from %s/%s, want the chart's Secret", ro, v, ref.Name, ref.Key)
		}
		if !hasSec || sec.StringData[v] != strings.Join(s.secrets, ",") {
			t.Errorf("chart Secret: %s does not hold source %s's secrets comma-separated", v, s.name)
		}
		if !strings.Contains(r.notes, "/webhooks/"+s.name) {
			t.Errorf("NOTES.txt does not list /webhooks/%s", s.name)
		}
	}
}

// TestAdminAndSourcesScenario spells out what ci/admin-sources-values.yaml
// must render, beyond the generic checks.
func TestAdminAndSourcesScenario(t *testing.T) {
	r, err := renderChart(renderOpts{valueFiles: []string{filepath.Join(chartDir, "ci", adminScenario)}})
	if err != nil {
		t.Fatal(err)
	}
	wo := r.mustFind(t, "Deployment", fullname+"-worker")
	wc := container(t, wo, &wo.obj.(*appsv1.Deployment).Spec.Template.Spec, "worker")
	checkSecretRef(t, wc, "ADMIN_TOKEN", fullname, "ADMIN_TOKEN")
	for k, v := range map[string]string{"ADMIN_ADDR": ":9092", "ADMIN_OPERATOR": "oncall", "ADMIN_REPLAY_RATE": "5", "ADMIN_DLQ_SCAN_LIMIT": "5000", "ADMIN_SESSION_TTL": "2h"} {
		if e, _ := env(wc, k); e.Value != v {
			t.Errorf("%s = %q, want %q", k, e.Value, v)
		}
	}
	for _, o := range r.ofKind("ConfigMap") {
		for k, v := range o.obj.(*corev1.ConfigMap).Data {
			if k == "ADMIN_TOKEN" || strings.Contains(v, "not-a-real-admin-token") {
				t.Errorf("%s: the admin token is in a ConfigMap (key %s)", o, k)
			}
		}
	}
	if got := r.mustFind(t, "Secret", fullname).obj.(*corev1.Secret).StringData["ADMIN_TOKEN"]; got != "not-a-real-admin-token-0123456789" {
		t.Errorf("chart Secret ADMIN_TOKEN = %q", got)
	}

	svc := r.mustFind(t, "Service", fullname+"-worker-admin").obj.(*corev1.Service)
	if svc.Spec.Type != corev1.ServiceTypeClusterIP || svc.Spec.Ports[0].Port != 9092 || svc.Spec.Ports[0].TargetPort.StrVal != "admin" {
		t.Errorf("admin Service: %s %+v", svc.Spec.Type, svc.Spec.Ports)
	}
	if !slices.ContainsFunc(wc.Ports, func(p corev1.ContainerPort) bool { return p.Name == "admin" && p.ContainerPort == 9092 }) {
		t.Errorf("worker ports %v: no admin 9092", wc.Ports)
	}
	if svc.Labels["app.kubernetes.io/component"] == "worker" {
		t.Errorf("admin Service labelled component=worker: the ServiceMonitor would scrape it")
	}

	np := r.mustFind(t, "NetworkPolicy", fullname+"-worker").obj.(*networkingv1.NetworkPolicy)
	found := false
	for _, rule := range np.Spec.Ingress {
		if len(rule.Ports) == 1 && rule.Ports[0].Port.StrVal == "admin" {
			found = true
			if len(rule.From) != 1 || rule.From[0].NamespaceSelector == nil ||
				rule.From[0].NamespaceSelector.MatchLabels["kubernetes.io/metadata.name"] != "ops" {
				t.Errorf("admin rule from %+v, want the ops namespace", rule.From)
			}
		}
	}
	if !found {
		t.Errorf("worker NetworkPolicy has no admin rule: %+v", np.Spec.Ingress)
	}
	rnp := r.mustFind(t, "NetworkPolicy", fullname+"-receiver").obj.(*networkingv1.NetworkPolicy)
	for _, rule := range rnp.Spec.Ingress {
		for _, p := range rule.Ports {
			if p.Port.StrVal == "admin" {
				t.Errorf("receiver NetworkPolicy has an admin rule")
			}
		}
	}

	ro := r.mustFind(t, "Deployment", fullname+"-receiver")
	rc := container(t, ro, &ro.obj.(*appsv1.Deployment).Spec.Template.Spec, "receiver")
	if e, _ := env(rc, "WEBHOOK_SOURCES"); e.Value != "shop:standard,github-app:github,stripe-connect:stripe" {
		t.Errorf("WEBHOOK_SOURCES = %q", e.Value)
	}
	sec := r.mustFind(t, "Secret", fullname).obj.(*corev1.Secret)
	for _, c := range []struct{ env, secret, key, value string }{
		{"WEBHOOK_SECRETS_SHOP", fullname, "WEBHOOK_SECRETS_SHOP", "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"},
		{"WEBHOOK_SECRETS_GITHUB_APP", "github-webhook", "secret", ""},
		{"WEBHOOK_SECRETS_STRIPE_CONNECT", fullname, "WEBHOOK_SECRETS_STRIPE_CONNECT", "whsec_not_a_real_secret_new,whsec_not_a_real_secret_old"},
	} {
		checkSecretRef(t, rc, c.env, c.secret, c.key)
		if c.value != "" && sec.StringData[c.key] != c.value {
			t.Errorf("chart Secret %s = %q, want %q", c.key, sec.StringData[c.key], c.value)
		}
	}
	if _, ok := sec.StringData["WEBHOOK_SECRETS_GITHUB_APP"]; ok {
		t.Error("chart Secret holds the GitHub source's secrets, which live in its existingSecret")
	}
}

// TestAdminOffByDefault: the default install has no admin server.
func TestAdminOffByDefault(t *testing.T) {
	r, err := renderChart(renderOpts{set: map[string]any{"networkPolicy": map[string]any{"enabled": true}}})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := r.find("Service", fullname+"-worker-admin"); ok {
		t.Error("admin Service rendered by default")
	}
	wo := r.mustFind(t, "Deployment", fullname+"-worker")
	wc := container(t, wo, &wo.obj.(*appsv1.Deployment).Spec.Template.Spec, "worker")
	if _, ok := env(wc, "ADMIN_TOKEN"); ok {
		t.Error("ADMIN_TOKEN set by default (the admin server would run)")
	}
	checkAdmin(t, r)
}

// TestAdminTokenFromExistingSecret: admin.existingSecret wins, and the chart's
// Secret then holds no token.
func TestAdminTokenFromExistingSecret(t *testing.T) {
	r, err := renderChart(renderOpts{set: map[string]any{"admin": map[string]any{
		"enabled": true, "existingSecret": "dlq-admin", "existingSecretKey": "token", "token": "ignored-when-existing-secret",
	}}})
	if err != nil {
		t.Fatal(err)
	}
	wo := r.mustFind(t, "Deployment", fullname+"-worker")
	wc := container(t, wo, &wo.obj.(*appsv1.Deployment).Spec.Template.Spec, "worker")
	checkSecretRef(t, wc, "ADMIN_TOKEN", "dlq-admin", "token")
	if _, ok := r.mustFind(t, "Secret", fullname).obj.(*corev1.Secret).StringData["ADMIN_TOKEN"]; ok {
		t.Error("chart Secret holds ADMIN_TOKEN though admin.existingSecret is set")
	}
	checkAdmin(t, r)
	checkReferences(t, r)
}

// TestAdminPortClosedWithoutPeers: with the NetworkPolicy on and no
// networkPolicy.adminFrom, no ingress rule admits the admin port.
func TestAdminPortClosedWithoutPeers(t *testing.T) {
	r, err := renderChart(renderOpts{set: map[string]any{
		"admin":         map[string]any{"enabled": true, "token": "0123456789abcdef"},
		"networkPolicy": map[string]any{"enabled": true},
	}})
	if err != nil {
		t.Fatal(err)
	}
	np := r.mustFind(t, "NetworkPolicy", fullname+"-worker").obj.(*networkingv1.NetworkPolicy)
	for _, rule := range np.Spec.Ingress {
		if portCovers(rule.Ports, "admin", 9092) {
			t.Errorf("rule %+v admits the admin port", rule)
		}
	}
	checkAdmin(t, r)
}

// TestWebhookSourceExistingSecretDefaultKey: without existingSecretKey the
// key is the variable's name.
func TestWebhookSourceExistingSecretDefaultKey(t *testing.T) {
	r, err := renderChart(renderOpts{set: withSources(map[string]any{"name": "acme-billing", "scheme": "standard", "existingSecret": "acme"})})
	if err != nil {
		t.Fatal(err)
	}
	ro := r.mustFind(t, "Deployment", fullname+"-receiver")
	rc := container(t, ro, &ro.obj.(*appsv1.Deployment).Spec.Template.Spec, "receiver")
	checkSecretRef(t, rc, "WEBHOOK_SECRETS_ACME_BILLING", "acme", "WEBHOOK_SECRETS_ACME_BILLING")
	if e, _ := env(rc, "WEBHOOK_SOURCES"); e.Value != "acme-billing:standard" {
		t.Errorf("WEBHOOK_SOURCES = %q", e.Value)
	}
	checkWebhookSources(t, r)
	checkReferences(t, r)
}

// TestPayPalSourceSettings: a paypal source gives the receiver
// PAYPAL_CERT_HOSTS (and PAYPAL_CA_FILE when set); without one the receiver
// has neither.
func TestPayPalSourceSettings(t *testing.T) {
	r, err := renderChart(renderOpts{set: withSources(map[string]any{"name": "paypal", "scheme": "paypal", "secrets": []any{"8PT597110X687430LKGECATA"}})})
	if err != nil {
		t.Fatal(err)
	}
	ro := r.mustFind(t, "Deployment", fullname+"-receiver")
	rc := container(t, ro, &ro.obj.(*appsv1.Deployment).Spec.Template.Spec, "receiver")
	if e, _ := env(rc, "PAYPAL_CERT_HOSTS"); e.Value != "api.paypal.com,api.sandbox.paypal.com" {
		t.Errorf("PAYPAL_CERT_HOSTS = %q", e.Value)
	}
	if e, ok := env(rc, "PAYPAL_CA_FILE"); ok {
		t.Errorf("PAYPAL_CA_FILE = %q though webhook.paypal.caFile is empty", e.Value)
	}
	checkWebhookSources(t, r)
	checkReferences(t, r)

	set := withSources(map[string]any{"name": "pp", "scheme": "paypal", "secrets": []any{"8PT597110X687430LKGECATA"}})
	set["webhook"].(map[string]any)["paypal"] = map[string]any{"certHosts": []any{"paypal-certs.internal:8443"}, "caFile": "/etc/paypal/ca.pem"}
	if r, err = renderChart(renderOpts{set: set}); err != nil {
		t.Fatal(err)
	}
	ro = r.mustFind(t, "Deployment", fullname+"-receiver")
	rc = container(t, ro, &ro.obj.(*appsv1.Deployment).Spec.Template.Spec, "receiver")
	for k, v := range map[string]string{"PAYPAL_CERT_HOSTS": "paypal-certs.internal:8443", "PAYPAL_CA_FILE": "/etc/paypal/ca.pem"} {
		if e, _ := env(rc, k); e.Value != v {
			t.Errorf("%s = %q, want %q", k, e.Value, v)
		}
	}

	if r, err = renderChart(renderOpts{set: withSources(map[string]any{"name": "gh", "scheme": "github", "secrets": []any{"s"}})}); err != nil {
		t.Fatal(err)
	}
	ro = r.mustFind(t, "Deployment", fullname+"-receiver")
	rc = container(t, ro, &ro.obj.(*appsv1.Deployment).Spec.Template.Spec, "receiver")
	for _, e := range rc.Env {
		if strings.HasPrefix(e.Name, "PAYPAL_") {
			t.Errorf("%s set without a paypal source", e.Name)
		}
	}
}

// TestSchemaErrorsHideSecrets: a refused admin token or signing secret is not
// printed in the install error (the schema checks them with "not", whose
// error names only the field).
func TestSchemaErrorsHideSecrets(t *testing.T) {
	const token = "this-token-ends-in-a-space "
	const secret = "whsec_this is not base64"
	_, err := renderChart(renderOpts{set: map[string]any{
		"admin": map[string]any{"enabled": true, "token": token},
		"webhook": map[string]any{"sources": []any{
			map[string]any{"name": "shop", "scheme": "standard", "secrets": []any{secret}},
		}},
	}})
	if err == nil {
		t.Fatal("accepted")
	}
	for _, w := range []string{"/admin/token", "/webhook/sources/0/secrets/0"} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error does not name %s: %v", w, err)
		}
	}
	for _, s := range []string{strings.TrimSpace(token), secret} {
		if strings.Contains(err.Error(), s) {
			t.Errorf("error prints the value %q: %v", s, err)
		}
	}
}
