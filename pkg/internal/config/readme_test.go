package config_test

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotent-events/idempotent-events/pkg/internal/config"
)

// configurationPage is where every variable is documented with its default;
// the README's Configuration section shows the few most set and links it.
const configurationPage = "docs/configuration.md"

// Every variable a binary reads is documented in docs/configuration.md (the
// page the README links for configuration) with its default.
func TestREADMEConfigurationPageDocumentsEveryVariable(t *testing.T) {
	page, err := os.ReadFile(filepath.Join(repoRoot(t), configurationPage))
	require.NoError(t, err)
	for _, spec := range []any{config.Receiver{}, config.Worker{}, config.Migrate{}} {
		for name, def := range variables(reflect.TypeOf(spec)) {
			var rows []string
			for _, line := range strings.Split(string(page), "\n") {
				if strings.HasPrefix(line, "| `"+name+"` | ") {
					rows = append(rows, line)
				}
			}
			if !assert.NotEmpty(t, rows, "%s has no table row for %s", configurationPage, name) || def == "" {
				continue
			}
			documented := false
			for _, line := range rows {
				documented = documented || strings.Contains(line, "`"+def+"`") || strings.Contains(line, "as above")
			}
			assert.True(t, documented, "no %s row of %s shows its default %q", configurationPage, name, def)
		}
	}
}

func variables(t reflect.Type) map[string]string {
	out := map[string]string{}
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		if f.Anonymous {
			for k, v := range variables(f.Type) {
				out[k] = v
			}
			continue
		}
		if name := f.Tag.Get("envconfig"); name != "" {
			out[name] = f.Tag.Get("default")
		}
	}
	return out
}

// repoRoot is the directory holding go.mod, found upwards from the test's
// working directory, so the documentation tests do not depend on how deep
// their package sits.
func repoRoot(t *testing.T) string {
	t.Helper()
	dir, err := os.Getwd()
	require.NoError(t, err)
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		require.NotEqual(t, dir, parent, "no go.mod above the test's directory")
		dir = parent
	}
}
