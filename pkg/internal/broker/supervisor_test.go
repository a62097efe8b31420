package broker_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotent-events/idempotent-events/pkg/internal/broker"
	"github.com/idempotent-events/idempotent-events/pkg/internal/servicetest"
)

func TestNodesSplitsAClusterURL(t *testing.T) {
	assert.Equal(t, []string{"amqp://a:5672/v", "amqp://b:5672/v"}, broker.Nodes(" amqp://a:5672/v, amqp://b:5672/v,"))
	assert.Equal(t, []string{"amqp://a/"}, broker.Nodes("amqp://a/"))
}

// A node that is down is passed over: every dial, whichever node it tries
// first, reaches the one that is up.
func TestDialPassesOverANodeThatIsDown(t *testing.T) {
	t.Parallel()
	up := servicetest.VHost(t)
	down := servicetest.ReplaceHost(up, servicetest.FreeAddr())
	d := broker.Dialer{URL: down + "," + up, Name: "test"}
	for range 4 {
		conn, err := d.Dial()
		require.NoError(t, err)
		require.NoError(t, conn.Close())
	}
	_, err := broker.Dialer{URL: down + "," + down}.Dial()
	require.Error(t, err)
}
