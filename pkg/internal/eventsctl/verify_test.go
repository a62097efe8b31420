package eventsctl_test

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idempotent-events/idempotent-events/pkg/internal/eventsctl"
)

// verify names exactly what is missing, so that a user who gave -id is not
// sent looking for a problem with it. Nothing is dialled: it stops first.
func TestVerifyNamesOnlyWhatIsMissing(t *testing.T) {
	const dbURL = "postgres://app@db.invalid:5432/ledger"
	cases := []struct {
		name    string
		args    []string
		env     map[string]string
		says    string
		notSays string
	}{
		{"no database", []string{"verify", "-id", "evt_1"}, nil,
			"eventsctl verify: DATABASE_URL (or -database-url) is required\n", "-id"},
		{"no id", []string{"verify"}, map[string]string{"DATABASE_URL": dbURL},
			"eventsctl verify: -id is required\n", "DATABASE_URL"},
		{"neither", []string{"verify"}, nil,
			"eventsctl verify: -id and DATABASE_URL (or -database-url) are required\n", ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			code := eventsctl.Main(context.Background(), c.args, func(k string) string { return c.env[k] }, strings.NewReader(""), &stdout, &stderr)
			require.Equal(t, 2, code)
			require.Equal(t, c.says, stderr.String())
			if c.notSays != "" {
				require.NotContains(t, stderr.String(), c.notSays)
			}
			require.Empty(t, stdout.String())
		})
	}
}
