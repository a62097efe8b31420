package config_test

import (
	"os"
	"reflect"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotent-events/idempotent-events/pkg/internal/config"
)

// Every variable a binary reads is documented in README with its default.
func TestREADMEDocumentsEveryVariable(t *testing.T) {
	readme, err := os.ReadFile("../../../README.md")
	require.NoError(t, err)
	for _, spec := range []any{config.Receiver{}, config.Worker{}, config.Migrate{}} {
		for name, def := range variables(reflect.TypeOf(spec)) {
			var rows []string
			for _, line := range strings.Split(string(readme), "\n") {
				if strings.HasPrefix(line, "| `"+name+"` | ") {
					rows = append(rows, line)
				}
			}
			if !assert.NotEmpty(t, rows, "README has no table row for %s", name) || def == "" {
				continue
			}
			documented := false
			for _, line := range rows {
				documented = documented || strings.Contains(line, "`"+def+"`") || strings.Contains(line, "as above")
			}
			assert.True(t, documented, "no README row of %s shows its default %q", name, def)
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
