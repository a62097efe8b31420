package eventsctl_test

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/idempotent-events/idempotent-events/pkg/internal/eventsctl"
)

// -h prints every flag's default, and the defaults of the URL and secret
// flags come from the environment: they must not be printed, password and
// all (the canary test in pkg/internal/e2etest found them in every
// command's help). The flags still show which variable they read.
func TestHelpPrintsNoCredentialFromTheEnvironment(t *testing.T) {
	env := map[string]string{
		"AMQP_URL":                "amqp://u:cnryamqphelp@h/v",
		"DATABASE_URL":            "postgres://u:cnrydbhelp@h/db",
		"RABBITMQ_MANAGEMENT_URL": "http://u:cnrymgmthelp@h:15672",
		"WEBHOOK_SECRETS":         "whsec_cnrywebhookhelp",
	}
	for _, cmd := range [][]string{{"send"}, {"sign"}, {"verify"}, {"status"}, {"dlq", "list"}, {"dlq", "show"},
		{"dlq", "replay"}, {"dlq", "discard"}, {"dlq", "audit"}, {"outbox", "list"}, {"outbox", "show"}, {"outbox", "retry"},
		{"reconcile"}, {"prune"}, {"effects", "backfill"}, {"effects", "status"}, {"events", "show"}, {"events", "object"}} {
		var stdout, stderr bytes.Buffer
		eventsctl.Main(context.Background(), append(cmd, "-h"), func(k string) string { return env[k] }, strings.NewReader(""), &stdout, &stderr)
		help := stdout.String() + stderr.String()
		assert.Contains(t, help, "Usage of eventsctl "+strings.Join(cmd, " "))
		for _, secret := range []string{"cnryamqphelp", "cnrydbhelp", "cnrymgmthelp", "cnrywebhookhelp"} {
			assert.NotContains(t, help, secret, "eventsctl %s -h", strings.Join(cmd, " "))
		}
		if strings.Contains(help, "-database-url") {
			assert.Contains(t, help, "$DATABASE_URL", "eventsctl %s -h names the variable", strings.Join(cmd, " "))
		}
	}
}
