package broker_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idempotent-events/idempotent-events/pkg/internal/broker"
	"github.com/idempotent-events/idempotent-events/pkg/internal/tlsconfig"
	"github.com/idempotent-events/idempotent-events/pkg/internal/tlsconfig/tlstest"
)

// TLS to a private RabbitMQ node (slow to boot: one for the whole test)
// whose TLS listener requires a client certificate of the test's CA: the
// matrix, then a rotation of the files of one Dialer, whose next dial uses
// them.
func TestTLS(t *testing.T) {
	t.Parallel()
	ca := tlstest.NewCA(t, "rabbitmq test CA")
	node := tlstest.StartRabbitMQ(t, ca)
	open := func(t *testing.T, f tlsconfig.Files) func() error {
		tc, err := tlsconfig.New(tlsconfig.RabbitMQ, f)
		require.NoError(t, err)
		d := broker.Dialer{URL: node.URL("127.0.0.1"), Name: "tls test", TLS: tc}
		return func() error {
			conn, err := d.Dial()
			if err != nil {
				return err
			}
			defer conn.Close()
			ch, err := conn.Channel()
			if err != nil {
				return tlsconfig.RabbitMQ.Explain(err)
			}
			return ch.Close()
		}
	}
	t.Run("matrix", func(t *testing.T) { tlstest.RunMatrix(t, node, ca, tlsconfig.RabbitMQ, open) })
	t.Run("rotation", func(t *testing.T) { tlstest.RunRotation(t, ca, tlsconfig.RabbitMQ, open) })
}
