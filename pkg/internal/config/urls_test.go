package config_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idempotent-events/idempotent-events/pkg/internal/config"
)

// A URL that does not parse is reported by its variable and in words only:
// the parsers quote the whole URL in their errors, and what most often
// breaks one is a password with an unencoded '/', '?', '#' or '%', so the
// password is in the very part they quote. Every row carries canaries in
// its user info; none may appear anywhere in the error.
func TestURLErrorsNameTheVariableButNeverTheURLOrItsUserInfo(t *testing.T) {
	cases := []struct {
		name     string
		variable string
		value    string
		canaries []string
		says     string // what is wrong, in words
	}{
		{"AMQP port", "AMQP_URL", "amqp://CanaryUser-AMQP1:S3cretCanary-AMQP1@rabbit:notaport/",
			[]string{"CanaryUser-AMQP1", "S3cretCanary-AMQP1", "notaport"}, "invalid port"},
		{"AMQP unencoded /", "AMQP_URL", "amqp://app:S3cretCanary-AMQP2/tail@rabbit:5672/",
			[]string{"S3cretCanary-AMQP2", "tail"}, "percent-encode"},
		{"AMQP unencoded #", "AMQP_URL", "amqp://app:S3cretCanary-AMQP3#tail@rabbit:5672/",
			[]string{"S3cretCanary-AMQP3", "tail"}, "percent-encode"},
		{"AMQP bad escape", "AMQP_URL", "amqp://app:S3cretCanary-AMQP4%zz@rabbit:5672/",
			[]string{"S3cretCanary-AMQP4", "%zz"}, "percent-encode"},
		{"AMQP cluster, second node", "AMQP_URL", "amqp://app:pw@rabbit-0:5672/payments,amqp://CanaryUser-AMQP5:S3cretCanary-AMQP5@rabbit-1:port/payments",
			[]string{"CanaryUser-AMQP5", "S3cretCanary-AMQP5", "rabbit-1"}, "invalid port"},
		{"Redis port", "REDIS_URL", "redis://CanaryUser-Redis1:S3cretCanary-Redis1@redis:port/0",
			[]string{"CanaryUser-Redis1", "S3cretCanary-Redis1"}, "invalid port"},
		{"Redis unencoded /", "REDIS_URL", "redis://:S3cretCanary-Redis2/tail@redis:6379/0",
			[]string{"S3cretCanary-Redis2", "tail"}, "percent-encode"},
		{"Redis Sentinel port", "REDIS_URL", "redis://:S3cretCanary-Sentinel1@sentinel-0:port/0?master_name=mymaster&addr=sentinel-1:26379",
			[]string{"S3cretCanary-Sentinel1", "sentinel-0", "mymaster"}, "invalid port"},
		{"Redis Sentinel option", "REDIS_URL", "redis://:S3cretCanary-Sentinel2@sentinel-0:26379/0?master_name=mymaster&sentinel_password=S3cretCanary-Sentinel3&dial_timeout=soon",
			[]string{"S3cretCanary-Sentinel2", "S3cretCanary-Sentinel3", "soon"}, "dial_timeout"},
		{"PostgreSQL port", "DATABASE_URL", "postgres://CanaryUser-PG1:S3cretCanary-PG1@db:notaport/ledger",
			[]string{"CanaryUser-PG1", "S3cretCanary-PG1", "notaport"}, "invalid port"},
		{"PostgreSQL unencoded /", "DATABASE_URL", "postgres://CanaryUser-PG2:S3cretCanary-PG2/tail@db:5432/ledger",
			[]string{"CanaryUser-PG2", "S3cretCanary-PG2", "tail"}, "percent-encode"},
		{"PostgreSQL keyword/value", "DATABASE_URL", "host=db user=CanaryUser-PG3 password=S3cretCanary-PG3 port=notaport",
			[]string{"CanaryUser-PG3", "S3cretCanary-PG3"}, "invalid port"},
		// The worker opens its pool with pgxpool, which reads settings of its
		// own: one that does not parse must stop --check-config, not the start.
		{"PostgreSQL pool setting", "DATABASE_URL", "postgres://CanaryUser-PG4:S3cretCanary-PG4@db:5432/ledger?pool_max_conns=many",
			[]string{"CanaryUser-PG4", "S3cretCanary-PG4", "many"}, "pool_max_conns"},
		{"management API port", "RABBITMQ_MANAGEMENT_URL", "http://CanaryUser-Mgmt:S3cretCanary-Mgmt@rabbit:port",
			[]string{"CanaryUser-Mgmt", "S3cretCanary-Mgmt"}, "invalid port"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cleanEnv(t)
			t.Setenv(c.variable, c.value)
			var w config.Worker
			err := config.Load(&w)
			require.Error(t, err)
			for _, canary := range c.canaries {
				require.NotContains(t, err.Error(), canary, "the error repeats part of the URL")
			}
			requireProblem(t, err, c.variable)
			require.Contains(t, err.Error(), c.says)
		})
	}
}
