package deploytest

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation"
)

// The chart/binary contract: every container of the release that runs one of
// the service's binaries gets an environment (and arguments) that binary
// accepts. The strict render, the schema and the API server's dry run check
// the chart's shape, not what the binaries make of the values (a boolean
// DUPLICATE_CHECK passed all three and crash-looped the receiver on a default
// install).

// imageEntrypoint is the Dockerfile's ENTRYPOINT: what a container of the
// image runs when it sets no command.
const imageEntrypoint = "/usr/local/bin/receiver"

// imageEnv is the environment the image itself sets (distroless/static);
// the container runtime puts the container's variables over it.
var imageEnv = map[string]string{
	"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
}

// checkedBinaries are the binaries with --check-config, by their path in
// the image.
var checkedBinaries = map[string]string{
	"/usr/local/bin/receiver": "receiver",
	"/usr/local/bin/worker":   "worker",
	"/usr/local/bin/migrate":  "migrate",
}

// eventsctlPath is the operator CLI in the image. Of its commands, those in
// checkedCommands have -check-config, which takes the command's own flags:
// such a container is checked with its arguments as well as its
// environment. The others (send and verify, which the helm test runs) are
// clients without it.
const eventsctlPath = "/usr/local/bin/eventsctl"

var checkedCommands = map[string]bool{"reconcile": true, "prune": true}

// builtBinaries are the cmd/ packages the contract test builds.
var builtBinaries = []string{"eventsctl", "migrate", "receiver", "worker"}

// userSecretStandIns stand in for the Secrets the values say the user manages
// (existingSecret), by the variable that reads them: values of the shape
// docs/kubernetes.md asks for. The webhook sources' variables are handled by
// sourceSecretStandIn.
var userSecretStandIns = map[string]string{
	"AMQP_URL":        "amqps://app:stand-in-password@rabbitmq.example.internal:5671/payments",
	"REDIS_URL":       "rediss://:stand-in-password@redis.example.internal:6380/0",
	"DATABASE_URL":    "postgres://app:stand-in-password@db.example.internal:5432/idempotent_events?sslmode=require",
	"WEBHOOK_SECRETS": "whsec_stand_in_signing_secret",
	"ADMIN_TOKEN":     "stand-in-admin-token-0123456789",
	"STRIPE_API_KEY":  "rk_live_stand_in_restricted_key",
}

// standInPod is the pod a resolved fieldRef reads from.
var standInPod = map[string]string{
	"metadata.uid":   "3f1c2b7e-9a4d-4e8b-b6a1-0c5d2e7f9a13",
	"spec.nodeName":  "node-1",
	"status.hostIP":  "172.18.0.2",
	"status.hostIPs": "172.18.0.2",
	"status.podIP":   "10.244.1.17",
	"status.podIPs":  "10.244.1.17",
}

// TestChartEnvironmentPassesCheckConfig renders the default values (also
// with the reconcile CronJob on) and every scenario, resolves the
// environment of each container that runs receiver, worker, migrate or
// `eventsctl reconcile` as the kubelet would, and runs that binary (built
// from this tree) with --check-config in exactly that environment; for
// `eventsctl reconcile`, with the container's arguments too, so its flags
// are parsed and checked as a run would.
func TestChartEnvironmentPassesCheckConfig(t *testing.T) {
	if testing.Short() {
		t.Skip("builds receiver, worker, migrate and eventsctl; skipped with -short")
	}
	bin := buildCheckedBinaries(t)
	type variant struct {
		name string
		opts renderOpts
	}
	variants := []variant{{"values.yaml", renderOpts{}}, {"values.yaml+reconcile", renderOpts{set: reconcileOn}}}
	for _, s := range scenarios(t) {
		variants = append(variants, variant{filepath.Base(s.file), renderOpts{valueFiles: []string{s.file}}})
	}
	for _, v := range variants {
		t.Run(v.name, func(t *testing.T) {
			v.opts.apis = []string{apiMonitoring, apiKEDA}
			r, err := renderChart(v.opts)
			if err != nil {
				t.Fatalf("render: %v", err)
			}
			ran := runCheckConfig(t, r, bin, v.name)
			t.Logf("--check-config passed for %v", ran)
			want := []string{"receiver", "worker"}
			if dig(r.values, "migration", "enabled") == true {
				want = append(want, "migrate")
			}
			if dig(r.values, "reconcile", "enabled") == true {
				want = append(want, "eventsctl reconcile")
			}
			if dig(r.values, "prune", "enabled") == true {
				want = append(want, "eventsctl prune")
			}
			for _, b := range want {
				if ran[b] == 0 {
					t.Errorf("no container runs %s; have: %s", b, r.summary())
				}
			}
		})
	}
}

// TestReconcileContractCatchesWhatTheSchemaCannot: a window beyond Stripe's
// 30 days is a valid duration to the schema; eventsctl refuses it, and the
// contract check says so before any cluster runs the CronJob.
func TestReconcileContractCatchesWhatTheSchemaCannot(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binaries; skipped with -short")
	}
	bin := buildCheckedBinaries(t)
	r, err := renderChart(renderOpts{set: mergeMaps(reconcileOn, map[string]any{"reconcile": map[string]any{"since": "800h"}})})
	if err != nil {
		t.Fatalf("render: %v", err)
	}
	o := r.mustFind(t, "CronJob", fullname+"-reconcile")
	tpl, _ := podTemplate(o)
	c := container(t, o, &tpl.Spec, "reconcile")
	env, err := containerEnv(r, tpl, c)
	if err != nil {
		t.Fatal(err)
	}
	b, argv, _, err := binaryOf(r, c, env)
	if err != nil {
		t.Fatal(err)
	}
	code, stderr := checkConfig(t, filepath.Join(bin, strings.Fields(b)[0]), argv, env)
	if code != 2 || !strings.Contains(stderr, "Since") {
		t.Errorf("eventsctl reconcile -since=800h -check-config: exit %d, stderr %q; want 2 naming Since", code, stderr)
	}
}

// runCheckConfig runs the check of every container of r that runs a checked
// binary, reports the failures, and counts the checks by binary.
func runCheckConfig(t *testing.T, r *rendering, bin, values string) map[string]int {
	t.Helper()
	ran := map[string]int{}
	for _, o := range r.objects {
		tpl, _ := podTemplate(o)
		if tpl == nil {
			continue
		}
		for _, c := range append(slices.Clone(tpl.Spec.InitContainers), tpl.Spec.Containers...) {
			env, envErr := containerEnv(r, tpl, c)
			b, argv, ok, err := binaryOf(r, c, env)
			if err != nil {
				t.Errorf("%s container %s: %v", o, c.Name, err)
			}
			if !ok {
				continue
			}
			where := fmt.Sprintf("%s container %s (%s, values %s)", o, c.Name, b, values)
			if envErr != nil {
				t.Errorf("%s: the kubelet would not start it: %v", where, envErr)
				continue
			}
			ran[b]++
			env = mountSecretFiles(t, r, tpl, c, env)
			code, stderr := checkConfig(t, filepath.Join(bin, strings.Fields(b)[0]), argv, env)
			if code != 0 {
				t.Errorf("%s: %s %s exited %d with the arguments and environment the chart gives it (%s):\n%s",
					where, strings.Fields(b)[0], strings.Join(argv, " "), code, strings.Join(sortedKeys(env), " "), stderr)
			}
		}
	}
	return ran
}

// buildCheckedBinaries builds builtBinaries from the service module at the
// repository root into a temporary directory.
func buildCheckedBinaries(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs(repoRoot)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	args := []string{"build", "-o", dir + string(filepath.Separator)}
	for _, b := range builtBinaries {
		args = append(args, "./cmd/"+b)
	}
	build := exec.Command("go", args...)
	build.Dir = root
	start := time.Now()
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	t.Logf("built %d binaries in %s", len(builtBinaries), time.Since(start).Round(time.Millisecond))
	return dir
}

// binaryOf tells which checked binary container c runs, and the arguments
// of its check: the first word of its command, or the image's entrypoint
// without one, with --check-config; for an eventsctl command with
// -check-config, the command's arguments (command and args, $(VAR) expanded
// from env as the kubelet does) and then -check-config. Containers of other
// images (the bundled services') and eventsctl's other commands are not
// checked; a command the image does not have is an error.
func binaryOf(r *rendering, c corev1.Container, env map[string]string) (string, []string, bool, error) {
	if c.Image != expectedImage(r) {
		return "", nil, false, nil
	}
	exe := imageEntrypoint
	if len(c.Command) > 0 {
		exe = c.Command[0]
	}
	if b, ok := checkedBinaries[exe]; ok {
		return b, []string{"--check-config"}, true, nil
	}
	if exe != eventsctlPath {
		return "", nil, false, fmt.Errorf("runs %q, which is not a binary of the image", exe)
	}
	var argv []string
	if len(c.Command) > 1 {
		argv = append(argv, c.Command[1:]...)
	}
	argv = append(argv, c.Args...)
	if len(argv) == 0 || !checkedCommands[argv[0]] {
		return "", nil, false, nil
	}
	for i, a := range argv {
		argv[i] = expand(a, env)
	}
	return "eventsctl " + argv[0], append(argv, "-check-config"), true, nil
}

// containerEnv resolves the environment of container c as the kubelet does:
// envFrom sources in order (with their prefix), then env in order, later
// names replacing earlier ones; $(VAR) in a value expands to a variable
// defined before it. A missing ConfigMap, Secret or key that is not optional
// is an error (the kubelet reports CreateContainerConfigError).
func containerEnv(r *rendering, tpl *corev1.PodTemplateSpec, c corev1.Container) (map[string]string, error) {
	env := map[string]string{}
	for _, ef := range c.EnvFrom {
		var data map[string]string
		var err error
		switch {
		case ef.ConfigMapRef != nil:
			data, err = configMapData(r, ef.ConfigMapRef.Name, ef.ConfigMapRef.Optional)
		case ef.SecretRef != nil:
			data, err = secretData(r, ef.SecretRef.Name, ef.SecretRef.Optional)
		default:
			err = errors.New("envFrom without a source")
		}
		if err != nil {
			return nil, err
		}
		for k, v := range data {
			name := ef.Prefix + k
			if errs := validation.IsEnvVarName(name); len(errs) > 0 {
				// The kubelet skips such a key with an event: the setting
				// silently never arrives.
				return nil, fmt.Errorf("envFrom key %q: %s", name, strings.Join(errs, "; "))
			}
			env[name] = v
		}
	}
	for _, e := range c.Env {
		v, set, err := envValue(r, tpl, c, e, env)
		if err != nil {
			return nil, fmt.Errorf("env %s: %w", e.Name, err)
		}
		if set {
			env[e.Name] = v
		}
	}
	return env, nil
}

// envValue is the value of one env entry; set is false for an optional
// reference to a missing key (the kubelet leaves the variable out).
func envValue(r *rendering, tpl *corev1.PodTemplateSpec, c corev1.Container, e corev1.EnvVar, defined map[string]string) (string, bool, error) {
	src := e.ValueFrom
	if src == nil {
		return expand(e.Value, defined), true, nil
	}
	switch {
	case src.ConfigMapKeyRef != nil:
		ref := src.ConfigMapKeyRef
		data, err := configMapData(r, ref.Name, ref.Optional)
		if err != nil {
			return "", false, err
		}
		return key(data, ref.Key, "ConfigMap "+ref.Name, ref.Optional)
	case src.SecretKeyRef != nil:
		ref := src.SecretKeyRef
		if _, rendered := r.find("Secret", ref.Name); !rendered && externalSecretNames(r)[ref.Name] {
			v, ok := standIn(r, e.Name)
			if !ok {
				return "", false, fmt.Errorf("reads the user's Secret %s and there is no stand-in value for %s (add one to userSecretStandIns)", ref.Name, e.Name)
			}
			return v, true, nil
		}
		data, err := secretData(r, ref.Name, ref.Optional)
		if err != nil {
			return "", false, err
		}
		return key(data, ref.Key, "Secret "+ref.Name, ref.Optional)
	case src.FieldRef != nil:
		return fieldValue(tpl, src.FieldRef.FieldPath)
	case src.ResourceFieldRef != nil:
		return "", false, fmt.Errorf("resourceFieldRef %s: not modelled by this test", src.ResourceFieldRef.Resource)
	}
	return "", false, errors.New("valueFrom without a source")
}

func key(data map[string]string, k, where string, optional *bool) (string, bool, error) {
	if v, ok := data[k]; ok {
		return v, true, nil
	}
	if optional != nil && *optional {
		return "", false, nil
	}
	return "", false, fmt.Errorf("%s has no key %s", where, k)
}

func configMapData(r *rendering, name string, optional *bool) (map[string]string, error) {
	o, ok := r.find("ConfigMap", name)
	if !ok {
		if optional != nil && *optional {
			return nil, nil
		}
		return nil, fmt.Errorf("ConfigMap %s is not rendered", name)
	}
	return o.obj.(*corev1.ConfigMap).Data, nil
}

// secretData is a rendered Secret's data as the API server stores it
// (stringData written over data).
func secretData(r *rendering, name string, optional *bool) (map[string]string, error) {
	o, ok := r.find("Secret", name)
	if !ok {
		if optional != nil && *optional {
			return nil, nil
		}
		return nil, fmt.Errorf("Secret %s is not rendered", name)
	}
	s := o.obj.(*corev1.Secret)
	out := map[string]string{}
	for k, v := range s.Data {
		out[k] = string(v)
	}
	for k, v := range s.StringData {
		out[k] = v
	}
	return out, nil
}

// standIn is the value a user's Secret holds for variable name.
func standIn(r *rendering, name string) (string, bool) {
	if v, ok := userSecretStandIns[name]; ok {
		return v, true
	}
	for _, s := range webhookSources(r) {
		if s.secretsVar() != name {
			continue
		}
		switch s.scheme {
		case "standard":
			return "whsec_" + base64.StdEncoding.EncodeToString([]byte("stand-in-standard-webhooks-key")), true
		case "stripe":
			return "whsec_stand_in_source_secret", true
		default:
			return "stand-in-" + s.scheme + "-secret", true
		}
	}
	return "", false
}

// fieldValue resolves a downward-API fieldRef of a pod made from tpl.
func fieldValue(tpl *corev1.PodTemplateSpec, field string) (string, bool, error) {
	switch {
	case field == "metadata.name":
		return "stand-in-pod-7d9c5b8f6-x2kqz", true, nil
	case field == "metadata.namespace":
		return namespace, true, nil
	case field == "spec.serviceAccountName":
		if tpl.Spec.ServiceAccountName == "" {
			return "default", true, nil
		}
		return tpl.Spec.ServiceAccountName, true, nil
	case strings.HasPrefix(field, "metadata.labels['"):
		return tpl.Labels[strings.TrimSuffix(strings.TrimPrefix(field, "metadata.labels['"), "']")], true, nil
	case strings.HasPrefix(field, "metadata.annotations['"):
		return tpl.Annotations[strings.TrimSuffix(strings.TrimPrefix(field, "metadata.annotations['"), "']")], true, nil
	}
	if v, ok := standInPod[field]; ok {
		return v, true, nil
	}
	return "", false, fmt.Errorf("fieldRef %s: not modelled by this test", field)
}

// expand replaces $(VAR) with the value of a variable defined earlier, $$
// with $, and leaves any other reference as written (the kubelet's rules).
func expand(s string, defined map[string]string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] != '$' || i+1 == len(s) {
			b.WriteByte(s[i])
			continue
		}
		switch s[i+1] {
		case '$':
			b.WriteByte('$')
			i++
			continue
		case '(':
			if end := strings.IndexByte(s[i+2:], ')'); end >= 0 {
				name := s[i+2 : i+2+end]
				if v, ok := defined[name]; ok {
					b.WriteString(v)
				} else {
					b.WriteString(s[i : i+3+end])
				}
				i += 2 + end
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// checkConfig runs bin with argv (its check) with the image's environment
// under env and nothing else, and returns its exit status and stderr.
func checkConfig(t *testing.T, bin string, argv []string, env map[string]string) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	all := map[string]string{}
	for k, v := range imageEnv {
		all[k] = v
	}
	for k, v := range env {
		all[k] = v
	}
	cmd := exec.CommandContext(ctx, bin, argv...)
	cmd.Env = []string{}
	for _, k := range sortedKeys(all) {
		cmd.Env = append(cmd.Env, k+"="+all[k])
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	err := cmd.Run()
	var exit *exec.ExitError
	switch {
	case err == nil:
		return 0, stderr.String()
	case errors.As(err, &exit):
		return exit.ExitCode(), stderr.String()
	}
	t.Fatalf("run %s: %v", path.Base(bin), err)
	return -1, ""
}

func sortedKeys(m map[string]string) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
