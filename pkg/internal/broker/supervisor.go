package broker

import (
	"context"
	"errors"
	"math/rand/v2"
	"os"
	"strings"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.uber.org/zap"

	"github.com/idempotent-events/idempotent-events/pkg/internal/backoff"
	"github.com/idempotent-events/idempotent-events/pkg/internal/tlsconfig"
)

// Dialer says how to reach the broker.
type Dialer struct {
	// URL is the AMQP URL, vhost included; for a cluster, the URLs of
	// several nodes separated by commas (Nodes).
	URL string
	// Name is shown as the connection name in the broker's UI.
	Name string
	// MaxBackoff caps the wait between reconnect attempts.
	MaxBackoff time.Duration
	// DialTimeout bounds one TCP connect plus handshake; 5s when zero.
	DialTimeout time.Duration
	// Heartbeat detects dead peers; 10s when zero.
	Heartbeat time.Duration
	// TLS is the TLS of amqps:// connections (AMQP_TLS_*): made anew for
	// every dial, so a rotated certificate reaches the next connection.
	// nil: amqp091's defaults (the system's roots).
	TLS *tlsconfig.Client
}

// Nodes splits an AMQP_URL that lists the nodes of a cluster, separated
// by commas, into their URLs.
func Nodes(url string) []string {
	var out []string
	for _, u := range strings.Split(url, ",") {
		if u = strings.TrimSpace(u); u != "" {
			out = append(out, u)
		}
	}
	return out
}

// nextNode rotates the node a dial tries first, so that a reconnect after
// a node's loss tries the others first. It starts at a random node in
// every process (firstNode): from 0, every receiver, worker and relay
// would dial the same node first, and the clients of a cluster would
// crowd onto it instead of spreading over its nodes.
var (
	nextNode  atomic.Uint32
	firstNode = rand.Uint32()
)

// Dial opens one connection, to the first node of URL that accepts it,
// starting from a node that rotates with every call.
func (d Dialer) Dial() (*amqp.Connection, error) {
	nodes := Nodes(d.URL)
	if len(nodes) == 0 {
		return nil, errors.New("no AMQP URL")
	}
	start := int(firstNode + nextNode.Add(1))
	var errs []error
	for i := range nodes {
		conn, err := d.dial(nodes[(start+i)%len(nodes)])
		if err == nil {
			return conn, nil
		}
		errs = append(errs, err)
	}
	return nil, errors.Join(errs...)
}

func (d Dialer) dial(url string) (*amqp.Connection, error) {
	timeout := d.DialTimeout
	if timeout <= 0 {
		timeout = 5 * time.Second
	}
	heartbeat := d.Heartbeat
	if heartbeat <= 0 {
		heartbeat = 10 * time.Second
	}
	props := amqp.NewConnectionProperties()
	host, _ := os.Hostname()
	props.SetClientConnectionName(d.Name + " " + host)
	cfg := amqp.Config{
		Heartbeat:  heartbeat,
		Locale:     "en_US",
		Properties: props,
		Dial:       amqp.DefaultDial(timeout),
	}
	if d.TLS != nil {
		// amqp091 sets the ServerName of the configuration it is given:
		// each node's dial gets its own, for its own host.
		if uri, err := amqp.ParseURI(url); err == nil && uri.Scheme == "amqps" {
			cfg.TLSClientConfig = d.TLS.AMQPConfig(uri.Host)
		}
	}
	// Recovery stays nil: reconnecting is Supervise's job, so that delivery
	// tags and unconfirmed publishes never outlive their connection.
	conn, err := amqp.DialConfig(url, cfg)
	if d.TLS != nil {
		return conn, d.TLS.Explain(err)
	}
	return conn, tlsconfig.RabbitMQ.Explain(err)
}

// stableConnection is how long a connection must have lived for its loss
// to restart the backoff from its minimum.
const stableConnection = time.Second

// ServeFunc uses one connection until it closes or ctx is done. It owns
// everything it opens on the connection. Returning an error makes Supervise
// close the connection and reconnect after a backoff.
type ServeFunc func(ctx context.Context, conn *amqp.Connection) error

// Supervise dials the broker and runs serve on each connection, redialing
// with jittered exponential backoff whenever the connection is lost, until
// ctx is done. It returns nil when ctx is done.
func Supervise(ctx context.Context, d Dialer, log *zap.Logger, onState func(connected bool), serve ServeFunc) error {
	maxBackoff := d.MaxBackoff
	if maxBackoff <= 0 {
		maxBackoff = 10 * time.Second
	}
	const minBackoff = 100 * time.Millisecond
	wait := minBackoff
	for {
		if ctx.Err() != nil {
			return nil
		}
		conn, err := d.Dial()
		if err != nil {
			log.Warn("broker connect failed", zap.Error(err), zap.Duration("retry_in", wait))
		} else {
			started := time.Now()
			log.Info("broker connected")
			onState(true)
			err = serve(ctx, conn)
			onState(false)
			_ = conn.Close()
			if ctx.Err() != nil {
				return nil
			}
			if err != nil {
				log.Warn("broker connection lost", zap.Error(err))
			} else {
				log.Warn("broker connection closed")
			}
			if time.Since(started) >= stableConnection {
				// The broker was reachable and the connection worked: a cut
				// is not an outage, so reconnect quickly. Only connections
				// that fail at once keep growing the backoff.
				wait = minBackoff
			}
		}
		if !backoff.Sleep(ctx, backoff.Jitter(wait)) {
			return nil
		}
		wait = min(wait*2, maxBackoff)
	}
}
