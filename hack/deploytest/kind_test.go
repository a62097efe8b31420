package deploytest

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"sigs.k8s.io/kind/pkg/apis/config/v1alpha4"
	"sigs.k8s.io/yaml"
)

// TestKindConfig decodes kind-config.yaml strictly into kind's v1alpha4
// types (what `kind create cluster --config` does before it needs Docker),
// then checks what kind itself would only check with Docker: roles, the
// first node, and that the receiver's NodePort reaches the host.
func TestKindConfig(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(repoRoot, "kind-config.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var c v1alpha4.Cluster
	if err := yaml.UnmarshalStrict(b, &c); err != nil {
		t.Fatalf("kind-config.yaml: %v", err)
	}
	if c.Kind != "Cluster" || c.APIVersion != "kind.x-k8s.io/v1alpha4" {
		t.Errorf("kind/apiVersion %q/%q", c.Kind, c.APIVersion)
	}
	if c.Name != "idempotent-events" {
		t.Errorf("cluster name %q, want idempotent-events (Tiltfile and hack scripts use kind-idempotent-events)", c.Name)
	}
	if len(c.Nodes) == 0 || c.Nodes[0].Role != v1alpha4.ControlPlaneRole {
		t.Fatalf("the first node must be the control plane: %+v", c.Nodes)
	}
	for i, n := range c.Nodes {
		if n.Role != v1alpha4.ControlPlaneRole && n.Role != v1alpha4.WorkerRole {
			t.Errorf("node %d: role %q", i, n.Role)
		}
	}
	// The receiver's NodePort from ci/kind-values.yaml is mapped to the host.
	vals, err := readValues([]string{filepath.Join(chartDir, "ci", "kind-values.yaml")}, nil)
	if err != nil {
		t.Fatal(err)
	}
	nodePort := int32(dig(vals, "receiver", "service", "nodePort").(float64))
	if dig(vals, "receiver", "service", "type") != "NodePort" {
		t.Errorf("ci/kind-values.yaml: receiver Service is not a NodePort")
	}
	found := false
	for _, pm := range c.Nodes[0].ExtraPortMappings {
		if pm.ContainerPort == nodePort {
			found = true
			if pm.HostPort != 8080 || pm.ListenAddress != "127.0.0.1" {
				t.Errorf("receiver NodePort %d mapped to %s:%d, want 127.0.0.1:8080", nodePort, pm.ListenAddress, pm.HostPort)
			}
		}
	}
	if !found {
		t.Errorf("NodePort %d of ci/kind-values.yaml is not in the control plane's extraPortMappings", nodePort)
	}
	// The local registry: containerd reads hosts.toml files (written by
	// hack/kind-up.sh), and the image of ci/kind-values.yaml is pushed there.
	if len(c.ContainerdConfigPatches) == 0 || !strings.Contains(c.ContainerdConfigPatches[0], `config_path = "/etc/containerd/certs.d"`) {
		t.Errorf("containerdConfigPatches must set the registry config_path")
	}
	repo := dig(vals, "image", "repository").(string)
	script, err := os.ReadFile(filepath.Join(repoRoot, "hack", "kind-up.sh"))
	if err != nil {
		t.Fatal(err)
	}
	reg := strings.SplitN(repo, "/", 2)[0]
	if !strings.Contains(string(script), reg) || !strings.Contains(string(script), "kind-config.yaml") || !strings.Contains(string(script), "ci/kind-values.yaml") {
		t.Errorf("hack/kind-up.sh must use kind-config.yaml, ci/kind-values.yaml and the registry %s", reg)
	}
}
