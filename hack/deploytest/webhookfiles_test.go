package deploytest

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
)

// webhookFilesScenario is the chart's scenario with the webhook signing
// secrets mounted as files.
var webhookFilesScenario = filepath.Join(chartDir, "ci", "webhook-files-values.yaml")

// With webhook.secretsAsFiles the receiver reads no signing secret from a
// variable: WEBHOOK_SECRETS_FILE and each source's
// WEBHOOK_SECRETS_<NAME>_FILE point into one projected volume of the
// Secrets' keys (the chart's own, and the user's existingSecret), mounted
// read-only and whole (a subPath mount never sees the kubelet's updates,
// and the rotation relies on them), not readable by other users.
func TestWebhookSecretsAsFiles(t *testing.T) {
	r, err := renderChart(renderOpts{valueFiles: []string{webhookFilesScenario}})
	if err != nil {
		t.Fatalf("render: %v", err)
	}
	dir := dig(r.values, "webhook", "secretsMountPath").(string)
	o := r.mustFind(t, "Deployment", fullname+"-receiver")
	tpl, _ := podTemplate(o)
	c := container(t, o, &tpl.Spec, "receiver")
	want := map[string]struct{ secret, key string }{
		"WEBHOOK_SECRETS":            {fullname, "WEBHOOK_SECRETS"},
		"WEBHOOK_SECRETS_SHOP":       {fullname, "WEBHOOK_SECRETS_SHOP"},
		"WEBHOOK_SECRETS_GITHUB_APP": {"github-webhook", "secret"},
	}
	for variable := range want {
		if e, ok := env(c, variable); ok {
			t.Errorf("receiver: %s is set (%+v); with secretsAsFiles only %s_FILE is", variable, e, variable)
		}
		e, ok := env(c, variable+"_FILE")
		if !ok || e.Value != dir+"/"+variable {
			t.Errorf("receiver: %s_FILE = %q, want %q", variable, e.Value, dir+"/"+variable)
		}
	}
	var mounted bool
	for _, m := range c.VolumeMounts {
		if m.Name == "webhook-secrets" {
			mounted = true
			if m.MountPath != dir || !m.ReadOnly || m.SubPath != "" {
				t.Errorf("receiver: mount %+v; want %q, read-only, whole", m, dir)
			}
		}
	}
	if !mounted {
		t.Errorf("receiver: volume webhook-secrets is not mounted")
	}
	v := volume(tpl, "webhook-secrets")
	if v == nil || v.Projected == nil {
		t.Fatalf("receiver: no projected volume webhook-secrets: %+v", v)
	}
	if v.Projected.DefaultMode == nil || *v.Projected.DefaultMode&0o007 != 0 {
		t.Errorf("webhook-secrets: mode %v; the files must not be world-readable", v.Projected.DefaultMode)
	}
	got := map[string]struct{ secret, key string }{}
	for _, src := range v.Projected.Sources {
		if src.Secret == nil {
			t.Errorf("webhook-secrets: a source that is not a Secret: %+v", src)
			continue
		}
		for _, it := range src.Secret.Items {
			got[it.Path] = struct{ secret, key string }{src.Secret.Name, it.Key}
		}
	}
	for path, w := range want {
		if got[path] != w {
			t.Errorf("webhook-secrets: file %s from %+v, want Secret %s key %s", path, got[path], w.secret, w.key)
		}
	}
	if len(got) != len(want) {
		t.Errorf("webhook-secrets: files %v, want exactly %v", got, want)
	}
}

// The secrets' values stay out of the pods' checksum annotation when they
// are files: a change of them (a rotation step) rolls no pod, the receiver
// reads them again. As variables, a change must roll the pods, the only
// way a variable reaches a running process.
func TestWebhookSecretsAsFilesRollNoPodOnRotation(t *testing.T) {
	checksum := func(asFiles bool, secrets string) string {
		t.Helper()
		var list []any
		for _, s := range strings.Split(secrets, ",") {
			list = append(list, s)
		}
		r, err := renderChart(renderOpts{set: map[string]any{"webhook": map[string]any{"secretsAsFiles": asFiles, "secrets": secrets,
			"sources": []any{map[string]any{"name": "shop", "scheme": "github", "secrets": list}}}}})
		if err != nil {
			t.Fatalf("render: %v", err)
		}
		o := r.mustFind(t, "Deployment", fullname+"-receiver")
		tpl, _ := podTemplate(o)
		return tpl.Annotations["checksum/secret"]
	}
	if a, b := checksum(true, "whsec_old"), checksum(true, "whsec_old,whsec_new"); a != b {
		t.Errorf("secretsAsFiles: adding a secret changes checksum/secret (%s -> %s): every pod would roll", a, b)
	}
	if a, b := checksum(false, "whsec_old"), checksum(false, "whsec_old,whsec_new"); a == b {
		t.Errorf("secrets as variables: adding a secret leaves checksum/secret as it was: no pod would get it")
	}
}

func volume(tpl *corev1.PodTemplateSpec, name string) *corev1.Volume {
	return specVolume(&tpl.Spec, name)
}

func specVolume(spec *corev1.PodSpec, name string) *corev1.Volume {
	for i := range spec.Volumes {
		if spec.Volumes[i].Name == name {
			return &spec.Volumes[i]
		}
	}
	return nil
}

// secretRefOf is the Secret key variable's value comes from in container c
// of spec: a secretKeyRef of the variable itself, or, with
// webhook.secretsAsFiles, the key projected to the file <variable>_FILE
// names.
func secretRefOf(spec *corev1.PodSpec, c corev1.Container, variable string) (*corev1.SecretKeySelector, bool) {
	if e, ok := env(c, variable); ok {
		if e.Value != "" || e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil {
			return nil, false
		}
		return e.ValueFrom.SecretKeyRef, true
	}
	f, ok := env(c, variable+"_FILE")
	if !ok {
		return nil, false
	}
	for _, m := range c.VolumeMounts {
		rest, under := strings.CutPrefix(f.Value, m.MountPath+"/")
		v := specVolume(spec, m.Name)
		if !under || v == nil || v.Projected == nil || m.SubPath != "" {
			continue
		}
		for _, src := range v.Projected.Sources {
			if src.Secret == nil {
				continue
			}
			for _, it := range src.Secret.Items {
				if it.Path == rest {
					return &corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: src.Secret.Name}, Key: it.Key}, true
				}
			}
		}
	}
	return nil, false
}

// mountSecretFiles does for the contract check what the kubelet does for a
// container's projected volumes of Secrets (webhook.secretsAsFiles): it
// writes each item's value to a file in a directory of the test's (the
// Secret's rendered data, or the stand-in of the variable the file stands
// for when the user manages the Secret), and points the variables that
// name a file under the mount path at that directory instead, so that the
// binary reads the files as it would in the pod.
func mountSecretFiles(t *testing.T, r *rendering, tpl *corev1.PodTemplateSpec, c corev1.Container, envm map[string]string) map[string]string {
	t.Helper()
	for _, m := range c.VolumeMounts {
		v := volume(tpl, m.Name)
		if v == nil || v.Projected == nil {
			continue
		}
		dir := t.TempDir()
		for _, src := range v.Projected.Sources {
			if src.Secret == nil {
				continue
			}
			data, err := secretData(r, src.Secret.Name, src.Secret.Optional)
			external := err != nil && externalSecretNames(r)[src.Secret.Name]
			if err != nil && !external {
				t.Errorf("volume %s: %v", m.Name, err)
				continue
			}
			for _, it := range src.Secret.Items {
				value, ok := data[it.Key]
				if external {
					value, ok = standIn(r, it.Path)
				}
				if !ok {
					t.Errorf("volume %s: no value for %s (Secret %s key %s)", m.Name, it.Path, src.Secret.Name, it.Key)
					continue
				}
				if err := os.WriteFile(filepath.Join(dir, it.Path), []byte(value), 0o600); err != nil {
					t.Fatal(err)
				}
			}
		}
		for k, val := range envm {
			if rest, ok := strings.CutPrefix(val, m.MountPath+"/"); ok {
				envm[k] = filepath.Join(dir, rest)
			}
		}
	}
	return envm
}
