package deploytest

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/equality"
)

// The reconcile CronJob (values reconcile.*): property checks run on every
// scenario by checkRendering, and tests of the cases no scenario shows. The
// scenario with every reconcile value set is testdata/reconcile-values.yaml;
// contract_test.go runs `eventsctl reconcile -check-config` with what the
// CronJob's container gets.

// reconcileOn turns the CronJob on with nothing else but the Secret it
// cannot do without.
var reconcileOn = map[string]any{"reconcile": map[string]any{
	"enabled": true, "stripe": map[string]any{"existingSecret": "stripe-reconcile"},
}}

// maxCronJobName: the CronJob controller names each Job <cronjob>-<8 digits>
// and the API server refuses CronJob names longer than 52 characters.
const maxCronJobName = 52

// reconcileObjects are the release's objects of component reconcile, by kind.
func reconcileObjects(r *rendering) map[string][]object {
	out := map[string][]object{}
	for _, o := range r.objects {
		if isOurs(o) && o.u.GetLabels()["app.kubernetes.io/component"] == "reconcile" {
			out[o.gvk.Kind] = append(out[o.gvk.Kind], o)
		}
	}
	return out
}

// sameAsValues: the rendered field, through JSON, equals the value given.
func sameAsValues(t *testing.T, where string, rendered, value any) {
	t.Helper()
	if value == nil || reflect.ValueOf(value).Len() == 0 {
		if rendered != nil && reflect.ValueOf(rendered).Len() != 0 {
			t.Errorf("%s: %v rendered, the value is empty", where, rendered)
		}
		return
	}
	var a, b any
	for _, x := range []struct {
		in  any
		out *any
	}{{rendered, &a}, {value, &b}} {
		raw, err := json.Marshal(x.in)
		if err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(raw, x.out); err != nil {
			t.Fatal(err)
		}
	}
	if !reflect.DeepEqual(a, b) {
		t.Errorf("%s: rendered %v, values say %v", where, a, b)
	}
}

// checkReconcile: with reconcile.enabled one CronJob runs `eventsctl
// reconcile`, never twice at once, with every reconcile.* value in its
// spec, arguments or environment; STRIPE_API_KEY only from the user's
// Secret, DATABASE_URL and AMQP_URL from where the worker reads them; and,
// with networkPolicy.enabled, egress to the API's port. Without it nothing
// of it renders. No ConfigMap ever has a STRIPE_API_KEY.
func checkReconcile(t *testing.T, r *rendering) {
	t.Helper()
	notInPlainSight(t, r, "the Stripe API key", "STRIPE_API_KEY", "")
	rc := valuesMap(dig(r.values, "reconcile"))
	objs := reconcileObjects(r)
	if rc["enabled"] != true {
		for _, list := range objs {
			for _, o := range list {
				t.Errorf("%s rendered though reconcile.enabled is false", o)
			}
		}
		return
	}
	if len(objs["CronJob"]) != 1 {
		t.Fatalf("reconcile.enabled: want one CronJob, got %d; have %s", len(objs["CronJob"]), r.summary())
	}
	o := objs["CronJob"][0]
	cj := o.obj.(*batchv1.CronJob)
	if len(o.name()) > maxCronJobName || !strings.HasSuffix(o.name(), "-reconcile") {
		t.Errorf("%s: name must end in -reconcile and have at most %d characters", o, maxCronJobName)
	}
	s := cj.Spec
	if s.Schedule != rc["schedule"] {
		t.Errorf("%s: schedule %q, values say %q", o, s.Schedule, rc["schedule"])
	}
	if s.ConcurrencyPolicy != batchv1.ForbidConcurrent {
		t.Errorf("%s: concurrencyPolicy %q, want Forbid (eventsctl runs one reconcile per source; a second would exit 3)", o, s.ConcurrencyPolicy)
	}
	if s.Suspend != nil && *s.Suspend {
		t.Errorf("%s: suspended", o)
	}
	for _, f := range []struct {
		name string
		got  *int32
	}{{"successfulJobsHistoryLimit", s.SuccessfulJobsHistoryLimit}, {"failedJobsHistoryLimit", s.FailedJobsHistoryLimit}} {
		if f.got == nil || float64(*f.got) != num(rc[f.name]) {
			t.Errorf("%s: %s %v, values say %v", o, f.name, f.got, rc[f.name])
		}
	}
	for _, f := range []struct {
		name string
		got  *int64
	}{{"startingDeadlineSeconds", s.StartingDeadlineSeconds}, {"activeDeadlineSeconds", s.JobTemplate.Spec.ActiveDeadlineSeconds}} {
		if f.got == nil || float64(*f.got) != num(rc[f.name]) {
			t.Errorf("%s: %s %v, values say %v", o, f.name, f.got, rc[f.name])
		}
	}
	if b := s.JobTemplate.Spec.BackoffLimit; b == nil || float64(*b) != num(rc["backoffLimit"]) {
		t.Errorf("%s: backoffLimit %v, values say %v", o, b, rc["backoffLimit"])
	}

	tpl := s.JobTemplate.Spec.Template
	pod := tpl.Spec
	if pod.RestartPolicy != corev1.RestartPolicyNever {
		t.Errorf("%s: restartPolicy %q, want Never (each attempt keeps its pod and logs)", o, pod.RestartPolicy)
	}
	if len(pod.InitContainers) != 1 || !slices.Equal(pod.InitContainers[0].Command, []string{"/usr/local/bin/migrate", "wait"}) {
		t.Errorf("%s: want one init container running `migrate wait`, got %v", o, pod.InitContainers)
	}
	for k, v := range valuesMap(rc["podLabels"]) {
		if tpl.Labels[k] != v {
			t.Errorf("%s: pod label %s = %q, values say %v", o, k, tpl.Labels[k], v)
		}
	}
	sameAsValues(t, o.String()+" pod annotations", tpl.Annotations, rc["podAnnotations"])
	sameAsValues(t, o.String()+" nodeSelector", pod.NodeSelector, rc["nodeSelector"])
	sameAsValues(t, o.String()+" tolerations", pod.Tolerations, rc["tolerations"])
	if aff := valuesMap(rc["affinity"]); len(aff) > 0 {
		sameAsValues(t, o.String()+" affinity", pod.Affinity, aff)
	} else if pod.Affinity != nil {
		t.Errorf("%s: affinity %+v, the value is empty", o, pod.Affinity)
	}

	c := container(t, o, &pod, "reconcile")
	if !slices.Equal(c.Command, []string{"/usr/local/bin/eventsctl", "reconcile"}) {
		t.Errorf("%s: command %v", o, c.Command)
	}
	wantArgs := []string{
		fmt.Sprintf("-since=%v", rc["since"]),
		fmt.Sprintf("-settle=%v", rc["settle"]),
		"-rate=" + strconv.FormatFloat(num(rc["rate"]), 'f', -1, 64),
		fmt.Sprintf("-undelivered-only=%v", rc["undeliveredOnly"] == true),
	}
	if !slices.Equal(c.Args, wantArgs) {
		t.Errorf("%s: args %q, want %q", o, c.Args, wantArgs)
	}
	var types []string
	items, _ := rc["types"].([]any)
	for _, it := range items {
		types = append(types, fmt.Sprint(it))
	}
	wantEnv := map[string]string{
		"STRIPE_API_URL":  fmt.Sprint(rc["apiURL"]),
		"RECONCILE_TYPES": strings.Join(types, ","),
		"LOG_LEVEL":       fmt.Sprint(dig(r.values, "config", "logLevel")),
		"LOG_FORMAT":      fmt.Sprint(dig(r.values, "config", "logFormat")),
	}
	for k, v := range wantEnv {
		if e, ok := env(c, k); !ok || e.ValueFrom != nil || e.Value != v {
			t.Errorf("%s: %s = %+v, want the value %q", o, k, e, v)
		}
	}
	stripe := valuesMap(rc["stripe"])
	checkSecretRef(t, c, "STRIPE_API_KEY", fmt.Sprint(stripe["existingSecret"]), fmt.Sprint(stripe["existingSecretKey"]))
	if sec, ok := chartSecret(r); ok {
		if _, held := sec.StringData["STRIPE_API_KEY"]; held {
			t.Errorf("the chart's Secret holds STRIPE_API_KEY: the key lives only in the user's Secret")
		}
	}
	wo := r.mustFind(t, "Deployment", fullname+"-worker")
	wc := container(t, wo, &wo.obj.(*appsv1.Deployment).Spec.Template.Spec, "worker")
	for _, name := range []string{"DATABASE_URL", "AMQP_URL"} {
		we, _ := env(wc, name)
		if we.ValueFrom == nil || we.ValueFrom.SecretKeyRef == nil {
			t.Fatalf("%s: %s is not from a Secret", wo, name)
		}
		checkSecretRef(t, c, name, we.ValueFrom.SecretKeyRef.Name, we.ValueFrom.SecretKeyRef.Key)
	}
	for _, e := range c.Env {
		if e.Name == "REDIS_URL" || e.Name == "WEBHOOK_SECRETS" || strings.HasPrefix(e.Name, "ADMIN_") {
			t.Errorf("%s: env %s, which eventsctl reconcile does not read", o, e.Name)
		}
	}
	var wantRes corev1.ResourceRequirements
	raw, err := json.Marshal(rc["resources"])
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(raw, &wantRes); err != nil {
		t.Fatalf("reconcile.resources: %v", err)
	}
	if !equality.Semantic.DeepEqual(c.Resources, wantRes) {
		t.Errorf("%s: resources %v, values say %v", o, c.Resources, wantRes)
	}

	nps := objs["NetworkPolicy"]
	if dig(r.values, "networkPolicy", "enabled") != true {
		if len(nps) > 0 {
			t.Errorf("%s rendered though networkPolicy.enabled is false", nps[0])
		}
		return
	}
	if len(nps) != 1 {
		t.Fatalf("networkPolicy.enabled: want one NetworkPolicy for the reconcile pods, got %d", len(nps))
	}
	np := nps[0].obj.(*networkingv1.NetworkPolicy)
	if len(np.Spec.Ingress) != 0 || !slices.Contains(np.Spec.PolicyTypes, networkingv1.PolicyTypeIngress) {
		t.Errorf("%s: the reconcile pods serve nothing: want Ingress denied, got %+v", nps[0], np.Spec)
	}
	port := apiPort(t, fmt.Sprint(rc["apiURL"]))
	if !egressAllows(np, port) {
		t.Errorf("%s: no egress to port %d (reconcile.apiURL %v) from anywhere", nps[0], port, rc["apiURL"])
	}
	for _, p := range dig(r.values, "networkPolicy", "egressPorts").([]any) {
		if !slices.ContainsFunc(np.Spec.Egress, func(rule networkingv1.NetworkPolicyEgressRule) bool {
			return coversNumber(rule.Ports, int32(num(p)))
		}) {
			t.Errorf("%s: no egress to port %v (networkPolicy.egressPorts: the database and the broker)", nps[0], p)
		}
	}
}

// apiPort is the TCP port of an http(s) URL, as the chart computes it.
func apiPort(t *testing.T, url string) int32 {
	t.Helper()
	rest, ok := strings.CutPrefix(url, "https://")
	port := int32(443)
	if !ok {
		rest, ok = strings.CutPrefix(url, "http://")
		port = 80
	}
	if !ok {
		t.Fatalf("reconcile.apiURL %q is not http(s)", url)
	}
	host, _, _ := strings.Cut(rest, "/")
	if i := strings.LastIndex(host, ":"); i >= 0 && !strings.HasSuffix(host, "]") {
		n, err := strconv.Atoi(host[i+1:])
		if err != nil {
			t.Fatalf("reconcile.apiURL %q: port: %v", url, err)
		}
		port = int32(n)
	}
	return port
}

// egressAllows: some egress rule without destinations admits TCP port.
func egressAllows(np *networkingv1.NetworkPolicy, port int32) bool {
	for _, rule := range np.Spec.Egress {
		if len(rule.To) == 0 && coversNumber(rule.Ports, port) {
			return true
		}
	}
	return false
}

// coversNumber: a NetworkPolicy port list (empty = all ports) admits TCP
// port number (a named port names a container's port, not a remote one).
func coversNumber(ports []networkingv1.NetworkPolicyPort, number int32) bool {
	if len(ports) == 0 {
		return true
	}
	for _, p := range ports {
		if p.Protocol != nil && *p.Protocol != corev1.ProtocolTCP {
			continue
		}
		if p.Port == nil || (p.Port.StrVal == "" && p.Port.IntVal <= number &&
			(number == p.Port.IntVal || (p.EndPort != nil && number <= *p.EndPort))) {
			return true
		}
	}
	return false
}

// TestReconcileOffByDefault: the default install, with NetworkPolicies on,
// has no CronJob and nothing else of reconcile.
func TestReconcileOffByDefault(t *testing.T) {
	r, err := renderChart(renderOpts{set: map[string]any{"networkPolicy": map[string]any{"enabled": true}}})
	if err != nil {
		t.Fatal(err)
	}
	if objs := reconcileObjects(r); len(objs) != 0 {
		t.Errorf("reconcile objects rendered by default: %v", objs)
	}
	if strings.Contains(r.notes, "reconcile") {
		t.Errorf("NOTES.txt mentions reconcile though it is off")
	}
	checkReconcile(t, r)
}

// TestReconcileDefaults: turned on with only its Secret, the CronJob runs
// hourly at minute 17 over the last 72h, every type, at 20 requests a
// second, against api.stripe.com.
func TestReconcileDefaults(t *testing.T) {
	r, err := renderChart(renderOpts{set: mergeMaps(reconcileOn, map[string]any{"networkPolicy": map[string]any{"enabled": true}})})
	if err != nil {
		t.Fatal(err)
	}
	o := r.mustFind(t, "CronJob", fullname+"-reconcile")
	cj := o.obj.(*batchv1.CronJob)
	if cj.Spec.Schedule != "17 * * * *" || *cj.Spec.StartingDeadlineSeconds != 600 || *cj.Spec.JobTemplate.Spec.ActiveDeadlineSeconds != 3000 {
		t.Errorf("schedule %q, startingDeadlineSeconds %d, activeDeadlineSeconds %d", cj.Spec.Schedule,
			*cj.Spec.StartingDeadlineSeconds, *cj.Spec.JobTemplate.Spec.ActiveDeadlineSeconds)
	}
	c := container(t, o, &cj.Spec.JobTemplate.Spec.Template.Spec, "reconcile")
	if want := []string{"-since=72h", "-settle=5m", "-rate=20", "-undelivered-only=false"}; !slices.Equal(c.Args, want) {
		t.Errorf("args %q, want %q", c.Args, want)
	}
	for k, v := range map[string]string{"STRIPE_API_URL": "https://api.stripe.com", "RECONCILE_TYPES": ""} {
		if e, ok := env(c, k); !ok || e.Value != v {
			t.Errorf("%s = %q, want %q", k, e.Value, v)
		}
	}
	checkSecretRef(t, c, "STRIPE_API_KEY", "stripe-reconcile", "STRIPE_API_KEY")
	checkSecretRef(t, c, "DATABASE_URL", releaseName+"-postgresql", "url")
	checkSecretRef(t, c, "AMQP_URL", releaseName+"-rabbitmq", "url")
	np := r.mustFind(t, "NetworkPolicy", fullname+"-reconcile").obj.(*networkingv1.NetworkPolicy)
	if !egressAllows(np, 443) {
		t.Errorf("NetworkPolicy: no egress to 443 for api.stripe.com: %+v", np.Spec.Egress)
	}
	if !strings.Contains(r.notes, "create job --from=cronjob/"+fullname+"-reconcile") {
		t.Errorf("NOTES.txt does not say how to start a run by hand:\n%s", r.notes)
	}
	checkReconcile(t, r)
}

// TestReconcileScenario spells out what testdata/reconcile-values.yaml must
// render, independently of checkReconcile's reading of the values.
func TestReconcileScenario(t *testing.T) {
	r, err := renderChart(renderOpts{valueFiles: []string{filepath.Join("testdata", "reconcile-values.yaml")}})
	if err != nil {
		t.Fatal(err)
	}
	o := r.mustFind(t, "CronJob", fullname+"-reconcile")
	cj := o.obj.(*batchv1.CronJob)
	s := cj.Spec
	if s.Schedule != "41 */2 * * *" || *s.StartingDeadlineSeconds != 300 || *s.SuccessfulJobsHistoryLimit != 1 || *s.FailedJobsHistoryLimit != 5 {
		t.Errorf("CronJob spec: %q %d %d %d", s.Schedule, *s.StartingDeadlineSeconds, *s.SuccessfulJobsHistoryLimit, *s.FailedJobsHistoryLimit)
	}
	if j := s.JobTemplate.Spec; *j.BackoffLimit != 4 || *j.ActiveDeadlineSeconds != 5400 {
		t.Errorf("Job spec: backoffLimit %d, activeDeadlineSeconds %d", *j.BackoffLimit, *j.ActiveDeadlineSeconds)
	}
	pod := s.JobTemplate.Spec.Template
	if pod.Labels["example.com/team"] != "payments" || pod.Annotations["example.com/owner"] != "payments" ||
		pod.Spec.NodeSelector["kubernetes.io/os"] != "linux" || len(pod.Spec.Tolerations) != 1 || pod.Spec.Tolerations[0].Key != "batch" ||
		pod.Spec.Affinity == nil || pod.Spec.Affinity.NodeAffinity == nil {
		t.Errorf("pod placement and metadata: labels %v, annotations %v, nodeSelector %v, tolerations %v, affinity %+v",
			pod.Labels, pod.Annotations, pod.Spec.NodeSelector, pod.Spec.Tolerations, pod.Spec.Affinity)
	}
	c := container(t, o, &pod.Spec, "reconcile")
	if want := []string{"-since=168h", "-settle=15m", "-rate=7.5", "-undelivered-only=true"}; !slices.Equal(c.Args, want) {
		t.Errorf("args %q, want %q", c.Args, want)
	}
	for k, v := range map[string]string{
		"STRIPE_API_URL":  "https://stripe-egress.payments.svc.cluster.local:8443",
		"RECONCILE_TYPES": "payment_intent.succeeded,payment_intent.payment_failed,charge.refunded",
		"LOG_LEVEL":       "debug",
		"LOG_FORMAT":      "console",
	} {
		if e, ok := env(c, k); !ok || e.Value != v {
			t.Errorf("%s = %q, want %q", k, e.Value, v)
		}
	}
	checkSecretRef(t, c, "STRIPE_API_KEY", "stripe-reconcile", "restricted-key")
	checkSecretRef(t, c, "DATABASE_URL", "payments-postgres", "DATABASE_URL")
	checkSecretRef(t, c, "AMQP_URL", "payments-rabbitmq", "uri")
	if c.Resources.Limits.Memory().String() != "96Mi" || c.Resources.Requests.Cpu().String() != "20m" {
		t.Errorf("resources %v", c.Resources)
	}
	np := r.mustFind(t, "NetworkPolicy", fullname+"-reconcile").obj.(*networkingv1.NetworkPolicy)
	if !egressAllows(np, 8443) || egressAllows(np, 5432) {
		t.Errorf("NetworkPolicy egress %+v: want 8443 anywhere, the database only to networkPolicy.egressTo", np.Spec.Egress)
	}
	checkReconcile(t, r)
}

// TestReconcileAPIPort: the NetworkPolicy opens the port of reconcile.apiURL.
func TestReconcileAPIPort(t *testing.T) {
	for url, port := range map[string]int32{
		"https://api.stripe.com":             443,
		"https://api.stripe.com/":            443,
		"http://stripe-mock.payments:12111":  12111,
		"http://stripe-mock.payments":        80,
		"https://[fd00::1]":                  443,
		"https://[fd00::1]:8443/v1-prefixed": 8443,
	} {
		t.Run(url, func(t *testing.T) {
			r, err := renderChart(renderOpts{set: mergeMaps(reconcileOn, map[string]any{
				"networkPolicy": map[string]any{"enabled": true},
				"reconcile":     map[string]any{"apiURL": url},
			})})
			if err != nil {
				t.Fatal(err)
			}
			np := r.mustFind(t, "NetworkPolicy", fullname+"-reconcile").obj.(*networkingv1.NetworkPolicy)
			if !egressAllows(np, port) {
				t.Errorf("no egress to %d: %+v", port, np.Spec.Egress)
			}
			if got := apiPort(t, url); got != port {
				t.Errorf("apiPort(%q) = %d, want %d", url, got, port)
			}
		})
	}
}

// TestReconcileNameFitsCronJobLimit: with the longest full name the chart
// makes (50 characters), the CronJob's name still fits the API server's 52.
func TestReconcileNameFitsCronJobLimit(t *testing.T) {
	r, err := renderChart(renderOpts{set: mergeMaps(reconcileOn, map[string]any{
		"fullnameOverride": strings.Repeat("payments-", 7),
		"networkPolicy":    map[string]any{"enabled": true},
	})})
	if err != nil {
		t.Fatal(err)
	}
	objs := reconcileObjects(r)
	if len(objs["CronJob"]) != 1 {
		t.Fatalf("want one CronJob, got %v", objs)
	}
	name := objs["CronJob"][0].name()
	if len(name) > maxCronJobName || !strings.HasSuffix(name, "-reconcile") || strings.Contains(name, "--") {
		t.Errorf("CronJob name %q (%d characters): want at most %d, ending in -reconcile", name, len(name), maxCronJobName)
	}
	if np := objs["NetworkPolicy"]; len(np) != 1 || np[0].name() != name {
		t.Errorf("NetworkPolicy %v, want one named %s", np, name)
	}
	if !strings.Contains(r.notes, "cronjob/"+name+" "+name+"-manual-1") {
		t.Errorf("NOTES.txt does not name the CronJob %s", name)
	}
}
