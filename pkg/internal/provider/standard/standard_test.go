package standard_test

import (
	"fmt"
	"net/http"
	"strconv"
	"testing"
	"time"

	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"
	"github.com/stretchr/testify/require"

	"github.com/idempotent-events/idempotent-events/pkg/internal/provider"
	"github.com/idempotent-events/idempotent-events/pkg/internal/provider/providertest"
	"github.com/idempotent-events/idempotent-events/pkg/internal/provider/standard"
	"github.com/idempotent-events/idempotent-events/pkg/internal/webhook"
)

// Fixture describes the Standard Webhooks provider to the conformance
// suite. It signs with the reference library for Go.
func Fixture() providertest.Fixture {
	return providertest.Fixture{
		New: func(t testing.TB, secrets []string) provider.Provider {
			p, err := standard.New(secrets, 5*time.Minute)
			require.NoError(t, err)
			return p
		},
		Secrets: [3]string{"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "whsec_QUJDREVGR0hJSktMTU5PUA==", "whsec_enp6enp6enp6enp6enp6eno="},
		Event: func(n int) ([]byte, string) {
			return []byte(fmt.Sprintf(`{"type":"invoice.paid","data":{"payment_intent":"pi_%d","amount_cents":%d,"currency":"eur","status":"paid"}}`, n, 100+n)),
				fmt.Sprintf("msg_conformance_%d", n)
		},
		Sign: func(t testing.TB, secret string, at time.Time, id string, body []byte) http.Header {
			wh, err := standardwebhooks.NewWebhook(secret)
			require.NoError(t, err)
			sig, err := wh.Sign(id, at, body)
			require.NoError(t, err)
			h := http.Header{}
			h.Set(webhook.StandardIDHeader, id)
			h.Set(webhook.StandardTimestampHeader, strconv.FormatInt(at.Unix(), 10))
			h.Set(webhook.StandardSignatureHeader, sig)
			return h
		},
		Tolerance:     5 * time.Minute,
		SignedHeaders: []string{webhook.StandardIDHeader, webhook.StandardTimestampHeader, webhook.StandardSignatureHeader},
	}
}

func TestConformance(t *testing.T) {
	t.Parallel()
	providertest.Run(t, Fixture())
}

// The provider's own signer and the reference library agree.
func TestSignIsTheReferenceLibrarys(t *testing.T) {
	t.Parallel()
	const secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
	body := []byte(`{"type":"a.b"}`)
	wh, err := standardwebhooks.NewWebhook(secret)
	require.NoError(t, err)
	require.NoError(t, wh.Verify(body, standard.Sign(secret, "msg_1", time.Now(), body)))
}
