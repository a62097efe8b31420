package config

import (
	"net"
	"net/url"
	"os"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

func (c *Connections) validate(p *problems, needRedis, needDB bool) {
	if err := CheckAMQPURL(c.AMQPURL); err != nil {
		p.add("AMQP_URL", "%v", err)
	}
	validateTLS(p, "AMQP_TLS", "AMQP_URL", c.AMQPTLSSettings(), func() string { return amqpPlaintext(c.AMQPURL) })
	if needRedis {
		if _, _, err := ParseRedisURL(c.RedisURL); err != nil {
			p.add("REDIS_URL", "%v", err)
		}
		validateTLS(p, "REDIS_TLS", "REDIS_URL", c.RedisTLSSettings(), func() string { return redisPlaintext(c.RedisURL) })
	}
	if needDB {
		validateDatabaseURL(p, c.DatabaseURL)
		validateTLS(p, "DATABASE_TLS", "DATABASE_URL", c.DatabaseTLSSettings(), func() string { return databasePlaintext(c.DatabaseURL) })
	}
	checkPositive(p, "AMQP_RECONNECT_MAX_BACKOFF", c.AMQPReconnectMaxBackoff)
}

func validateDatabaseURL(p *problems, url string) {
	if err := CheckDatabaseURL(url); err != nil {
		p.add("DATABASE_URL", "%v", err)
	}
}

func (l *Logging) validate(p *problems) {
	switch strings.ToLower(l.LogLevel) {
	case "debug", "info", "warn", "error":
	default:
		p.add("LOG_LEVEL", "must be one of debug, info, warn, error, got %q", l.LogLevel)
	}
	switch l.LogFormat {
	case "json", "console":
	default:
		p.add("LOG_FORMAT", "must be json or console, got %q", l.LogFormat)
	}
}

func (t *Topology) validate(p *problems) {
	switch t.QueueType {
	case QueueClassic, QueueQuorum:
	default:
		p.add("QUEUE_TYPE", "must be classic or quorum, got %q", t.QueueType)
	}
	if len(t.RetryDelays) > 25 {
		p.add("RETRY_DELAYS", "at most 25 retry attempts, got %d", len(t.RetryDelays))
	}
	for _, d := range t.RetryDelays {
		// x-message-ttl is a 32-bit count of milliseconds.
		if d < time.Millisecond || d > 24*24*time.Hour {
			p.add("RETRY_DELAYS", "each delay must be between 1ms and 576h, got %s", d)
			break
		}
	}
	checkRange(p, "QUORUM_DELIVERY_LIMIT", int64(t.QuorumDeliveryLimit), 2, 1<<30)
}

func (d *Dedupe) validate(p *problems) {
	if len(d.RedisKeyPrefix) > 64 {
		p.add("REDIS_KEY_PREFIX", "at most 64 characters, got %d", len(d.RedisKeyPrefix))
	}
	if d.DedupeTTL < time.Second {
		p.add("DEDUPE_TTL", "must be at least 1s, got %s", d.DedupeTTL)
	}
}

func validateAddr(p *problems, name, addr string) {
	if _, _, err := net.SplitHostPort(addr); err != nil {
		p.add(name, "must be host:port or :port, got %q", addr)
	}
}

// Validate implements Spec.
func (c *Receiver) Validate() error {
	var p problems
	switch c.DuplicateCheck {
	case DuplicateCheckOff, DuplicateCheckRedis, DuplicateCheckPostgres:
	default:
		p.add("DUPLICATE_CHECK", "must be redis, postgres or off, got %q", c.DuplicateCheck)
	}
	c.Connections.validate(&p, c.DuplicateCheck != DuplicateCheckOff, c.DuplicateCheck == DuplicateCheckPostgres)
	c.Logging.validate(&p)
	c.Topology.validate(&p)
	c.Dedupe.validate(&p)
	validateAddr(&p, "HTTP_ADDR", c.HTTPAddr)
	validateAddr(&p, "METRICS_ADDR", c.MetricsAddr)
	if c.WebhookSecretsFile != "" {
		readSecretsFile(&p, "WEBHOOK_SECRETS", "WEBHOOK_SECRETS_FILE", c.WebhookSecretsFile, (*[]string)(&c.WebhookSecrets))
	} else if len(c.WebhookSecrets) == 0 && !c.InsecureSkipVerify {
		p.add("WEBHOOK_SECRETS", "no signing secret set; set the provider's signing secret(s), comma-separated, "+
			"or WEBHOOK_SECRETS_FILE (or INSECURE_SKIP_SIGNATURE_VERIFICATION=true to accept unsigned, forgeable webhooks)")
	}
	if len(c.WebhookSecrets) > 0 && c.InsecureSkipVerify {
		p.add("INSECURE_SKIP_SIGNATURE_VERIFICATION", "must not be set together with WEBHOOK_SECRETS or WEBHOOK_SECRETS_FILE")
	}
	c.Sources = c.parseSources(&p)
	c.WebhookSecretFiles.validate(&p)
	c.ReceiverLimits.validate(&p)
	checkHosts(&p, "PAYPAL_CERT_HOSTS", c.PayPalCertHosts)
	checkPositive(&p, "WEBHOOK_TOLERANCE", c.WebhookTolerance)
	checkRange(&p, "WEBHOOK_MAX_BODY_BYTES", c.WebhookMaxBody, 1024, 64<<20)
	checkPositive(&p, "PUBLISH_TIMEOUT", c.PublishTimeout)
	checkRange(&p, "PUBLISH_CHANNELS", int64(c.PublishChannels), 1, 64)
	checkRange(&p, "RECEIVER_MAX_IN_FLIGHT", int64(c.MaxInFlight), 1, 1<<20)
	if c.RetryAfter < time.Second {
		p.add("RECEIVER_RETRY_AFTER", "must be at least 1s, got %s", c.RetryAfter)
	}
	checkPositive(&p, "DUPLICATE_CHECK_TIMEOUT", c.DuplicateCheckTimeout)
	checkPositive(&p, "SHUTDOWN_TIMEOUT", c.ShutdownTimeout)
	return p.err()
}

var sourceName = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,31}$`)

// SecretsVar is the variable a WEBHOOK_SOURCES source reads its secrets
// from: WEBHOOK_SECRETS_<NAME>, the name in upper case with "-" as "_".
// The chart's idempotent-events.sourceSecretsVar helper writes the same
// name.
func SecretsVar(source string) string {
	return "WEBHOOK_SECRETS_" + strings.ToUpper(strings.ReplaceAll(source, "-", "_"))
}

// checkHosts validates a list of "host" or "host:port" items.
func checkHosts(p *problems, name string, hosts []string) {
	if len(hosts) == 0 {
		p.add(name, "must name at least one host")
	}
	for _, h := range hosts {
		host := h
		if hh, port, err := net.SplitHostPort(h); err == nil {
			host = hh
			if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
				p.add(name, "%q: the port must be 1-65535", h)
				continue
			}
		}
		if host == "" || strings.ContainsAny(host, "/:@?#[] ") {
			p.add(name, "%q is not a host or host:port (no scheme, path or user)", h)
		}
	}
}

// parseSources reads WEBHOOK_SOURCES and each source's secrets variable.
func (c *Receiver) parseSources(p *problems) []Source {
	var out []Source
	seen := map[string]bool{}
	for _, item := range c.WebhookSources {
		name, scheme, ok := strings.Cut(item, ":")
		switch {
		case !ok:
			p.add("WEBHOOK_SOURCES", "item %q is not name:scheme", item)
			continue
		case !sourceName.MatchString(name):
			p.add("WEBHOOK_SOURCES", "source name %q must be 1-32 of a-z, 0-9 and -", name)
			continue
		case name == "payment" || name == "stripe":
			p.add("WEBHOOK_SOURCES", "source name %q is reserved for the default Stripe route /webhooks/payment", name)
			continue
		case name == "file" || strings.HasSuffix(name, "-file") && listed(c.WebhookSources, strings.TrimSuffix(name, "-file")):
			// Its WEBHOOK_SECRETS_<NAME> would be another source's _FILE variable.
			p.add("WEBHOOK_SOURCES", "source name %q is taken: %s names the secrets file of another route", name, SecretsVar(name))
			continue
		case seen[name]:
			p.add("WEBHOOK_SOURCES", "source %q is listed twice", name)
			continue
		}
		seen[name] = true
		src := Source{Name: name, Scheme: scheme, SecretsVar: SecretsVar(name)}
		var secrets List
		_ = secrets.Decode(os.Getenv(src.SecretsVar))
		src.Secrets = secrets
		fileVar := SecretsFileVar(src.SecretsVar)
		if src.SecretsFile = os.Getenv(fileVar); src.SecretsFile != "" {
			readSecretsFile(p, src.SecretsVar, fileVar, src.SecretsFile, &src.Secrets)
		} else if len(src.Secrets) == 0 && !c.InsecureSkipVerify {
			p.add(src.SecretsVar, "no signing secret set for source %q", name)
		}
		out = append(out, src)
	}
	return out
}

// listed reports whether the WEBHOOK_SOURCES items list the source name.
func listed(items []string, name string) bool {
	for _, item := range items {
		if n, _, _ := strings.Cut(item, ":"); n == name {
			return true
		}
	}
	return false
}

// Validate implements Spec.
func (c *Worker) Validate() error {
	var p problems
	c.Connections.validate(&p, true, true)
	c.Logging.validate(&p)
	c.Topology.validate(&p)
	c.Dedupe.validate(&p)
	c.Admin.validate(&p)
	validateAddr(&p, "METRICS_ADDR", c.MetricsAddr)
	checkRange(&p, "WORKER_PREFETCH", int64(c.Prefetch), 1, 65535)
	checkRange(&p, "WORKER_REPLAY_PREFETCH", int64(c.ReplayPrefetch), 1, 1000)
	checkRange(&p, "WORKER_CONCURRENCY", int64(c.Concurrency), 1, 256)
	checkRange(&p, "WORKER_BATCH_SIZE", int64(c.BatchSize), 1, 10000)
	if c.BatchWait < 0 {
		p.add("WORKER_BATCH_WAIT", "must not be negative, got %s", c.BatchWait)
	}
	switch c.OutageMode {
	case "pause", "retry":
	default:
		p.add("WORKER_OUTAGE_MODE", "must be pause or retry, got %q", c.OutageMode)
	}
	checkRange(&p, "DB_MAX_CONNS", int64(c.DBMaxConns), 1, 1000)
	checkPositive(&p, "PROCESS_TIMEOUT", c.ProcessTimeout)
	checkPositive(&p, "PUBLISH_TIMEOUT", c.PublishTimeout)
	checkPositive(&p, "SHUTDOWN_TIMEOUT", c.ShutdownTimeout)
	if err := CheckManagementURL(c.RabbitMQManagementURL); err != nil {
		p.add("RABBITMQ_MANAGEMENT_URL", "%v", err)
	}
	c.Outbox.validate(&p)
	if c.QueueStatsInterval < time.Second {
		p.add("QUEUE_STATS_INTERVAL", "must be at least 1s, got %s", c.QueueStatsInterval)
	}
	return p.err()
}

// Validate implements Spec.
func (c *Migrate) Validate() error {
	var p problems
	c.Logging.validate(&p)
	validateDatabaseURL(&p, c.DatabaseURL)
	validateTLS(&p, "DATABASE_TLS", "DATABASE_URL", c.DatabaseTLSSettings(), func() string { return databasePlaintext(c.DatabaseURL) })
	checkPositive(&p, "MIGRATE_LOCK_TIMEOUT", c.LockTimeout)
	checkPositive(&p, "MIGRATE_WAIT_TIMEOUT", c.WaitTimeout)
	return p.err()
}

// ParseRedisURL reads a REDIS_URL of any of the three forms dedupe.Open
// takes (one server, a Sentinel-managed master, a cluster), and reports
// whether it names a cluster. Its error says what is wrong in words and
// repeats no part of redisURL (go-redis's own errors quote it, password and
// all); it is not wrapped, so no caller can print the original by mistake.
func ParseRedisURL(redisURL string) (opts *redis.UniversalOptions, cluster bool, err error) {
	u, err := url.Parse(redisURL)
	if err != nil {
		return nil, false, redisURLError(redisURL, err)
	}
	q := u.Query()
	switch {
	case q.Has("master_name"):
		f, err := redis.ParseFailoverURL(redisURL)
		if err != nil {
			return nil, false, redisURLError(redisURL, err)
		}
		return &redis.UniversalOptions{Addrs: f.SentinelAddrs, MasterName: f.MasterName, DB: f.DB,
			Username: f.Username, Password: f.Password, SentinelUsername: f.SentinelUsername,
			SentinelPassword: f.SentinelPassword, TLSConfig: f.TLSConfig}, false, nil
	case q.Has("addr"):
		c, err := redis.ParseClusterURL(redisURL)
		if err != nil {
			return nil, false, redisURLError(redisURL, err)
		}
		return &redis.UniversalOptions{Addrs: c.Addrs, Username: c.Username, Password: c.Password, TLSConfig: c.TLSConfig}, true, nil
	}
	o, err := redis.ParseURL(redisURL)
	if err != nil {
		return nil, false, redisURLError(redisURL, err)
	}
	return &redis.UniversalOptions{Addrs: []string{o.Addr}, DB: o.DB, Username: o.Username, Password: o.Password,
		TLSConfig: o.TLSConfig, Protocol: o.Protocol}, false, nil
}
