package config_test

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotent-events/idempotent-events/pkg/internal/config"
)

func writeFile(t *testing.T, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "secrets")
	require.NoError(t, os.WriteFile(path, []byte(content), 0o600))
	return path
}

// WEBHOOK_SECRETS_FILE and WEBHOOK_SECRETS_<NAME>_FILE replace the
// variables: comma- or newline-separated secrets, read at start with the
// other settings, and the file remembered so the receiver reads it again.
func TestWebhookSecretsFromFiles(t *testing.T) {
	cleanEnv(t)
	t.Setenv("WEBHOOK_SECRETS_FILE", writeFile(t, "whsec_new\nwhsec_old\n"))
	t.Setenv("WEBHOOK_SOURCES", "shop:github")
	shop := writeFile(t, "gh_secret")
	t.Setenv("WEBHOOK_SECRETS_SHOP_FILE", shop)
	var c config.Receiver
	require.NoError(t, config.Load(&c))
	assert.Equal(t, config.List{"whsec_new", "whsec_old"}, c.WebhookSecrets)
	assert.Equal(t, 5*time.Second, c.WebhookSecretsReload)
	require.Len(t, c.Sources, 1)
	assert.Equal(t, config.Source{Name: "shop", Scheme: "github", Secrets: []string{"gh_secret"}, SecretsVar: "WEBHOOK_SECRETS_SHOP", SecretsFile: shop}, c.Sources[0])
}

// A file that cannot be used, or one set beside its variable, is a problem
// naming the _FILE variable; the message names the file, never its
// content.
func TestBadWebhookSecretsFilesNameTheVariable(t *testing.T) {
	const canary = "cnryfilecontent0123"
	for name, set := range map[string]func(t *testing.T) string{
		"missing file": func(t *testing.T) string {
			t.Setenv("WEBHOOK_SECRETS_FILE", filepath.Join(t.TempDir(), "nope"))
			return "WEBHOOK_SECRETS_FILE"
		},
		"empty file": func(t *testing.T) string {
			t.Setenv("WEBHOOK_SECRETS_FILE", writeFile(t, " \n,\n"))
			return "WEBHOOK_SECRETS_FILE"
		},
		"a directory": func(t *testing.T) string {
			t.Setenv("WEBHOOK_SECRETS_FILE", t.TempDir())
			return "WEBHOOK_SECRETS_FILE"
		},
		"too large": func(t *testing.T) string {
			big := make([]byte, 0, 70<<10)
			for len(big) < 70<<10 {
				big = append(big, canary+","...)
			}
			t.Setenv("WEBHOOK_SECRETS_FILE", writeFile(t, string(big)))
			return "WEBHOOK_SECRETS_FILE"
		},
		"file and variable": func(t *testing.T) string {
			t.Setenv("WEBHOOK_SECRETS", canary)
			t.Setenv("WEBHOOK_SECRETS_FILE", writeFile(t, canary))
			return "WEBHOOK_SECRETS_FILE"
		},
		"source file missing": func(t *testing.T) string {
			t.Setenv("WEBHOOK_SECRETS", "whsec_x")
			t.Setenv("WEBHOOK_SOURCES", "shop:github")
			t.Setenv("WEBHOOK_SECRETS_SHOP_FILE", filepath.Join(t.TempDir(), "nope"))
			return "WEBHOOK_SECRETS_SHOP_FILE"
		},
		"source file and variable": func(t *testing.T) string {
			t.Setenv("WEBHOOK_SECRETS", "whsec_x")
			t.Setenv("WEBHOOK_SOURCES", "shop:github")
			t.Setenv("WEBHOOK_SECRETS_SHOP", canary)
			t.Setenv("WEBHOOK_SECRETS_SHOP_FILE", writeFile(t, canary))
			return "WEBHOOK_SECRETS_SHOP_FILE"
		},
		"a source whose secrets variable is another's file variable": func(t *testing.T) string {
			t.Setenv("WEBHOOK_SECRETS", "whsec_x")
			t.Setenv("WEBHOOK_SOURCES", "shop:github,shop-file:github")
			t.Setenv("WEBHOOK_SECRETS_SHOP", "s")
			return "WEBHOOK_SOURCES"
		},
		"a source named file": func(t *testing.T) string {
			t.Setenv("WEBHOOK_SECRETS", "whsec_x")
			t.Setenv("WEBHOOK_SOURCES", "file:github")
			return "WEBHOOK_SOURCES"
		},
		"a reload interval too short": func(t *testing.T) string {
			t.Setenv("WEBHOOK_SECRETS", "whsec_x")
			t.Setenv("WEBHOOK_SECRETS_RELOAD_INTERVAL", "1ms")
			return "WEBHOOK_SECRETS_RELOAD_INTERVAL"
		},
	} {
		t.Run(name, func(t *testing.T) {
			cleanEnv(t)
			variable := set(t)
			var c config.Receiver
			err := config.Load(&c)
			requireProblem(t, err, variable)
			assert.NotContains(t, err.Error(), canary)
		})
	}
}

func TestReceiverLimits(t *testing.T) {
	cleanEnv(t)
	t.Setenv("WEBHOOK_SECRETS", "whsec_x")
	var c config.Receiver
	require.NoError(t, config.Load(&c))
	assert.Equal(t, config.ReceiverLimits{WebhookBodyTimeout: 10 * time.Second, FailureRate: 2, FailureBurst: 20}, c.ReceiverLimits)
	for variable, value := range map[string]string{
		"WEBHOOK_BODY_TIMEOUT":  "0s",
		"RECEIVER_FAILURE_RATE": "-1",
	} {
		t.Setenv(variable, value)
		requireProblem(t, config.Load(&c), variable)
		t.Setenv(variable, "")
		require.NoError(t, os.Unsetenv(variable))
	}
	t.Setenv("RECEIVER_FAILURE_BURST", "0")
	requireProblem(t, config.Load(&c), "RECEIVER_FAILURE_BURST")
	t.Setenv("RECEIVER_FAILURE_RATE", "0")
	require.NoError(t, config.Load(&c), "the burst does not matter with the limit off")
}
