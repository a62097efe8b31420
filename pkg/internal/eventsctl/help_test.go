package eventsctl_test

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/idempotent-events/idempotent-events/pkg/internal/eventsctl"
)

// Help is not an error: every command's -h and --help exit 0, as the flag
// package's own ExitOnError does; a flag the command does not have exits 2.
func TestHelpOfEveryCommandExitsZero(t *testing.T) {
	noEnv := func(string) string { return "" }
	for _, cmd := range [][]string{{"send"}, {"sign"}, {"verify"}, {"status"}, {"dlq", "list"}, {"dlq", "show"},
		{"dlq", "replay"}, {"dlq", "discard"}, {"dlq", "audit"}, {"outbox", "list"}, {"outbox", "show"}, {"outbox", "retry"}, {"reconcile"}, {"prune"}} {
		for _, help := range []string{"-h", "--help"} {
			var stdout, stderr bytes.Buffer
			code := eventsctl.Main(context.Background(), append(cmd, help), noEnv, strings.NewReader(""), &stdout, &stderr)
			assert.Equal(t, 0, code, "eventsctl %s %s: %s", strings.Join(cmd, " "), help, stderr.String())
			assert.Contains(t, stdout.String()+stderr.String(), "Usage of eventsctl "+strings.Join(cmd, " "))
		}
		var stdout, stderr bytes.Buffer
		code := eventsctl.Main(context.Background(), append(cmd, "-no-such-flag"), noEnv, strings.NewReader(""), &stdout, &stderr)
		assert.Equal(t, 2, code, "eventsctl %s -no-such-flag", strings.Join(cmd, " "))
	}
}
