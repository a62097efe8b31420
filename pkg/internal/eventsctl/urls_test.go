package eventsctl_test

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idempotent-events/idempotent-events/pkg/internal/eventsctl"
)

// A connection URL that does not parse stops a command with status 2 and a
// line naming the variable and what is wrong, before anything is dialled,
// and no part of the URL is printed: the parsers quote the whole URL in
// their errors, password included. The URLs point nowhere.
func TestURLsThatDoNotParseAreNamedButNeverPrinted(t *testing.T) {
	const (
		badDB   = "postgres://CanaryUser-CLI:S3cretCanary-CLI-PG@db.invalid:notaport/ledger"
		badAMQP = "amqp://CanaryUser-CLI:S3cretCanary-CLI-AMQP/tail@rabbit.invalid:5672/"
		badMgmt = "http://CanaryUser-CLI:S3cretCanary-CLI-Mgmt@rabbit.invalid:port"
		goodDB  = "postgres://app:pw@db.invalid:5432/ledger"
	)
	canaries := []string{"CanaryUser-CLI", "S3cretCanary-CLI", "tail", "notaport", "db.invalid", "rabbit.invalid"}
	cases := []struct {
		name     string
		args     []string
		env      map[string]string
		variable string
		says     string
	}{
		{"reconcile -check-config, database", []string{"reconcile", "-check-config"},
			map[string]string{"STRIPE_API_KEY": "rk_test", "DATABASE_URL": badDB}, "DATABASE_URL", "invalid port"},
		{"reconcile -check-config, broker", []string{"reconcile", "-check-config"},
			map[string]string{"STRIPE_API_KEY": "rk_test", "DATABASE_URL": goodDB, "AMQP_URL": badAMQP}, "AMQP_URL", "percent-encode"},
		{"reconcile -dry-run, database", []string{"reconcile", "-dry-run"},
			map[string]string{"STRIPE_API_KEY": "rk_test", "DATABASE_URL": badDB}, "DATABASE_URL", "invalid port"},
		{"prune -check-config", []string{"prune", "-check-config"},
			map[string]string{"DATABASE_URL": badDB}, "DATABASE_URL", "invalid port"},
		{"prune", []string{"prune"},
			map[string]string{"DATABASE_URL": badDB}, "DATABASE_URL", "invalid port"},
		{"status, broker", []string{"status", "-worker-metrics", ""},
			map[string]string{"AMQP_URL": badAMQP}, "AMQP_URL", "percent-encode"},
		{"status, management API", []string{"status", "-worker-metrics", ""},
			map[string]string{"RABBITMQ_MANAGEMENT_URL": badMgmt}, "RABBITMQ_MANAGEMENT_URL", "invalid port"},
		{"status, database", []string{"status", "-worker-metrics", ""},
			map[string]string{"RABBITMQ_MANAGEMENT_URL": "off", "DATABASE_URL": badDB}, "DATABASE_URL", "invalid port"},
		{"dlq list", []string{"dlq", "list"},
			map[string]string{"AMQP_URL": badAMQP}, "AMQP_URL", "percent-encode"},
		{"dlq audit", []string{"dlq", "audit"},
			map[string]string{"DATABASE_URL": badDB}, "DATABASE_URL", "invalid port"},
		{"dlq discard", []string{"dlq", "discard", "-operator", "me", "-all"},
			map[string]string{"DATABASE_URL": badDB}, "DATABASE_URL", "invalid port"},
		{"outbox list", []string{"outbox", "list"},
			map[string]string{"DATABASE_URL": badDB}, "DATABASE_URL", "invalid port"},
		{"verify", []string{"verify", "-id", "evt_x", "-timeout", "2s"},
			map[string]string{"DATABASE_URL": badDB}, "DATABASE_URL", "invalid port"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			env := func(k string) string { return c.env[k] }
			var stdout, stderr bytes.Buffer
			code := eventsctl.Main(ctx, c.args, env, strings.NewReader(""), &stdout, &stderr)
			out := stdout.String() + stderr.String()
			for _, canary := range canaries {
				require.NotContains(t, out, canary, "the output repeats part of the URL")
			}
			require.Equal(t, 2, code, out)
			require.Contains(t, stderr.String(), c.variable)
			require.Contains(t, stderr.String(), c.says)
		})
	}
}
