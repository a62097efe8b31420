package deploytest

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"go.starlark.net/starlark"
	"go.starlark.net/syntax"
)

// tiltBuiltins are the Tilt API functions the Tiltfile may call. Each is
// stubbed: the stub records the call so the test can check its arguments.
var tiltBuiltins = []string{
	"allow_k8s_contexts", "version_settings", "update_settings", "local_resource",
	"docker_build", "k8s_yaml", "helm", "k8s_resource", "port_forward", "sync", "run",
	"local", "namespace_create", "fall_back_on", "restart_container", "watch_file",
	"load_dynamic", "config", "include", "k8s_kind", "custom_build", "link", "fail",
}

type tiltCall struct {
	fn     string
	args   starlark.Tuple
	kwargs map[string]starlark.Value
}

func (c tiltCall) kw(name string) starlark.Value { return c.kwargs[name] }

// runTiltfile executes the Tiltfile with stub builtins and returns its calls
// and globals. Syntax errors, undefined names and runtime errors fail.
func runTiltfile(t *testing.T) ([]tiltCall, starlark.StringDict) {
	t.Helper()
	src, err := os.ReadFile(filepath.Join(repoRoot, "Tiltfile"))
	if err != nil {
		t.Fatal(err)
	}
	if regexp.MustCompile(`load\(\s*['"]ext://`).Match(src) {
		t.Error("Tiltfile loads an ext:// extension; those need network at `tilt up` time")
	}
	var calls []tiltCall
	predeclared := starlark.StringDict{
		"TRIGGER_MODE_AUTO":   starlark.MakeInt(0),
		"TRIGGER_MODE_MANUAL": starlark.MakeInt(1),
	}
	for _, name := range tiltBuiltins {
		predeclared[name] = starlark.NewBuiltin(name, func(_ *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
			c := tiltCall{fn: b.Name(), args: args, kwargs: map[string]starlark.Value{}}
			for _, kv := range kwargs {
				c.kwargs[string(kv[0].(starlark.String))] = kv[1]
			}
			calls = append(calls, c)
			switch b.Name() {
			case "local":
				return starlark.String("amd64\n"), nil
			case "helm":
				return starlark.String("<helm output>"), nil
			case "port_forward":
				return starlark.Tuple{args[0], args[1]}, nil
			}
			return starlark.None, nil
		})
	}
	opts := &syntax.FileOptions{Set: true, While: true, TopLevelControl: true, GlobalReassign: true, Recursion: true}
	thread := &starlark.Thread{Name: "Tiltfile", Print: func(_ *starlark.Thread, msg string) { t.Log(msg) }}
	globals, err := starlark.ExecFileOptions(opts, thread, "Tiltfile", src, predeclared)
	if err != nil {
		if ee, ok := err.(*starlark.EvalError); ok {
			t.Fatalf("Tiltfile: %s", ee.Backtrace())
		}
		t.Fatalf("Tiltfile: %v", err)
	}
	return calls, globals
}

func str(v starlark.Value) string {
	s, ok := starlark.AsString(v)
	if !ok {
		return fmt.Sprint(v)
	}
	return s
}

// TestTiltfile runs the Tiltfile and checks that what it deploys and names
// exists: the chart and values files, the image the chart uses, the
// resources (workloads rendered from the chart with the same values) and the
// ports it forwards.
func TestTiltfile(t *testing.T) {
	calls, globals := runTiltfile(t)
	byFn := map[string][]tiltCall{}
	for _, c := range calls {
		byFn[c.fn] = append(byFn[c.fn], c)
	}
	helmCalls := byFn["helm"]
	if len(helmCalls) != 1 {
		t.Fatalf("want one helm() call, got %d", len(helmCalls))
	}
	h := helmCalls[0]
	chart := filepath.Join(repoRoot, str(h.args[0]))
	if _, err := os.Stat(filepath.Join(chart, "Chart.yaml")); err != nil {
		t.Fatalf("helm(): %v", err)
	}
	var valueFiles []string
	for v := range h.kw("values").(*starlark.List).Elements() {
		f := filepath.Join(repoRoot, str(v))
		if _, err := os.Stat(f); err != nil {
			t.Fatalf("helm() values: %v", err)
		}
		valueFiles = append(valueFiles, f)
	}
	rel, ns := str(h.kw("name")), str(h.kw("namespace"))
	r, err := renderChart(renderOpts{valueFiles: valueFiles, release: rel, namespace: ns})
	if err != nil {
		t.Fatalf("render with the Tiltfile's values: %v", err)
	}
	workloads := map[string]bool{}
	for _, o := range r.objects {
		if tpl, _ := podTemplate(o); tpl != nil && o.u.GetAnnotations()["helm.sh/hook"] == "" {
			workloads[o.name()] = true
		}
		if h := o.u.GetAnnotations()["helm.sh/hook"]; strings.Contains(h, "test") {
			t.Errorf("%s: Tilt applies hooks as ordinary objects; the dev values must disable the helm test", o)
		}
	}
	named := map[string]bool{}
	for _, c := range byFn["k8s_resource"] {
		name := str(c.args[0])
		named[name] = true
		if !workloads[name] {
			t.Errorf("k8s_resource(%q): no such workload in the chart; have %v", name, workloads)
		}
	}
	for w := range workloads {
		if !named[w] {
			t.Errorf("workload %s has no k8s_resource (no labels or dependencies in the Tilt UI)", w)
		}
	}
	// Resource dependencies name resources that exist.
	resources := maps(named)
	for _, c := range byFn["local_resource"] {
		resources[str(c.args[0])] = true
	}
	for _, c := range append(byFn["k8s_resource"], byFn["local_resource"]...) {
		if deps, ok := c.kw("resource_deps").(*starlark.List); ok {
			for d := range deps.Elements() {
				if !resources[str(d)] {
					t.Errorf("%s(%s): resource_deps names unknown resource %s", c.fn, str(c.args[0]), str(d))
				}
			}
		}
		if deps, ok := c.kw("deps").(*starlark.List); ok {
			for d := range deps.Elements() {
				if _, err := os.Stat(filepath.Join(repoRoot, str(d))); err != nil {
					t.Errorf("local_resource(%s): dep %v", str(c.args[0]), err)
				}
			}
		}
	}
	// The image Tilt builds is the one the chart deploys with these values.
	builds := byFn["docker_build"]
	if len(builds) != 1 {
		t.Fatalf("want one docker_build, got %d", len(builds))
	}
	if ref, repo := str(builds[0].args[0]), dig(r.values, "image", "repository"); ref != repo {
		t.Errorf("docker_build(%q) does not match image.repository %q of the dev values", ref, repo)
	}
	// Port forwards hit ports the chart opens.
	ports := map[string][]int{
		rel + "-receiver":   {8080, 9090},
		rel + "-worker":     {9091},
		rel + "-rabbitmq":   {15672, 15692},
		rel + "-redis":      {6379},
		rel + "-postgresql": {5432},
	}
	for _, c := range byFn["k8s_resource"] {
		pf, ok := c.kw("port_forwards").(*starlark.List)
		if !ok {
			continue
		}
		for p := range pf.Elements() {
			var container int
			switch v := p.(type) {
			case starlark.Tuple:
				container, _ = starlark.AsInt32(v[1])
			case starlark.String:
				parts := strings.Split(string(v), ":")
				fmt.Sscan(parts[len(parts)-1], &container)
			}
			if !slices.Contains(ports[str(c.args[0])], container) {
				t.Errorf("k8s_resource(%s): port forward to %d, which the pod does not serve (%v)", str(c.args[0]), container, ports[str(c.args[0])])
			}
		}
	}
	if _, ok := globals["DEV_DOCKERFILE"]; !ok {
		t.Error("Tiltfile: DEV_DOCKERFILE not defined (the Dockerfile test lints it)")
	}
}

func maps(m map[string]bool) map[string]bool {
	out := map[string]bool{}
	for k, v := range m {
		out[k] = v
	}
	return out
}
