package github_test

import (
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/idempotent-events/idempotent-events/pkg/internal/provider"
	"github.com/idempotent-events/idempotent-events/pkg/internal/provider/github"
	"github.com/idempotent-events/idempotent-events/pkg/internal/provider/providertest"
	"github.com/idempotent-events/idempotent-events/pkg/internal/webhook"
)

// Fixture describes the GitHub provider to the conformance suite. GitHub
// signs no timestamp, so the suite's timestamp cases do not apply.
func Fixture() providertest.Fixture {
	return providertest.Fixture{
		New:     func(_ testing.TB, secrets []string) provider.Provider { return github.New(secrets) },
		Secrets: [3]string{"gh-conformance-current", "gh-conformance-retiring", "gh-conformance-wrong"},
		Event: func(n int) ([]byte, string) {
			return []byte(fmt.Sprintf(`{"action":"opened","number":%d}`, n)), fmt.Sprintf("72d3162e-cc78-11e3-81ab-%012d", n)
		},
		Sign: func(_ testing.TB, secret string, _ time.Time, id string, body []byte) http.Header {
			return github.Sign(secret, id, "pull_request", body)
		},
		SignedHeaders:   []string{webhook.GitHubSignatureHeader},
		IdentityHeaders: []string{webhook.GitHubDeliveryHeader, webhook.GitHubEventHeader},
	}
}

func TestConformance(t *testing.T) {
	t.Parallel()
	providertest.Run(t, Fixture())
}
