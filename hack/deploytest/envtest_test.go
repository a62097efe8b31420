package deploytest

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
)

type warningCollector struct {
	mu   sync.Mutex
	msgs []string
}

func (w *warningCollector) HandleWarningHeader(_ int, _ string, msg string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.msgs = append(w.msgs, msg)
}

func (w *warningCollector) take() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	m := w.msgs
	w.msgs = nil
	return m
}

// TestAPIServerDryRun starts a real kube-apiserver and etcd (envtest; the
// binaries are built from hack/tools by hack/check-deploy.sh and found through
// KUBEBUILDER_ASSETS) and creates every rendered built-in object of every
// scenario with a server-side dry run and strict field validation: the API
// server's own validation (unknown fields, required fields, value ranges,
// immutable-field rules, defaulting) must accept all of them without a
// warning. CRD kinds (ServiceMonitor, PrometheusRule, ScaledObject,
// TriggerAuthentication) are not served here: no CRDs are available offline.
func TestAPIServerDryRun(t *testing.T) {
	assets := os.Getenv("KUBEBUILDER_ASSETS")
	if assets == "" {
		if os.Getenv("DEPLOYTEST_REQUIRE_ENVTEST") != "" {
			t.Fatal("KUBEBUILDER_ASSETS is not set (run hack/check-deploy.sh)")
		}
		t.Skip("KUBEBUILDER_ASSETS not set: no kube-apiserver/etcd to test against")
	}
	for _, b := range []string{"kube-apiserver", "etcd"} {
		if _, err := os.Stat(filepath.Join(assets, b)); err != nil {
			t.Fatalf("envtest asset: %v", err)
		}
	}
	env := &envtest.Environment{BinaryAssetsDirectory: assets}
	cfg, err := env.Start()
	if err != nil {
		t.Fatalf("start envtest: %v", err)
	}
	t.Cleanup(func() {
		if err := env.Stop(); err != nil {
			t.Errorf("stop envtest: %v", err)
		}
	})
	warnings := &warningCollector{}
	cfg = rest.CopyConfig(cfg)
	cfg.WarningHandler = warnings
	ctx := context.Background()

	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	v, err := cs.Discovery().ServerVersion()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("API server %s", v.GitVersion)
	if v.GitVersion != kubeVersion {
		t.Errorf("API server %s, the chart is rendered for %s", v.GitVersion, kubeVersion)
	}
	for _, ns := range []string{namespace, "monitoring", "idempotent-events"} {
		if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	dc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc))

	type variant struct {
		name string
		opts renderOpts
	}
	var variants []variant
	for _, s := range scenarios(t) {
		variants = append(variants, variant{s.name, renderOpts{valueFiles: []string{s.file}, apis: []string{apiMonitoring, apiKEDA}}})
	}
	variants = append(variants, variant{"default-upgrade", renderOpts{upgrade: true}})
	// A 47-character full name (the longest with which every object of the
	// default values fits in 63) and the reconcile CronJob, whose name the
	// API server limits to 52 characters.
	variants = append(variants, variant{"reconcile-long-name", renderOpts{set: mergeMaps(reconcileOn, map[string]any{
		"fullnameOverride": strings.Repeat("payments-", 5) + "ab", "networkPolicy": map[string]any{"enabled": true},
	})}})
	accepted, skipped := 0, map[string]int{}
	for _, vr := range variants {
		t.Run(vr.name, func(t *testing.T) {
			r, err := renderChart(vr.opts)
			if err != nil {
				t.Fatalf("render: %v", err)
			}
			for _, o := range r.objects {
				if o.obj == nil || strings.HasPrefix(o.gvk.Group, "monitoring.coreos.com") {
					skipped[o.gvk.Kind]++
					continue
				}
				m, err := mapper.RESTMapping(o.gvk.GroupKind(), o.gvk.Version)
				if err != nil {
					t.Errorf("%s: the API server does not serve it: %v", o, err)
					continue
				}
				_, err = dyn.Resource(m.Resource).Namespace(o.u.GetNamespace()).Create(ctx, o.u.DeepCopy(), metav1.CreateOptions{
					DryRun:          []string{metav1.DryRunAll},
					FieldValidation: metav1.FieldValidationStrict,
				})
				if err != nil {
					t.Errorf("%s: rejected: %v", o, err)
					continue
				}
				for _, w := range warnings.take() {
					t.Errorf("%s: API warning: %s", o, w)
				}
				accepted++
			}
		})
	}
	t.Logf("accepted %d objects in %d variants; not served (CRDs) and skipped: %v", accepted, len(variants), skipped)
	if accepted == 0 {
		t.Fatal("nothing was sent to the API server")
	}

	// Negative controls: the server rejects an unknown field (strict field
	// validation) and an invalid value (its own validation), so the dry runs
	// above prove something.
	r, err := renderChart(renderOpts{})
	if err != nil {
		t.Fatalf("render: %v", err)
	}
	base := r.mustFind(t, "Deployment", fullname+"-receiver").u
	unknown := base.DeepCopy()
	if err := unstructuredSetField(unknown.Object, "x", "spec", "template", "spec", "containers", "0", "bogusField"); err != nil {
		t.Fatal(err)
	}
	invalid := base.DeepCopy()
	invalid.SetName("Not_A_DNS_Name")
	deployments := appsv1.SchemeGroupVersion.WithResource("deployments")
	for _, c := range []struct {
		name string
		obj  *unstructured.Unstructured
		want string
	}{{"unknown field", unknown, `unknown field "spec.template.spec.containers[0].bogusField"`}, {"invalid name", invalid, "Not_A_DNS_Name"}} {
		_, err := dyn.Resource(deployments).Namespace(namespace).Create(ctx, c.obj, metav1.CreateOptions{
			DryRun: []string{metav1.DryRunAll}, FieldValidation: metav1.FieldValidationStrict,
		})
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("negative control %q: want an error containing %q, got %v", c.name, c.want, err)
		}
	}
}

// unstructuredSetField sets a field, treating numeric path parts as list indexes.
func unstructuredSetField(obj map[string]any, value any, path ...string) error {
	var cur any = obj
	for i, p := range path {
		last := i == len(path)-1
		switch node := cur.(type) {
		case map[string]any:
			if last {
				node[p] = value
				return nil
			}
			cur = node[p]
		case []any:
			idx, err := strconv.Atoi(p)
			if err != nil || idx >= len(node) {
				return fmt.Errorf("bad index %q", p)
			}
			cur = node[idx]
		default:
			return fmt.Errorf("cannot descend into %T at %q", cur, p)
		}
	}
	return nil
}
