package eventsctl_test

import (
	"bytes"
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idempotent-events/idempotent-events/pkg/internal/broker"
	"github.com/idempotent-events/idempotent-events/pkg/internal/eventsctl"
	"github.com/idempotent-events/idempotent-events/pkg/internal/servicetest"
)

// status leaves the ledger section out without DATABASE_URL, and says so
// and how to get it: a section missing without a word read as an empty
// ledger. With DATABASE_URL the section is there and the line is not.
func TestStatusSaysWhenItSkipsTheLedger(t *testing.T) {
	t.Parallel()
	amqpURL := servicetest.VHost(t)
	servicetest.NewBroker(t, amqpURL, broker.Topology{QueueType: broker.QueueClassic, RetryDelays: []time.Duration{time.Second}})
	// The management API client status uses keeps its connection for the
	// next request; closed, no goroutine of it outlives the tests (goleak).
	t.Cleanup(http.DefaultTransport.(*http.Transport).CloseIdleConnections)
	status := func(env map[string]string) (int, string, string) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		var stdout, stderr bytes.Buffer
		code := eventsctl.Main(ctx, []string{"status", "-worker-metrics", ""}, func(k string) string { return env[k] },
			strings.NewReader(""), &stdout, &stderr)
		return code, stdout.String(), stderr.String()
	}

	code, out, errOut := status(map[string]string{"AMQP_URL": amqpURL})
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, broker.MainQueue)
	require.Contains(t, out, "\nledger: skipped, DATABASE_URL is not set (set it or pass -database-url")

	code, out, errOut = status(map[string]string{"AMQP_URL": amqpURL, "DATABASE_URL": servicetest.Schema(t)})
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "\nledger: 0 events processed in the last 5m")
	require.NotContains(t, out, "skipped")
}
