package deploytest

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"helm.sh/helm/v4/pkg/chart/common"
	"helm.sh/helm/v4/pkg/chart/v2/lint"
	"helm.sh/helm/v4/pkg/chart/v2/lint/support"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/yaml"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
)

// fullname is the name prefix for release "test" (see _helpers.tpl).
const fullname = releaseName + "-idempotent-events"

// TestChartLint runs Helm's lint rules (`helm lint --strict`: warnings fail)
// for the chart's own values and for every scenario.
func TestChartLint(t *testing.T) {
	kv, err := common.ParseKubeVersion(kubeVersion)
	if err != nil {
		t.Fatal(err)
	}
	files := []string{""}
	for _, s := range scenarios(t) {
		files = append(files, s.file)
	}
	for _, f := range files {
		name := "values.yaml"
		if f != "" {
			name = filepath.Base(f)
		}
		t.Run(name, func(t *testing.T) {
			var vf []string
			if f != "" {
				vf = []string{f}
			}
			vals, err := readValues(vf, nil)
			if err != nil {
				t.Fatal(err)
			}
			// The KEDA scenario needs keda.sh/v1alpha1, which lint cannot be
			// told about; lint its templates through the render tests instead.
			if a, ok := dig(vals, "worker", "autoscaling").(map[string]any); ok && a["mode"] == "keda" && a["enabled"] == true {
				vals = mergeMaps(vals, map[string]any{"worker": map[string]any{"autoscaling": map[string]any{"mode": "hpa"}}})
			}
			res := lint.RunAll(chartDir, vals, namespace, lint.WithKubeVersion(kv))
			for _, m := range res.Messages {
				if m.Severity >= support.WarningSev {
					t.Errorf("lint: %s", m)
				} else if m.Severity > support.InfoSev {
					t.Logf("lint: %s", m)
				}
			}
		})
	}
}

// TestChartRendersEveryScenario renders each ci/*-values.yaml scenario with
// and without the optional CRD APIs, decodes every object strictly and checks
// the chart's promises on it.
func TestChartRendersEveryScenario(t *testing.T) {
	for _, s := range scenarios(t) {
		for _, cv := range capsVariants {
			t.Run(s.name+"/"+cv.name, func(t *testing.T) {
				r, err := renderChart(renderOpts{valueFiles: []string{s.file}, apis: cv.apis})
				keda := isKEDA(t, s.file)
				if keda && cv.apis == nil {
					// Without KEDA the chart must refuse: the worker would have no
					// replicas field and nothing that owns it.
					if err == nil || !strings.Contains(err.Error(), "needs KEDA installed") {
						t.Fatalf("want the keda.sh/v1alpha1 error, got %v", err)
					}
					return
				}
				if err != nil {
					t.Fatalf("render: %v", err)
				}
				if len(r.objects) == 0 {
					t.Fatal("nothing rendered")
				}
				t.Logf("%d objects: %s", len(r.objects), r.summary())
				checkRendering(t, r, cv.apis)
				if dir := os.Getenv("DEPLOYTEST_RENDER_DIR"); dir != "" && cv.apis != nil {
					writeRendering(t, filepath.Join(dir, s.name+".yaml"), r)
				}
			})
		}
	}
}

func isKEDA(t *testing.T, file string) bool {
	vals, err := readValues([]string{file}, nil)
	if err != nil {
		t.Fatal(err)
	}
	a, _ := dig(vals, "worker", "autoscaling").(map[string]any)
	return a != nil && a["enabled"] == true && a["mode"] == "keda"
}

// dig walks nested maps.
func dig(m map[string]any, keys ...string) any {
	var cur any = m
	for _, k := range keys {
		mm := valuesMap(cur)
		if mm == nil {
			return nil
		}
		cur = mm[k]
	}
	return cur
}

func valuesMap(v any) map[string]any {
	switch m := v.(type) {
	case common.Values:
		return m
	case map[string]any:
		return m
	}
	return nil
}

// checkRendering runs every property check on one rendering.
func checkRendering(t *testing.T, r *rendering, apis []string) {
	t.Helper()
	checkNamesAndLabels(t, r)
	checkPodHardening(t, r)
	checkSelectors(t, r)
	checkReferences(t, r)
	checkAppWorkloads(t, r)
	checkAutoscaling(t, r)
	checkMigration(t, r)
	checkHelmTest(t, r)
	checkMonitoring(t, r, apis)
	checkNotes(t, r)
	checkAdmin(t, r)
	checkWebhookSources(t, r)
	checkReconcile(t, r)
}

func checkNamesAndLabels(t *testing.T, r *rendering) {
	t.Helper()
	seen := map[string]bool{}
	for _, o := range r.objects {
		key := o.gvk.Kind + "/" + o.u.GetNamespace() + "/" + o.name()
		if seen[key] {
			t.Errorf("%s rendered twice", key)
		}
		seen[key] = true
		if len(o.name()) > 63 {
			t.Errorf("%s: name longer than 63 characters", o)
		}
		if o.u.GetNamespace() == "" {
			t.Errorf("%s: no metadata.namespace", o)
		}
		l := o.u.GetLabels()
		for _, k := range []string{"app.kubernetes.io/name", "app.kubernetes.io/instance", "app.kubernetes.io/managed-by", "helm.sh/chart", "app.kubernetes.io/part-of"} {
			if l[k] == "" {
				t.Errorf("%s: label %s missing", o, k)
			}
		}
		if l["app.kubernetes.io/instance"] != releaseName {
			t.Errorf("%s: instance label %q", o, l["app.kubernetes.io/instance"])
		}
	}
}

// podTemplate returns the pod template of a workload kind; for a bare Pod,
// the Pod itself as a template (no selector).
func podTemplate(o object) (*corev1.PodTemplateSpec, *metav1.LabelSelector) {
	switch w := o.obj.(type) {
	case *corev1.Pod:
		return &corev1.PodTemplateSpec{ObjectMeta: w.ObjectMeta, Spec: w.Spec}, nil
	case *appsv1.Deployment:
		return &w.Spec.Template, w.Spec.Selector
	case *appsv1.StatefulSet:
		return &w.Spec.Template, w.Spec.Selector
	case *batchv1.Job:
		return &w.Spec.Template, nil
	case *batchv1.CronJob:
		return &w.Spec.JobTemplate.Spec.Template, nil
	}
	return nil, nil
}

func isOurs(o object) bool {
	return o.u.GetLabels()["app.kubernetes.io/name"] == "idempotent-events"
}

// checkPodHardening: every pod of the release (ours and the subcharts') runs
// as non-root with seccomp RuntimeDefault, no privilege escalation and no
// capabilities; ours also with a read-only root filesystem and resources.
func checkPodHardening(t *testing.T, r *rendering) {
	t.Helper()
	for _, o := range r.objects {
		tpl, _ := podTemplate(o)
		if tpl == nil {
			continue
		}
		ps := tpl.Spec.SecurityContext
		if ps == nil || ps.RunAsNonRoot == nil || !*ps.RunAsNonRoot {
			t.Errorf("%s: pod securityContext.runAsNonRoot is not true", o)
		}
		if ps == nil || ps.SeccompProfile == nil || ps.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
			t.Errorf("%s: pod seccompProfile is not RuntimeDefault", o)
		}
		if tpl.Spec.AutomountServiceAccountToken == nil || *tpl.Spec.AutomountServiceAccountToken {
			t.Errorf("%s: automountServiceAccountToken is not false", o)
		}
		all := append(slices.Clone(tpl.Spec.InitContainers), tpl.Spec.Containers...)
		for _, c := range all {
			sc := c.SecurityContext
			where := fmt.Sprintf("%s container %s", o, c.Name)
			if sc == nil {
				t.Errorf("%s: no securityContext", where)
				continue
			}
			if sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
				t.Errorf("%s: allowPrivilegeEscalation is not false", where)
			}
			if sc.Capabilities == nil || !slices.Contains(sc.Capabilities.Drop, "ALL") || len(sc.Capabilities.Add) > 0 {
				t.Errorf("%s: capabilities do not drop ALL", where)
			}
			if sc.Privileged != nil && *sc.Privileged {
				t.Errorf("%s: privileged", where)
			}
			if sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
				// The Tilt dev values turn it off for live update, on purpose.
				if !(isOurs(o) && dig(r.values, "securityContext", "readOnlyRootFilesystem") == false) {
					t.Errorf("%s: readOnlyRootFilesystem is not true", where)
				}
			}
			if c.Resources.Requests.Cpu().IsZero() || c.Resources.Requests.Memory().IsZero() || c.Resources.Limits.Memory().IsZero() {
				t.Errorf("%s: resources need cpu+memory requests and a memory limit, got %v", where, c.Resources)
			}
			if isOurs(o) {
				if sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot || sc.RunAsUser == nil || *sc.RunAsUser != 65532 {
					t.Errorf("%s: not runAsNonRoot as uid 65532 (the image's nonroot user)", where)
				}
				if sc.SeccompProfile == nil || sc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
					t.Errorf("%s: container seccompProfile is not RuntimeDefault", where)
				}
				if c.Image != expectedImage(r) {
					t.Errorf("%s: image %q, want %q", where, c.Image, expectedImage(r))
				}
			}
		}
	}
}

func expectedImage(r *rendering) string {
	img := valuesMap(r.values["image"])
	if d, _ := img["digest"].(string); d != "" {
		return img["repository"].(string) + "@" + d
	}
	tag, _ := img["tag"].(string)
	if tag == "" {
		tag = appVersion()
	}
	return img["repository"].(string) + ":" + tag
}

func appVersion() string {
	ch, err := loadChart()
	if err != nil {
		panic(err)
	}
	return ch.Metadata.AppVersion
}

// checkSelectors: workload selectors match their pod labels; Services, PDBs
// and NetworkPolicies select pods that some workload of the release creates,
// and Service target ports are named ports of those pods.
func checkSelectors(t *testing.T, r *rendering) {
	t.Helper()
	type pods struct {
		owner object
		tpl   *corev1.PodTemplateSpec
	}
	var all []pods
	for _, o := range r.objects {
		tpl, sel := podTemplate(o)
		if tpl == nil {
			continue
		}
		all = append(all, pods{o, tpl})
		if sel != nil {
			s, err := metav1.LabelSelectorAsSelector(sel)
			if err != nil || s.Empty() || !s.Matches(labels.Set(tpl.Labels)) {
				t.Errorf("%s: selector %v does not match its pod labels %v", o, sel, tpl.Labels)
			}
		}
	}
	matching := func(sel labels.Selector) []pods {
		var out []pods
		for _, p := range all {
			if sel.Matches(labels.Set(p.tpl.Labels)) {
				out = append(out, p)
			}
		}
		return out
	}
	for _, o := range r.objects {
		switch v := o.obj.(type) {
		case *corev1.Service:
			m := matching(labels.SelectorFromSet(v.Spec.Selector))
			if len(v.Spec.Selector) == 0 || len(m) == 0 {
				t.Errorf("%s: selector %v matches no pods of the release", o, v.Spec.Selector)
				continue
			}
			for _, p := range m {
				if isOurs(o) != isOurs(p.owner) {
					t.Errorf("%s selects pods of %s", o, p.owner)
				}
			}
			for _, port := range v.Spec.Ports {
				if port.TargetPort.StrVal == "" {
					continue
				}
				for _, p := range m {
					if !hasNamedPort(p.tpl, port.TargetPort.StrVal) {
						t.Errorf("%s: targetPort %q is not a port of %s", o, port.TargetPort.StrVal, p.owner)
					}
				}
			}
		case *policyv1.PodDisruptionBudget:
			s, err := metav1.LabelSelectorAsSelector(v.Spec.Selector)
			if err != nil || len(matching(s)) != 1 {
				t.Errorf("%s: selector must match exactly one workload's pods", o)
			}
		case *networkingv1.NetworkPolicy:
			s, err := metav1.LabelSelectorAsSelector(&v.Spec.PodSelector)
			if err != nil || len(matching(s)) != 1 {
				t.Errorf("%s: podSelector must match exactly one workload's pods", o)
			}
		}
	}
}

func hasNamedPort(tpl *corev1.PodTemplateSpec, name string) bool {
	for _, c := range tpl.Spec.Containers {
		for _, p := range c.Ports {
			if p.Name == name {
				return true
			}
		}
	}
	return false
}

// externalSecretNames are Secrets the values say the user manages.
func externalSecretNames(r *rendering) map[string]bool {
	out := map[string]bool{}
	for _, k := range []string{"webhook", "externalRabbitmq", "externalRedis", "externalDatabase", "admin"} {
		if n, _ := dig(r.values, k, "existingSecret").(string); n != "" {
			out[n] = true
		}
	}
	for _, src := range webhookSources(r) {
		if src.existingSecret != "" {
			out[src.existingSecret] = true
		}
	}
	if n, _ := dig(r.values, "worker", "autoscaling", "keda", "managementUrlSecret", "name").(string); n != "" {
		out[n] = true
	}
	if n, _ := dig(r.values, "reconcile", "stripe", "existingSecret").(string); n != "" {
		out[n] = true
	}
	return out
}

func secretKeys(o object) map[string]bool {
	s := o.obj.(*corev1.Secret)
	keys := map[string]bool{}
	for k := range s.StringData {
		keys[k] = true
	}
	for k := range s.Data {
		keys[k] = true
	}
	return keys
}

// checkReferences: every Secret key and ConfigMap a pod reads is rendered
// by the release (with that key) or is a Secret the values name as external.
func checkReferences(t *testing.T, r *rendering) {
	t.Helper()
	external := externalSecretNames(r)
	checkSecretRef := func(where, name, key string) {
		if s, ok := r.find("Secret", name); ok {
			if !secretKeys(s)[key] {
				t.Errorf("%s: Secret %s has no key %s", where, name, key)
			}
			return
		}
		if !external[name] {
			t.Errorf("%s: Secret %s is neither rendered nor a configured existingSecret", where, name)
		}
	}
	for _, o := range r.objects {
		tpl, _ := podTemplate(o)
		if tpl == nil {
			continue
		}
		for _, c := range append(slices.Clone(tpl.Spec.InitContainers), tpl.Spec.Containers...) {
			where := fmt.Sprintf("%s container %s", o, c.Name)
			for _, e := range c.Env {
				if e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil {
					checkSecretRef(where+" env "+e.Name, e.ValueFrom.SecretKeyRef.Name, e.ValueFrom.SecretKeyRef.Key)
				}
			}
			for _, ef := range c.EnvFrom {
				if ef.ConfigMapRef != nil {
					if _, ok := r.find("ConfigMap", ef.ConfigMapRef.Name); !ok {
						t.Errorf("%s: envFrom ConfigMap %s not rendered", where, ef.ConfigMapRef.Name)
					}
				}
			}
		}
		for _, v := range tpl.Spec.Volumes {
			if v.ConfigMap != nil {
				if _, ok := r.find("ConfigMap", v.ConfigMap.Name); !ok {
					t.Errorf("%s: volume ConfigMap %s not rendered", o, v.ConfigMap.Name)
				}
			}
		}
		if sa := tpl.Spec.ServiceAccountName; sa != "" && sa != "default" {
			if _, ok := r.find("ServiceAccount", sa); !ok && dig(r.values, "serviceAccount", "create") == true {
				t.Errorf("%s: ServiceAccount %s not rendered", o, sa)
			}
		}
	}
	for _, o := range r.ofKind("TriggerAuthentication") {
		refs, _, _ := unstructuredSlice(o.u.Object, "spec", "secretTargetRef")
		if len(refs) == 0 {
			t.Errorf("%s: no secretTargetRef", o)
		}
		for _, ref := range refs {
			m := ref.(map[string]any)
			checkSecretRef(o.String(), fmt.Sprint(m["name"]), fmt.Sprint(m["key"]))
		}
	}
}

func unstructuredSlice(obj map[string]any, fields ...string) ([]any, bool, error) {
	v := dig(obj, fields...)
	s, ok := v.([]any)
	return s, ok, nil
}

func env(c corev1.Container, name string) (corev1.EnvVar, bool) {
	for _, e := range c.Env {
		if e.Name == name {
			return e, true
		}
	}
	return corev1.EnvVar{}, false
}

// checkSecretRef reports an error unless the container's variable name is
// set from key of Secret secret (and nothing else).
func checkSecretRef(t *testing.T, c corev1.Container, name, secret, key string) {
	t.Helper()
	e, ok := env(c, name)
	if !ok || e.Value != "" || e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil ||
		e.ValueFrom.SecretKeyRef.Name != secret || e.ValueFrom.SecretKeyRef.Key != key {
		t.Errorf("%s: %+v, want secretKeyRef %s/%s", name, e, secret, key)
	}
}

func container(t *testing.T, o object, spec *corev1.PodSpec, name string) corev1.Container {
	t.Helper()
	for _, c := range spec.Containers {
		if c.Name == name {
			return c
		}
	}
	t.Fatalf("%s: no container %s", o, name)
	return corev1.Container{}
}

// checkAppWorkloads: receiver and worker have the probes, ports, commands,
// schema wait and the shutdown timing the chart promises.
func checkAppWorkloads(t *testing.T, r *rendering) {
	t.Helper()
	for _, comp := range []struct {
		name, port string
	}{{"receiver", "http"}, {"worker", "metrics"}} {
		o := r.mustFind(t, "Deployment", fullname+"-"+comp.name)
		d := o.obj.(*appsv1.Deployment)
		spec := &d.Spec.Template.Spec
		c := container(t, o, spec, comp.name)
		if !slices.Equal(c.Command, []string{"/usr/local/bin/" + comp.name}) {
			t.Errorf("%s: command %v", o, c.Command)
		}
		for _, p := range []struct {
			probe *corev1.Probe
			kind  string
			path  string
		}{{c.LivenessProbe, "liveness", "/livez"}, {c.ReadinessProbe, "readiness", "/readyz"}, {c.StartupProbe, "startup", "/livez"}} {
			if p.probe == nil || p.probe.HTTPGet == nil {
				t.Errorf("%s: no HTTP %s probe", o, p.kind)
				continue
			}
			if p.probe.HTTPGet.Path != p.path || p.probe.HTTPGet.Port.StrVal != comp.port {
				t.Errorf("%s: %s probe %s on %v, want %s on %s", o, p.kind, p.probe.HTTPGet.Path, p.probe.HTTPGet.Port, p.path, comp.port)
			}
		}
		if !hasNamedPort(&d.Spec.Template, comp.port) || !hasNamedPort(&d.Spec.Template, "metrics") {
			t.Errorf("%s: ports %v", o, c.Ports)
		}
		// Shutdown: terminationGracePeriodSeconds > preStop sleep + SHUTDOWN_TIMEOUT.
		st, ok := env(c, "SHUTDOWN_TIMEOUT")
		if !ok {
			t.Errorf("%s: no SHUTDOWN_TIMEOUT", o)
			continue
		}
		timeout, err := time.ParseDuration(st.Value)
		if err != nil {
			t.Errorf("%s: SHUTDOWN_TIMEOUT %q: %v", o, st.Value, err)
			continue
		}
		var sleep time.Duration
		if c.Lifecycle != nil && c.Lifecycle.PreStop != nil {
			if c.Lifecycle.PreStop.Sleep == nil {
				t.Errorf("%s: preStop is not a sleep action (the image has no shell)", o)
			} else {
				sleep = time.Duration(c.Lifecycle.PreStop.Sleep.Seconds) * time.Second
			}
		}
		want := int64(dig(r.values, comp.name, "shutdown", "preStopSleepSeconds").(float64))
		if int64(sleep/time.Second) != want {
			t.Errorf("%s: preStop sleep %s, values say %ds", o, sleep, want)
		}
		if comp.name == "receiver" && want > 0 && sleep == 0 {
			t.Errorf("%s: receiver has no preStop drain", o)
		}
		grace := spec.TerminationGracePeriodSeconds
		if grace == nil || time.Duration(*grace)*time.Second <= sleep+timeout {
			t.Errorf("%s: terminationGracePeriodSeconds %v must exceed preStop %s + SHUTDOWN_TIMEOUT %s", o, grace, sleep, timeout)
		}
		// Wait for the schema before starting.
		if len(spec.InitContainers) != 1 || !slices.Equal(spec.InitContainers[0].Command, []string{"/usr/local/bin/migrate", "wait"}) {
			t.Errorf("%s: want one init container running `migrate wait`, got %v", o, spec.InitContainers)
		}
		for _, e := range []string{"AMQP_URL", "REDIS_URL", "DATABASE_URL"} {
			if v, ok := env(c, e); !ok || v.ValueFrom == nil || v.ValueFrom.SecretKeyRef == nil {
				t.Errorf("%s: %s must come from a Secret", o, e)
			}
		}
		if comp.name == "receiver" {
			if _, ok := secretRefOf(spec, c, "WEBHOOK_SECRETS"); !ok {
				t.Errorf("%s: WEBHOOK_SECRETS must come from a Secret (a secretKeyRef, or a file of it)", o)
			}
		}
		if d.Spec.Template.Annotations["checksum/config"] == "" {
			t.Errorf("%s: no checksum/config annotation (pods would not roll on config changes)", o)
		}
	}
	svc := r.mustFind(t, "Service", fullname+"-receiver").obj.(*corev1.Service)
	if svc.Spec.Ports[0].Name != "http" {
		t.Errorf("receiver Service: first port %q", svc.Spec.Ports[0].Name)
	}
	for _, ing := range r.ofKind("Ingress") {
		for _, rule := range ing.obj.(*networkingv1.Ingress).Spec.Rules {
			for _, p := range rule.HTTP.Paths {
				if p.Backend.Service == nil || p.Backend.Service.Name != fullname+"-receiver" || p.Backend.Service.Port.Name != "http" {
					t.Errorf("%s: path %s does not route to the receiver's http port", ing, p.Path)
				}
			}
		}
	}
}

// checkAutoscaling: with autoscaling on, the worker has no replicas field and
// exactly one autoscaler targets it; with it off, replicas is set and no
// autoscaler exists (so `kubectl scale` is not fought).
func checkAutoscaling(t *testing.T, r *rendering) {
	t.Helper()
	worker := r.mustFind(t, "Deployment", fullname+"-worker")
	d := worker.obj.(*appsv1.Deployment)
	a := valuesMap(dig(r.values, "worker", "autoscaling"))
	hpas, scaled := r.ofKind("HorizontalPodAutoscaler"), r.ofKind("ScaledObject")
	if a["enabled"] != true {
		if d.Spec.Replicas == nil || float64(*d.Spec.Replicas) != dig(r.values, "worker", "replicaCount").(float64) {
			t.Errorf("autoscaling off: worker replicas %v, want worker.replicaCount", d.Spec.Replicas)
		}
		if len(hpas)+len(scaled) != 0 {
			t.Errorf("autoscaling off but autoscalers rendered: %v %v", hpas, scaled)
		}
		return
	}
	if d.Spec.Replicas != nil {
		t.Errorf("autoscaling on: the worker Deployment must not set replicas (the autoscaler owns it), got %d", *d.Spec.Replicas)
	}
	minR, maxR := int32(a["minReplicas"].(float64)), int32(a["maxReplicas"].(float64))
	target := fmt.Sprint(a["targetMessagesPerReplica"])
	switch a["mode"] {
	case "hpa":
		if len(hpas) != 1 || len(scaled) != 0 {
			t.Fatalf("hpa mode: want 1 HPA and no ScaledObject, got %d/%d", len(hpas), len(scaled))
		}
		h := hpas[0].obj.(*autoscalingv2.HorizontalPodAutoscaler)
		ref := h.Spec.ScaleTargetRef
		if ref.Kind != "Deployment" || ref.APIVersion != "apps/v1" || ref.Name != d.Name {
			t.Errorf("HPA scaleTargetRef %+v, want the worker Deployment", ref)
		}
		if h.Spec.MinReplicas == nil || *h.Spec.MinReplicas != minR || h.Spec.MaxReplicas != maxR {
			t.Errorf("HPA min/max %v/%d, want %d/%d", h.Spec.MinReplicas, h.Spec.MaxReplicas, minR, maxR)
		}
		if len(h.Spec.Metrics) != 1 || h.Spec.Metrics[0].Type != autoscalingv2.ExternalMetricSourceType || h.Spec.Metrics[0].External == nil {
			t.Fatalf("HPA metrics %+v, want one External metric", h.Spec.Metrics)
		}
		ext := h.Spec.Metrics[0].External
		wantName := dig(r.values, "worker", "autoscaling", "hpa", "metricName")
		if ext.Metric.Name != wantName {
			t.Errorf("HPA metric %q, want %q", ext.Metric.Name, wantName)
		}
		if ext.Metric.Selector == nil || ext.Metric.Selector.MatchLabels["queue"] != "events.main" {
			t.Errorf("HPA metric selector %v, want queue=events.main", ext.Metric.Selector)
		}
		if ext.Target.Type != autoscalingv2.AverageValueMetricType || ext.Target.AverageValue == nil || ext.Target.AverageValue.String() != target {
			t.Errorf("HPA target %+v, want AverageValue %s", ext.Target, target)
		}
		checkAdapterRule(t, r, ext.Metric.Name)
	case "keda":
		if len(scaled) != 1 || len(hpas) != 0 {
			t.Fatalf("keda mode: want 1 ScaledObject and no HPA, got %d/%d", len(scaled), len(hpas))
		}
		so := scaled[0].u.Object
		if dig(so, "spec", "scaleTargetRef", "name") != d.Name {
			t.Errorf("ScaledObject scaleTargetRef %v, want %s", dig(so, "spec", "scaleTargetRef"), d.Name)
		}
		if fmt.Sprint(dig(so, "spec", "minReplicaCount")) != fmt.Sprint(minR) || fmt.Sprint(dig(so, "spec", "maxReplicaCount")) != fmt.Sprint(maxR) {
			t.Errorf("ScaledObject min/max %v/%v", dig(so, "spec", "minReplicaCount"), dig(so, "spec", "maxReplicaCount"))
		}
		triggers, _, _ := unstructuredSlice(so, "spec", "triggers")
		if len(triggers) != 1 {
			t.Fatalf("ScaledObject triggers %v", triggers)
		}
		tr := triggers[0].(map[string]any)
		md := valuesMap(tr["metadata"])
		if tr["type"] != "rabbitmq" || md["queueName"] != "events.main" || md["mode"] != "QueueLength" || md["value"] != target {
			t.Errorf("ScaledObject trigger %v", tr)
		}
		if !slices.Contains([]any{"amqp", "http"}, md["protocol"]) {
			t.Errorf("ScaledObject trigger protocol %v", md["protocol"])
		}
		auth := fmt.Sprint(dig(tr, "authenticationRef", "name"))
		if _, ok := r.find("TriggerAuthentication", auth); !ok {
			t.Errorf("ScaledObject authenticationRef %s not rendered", auth)
		}
		// Every field must be one KEDA's ScaledObject spec has.
		for k := range valuesMap(so["spec"]) {
			if !slices.Contains([]string{"scaleTargetRef", "pollingInterval", "cooldownPeriod", "minReplicaCount", "maxReplicaCount", "advanced", "triggers"}, k) {
				t.Errorf("ScaledObject: unexpected spec field %q", k)
			}
		}
	default:
		t.Errorf("unknown autoscaling mode %v", a["mode"])
	}
}

// checkAdapterRule: the shipped prometheus-adapter rule serves the metric
// name the HPA asks for.
func checkAdapterRule(t *testing.T, r *rendering, metric string) {
	t.Helper()
	if dig(r.values, "worker", "autoscaling", "hpa", "prometheusAdapter", "createConfigMap") != true {
		return
	}
	o := r.mustFind(t, "ConfigMap", fullname+"-prometheus-adapter")
	ns, _ := dig(r.values, "worker", "autoscaling", "hpa", "prometheusAdapter", "namespace").(string)
	if ns != "" && o.u.GetNamespace() != ns {
		t.Errorf("%s: namespace %s, want %s", o, o.u.GetNamespace(), ns)
	}
	var cfg struct {
		ExternalRules []struct {
			SeriesQuery string `json:"seriesQuery"`
			Resources   struct {
				Overrides map[string]struct {
					Resource string `json:"resource"`
				} `json:"overrides"`
			} `json:"resources"`
			Name struct {
				Matches string `json:"matches"`
				As      string `json:"as"`
			} `json:"name"`
			MetricsQuery string `json:"metricsQuery"`
		} `json:"externalRules"`
	}
	if err := yaml.UnmarshalStrict([]byte(o.obj.(*corev1.ConfigMap).Data["config.yaml"]), &cfg); err != nil {
		t.Fatalf("%s: config.yaml: %v", o, err)
	}
	if len(cfg.ExternalRules) != 1 {
		t.Fatalf("%s: want one external rule, got %d", o, len(cfg.ExternalRules))
	}
	rule := cfg.ExternalRules[0]
	if rule.Name.As != metric {
		t.Errorf("%s: rule serves %q, the HPA asks for %q", o, rule.Name.As, metric)
	}
	if !strings.Contains(rule.MetricsQuery, "<<.LabelMatchers>>") || rule.Resources.Overrides["namespace"].Resource != "namespace" {
		t.Errorf("%s: rule must keep the HPA's label selector and namespace: %+v", o, rule)
	}
}

func hookWeight(o object) int {
	w, _ := strconv.Atoi(o.u.GetAnnotations()["helm.sh/hook-weight"])
	return w
}

func isHook(o object, phase string) bool {
	return slices.Contains(strings.Split(o.u.GetAnnotations()["helm.sh/hook"], ","), phase)
}

// checkMigration: the migration Job runs `migrate` as a pre-install and
// pre-upgrade hook, except on the first install with the bundled PostgreSQL.
func checkMigration(t *testing.T, r *rendering) {
	t.Helper()
	if dig(r.values, "migration", "enabled") != true {
		return
	}
	bundledDB := dig(r.values, "postgresql", "enabled") == true
	var jobs []object
	for _, o := range r.ofKind("Job") {
		if o.u.GetLabels()["app.kubernetes.io/component"] == "migration" {
			jobs = append(jobs, o)
		}
	}
	if len(jobs) != 1 {
		t.Fatalf("want one migration Job, got %d", len(jobs))
	}
	o := jobs[0]
	j := o.obj.(*batchv1.Job)
	c := container(t, o, &j.Spec.Template.Spec, "migrate")
	if !slices.Equal(c.Command, []string{"/usr/local/bin/migrate"}) {
		t.Errorf("%s: command %v", o, c.Command)
	}
	if bundledDB {
		if o.name() != fullname+"-migrate-install" || o.u.GetAnnotations()["helm.sh/hook"] != "" {
			t.Errorf("%s: on install with the bundled database the Job must be an ordinary object", o)
		}
		return
	}
	if !isHook(o, "pre-install") || !isHook(o, "pre-upgrade") || !isHook(o, "pre-rollback") {
		t.Errorf("%s: helm.sh/hook %q, want pre-install,pre-upgrade,pre-rollback", o, o.u.GetAnnotations()["helm.sh/hook"])
	}
	// The hook announces the release the new worker pods belong to.
	got := envOf(t, r, "Job", o.name(), "migrate")["WORKER_RELEASE"]
	if want := envOf(t, r, "Deployment", fullname+"-worker", "worker")["WORKER_RELEASE"]; got == "" || got != want {
		t.Errorf("%s: WORKER_RELEASE %q, the workers' %q", o, got, want)
	}
	if o.u.GetAnnotations()["helm.sh/hook-delete-policy"] != "before-hook-creation" {
		t.Errorf("%s: hook-delete-policy %q", o, o.u.GetAnnotations()["helm.sh/hook-delete-policy"])
	}
	if j.Spec.Template.Spec.ServiceAccountName != "" {
		t.Errorf("%s: a pre-install hook cannot use the release's ServiceAccount (created later)", o)
	}
	// Whatever the hook reads must exist before the release's own objects.
	ref := c.Env[len(c.Env)-1].ValueFrom.SecretKeyRef
	if s, ok := r.find("Secret", ref.Name); ok && !isHook(s, "pre-install") {
		t.Errorf("%s reads Secret %s, which is created only after pre-install hooks", o, ref.Name)
	} else if ok && hookWeight(s) >= hookWeight(o) {
		t.Errorf("Secret %s must have a lower hook weight than %s", ref.Name, o)
	}
}

// checkHelmTest: the test hook is a Pod (`helm test --logs` reads the logs
// of test Pods only, and fails on a Job) that sends one event twice, then
// verifies it was processed once. The event id ends in the Pod's UID, from
// the downward API in both containers, so that no two runs share an id.
func checkHelmTest(t *testing.T, r *rendering) {
	t.Helper()
	var hooks []object
	for _, o := range r.objects {
		if isHook(o, "test") {
			hooks = append(hooks, o)
		}
	}
	if dig(r.values, "helmTest", "enabled") != true {
		if len(hooks) > 0 {
			t.Errorf("helmTest.enabled=false but %s rendered", hooks[0])
		}
		return
	}
	if len(hooks) != 1 {
		t.Fatalf("want one helm test hook, got %d: %s", len(hooks), r.summary())
	}
	o := hooks[0]
	pod, ok := o.obj.(*corev1.Pod)
	if !ok || o.name() != fullname+"-test" {
		t.Fatalf("%s: the helm test hook must be Pod %s-test (helm test --logs finds no Pod of a Job)", o, fullname)
	}
	if o.u.GetAnnotations()["helm.sh/hook-delete-policy"] != "before-hook-creation" {
		t.Errorf("%s: hook-delete-policy %q, want before-hook-creation", o, o.u.GetAnnotations()["helm.sh/hook-delete-policy"])
	}
	spec := pod.Spec
	if spec.RestartPolicy != corev1.RestartPolicyNever {
		t.Errorf("%s: restartPolicy %q, want Never (a failed check must fail the test)", o, spec.RestartPolicy)
	}
	if spec.ActiveDeadlineSeconds == nil || *spec.ActiveDeadlineSeconds <= 0 {
		t.Errorf("%s: no activeDeadlineSeconds", o)
	}
	if len(spec.InitContainers) != 1 || len(spec.Containers) != 1 {
		t.Fatalf("%s: want send (init) + verify containers", o)
	}
	sendC, verifyC := spec.InitContainers[0], spec.Containers[0]
	send, verify := strings.Join(sendC.Command, " "), strings.Join(verifyC.Command, " ")
	id := flagValue(sendC.Command, "--id")
	if !strings.HasPrefix(send, "/usr/local/bin/eventsctl send ") || flagValue(sendC.Command, "--times") != "2" || id == "" {
		t.Errorf("%s: send step %q must send one id twice", o, send)
	}
	if !strings.Contains(flagValue(sendC.Command, "--url"), fullname+"-receiver") {
		t.Errorf("%s: send step does not target the receiver Service: %q", o, send)
	}
	if !strings.HasPrefix(verify, "/usr/local/bin/eventsctl verify ") || flagValue(verifyC.Command, "--id") != id || flagValue(verifyC.Command, "--expect") != "1" {
		t.Errorf("%s: verify step %q must expect the same id exactly once", o, verify)
	}
	if !strings.HasSuffix(id, "_$(POD_UID)") {
		t.Errorf("%s: event id %q does not end in _$(POD_UID): a rerun would send an id a surviving Redis answers as a duplicate", o, id)
	}
	for _, c := range []corev1.Container{sendC, verifyC} {
		e, ok := env(c, "POD_UID")
		if !ok || e.Value != "" || e.ValueFrom == nil || e.ValueFrom.FieldRef == nil || e.ValueFrom.FieldRef.FieldPath != "metadata.uid" {
			t.Errorf("%s container %s: POD_UID is %+v, want fieldRef metadata.uid (Kubernetes expands $(POD_UID) only from the container's env)", o, c.Name, e)
		}
	}
}

func flagValue(args []string, name string) string {
	for i, a := range args {
		if a == name && i+1 < len(args) {
			return args[i+1]
		}
	}
	return ""
}

// checkMonitoring: ServiceMonitor, PrometheusRule and dashboard exist when
// asked for (the first two only where the Prometheus Operator API exists)
// and carry the artifacts of rules/ and dashboards/.
func checkMonitoring(t *testing.T, r *rendering, apis []string) {
	t.Helper()
	hasAPI := slices.Contains(apis, apiMonitoring)
	want := func(key string) bool { return dig(r.values, "monitoring", key, "enabled") == true }
	sms := r.ofKind("ServiceMonitor")
	var ours []object
	for _, o := range sms {
		if isOurs(o) {
			ours = append(ours, o)
		}
	}
	if got, exp := len(ours), btoi(want("serviceMonitor") && hasAPI); got != exp {
		t.Errorf("ServiceMonitors: %d, want %d", got, exp)
	}
	for _, o := range ours {
		sm := o.obj.(*monitoringv1.ServiceMonitor)
		sel, err := metav1.LabelSelectorAsSelector(&sm.Spec.Selector)
		if err != nil {
			t.Fatal(err)
		}
		var matched []string
		for _, s := range r.ofKind("Service") {
			if sel.Matches(labels.Set(s.u.GetLabels())) {
				matched = append(matched, s.name())
				if !slices.ContainsFunc(s.obj.(*corev1.Service).Spec.Ports, func(p corev1.ServicePort) bool { return p.Name == sm.Spec.Endpoints[0].Port }) {
					t.Errorf("%s selects %s, which has no port %q", o, s, sm.Spec.Endpoints[0].Port)
				}
			}
		}
		slices.Sort(matched)
		if !slices.Equal(matched, []string{fullname + "-receiver", fullname + "-worker-metrics"}) {
			t.Errorf("%s selects %v, want the receiver and worker-metrics Services", o, matched)
		}
	}
	prs := r.ofKind("PrometheusRule")
	if got, exp := len(prs), btoi(want("prometheusRule") && hasAPI); got != exp {
		t.Errorf("PrometheusRules: %d, want %d", got, exp)
	}
	for _, o := range prs {
		pr := o.obj.(*monitoringv1.PrometheusRule)
		file, err := os.ReadFile(filepath.Join(chartDir, "rules", "idempotent-events.rules.yaml"))
		if err != nil {
			t.Fatal(err)
		}
		var spec monitoringv1.PrometheusRuleSpec
		if err := yaml.UnmarshalStrict(file, &spec); err != nil {
			t.Fatalf("rules file does not decode strictly as a PrometheusRule spec: %v", err)
		}
		if len(pr.Spec.Groups) == 0 || len(pr.Spec.Groups) != len(spec.Groups) {
			t.Errorf("%s: %d groups, the rules file has %d", o, len(pr.Spec.Groups), len(spec.Groups))
		}
		for i := range spec.Groups {
			if i < len(pr.Spec.Groups) && len(pr.Spec.Groups[i].Rules) != len(spec.Groups[i].Rules) {
				t.Errorf("%s: group %s has %d rules, the file %d", o, spec.Groups[i].Name, len(pr.Spec.Groups[i].Rules), len(spec.Groups[i].Rules))
			}
		}
	}
	dash, ok := r.find("ConfigMap", fullname+"-dashboard")
	if ok != want("dashboard") {
		t.Errorf("dashboard ConfigMap rendered=%v, want %v", ok, want("dashboard"))
	}
	if ok {
		cm := dash.obj.(*corev1.ConfigMap)
		if cm.Labels["grafana_dashboard"] != "1" {
			t.Errorf("%s: no grafana_dashboard label", dash)
		}
		file, err := os.ReadFile(filepath.Join(chartDir, "dashboards", "idempotent-events.json"))
		if err != nil {
			t.Fatal(err)
		}
		var a, b any
		if err := json.Unmarshal([]byte(cm.Data["idempotent-events.json"]), &a); err != nil {
			t.Fatalf("%s: dashboard is not JSON: %v", dash, err)
		}
		if err := json.Unmarshal(file, &b); err != nil {
			t.Fatal(err)
		}
		ja, _ := json.Marshal(a)
		jb, _ := json.Marshal(b)
		if string(ja) != string(jb) {
			t.Errorf("%s: dashboard differs from dashboards/idempotent-events.json", dash)
		}
	}
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

func checkNotes(t *testing.T, r *rendering) {
	t.Helper()
	for _, want := range []string{"eventsctl send", "--times 2", "helm test", fullname + "-receiver"} {
		if !strings.Contains(r.notes, want) {
			t.Errorf("NOTES.txt does not mention %q", want)
		}
	}
}

// writeRendering saves the objects as one multi-document YAML file, for the
// kubernetes-models validation of hack/deploytest/crdcheck.
func writeRendering(t *testing.T, path string, r *rendering) {
	t.Helper()
	var b strings.Builder
	for _, o := range r.objects {
		b.WriteString("---\n# Source: " + o.file + "\n")
		b.Write(o.raw)
		if !strings.HasSuffix(string(o.raw), "\n") {
			b.WriteString("\n")
		}
	}
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
}
