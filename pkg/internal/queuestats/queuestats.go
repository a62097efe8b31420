// Package queuestats reads the depth, consumers and head-of-queue age of the
// pipeline's queues from the RabbitMQ management API, for the lag metrics,
// the alerts built on them and `eventsctl status`.
//
// The management API is a monitoring input, never a correctness input: when
// it is unreachable the gauges keep their last values and
// idempotent_events_queue_stats_up drops to 0, which has its own alert.
package queuestats

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idempotent-events/idempotent-events/pkg/internal/telemetry"
	"github.com/idempotent-events/idempotent-events/pkg/internal/tlsconfig"
)

// Queue is one queue's state.
type Queue struct {
	Name      string
	Type      string
	Ready     int
	Unacked   int
	Consumers int
	// Oldest is the publish time of the message at the head of the queue,
	// zero when the queue is empty or the queue type does not report it.
	Oldest time.Time
}

// Client talks to the management API of one vhost.
type Client struct {
	base  *url.URL
	vhost string
	http  *http.Client
}

// ManagementURL returns the management API URL to use: explicit as given;
// "auto" derives http://<user>:<pass>@<amqp host>:15672 from amqpURL; "off"
// returns "".
func ManagementURL(setting, amqpURL string) (string, error) {
	switch setting {
	case "off", "":
		return "", nil
	case "auto":
		uri, err := amqp.ParseURI(firstNode(amqpURL))
		if err != nil {
			return "", err
		}
		scheme := "http"
		if uri.Scheme == "amqps" {
			scheme = "https"
		}
		u := url.URL{Scheme: scheme, Host: fmt.Sprintf("%s:15672", uri.Host), User: url.UserPassword(uri.Username, uri.Password)}
		return u.String(), nil
	}
	return setting, nil
}

// New returns a client for vhost at the management API base URL.
func New(base, vhost string) (*Client, error) {
	u, err := url.Parse(base)
	if err != nil {
		return nil, fmt.Errorf("parse management URL: %w", err)
	}
	return &Client{base: u, vhost: vhost, http: &http.Client{Timeout: 5 * time.Second}}, nil
}

// firstNode is the first URL of an AMQP_URL that lists several nodes.
func firstNode(amqpURL string) string {
	first, _, _ := strings.Cut(amqpURL, ",")
	return strings.TrimSpace(first)
}

// ForAMQP returns a client for the vhost of amqpURL.
func ForAMQP(base, amqpURL string) (*Client, error) {
	return ForAMQPTLS(base, amqpURL, nil)
}

// ForAMQPTLS is ForAMQP whose HTTPS connections trust the broker's CA and
// present its client certificate (AMQP_TLS_*): the management API of a
// broker with a private CA is served under the same CA, as cert-manager
// issues one certificate for both listeners. A nil tc is ForAMQP (the
// system's roots).
func ForAMQPTLS(base, amqpURL string, tc *tlsconfig.Client) (*Client, error) {
	uri, err := amqp.ParseURI(firstNode(amqpURL))
	if err != nil {
		return nil, err
	}
	c, err := New(base, uri.Vhost)
	if err != nil {
		return nil, err
	}
	if t := tc.HTTPTransport(); t != nil {
		c.http.Transport = t
	}
	return c, nil
}

type apiQueue struct {
	Name      string `json:"name"`
	Type      string `json:"type"`
	Ready     int    `json:"messages_ready"`
	Unacked   int    `json:"messages_unacknowledged"`
	Consumers int    `json:"consumers"`
	HeadTS    *int64 `json:"head_message_timestamp"`
}

// Queues returns the queues of the vhost whose names start with prefix,
// sorted by name.
func (c *Client) Queues(ctx context.Context, prefix string) ([]Queue, error) {
	base := *c.base
	base.User = nil
	endpoint := strings.TrimSuffix(base.String(), "/") + "/api/queues/" + url.PathEscape(c.vhost) +
		"?columns=name,type,messages_ready,messages_unacknowledged,consumers,head_message_timestamp"
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, endpoint, nil)
	if err != nil {
		return nil, err
	}
	if c.base.User != nil {
		pw, _ := c.base.User.Password()
		req.SetBasicAuth(c.base.User.Username(), pw)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, fmt.Errorf("management API: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("management API: list queues of vhost %q: %s", c.vhost, resp.Status)
	}
	var raw []apiQueue
	if err := json.NewDecoder(resp.Body).Decode(&raw); err != nil {
		return nil, fmt.Errorf("management API: decode queues: %w", err)
	}
	var out []Queue
	for _, q := range raw {
		if !strings.HasPrefix(q.Name, prefix) {
			continue
		}
		qq := Queue{Name: q.Name, Type: q.Type, Ready: q.Ready, Unacked: q.Unacked, Consumers: q.Consumers}
		if q.HeadTS != nil && *q.HeadTS > 0 {
			qq.Oldest = time.Unix(*q.HeadTS, 0)
		}
		out = append(out, qq)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// Collector exports the last polled queue state as Prometheus gauges.
type Collector struct {
	opts CollectorOptions
	now  func() time.Time

	mu     sync.Mutex
	queues []Queue
	up     bool

	messages, consumers, oldest, upDesc *prometheus.Desc
}

// CollectorOptions configures a Collector.
type CollectorOptions struct {
	// Registerer is where the gauges are registered.
	Registerer prometheus.Registerer
	Client     *Client
	// Prefix selects the queues: those whose name starts with it.
	Prefix string
	// Interval is the time between two polls, and the bound of one.
	Interval time.Duration
	// OnError is told of every failed poll (nil: ignored); the gauges keep
	// their last values and queue_stats_up turns 0.
	OnError func(error)
}

// NewCollector validates opts, returns a collector for the queues named
// Prefix* and registers it.
func NewCollector(opts CollectorOptions) (*Collector, error) {
	switch {
	case opts.Registerer == nil:
		return nil, errors.New("queuestats: CollectorOptions.Registerer is required")
	case opts.Client == nil:
		return nil, errors.New("queuestats: CollectorOptions.Client is required")
	case opts.Interval <= 0:
		return nil, errors.New("queuestats: CollectorOptions.Interval must be positive")
	}
	if opts.OnError == nil {
		opts.OnError = func(error) {}
	}

	ns := telemetry.Namespace
	c := &Collector{
		opts: opts, now: time.Now,
		messages: prometheus.NewDesc(ns+"_queue_messages", "Messages in a pipeline queue by state (ready, unacked), from the RabbitMQ management API.",
			[]string{"queue", "state"}, nil),
		consumers: prometheus.NewDesc(ns+"_queue_consumers", "Consumers attached to a pipeline queue.", []string{"queue"}, nil),
		oldest: prometheus.NewDesc(ns+"_queue_oldest_message_age_seconds",
			"Age of the message at the head of a pipeline queue (0 when empty; absent for queue types that do not report it).", []string{"queue"}, nil),
		upDesc: prometheus.NewDesc(ns+"_queue_stats_up", "1 if the last poll of the RabbitMQ management API succeeded.", nil, nil),
	}
	if err := opts.Registerer.Register(c); err != nil {
		return nil, fmt.Errorf("queuestats: register: %w", err)
	}
	return c, nil
}

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.messages
	ch <- c.consumers
	ch <- c.oldest
	ch <- c.upDesc
}

// Collect implements prometheus.Collector.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	defer c.mu.Unlock()
	up := 0.0
	if c.up {
		up = 1
	}
	ch <- prometheus.MustNewConstMetric(c.upDesc, prometheus.GaugeValue, up)
	now := c.now()
	for _, q := range c.queues {
		ch <- prometheus.MustNewConstMetric(c.messages, prometheus.GaugeValue, float64(q.Ready), q.Name, "ready")
		ch <- prometheus.MustNewConstMetric(c.messages, prometheus.GaugeValue, float64(q.Unacked), q.Name, "unacked")
		ch <- prometheus.MustNewConstMetric(c.consumers, prometheus.GaugeValue, float64(q.Consumers), q.Name)
		switch {
		case q.Ready+q.Unacked == 0:
			ch <- prometheus.MustNewConstMetric(c.oldest, prometheus.GaugeValue, 0, q.Name)
		case !q.Oldest.IsZero():
			ch <- prometheus.MustNewConstMetric(c.oldest, prometheus.GaugeValue, max(0, now.Sub(q.Oldest).Seconds()), q.Name)
		}
	}
}

// Poll refreshes the state once.
func (c *Collector) Poll(ctx context.Context) error {
	qs, err := c.opts.Client.Queues(ctx, c.opts.Prefix)
	c.mu.Lock()
	defer c.mu.Unlock()
	c.up = err == nil
	if err == nil {
		c.queues = qs
	}
	return err
}

// Run polls every Interval until ctx is done. It always returns nil:
// failed polls go to OnError.
func (c *Collector) Run(ctx context.Context) error {
	t := time.NewTicker(c.opts.Interval)
	defer t.Stop()
	for {
		pctx, cancel := context.WithTimeout(ctx, c.opts.Interval)
		if err := c.Poll(pctx); err != nil && ctx.Err() == nil {
			c.opts.OnError(err)
		}
		cancel()
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}
