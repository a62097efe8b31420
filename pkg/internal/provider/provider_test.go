package provider_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotent-events/idempotent-events/pkg/internal/event"
	"github.com/idempotent-events/idempotent-events/pkg/internal/provider"
)

// The worker decodes with event.Parse: every provider has its decoder
// there, and event has no decoder without a provider.
func TestTheRegistryAndTheWorkersDecodersAgree(t *testing.T) {
	names := provider.Names()
	slices.Sort(names)
	assert.Equal(t, event.Schemes(), names)
}

// Every kind builds without secrets (the receiver uses such a provider to
// identify and decode for a source given only a scheme) and is named as
// registered.
func TestEveryKindBuildsAndIsNamedAsRegistered(t *testing.T) {
	for _, k := range provider.Kinds() {
		p, err := provider.New(k.Name, provider.Settings{})
		require.NoError(t, err, k.Name)
		assert.Equal(t, k.Name, p.Scheme())
	}
	_, err := provider.New("soap", provider.Settings{})
	require.Error(t, err)
	assert.Equal(t, `scheme must be one of `+strings.Join(provider.Names(), ", ")+`, got "soap"`, err.Error())
}

func TestAnUnusableCAFileNamesTheVariable(t *testing.T) {
	empty := filepath.Join(t.TempDir(), "empty.pem")
	require.NoError(t, os.WriteFile(empty, []byte("no certificate here"), 0o600))
	for _, file := range []string{filepath.Join(t.TempDir(), "missing.pem"), empty} {
		_, err := provider.New("paypal", provider.Settings{CAFile: file})
		var serr *provider.SettingError
		require.ErrorAs(t, err, &serr, file)
		assert.Equal(t, "PAYPAL_CA_FILE", serr.Var)
		assert.NotContains(t, serr.Problem, file, "the path is the operator's; the problem is enough")
	}
}

// The chart's schema accepts exactly the registered schemes.
func TestTheChartSchemaListsEveryProvider(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join(repoRoot(t), "charts/idempotent-events/values.schema.json"))
	require.NoError(t, err)
	var schema struct {
		Properties struct {
			Webhook struct {
				Properties struct {
					Sources struct {
						Items struct {
							Properties struct {
								Scheme struct {
									Enum []string `json:"enum"`
								} `json:"scheme"`
							} `json:"properties"`
						} `json:"items"`
					} `json:"sources"`
				} `json:"properties"`
			} `json:"webhook"`
		} `json:"properties"`
	}
	require.NoError(t, json.Unmarshal(raw, &schema))
	assert.Equal(t, provider.Names(), schema.Properties.Webhook.Properties.Sources.Items.Properties.Scheme.Enum)
}

// docs/providers.md has a section per provider, and the configuration page
// names every scheme WEBHOOK_SOURCES takes.
func TestTheDocsDescribeEveryProvider(t *testing.T) {
	root := repoRoot(t)
	page, err := os.ReadFile(filepath.Join(root, "docs/providers.md"))
	require.NoError(t, err)
	config, err := os.ReadFile(filepath.Join(root, "docs/configuration.md"))
	require.NoError(t, err)
	var sourcesRow string
	for _, line := range strings.Split(string(config), "\n") {
		if strings.HasPrefix(line, "| `WEBHOOK_SOURCES` |") {
			sourcesRow = line
		}
	}
	for _, name := range provider.Names() {
		found := false
		for _, line := range strings.Split(string(page), "\n") {
			found = found || strings.HasPrefix(line, "## ") && strings.Contains(line, "(`"+name+"`)")
		}
		assert.True(t, found, "docs/providers.md has no section \"## … (`%s`)\"", name)
		assert.Contains(t, sourcesRow, "`"+name+"`", "docs/configuration.md's WEBHOOK_SOURCES row names %s", name)
	}
}

func repoRoot(t *testing.T) string {
	t.Helper()
	dir, err := os.Getwd()
	require.NoError(t, err)
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		require.NotEqual(t, dir, parent, "no go.mod above the test")
		dir = parent
	}
}
