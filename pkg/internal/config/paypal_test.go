package config_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotent-events/idempotent-events/pkg/internal/config"
)

// One function names a source's secrets variable; the chart's helper
// writes the same (hack/deploytest checks the rendering).
func TestSecretsVarOfASource(t *testing.T) {
	assert.Equal(t, "WEBHOOK_SECRETS_GH_APP", config.SecretsVar("gh-app"))
	assert.Equal(t, "WEBHOOK_SECRETS_PAYPAL", config.SecretsVar("paypal"))
}

func TestPayPalCertHosts(t *testing.T) {
	cleanEnv(t)
	t.Setenv("WEBHOOK_SECRETS", "whsec_stripe")
	var c config.Receiver
	require.NoError(t, config.Load(&c))
	assert.Equal(t, []string{"api.paypal.com", "api.sandbox.paypal.com"}, []string(c.PayPalCertHosts))
	assert.Empty(t, c.PayPalCAFile)

	t.Setenv("PAYPAL_CERT_HOSTS", "127.0.0.1:8443,certs.internal")
	require.NoError(t, config.Load(&c))
	assert.Equal(t, []string{"127.0.0.1:8443", "certs.internal"}, []string(c.PayPalCertHosts))
	for _, bad := range []string{"https://api.paypal.com", "api.paypal.com/v1", "user@api.paypal.com", "api.paypal.com:0", "api.paypal.com:https"} {
		t.Setenv("PAYPAL_CERT_HOSTS", bad)
		requireProblem(t, config.Load(&c), "PAYPAL_CERT_HOSTS")
	}
}
