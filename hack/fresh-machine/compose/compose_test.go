// Package compose checks the repository's compose.yaml offline (its images
// cannot be pulled on the machines that run the suite): it is a valid Compose
// file by Compose's own loader and schema (compose-spec/compose-go, what
// `docker compose` uses), it has the three services hack/services.sh starts
// from it, on 127.0.0.1 only at the ports the tests use, and their images are
// the ones the Helm chart's subcharts run.
//
// It is a module of its own so that the project's module does not depend on
// compose-go. Run by `make fresh-machine` (the fresh-machine stage of
// `make test`).
package compose

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/compose-spec/compose-go/v2/loader"
	"github.com/compose-spec/compose-go/v2/types"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v4"
)

const root = "../../.."

// expected is what the tests and `make dev` need of each service: the
// subchart that names its image, and its ports on 127.0.0.1.
var expected = map[string]struct {
	subchart string
	ports    []uint32
}{
	"postgres": {"postgresql", []uint32{5432}},
	"redis":    {"redis", []uint32{6379}},
	"rabbitmq": {"rabbitmq", []uint32{5672, 15672}},
}

func load(t *testing.T, path string) *types.Project {
	t.Helper()
	abs, err := filepath.Abs(path)
	require.NoError(t, err)
	b, err := os.ReadFile(abs)
	require.NoError(t, err)
	p, err := loader.LoadWithContext(context.Background(), types.ConfigDetails{
		WorkingDir:  filepath.Dir(abs),
		ConfigFiles: []types.ConfigFile{{Filename: abs, Content: b}},
		Environment: types.Mapping{},
	}, func(o *loader.Options) { o.SetProjectName("idempotent-events", true) })
	require.NoError(t, err, "%s is not a valid Compose file", path)
	return p
}

// chartImage is repository:tag of a subchart's values.yaml.
func chartImage(t *testing.T, subchart string) string {
	t.Helper()
	path := filepath.Join(root, "charts/idempotent-events/charts", subchart, "values.yaml")
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	var v struct {
		Image struct{ Repository, Tag string }
	}
	require.NoError(t, yaml.Unmarshal(b, &v), path)
	require.NotEmpty(t, v.Image.Repository, "%s: image.repository", path)
	require.NotEmpty(t, v.Image.Tag, "%s: image.tag", path)
	return v.Image.Repository + ":" + v.Image.Tag
}

// problems lists every way p differs from what the services need, with
// images[service] the chart's image of each.
func problems(p *types.Project, images map[string]string) []string {
	var out []string
	names := slices.Sorted(func(yield func(string) bool) {
		for n := range p.Services {
			if !yield(n) {
				return
			}
		}
	})
	if want := []string{"postgres", "rabbitmq", "redis"}; !slices.Equal(names, want) {
		out = append(out, fmt.Sprintf("services are %v, want %v (hack/services.sh starts them by these names)", names, want))
	}
	for name, want := range expected {
		s, ok := p.Services[name]
		if !ok {
			continue
		}
		if s.Image != images[name] {
			out = append(out, fmt.Sprintf("%s: image %q, the %s subchart runs %q", name, s.Image, want.subchart, images[name]))
		}
		var got []uint32
		for _, port := range s.Ports {
			if port.HostIP != "127.0.0.1" {
				out = append(out, fmt.Sprintf("%s: port %d is published on %q, want 127.0.0.1 only", name, port.Target, port.HostIP))
			}
			if port.Published != fmt.Sprint(port.Target) {
				out = append(out, fmt.Sprintf("%s: port %d is published as %q, the tests expect the same port", name, port.Target, port.Published))
			}
			got = append(got, port.Target)
		}
		slices.Sort(got)
		if !slices.Equal(got, want.ports) {
			out = append(out, fmt.Sprintf("%s: ports %v, want %v", name, got, want.ports))
		}
		if s.HealthCheck == nil || len(s.HealthCheck.Test) == 0 {
			out = append(out, name+": no healthcheck (hack/services.sh waits with up --wait)")
		}
	}
	if s, ok := p.Services["postgres"]; ok {
		if v := s.Environment["POSTGRES_HOST_AUTH_METHOD"]; v == nil || *v != "trust" {
			out = append(out, "postgres: POSTGRES_HOST_AUTH_METHOD is not trust (the user postgres connects without a password)")
		}
	}
	if s, ok := p.Services["rabbitmq"]; ok && !strings.HasSuffix(s.Image, "-management") {
		out = append(out, "rabbitmq: not a -management image (the tests use the management API)")
	}
	return out
}

func chartImages(t *testing.T) map[string]string {
	t.Helper()
	images := map[string]string{}
	for name, want := range expected {
		images[name] = chartImage(t, want.subchart)
	}
	return images
}

func TestComposeFileMatchesTheChartAndTheTests(t *testing.T) {
	p := load(t, filepath.Join(root, "compose.yaml"))
	assert.Empty(t, problems(p, chartImages(t)))
}

// The check catches what it is for: a copy of compose.yaml with another
// tag, a port on every interface and no trust.
func TestComposeCheckFindsDrift(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(root, "compose.yaml"))
	require.NoError(t, err)
	images := chartImages(t)
	s := string(b)
	for _, r := range []struct{ old, new string }{
		{images["redis"], images["redis"] + "-drift"},
		{"127.0.0.1:5432:5432", "5432:5432"},
		{"POSTGRES_HOST_AUTH_METHOD: trust", "POSTGRES_HOST_AUTH_METHOD: scram-sha-256"},
	} {
		require.Contains(t, s, r.old, "compose.yaml has nothing to spoil")
		s = strings.Replace(s, r.old, r.new, 1)
	}
	path := filepath.Join(t.TempDir(), "compose.yaml")
	require.NoError(t, os.WriteFile(path, []byte(s), 0o644))
	got := strings.Join(problems(load(t, path), images), "\n")
	for _, want := range []string{`redis: image`, `postgres: port 5432 is published on ""`, `POSTGRES_HOST_AUTH_METHOD is not trust`} {
		assert.Contains(t, got, want)
	}

	_, err = loader.LoadWithContext(context.Background(), types.ConfigDetails{
		WorkingDir:  t.TempDir(),
		ConfigFiles: []types.ConfigFile{{Filename: "bad.yaml", Content: []byte("services:\n  redis:\n    image: redis\n    ports: 6379\n")}},
		Environment: types.Mapping{},
	}, func(o *loader.Options) { o.SetProjectName("x", true) })
	assert.Error(t, err, "the loader accepted ports: 6379 (a scalar): it does not validate against the schema")
}
