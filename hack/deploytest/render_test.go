package deploytest

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"helm.sh/helm/v4/pkg/chart/common"
	"helm.sh/helm/v4/pkg/chart/common/util"
	chart "helm.sh/helm/v4/pkg/chart/v2"
	"helm.sh/helm/v4/pkg/chart/v2/loader"
	chartutil "helm.sh/helm/v4/pkg/chart/v2/util"
	"helm.sh/helm/v4/pkg/engine"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/yaml"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
)

// Paths, relative to this module's directory (go test runs tests there).
var (
	repoRoot = filepath.Join("..", "..")
	chartDir = filepath.Join(repoRoot, "charts", "idempotent-events")
)

const (
	// kubeVersion is the Kubernetes version rendered for and served by envtest.
	kubeVersion = "v1.37.2"
	releaseName = "test"
	namespace   = "payments"
	// Optional APIs some templates are gated on.
	apiMonitoring = "monitoring.coreos.com/v1"
	apiKEDA       = "keda.sh/v1alpha1"
)

// capsVariants are the API sets every scenario is rendered with.
var capsVariants = []struct {
	name string
	apis []string
}{
	{"plain", nil},
	{"crds", []string{apiMonitoring, apiKEDA}},
}

// scenario is one charts/idempotent-events/ci/*-values.yaml file, or one
// testdata/*-values.yaml file: an offline-only scenario, which make k8s-e2e
// (it installs every ci/ file) does not install because its cluster lacks
// something the values need, such as a Stripe account.
type scenario struct {
	name string // file name without -values.yaml; "offline-" first for testdata
	file string
}

func scenarios(t *testing.T) []scenario {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(chartDir, "ci", "*-values.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no ci/*-values.yaml scenarios found (%v)", err)
	}
	offline, err := filepath.Glob(filepath.Join("testdata", "*-values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(files)
	sort.Strings(offline)
	out := make([]scenario, 0, len(files)+len(offline))
	for _, f := range files {
		out = append(out, scenario{name: strings.TrimSuffix(filepath.Base(f), "-values.yaml"), file: f})
	}
	for _, f := range offline {
		out = append(out, scenario{name: "offline-" + strings.TrimSuffix(filepath.Base(f), "-values.yaml"), file: f})
	}
	return out
}

// renderOpts describes one render.
type renderOpts struct {
	valueFiles []string
	set        map[string]any // merged last, like --set
	apis       []string       // extra API versions (like --api-versions)
	upgrade    bool           // render as helm upgrade (revision 2) instead of install
	release    string
	namespace  string
}

// object is one rendered Kubernetes object.
type object struct {
	file string // template path, e.g. idempotent-events/templates/worker/deployment.yaml
	gvk  schema.GroupVersionKind
	raw  []byte
	obj  runtime.Object // typed object (built-in kinds and monitoring.coreos.com)
	u    *unstructured.Unstructured
}

func (o object) name() string { return o.u.GetName() }
func (o object) String() string {
	return fmt.Sprintf("%s %s (%s)", o.gvk.Kind, o.u.GetName(), o.file)
}

// rendering is the output of one render.
type rendering struct {
	values  map[string]any // the values passed to the templates (.Values)
	objects []object
	notes   string
}

func (r *rendering) find(kind, name string) (object, bool) {
	for _, o := range r.objects {
		if o.gvk.Kind == kind && o.name() == name {
			return o, true
		}
	}
	return object{}, false
}

func (r *rendering) mustFind(t *testing.T, kind, name string) object {
	t.Helper()
	o, ok := r.find(kind, name)
	if !ok {
		t.Fatalf("no %s %q rendered; have: %s", kind, name, r.summary())
	}
	return o
}

func (r *rendering) ofKind(kind string) []object {
	var out []object
	for _, o := range r.objects {
		if o.gvk.Kind == kind {
			out = append(out, o)
		}
	}
	return out
}

func (r *rendering) summary() string {
	var parts []string
	for _, o := range r.objects {
		parts = append(parts, o.gvk.Kind+"/"+o.name())
	}
	return strings.Join(parts, ", ")
}

// scheme knows the built-in kinds and the Prometheus Operator's kinds, so
// they decode into typed objects.
var scheme = func() *runtime.Scheme {
	s := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(s); err != nil {
		panic(err)
	}
	if err := monitoringv1.AddToScheme(s); err != nil {
		panic(err)
	}
	return s
}()

// strictDecoder rejects unknown and duplicate fields.
var strictDecoder = serializer.NewCodecFactory(scheme, serializer.EnableStrict).UniversalDeserializer()

// readValues reads and merges value files and overrides like helm -f ... --set.
func readValues(files []string, set map[string]any) (map[string]any, error) {
	vals := map[string]any{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		m := map[string]any{}
		if err := yaml.Unmarshal(b, &m); err != nil {
			return nil, fmt.Errorf("%s: %w", f, err)
		}
		vals = mergeMaps(vals, m)
	}
	return mergeMaps(vals, set), nil
}

// mergeMaps merges b over a (deep for maps), like Helm merges value files.
func mergeMaps(a, b map[string]any) map[string]any {
	out := make(map[string]any, len(a))
	for k, v := range a {
		out[k] = v
	}
	for k, v := range b {
		if bm, ok := v.(map[string]any); ok {
			if am, ok := out[k].(map[string]any); ok {
				out[k] = mergeMaps(am, bm)
				continue
			}
		}
		out[k] = v
	}
	return out
}

func capabilities(apis []string) *common.Capabilities {
	caps := common.DefaultCapabilities.Copy()
	kv, err := common.ParseKubeVersion(kubeVersion)
	if err != nil {
		panic(err)
	}
	caps.KubeVersion = *kv
	caps.APIVersions = append(append(common.VersionSet{}, caps.APIVersions...), apis...)
	return caps
}

func loadChart() (*chart.Chart, error) {
	return loader.Load(chartDir)
}

// renderChart renders the chart as `helm template` would, but with the
// engine in strict mode (missing keys are errors), and decodes every
// document strictly. An error is returned for a schema violation, a template
// failure or an object that does not decode.
func renderChart(o renderOpts) (*rendering, error) {
	ch, err := loadChart()
	if err != nil {
		return nil, fmt.Errorf("load chart: %w", err)
	}
	if !chartutil.IsCompatibleRange(ch.Metadata.KubeVersion, kubeVersion) {
		return nil, fmt.Errorf("chart kubeVersion %q excludes %s", ch.Metadata.KubeVersion, kubeVersion)
	}
	vals, err := readValues(o.valueFiles, o.set)
	if err != nil {
		return nil, err
	}
	if err := chartutil.ProcessDependencies(ch, vals); err != nil {
		return nil, fmt.Errorf("dependencies: %w", err)
	}
	rel := common.ReleaseOptions{Name: o.release, Namespace: o.namespace, Revision: 1, IsInstall: true}
	if rel.Name == "" {
		rel.Name = releaseName
	}
	if rel.Namespace == "" {
		rel.Namespace = namespace
	}
	if o.upgrade {
		rel.Revision, rel.IsInstall, rel.IsUpgrade = 2, false, true
	}
	top, err := util.ToRenderValues(ch, vals, rel, capabilities(o.apis))
	if err != nil {
		return nil, err
	}
	files, err := engine.Engine{Strict: true}.Render(ch, top)
	if err != nil {
		return nil, err
	}
	out := &rendering{values: top["Values"].(common.Values)}
	names := make([]string, 0, len(files))
	for n := range files {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		content := files[n]
		if strings.HasSuffix(n, "NOTES.txt") {
			if n == ch.Name()+"/templates/NOTES.txt" {
				out.notes = content
			}
			continue
		}
		if !strings.HasSuffix(n, ".yaml") && !strings.HasSuffix(n, ".yml") {
			if strings.TrimSpace(content) != "" {
				return nil, fmt.Errorf("%s: non-YAML template rendered output", n)
			}
			continue
		}
		objs, err := decodeDocuments(n, []byte(content))
		if err != nil {
			return nil, err
		}
		out.objects = append(out.objects, objs...)
	}
	return out, nil
}

// decodeDocuments splits a rendered file into documents and decodes each.
func decodeDocuments(file string, content []byte) ([]object, error) {
	var out []object
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(content)))
	for i := 0; ; i++ {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, fmt.Errorf("%s: document %d: %w", file, i, err)
		}
		if isEmptyDocument(doc) {
			continue
		}
		o, err := decodeObject(file, doc)
		if err != nil {
			return nil, fmt.Errorf("%s: document %d: %w", file, i, err)
		}
		out = append(out, o)
	}
}

func isEmptyDocument(doc []byte) bool {
	for _, line := range strings.Split(string(doc), "\n") {
		l := strings.TrimSpace(line)
		if l != "" && !strings.HasPrefix(l, "#") && l != "---" {
			return false
		}
	}
	return true
}

func decodeObject(file string, doc []byte) (object, error) {
	u := &unstructured.Unstructured{}
	js, err := yaml.YAMLToJSON(doc)
	if err != nil {
		return object{}, err
	}
	if err := u.UnmarshalJSON(js); err != nil {
		return object{}, err
	}
	gvk := u.GroupVersionKind()
	o := object{file: file, gvk: gvk, raw: doc, u: u}
	if scheme.Recognizes(gvk) {
		obj, _, err := strictDecoder.Decode(doc, nil, nil)
		if err != nil {
			return object{}, fmt.Errorf("strict decode of %s %s: %w", gvk.Kind, u.GetName(), err)
		}
		o.obj = obj
		return o, nil
	}
	// Only the KEDA kinds are expected here; they are checked field by field
	// in the property tests (and by the API server only where KEDA's CRDs are
	// installed, which they are not offline).
	if gvk.GroupVersion().String() != apiKEDA {
		return object{}, fmt.Errorf("unexpected kind %s (no Go type registered)", gvk)
	}
	return o, nil
}
