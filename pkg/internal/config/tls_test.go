package config_test

import (
	"os"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idempotent-events/idempotent-events/pkg/internal/config"
)

// tlsVars are the TLS settings of the three services.
var tlsVars = []string{
	"AMQP_TLS_CA_FILE", "AMQP_TLS_CERT_FILE", "AMQP_TLS_KEY_FILE", "AMQP_TLS_REQUIRED",
	"REDIS_TLS_CA_FILE", "REDIS_TLS_CERT_FILE", "REDIS_TLS_KEY_FILE", "REDIS_TLS_REQUIRED",
	"DATABASE_TLS_CA_FILE", "DATABASE_TLS_CERT_FILE", "DATABASE_TLS_KEY_FILE", "DATABASE_TLS_REQUIRED",
}

func cleanTLSEnv(t *testing.T) {
	cleanEnv(t)
	for _, name := range tlsVars {
		t.Setenv(name, "") // registers the restore
		require.NoError(t, os.Unsetenv(name))
	}
}

func TestTLSSettingsAreRead(t *testing.T) {
	cleanTLSEnv(t)
	t.Setenv("AMQP_URL", "amqps://u:p@rabbit:5671/v")
	t.Setenv("AMQP_TLS_CA_FILE", "/tls/amqp/ca.crt")
	t.Setenv("REDIS_URL", "rediss://redis:6380/0")
	t.Setenv("REDIS_TLS_REQUIRED", "true")
	t.Setenv("DATABASE_URL", "postgres://u@db/x") // sslmode=prefer: upgraded
	t.Setenv("DATABASE_TLS_CERT_FILE", "/tls/db/tls.crt")
	t.Setenv("DATABASE_TLS_KEY_FILE", "/tls/db/tls.key")
	var w config.Worker
	require.NoError(t, config.Load(&w))
	require.Equal(t, config.TLS{CAFile: "/tls/amqp/ca.crt"}, w.AMQPTLSSettings())
	require.Equal(t, config.TLS{Required: true}, w.RedisTLSSettings())
	require.Equal(t, config.TLS{CertFile: "/tls/db/tls.crt", KeyFile: "/tls/db/tls.key"}, w.DatabaseTLSSettings())
	require.True(t, w.DatabaseTLSSettings().Enabled())

	t.Setenv("DATABASE_URL", "postgres://u@db/x?sslmode=verify-full")
	var m config.Migrate
	require.NoError(t, config.Load(&m))
	require.Equal(t, "/tls/db/tls.crt", m.DatabaseTLSSettings().CertFile)
}

// With TLS configured, a URL that would connect in plaintext is refused,
// naming the URL's variable and the setting that requires TLS, and never
// the URL.
func TestTLSRefusesAPlaintextURL(t *testing.T) {
	for _, tc := range []struct {
		env     map[string]string
		problem string
		says    string
	}{
		{env: map[string]string{"AMQP_TLS_CA_FILE": "/ca.crt", "AMQP_URL": "amqp://u:s3cr3tpw@rabbit:5672/v"},
			problem: "AMQP_URL", says: "an amqp:// URL is plaintext; use amqps://, but TLS is required (AMQP_TLS_CA_FILE is set)"},
		{env: map[string]string{"AMQP_TLS_REQUIRED": "true", "AMQP_URL": "amqps://u:s3cr3tpw@r0:5671/v,amqp://u:s3cr3tpw@r1:5672/v"},
			problem: "AMQP_URL", says: "node 2 of the list is an amqp:// URL, plaintext; use amqps://, but TLS is required (AMQP_TLS_REQUIRED=true)"},
		{env: map[string]string{"REDIS_TLS_CERT_FILE": "/tls.crt", "REDIS_TLS_KEY_FILE": "/tls.key", "REDIS_URL": "redis://:s3cr3tpw@redis:6379/0"},
			problem: "REDIS_URL", says: "a redis:// URL is plaintext; use rediss://, but TLS is required (REDIS_TLS_CERT_FILE is set)"},
		{env: map[string]string{"DATABASE_TLS_REQUIRED": "true", "DATABASE_URL": "postgres://u:s3cr3tpw@db/x?sslmode=disable"},
			problem: "DATABASE_URL", says: "its sslmode (disable or allow) connects in plaintext"},
		{env: map[string]string{"DATABASE_TLS_CA_FILE": "/ca.crt", "DATABASE_URL": "postgres://u:s3cr3tpw@db/x?sslmode=allow"},
			problem: "DATABASE_URL", says: "(DATABASE_TLS_CA_FILE is set)"},
		{env: map[string]string{"DATABASE_TLS_CERT_FILE": "/tls.crt"},
			problem: "DATABASE_TLS_CERT_FILE", says: "DATABASE_TLS_CERT_FILE and DATABASE_TLS_KEY_FILE go together"},
	} {
		t.Run(tc.problem+" "+tc.says, func(t *testing.T) {
			cleanTLSEnv(t)
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			var w config.Worker
			err := config.Load(&w)
			requireProblem(t, err, tc.problem)
			require.Contains(t, err.Error(), tc.says)
			require.NotContains(t, err.Error(), "s3cr3tpw")
		})
	}
}

// --check-config does not read the files: a rendered chart's paths exist
// only in the pod.
func TestTLSFilesAreNotReadByLoad(t *testing.T) {
	cleanTLSEnv(t)
	t.Setenv("DATABASE_URL", "postgres://u@db/x?sslmode=verify-full")
	t.Setenv("DATABASE_TLS_CA_FILE", "/nonexistent/ca.crt")
	var m config.Migrate
	require.NoError(t, config.Load(&m))
}
