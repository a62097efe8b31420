package deploytest

import (
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
)

// tlsScenario is the chart's scenario with TLS to all three services.
var tlsScenario = filepath.Join("testdata", "tls-values.yaml")

// tlsServices are the chart's TLS values by service: the URL variable that
// says a container connects to the service, and the prefix of its TLS
// variables.
var tlsServices = []struct{ values, urlVar, prefix string }{
	{"rabbitmq", "AMQP_URL", "AMQP_TLS"},
	{"redis", "REDIS_URL", "REDIS_TLS"},
	{"postgresql", "DATABASE_URL", "DATABASE_TLS"},
}

// Every container that is given a service's URL is given its TLS too: the
// variables the tls.<service> values ask for, pointing into the service's
// Secret, mounted read-only and whole (a subPath mount never sees the
// kubelet's updates, and rotation relies on them) from a volume of the
// Secret named in the values, not readable by other users.
func TestTLSValuesReachTheContainers(t *testing.T) {
	r, err := renderChart(renderOpts{valueFiles: []string{tlsScenario}})
	if err != nil {
		t.Fatalf("render: %v", err)
	}
	mount := dig(r.values, "tls", "mountPath").(string)
	checked := map[string]int{}
	for _, o := range r.objects {
		tpl, _ := podTemplate(o)
		if tpl == nil || !isOurs(o) {
			continue
		}
		for _, c := range append(append([]corev1.Container{}, tpl.Spec.InitContainers...), tpl.Spec.Containers...) {
			for _, s := range tlsServices {
				if _, ok := env(c, s.urlVar); !ok {
					if _, tls := env(c, s.prefix+"_CA_FILE"); tls {
						t.Errorf("%s container %s: %s_CA_FILE without %s", o, c.Name, s.prefix, s.urlVar)
					}
					continue
				}
				checked[s.values]++
				v := valuesMap(dig(r.values, "tls", s.values))
				dir := mount + "/" + s.values
				want := map[string]string{}
				if v["ca"] == true {
					want[s.prefix+"_CA_FILE"] = dir + "/ca.crt"
				}
				if v["clientCertificate"] == true {
					want[s.prefix+"_CERT_FILE"] = dir + "/tls.crt"
					want[s.prefix+"_KEY_FILE"] = dir + "/tls.key"
				}
				if v["required"] == true {
					want[s.prefix+"_REQUIRED"] = "true"
				}
				for _, suffix := range []string{"_CA_FILE", "_CERT_FILE", "_KEY_FILE", "_REQUIRED"} {
					name := s.prefix + suffix
					got, ok := env(c, name)
					switch w, wanted := want[name]; {
					case wanted && (!ok || got.Value != w):
						t.Errorf("%s container %s: %s = %q, want %q", o, c.Name, name, got.Value, w)
					case !wanted && ok:
						t.Errorf("%s container %s: %s = %q, not asked for by the values", o, c.Name, name, got.Value)
					}
				}
				checkTLSMount(t, o, tpl, c, "tls-"+s.values, dir, v["existingSecret"].(string))
			}
		}
	}
	// The receiver and worker (and their schema wait), the relay-less
	// migration Job, prune and reconcile all connect to PostgreSQL.
	for _, s := range []string{"rabbitmq", "redis", "postgresql"} {
		if checked[s] == 0 {
			t.Errorf("no container connects to %s: %s", s, r.summary())
		}
	}
	t.Logf("containers checked by service: %v", checked)
}

func checkTLSMount(t *testing.T, o object, tpl *corev1.PodTemplateSpec, c corev1.Container, volume, dir, secret string) {
	t.Helper()
	var found bool
	for _, m := range c.VolumeMounts {
		if m.Name != volume {
			continue
		}
		found = true
		if m.MountPath != dir || !m.ReadOnly || m.SubPath != "" {
			t.Errorf("%s container %s: mount %s at %q readOnly=%v subPath=%q; want %q, read-only, whole", o, c.Name, volume, m.MountPath, m.ReadOnly, m.SubPath, dir)
		}
	}
	if !found {
		t.Errorf("%s container %s: no mount of volume %s", o, c.Name, volume)
	}
	for _, v := range tpl.Spec.Volumes {
		if v.Name != volume {
			continue
		}
		if v.Secret == nil || v.Secret.SecretName != secret || v.Secret.DefaultMode == nil || *v.Secret.DefaultMode&0o007 != 0 {
			t.Errorf("%s volume %s: %+v; want Secret %s, not world-readable", o, volume, v.VolumeSource, secret)
		}
		return
	}
	t.Errorf("%s: no volume %s", o, volume)
}

// Without tls values, nothing of TLS is rendered: the URLs' schemes and the
// libraries' defaults apply, as before.
func TestTLSOffByDefault(t *testing.T) {
	r, err := renderChart(renderOpts{})
	if err != nil {
		t.Fatalf("render: %v", err)
	}
	for _, o := range r.objects {
		tpl, _ := podTemplate(o)
		if tpl == nil {
			continue
		}
		for _, c := range append(append([]corev1.Container{}, tpl.Spec.InitContainers...), tpl.Spec.Containers...) {
			for _, e := range c.Env {
				if strings.Contains(e.Name, "_TLS_") {
					t.Errorf("%s container %s: %s set by default", o, c.Name, e.Name)
				}
			}
		}
		for _, v := range tpl.Spec.Volumes {
			if strings.HasPrefix(v.Name, "tls-") {
				t.Errorf("%s: volume %s by default", o, v.Name)
			}
		}
	}
}

// The contract check (--check-config in each container's rendered
// environment) passes the TLS scenario with the URLs' TLS schemes (the
// scenario is among those TestChartEnvironmentPassesCheckConfig runs; the
// mounted files are not read by --check-config, they exist only in the
// pod), and catches a plaintext URL beside TLS values, which the schema
// cannot see: REDIS_URL redis:// with tls.redis set.
func TestTLSContractRefusesAPlaintextURL(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binaries; skipped with -short")
	}
	bin := buildCheckedBinaries(t)
	r, err := renderChart(renderOpts{valueFiles: []string{tlsScenario},
		set: map[string]any{"externalRedis": map[string]any{"url": "redis://:not-a-real-password@redis.example.internal:6379/0"}}})
	if err != nil {
		t.Fatalf("render: %v", err)
	}
	o := r.mustFind(t, "Deployment", fullname+"-worker")
	tpl, _ := podTemplate(o)
	c := container(t, o, &tpl.Spec, "worker")
	envm, err := containerEnv(r, tpl, c)
	if err != nil {
		t.Fatal(err)
	}
	code, stderr := checkConfig(t, filepath.Join(bin, "worker"), []string{"--check-config"}, envm)
	if code != 2 || !strings.Contains(stderr, "invalid configuration: REDIS_URL: a redis:// URL is plaintext") || strings.Contains(stderr, "not-a-real-password") {
		t.Errorf("worker --check-config with redis:// and REDIS_TLS_*: exit %d, stderr %q; want 2 naming REDIS_URL, without the password", code, stderr)
	}
}
