// Package config reads the settings of the idempotent-events binaries from
// environment variables (github.com/kelseyhightower/envconfig) and validates
// them.
//
// Every setting has a default that points at services on 127.0.0.1, so a bare
// receiver or worker runs on a development machine. Bad values are reported
// all at once, as a *Error with a Problem per variable that names it and what
// is wrong with it; the binaries print it, a line per Problem, and exit with
// status 2. Values of variables that may carry credentials (URLs, secrets)
// are never echoed, nor any part of them (see urls.go).
package config

import (
	"errors"
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"time"

	"github.com/kelseyhightower/envconfig"
)

// ExitCode is the process exit status for invalid configuration.
const ExitCode = 2

// Connections holds the addresses of the three services the pipeline uses.
type Connections struct {
	AMQPURL     string `envconfig:"AMQP_URL" default:"amqp://guest:guest@127.0.0.1:5672/" sensitive:"true"`
	RedisURL    string `envconfig:"REDIS_URL" default:"redis://127.0.0.1:6379/0" sensitive:"true"`
	DatabaseURL string `envconfig:"DATABASE_URL" default:"postgres://postgres@127.0.0.1:5432/idempotent_events?sslmode=disable" sensitive:"true"`
	// AMQPReconnectMaxBackoff caps the jittered exponential wait between
	// reconnect attempts to RabbitMQ.
	AMQPReconnectMaxBackoff time.Duration `envconfig:"AMQP_RECONNECT_MAX_BACKOFF" default:"10s"`

	// TLS of each service's connections (tls.go).
	AMQPTLS
	RedisTLS
	DatabaseTLS
}

// Logging selects the zap logger's level and encoding.
type Logging struct {
	LogLevel  string `envconfig:"LOG_LEVEL" default:"info"`
	LogFormat string `envconfig:"LOG_FORMAT" default:"json"`
	// Pprof serves Go's /debug/pprof profiles on METRICS_ADDR.
	Pprof bool `envconfig:"METRICS_PPROF" default:"false"`
}

// Topology describes the RabbitMQ queues both receiver and worker declare.
type Topology struct {
	// QueueType is QueueClassic or QueueQuorum.
	QueueType string `envconfig:"QUEUE_TYPE" default:"classic"`
	// RetryDelays lists one delay per retry attempt; each distinct delay is a
	// retry queue with a queue-level TTL. The seed's fixed 5s x 3 is "5s,5s,5s".
	RetryDelays Durations `envconfig:"RETRY_DELAYS" default:"5s,30s,2m,10m,1h"`
	// QuorumDeliveryLimit is x-delivery-limit on quorum queues. A message that
	// exceeds it is dead-lettered to events.dlq, never dropped.
	QuorumDeliveryLimit int `envconfig:"QUORUM_DELIVERY_LIMIT" default:"1000"`
}

// Dedupe configures the Redis fast path in front of Postgres.
type Dedupe struct {
	// RedisKeyPrefix namespaces every key the service writes.
	RedisKeyPrefix string `envconfig:"REDIS_KEY_PREFIX" default:"ie:"`
	// DedupeTTL is how long Redis remembers a committed event. It is a cache
	// lifetime only: Postgres decides correctness.
	DedupeTTL time.Duration `envconfig:"DEDUPE_TTL" default:"24h"`
}

// Receiver is the configuration of the receiver binary.
type Receiver struct {
	Connections
	Logging
	Topology
	Dedupe

	HTTPAddr    string `envconfig:"HTTP_ADDR" default:":8080"`
	MetricsAddr string `envconfig:"METRICS_ADDR" default:":9090"`

	// WebhookSecrets are the Stripe signing secrets; more than one during a
	// rotation. Without any the receiver refuses to start, unless
	// InsecureSkipVerify is set.
	WebhookSecrets List `envconfig:"WEBHOOK_SECRETS" sensitive:"true"`
	// WebhookSources adds a route /webhooks/{name} per "name:scheme" item
	// (scheme: a provider of pkg/internal/provider, such as stripe,
	// standard, github or paypal); each reads its own secrets from
	// SecretsVar(name).
	WebhookSources     List          `envconfig:"WEBHOOK_SOURCES"`
	WebhookTolerance   time.Duration `envconfig:"WEBHOOK_TOLERANCE" default:"5m"`
	WebhookMaxBody     int64         `envconfig:"WEBHOOK_MAX_BODY_BYTES" default:"1048576"`
	InsecureSkipVerify bool          `envconfig:"INSECURE_SKIP_SIGNATURE_VERIFICATION" default:"false"`
	// PayPalCertHosts are the hosts PAYPAL-CERT-URL may name ("host" or
	// "host:port"): PayPal's signing certificates are fetched from them
	// only, over HTTPS.
	PayPalCertHosts List `envconfig:"PAYPAL_CERT_HOSTS" default:"api.paypal.com,api.sandbox.paypal.com"`
	// PayPalCAFile is a PEM bundle that replaces the system roots for
	// PayPal's certificate hosts and the certificates they serve; empty
	// means the system roots.
	PayPalCAFile string `envconfig:"PAYPAL_CA_FILE"`

	// Webhook secrets read from files, and the limits on senders without
	// them (secretfiles.go, receiverlimits.go).
	WebhookSecretFiles
	ReceiverLimits

	PublishTimeout  time.Duration `envconfig:"PUBLISH_TIMEOUT" default:"5s"`
	PublishChannels int           `envconfig:"PUBLISH_CHANNELS" default:"1"`
	MaxInFlight     int           `envconfig:"RECEIVER_MAX_IN_FLIGHT" default:"1024"`
	RetryAfter      time.Duration `envconfig:"RECEIVER_RETRY_AFTER" default:"5s"`

	// DuplicateCheck answers 200 duplicate, without publishing, for an event
	// that is recorded as committed: "redis" asks the Redis fast path only,
	// "postgres" also asks Postgres on a Redis miss (a query per request),
	// "off" always publishes. Any lookup error publishes.
	DuplicateCheck        string        `envconfig:"DUPLICATE_CHECK" default:"redis"`
	DuplicateCheckTimeout time.Duration `envconfig:"DUPLICATE_CHECK_TIMEOUT" default:"100ms"`

	ShutdownTimeout time.Duration `envconfig:"SHUTDOWN_TIMEOUT" default:"20s"`

	// Sources is WebhookSources with their secrets, filled by Validate.
	Sources []Source `ignored:"true"`
}

// Source is one configured webhook source. Its scheme and secrets are
// checked by the signature package that uses them (see app), which reports
// a bad value as an *Error naming SecretsVar or WEBHOOK_SOURCES.
type Source struct {
	Name    string
	Scheme  string
	Secrets []string
	// SecretsVar is the variable the secrets were read from.
	SecretsVar string
	// SecretsFile, when set, is the file the secrets were read from
	// (SecretsFileVar(SecretsVar)); the receiver reads it again as it
	// changes.
	SecretsFile string
}

// Queue types of QUEUE_TYPE: the RabbitMQ queue types of the same names.
const (
	QueueClassic = "classic"
	QueueQuorum  = "quorum"
)

// Duplicate check modes of the receiver.
const (
	DuplicateCheckOff      = "off"
	DuplicateCheckRedis    = "redis"
	DuplicateCheckPostgres = "postgres"
)

// Worker is the configuration of the worker binary.
type Worker struct {
	Connections
	Logging
	Topology
	Dedupe
	Admin

	MetricsAddr string `envconfig:"METRICS_ADDR" default:":9091"`

	Prefetch       int           `envconfig:"WORKER_PREFETCH" default:"1024"`
	ReplayPrefetch int           `envconfig:"WORKER_REPLAY_PREFETCH" default:"4"`
	Concurrency    int           `envconfig:"WORKER_CONCURRENCY" default:"4"`
	BatchSize      int           `envconfig:"WORKER_BATCH_SIZE" default:"128"`
	BatchWait      time.Duration `envconfig:"WORKER_BATCH_WAIT" default:"5ms"`

	// OutageMode is what the worker does while Postgres is unreachable:
	// "pause" stops consuming until it answers (messages wait in
	// events.main); "retry" sends them through the retry tiers.
	OutageMode string `envconfig:"WORKER_OUTAGE_MODE" default:"pause"`

	// DurabilityAllowAsync lets the worker start on a primary whose
	// standbys are all asynchronous: a failover may then lose committed,
	// acked events (docs/operations.md#replicated-postgres).
	DurabilityAllowAsync bool `envconfig:"DURABILITY_ALLOW_ASYNC" default:"false"`

	DBMaxConns     int32         `envconfig:"DB_MAX_CONNS" default:"10"`
	ProcessTimeout time.Duration `envconfig:"PROCESS_TIMEOUT" default:"15s"`
	// PublishTimeout bounds a retry or DLQ publish waiting for its confirm.
	PublishTimeout  time.Duration `envconfig:"PUBLISH_TIMEOUT" default:"5s"`
	ShutdownTimeout time.Duration `envconfig:"SHUTDOWN_TIMEOUT" default:"20s"`

	// RabbitMQManagementURL is where queue depths and ages are read for the
	// lag metrics: "auto" derives http://<user>:<pass>@<AMQP host>:15672,
	// "off" disables the queue metrics.
	RabbitMQManagementURL string        `envconfig:"RABBITMQ_MANAGEMENT_URL" default:"auto" sensitive:"true"`
	QueueStatsInterval    time.Duration `envconfig:"QUEUE_STATS_INTERVAL" default:"15s"`

	// Release names the deploy the worker belongs to, for the fence on
	// handler sets (the chart sets <release>-<revision>); "": the worker's
	// handler set names it.
	Release string `envconfig:"WORKER_RELEASE"`

	// EventArchive keeps the body of every committed event (event_archive),
	// so that a handler added later can be backfilled over it.
	EventArchive bool `envconfig:"EVENT_ARCHIVE" default:"false"`

	Outbox
}

// Outbox configures the worker's outbox relay, which publishes the
// messages effects handlers enqueue.
type Outbox struct {
	// OutboxRelay runs the relay in this worker ("on"), not at all ("off":
	// another process publishes the outbox), or only the relay ("only": the
	// process consumes no events; a relay Deployment of its own).
	OutboxRelay       string        `envconfig:"OUTBOX_RELAY" default:"on"`
	OutboxBatchSize   int           `envconfig:"OUTBOX_BATCH_SIZE" default:"100"`
	OutboxPoll        time.Duration `envconfig:"OUTBOX_POLL_INTERVAL" default:"1s"`
	OutboxMaxAttempts int           `envconfig:"OUTBOX_MAX_ATTEMPTS" default:"10"`
	OutboxMaxBackoff  time.Duration `envconfig:"OUTBOX_MAX_BACKOFF" default:"5m"`
	// OutboxRetention is how long published rows are kept.
	OutboxRetention time.Duration `envconfig:"OUTBOX_RETENTION" default:"168h"`
}

// RelayEnabled reports whether the worker runs the outbox relay.
func (o *Outbox) RelayEnabled() bool { return o.OutboxRelay == "on" || o.OutboxRelay == "only" }

// RelayOnly reports whether the process runs the relay and nothing else.
func (o *Outbox) RelayOnly() bool { return o.OutboxRelay == "only" }

func (o *Outbox) validate(p *problems) {
	switch o.OutboxRelay {
	case "on", "off", "only":
	default:
		p.add("OUTBOX_RELAY", "must be on, off or only, got %q", o.OutboxRelay)
	}
	checkRange(p, "OUTBOX_BATCH_SIZE", int64(o.OutboxBatchSize), 1, 10000)
	checkPositive(p, "OUTBOX_POLL_INTERVAL", o.OutboxPoll)
	checkRange(p, "OUTBOX_MAX_ATTEMPTS", int64(o.OutboxMaxAttempts), 1, 1000)
	checkPositive(p, "OUTBOX_MAX_BACKOFF", o.OutboxMaxBackoff)
	if o.OutboxRetention < time.Hour {
		p.add("OUTBOX_RETENTION", "must be at least 1h, got %s", o.OutboxRetention)
	}
}

// Migrate is the configuration of the migrate binary.
type Migrate struct {
	Logging
	DatabaseURL string `envconfig:"DATABASE_URL" default:"postgres://postgres@127.0.0.1:5432/idempotent_events?sslmode=disable" sensitive:"true"`
	DatabaseTLS
	LockTimeout time.Duration `envconfig:"MIGRATE_LOCK_TIMEOUT" default:"5m"`
	// WaitTimeout bounds `migrate wait`, which init containers use to hold a
	// pod until the schema is current.
	WaitTimeout time.Duration `envconfig:"MIGRATE_WAIT_TIMEOUT" default:"5m"`
	// Release, when set, is announced after `migrate up` as the newest
	// generation of the workers (the chart's hook, with <release>-<revision>,
	// before an upgrade or a rollback): workers of another handler set stop
	// committing from then on.
	Release string `envconfig:"WORKER_RELEASE"`

	// EventArchive keeps the body of every committed event (event_archive),
	// so that a handler added later can be backfilled over it.
	EventArchive bool `envconfig:"EVENT_ARCHIVE" default:"false"`
}

// Spec is the configuration of one binary (Receiver, Worker or Migrate): it
// validates itself and carries the logging settings.
type Spec interface {
	Validate() error
	logging() Logging
}

func (l Logging) logging() Logging { return l }

// LoggingOf returns the logging settings of spec.
func LoggingOf(spec Spec) Logging { return spec.logging() }

// Load fills spec from the environment and validates it. Every bad
// variable is reported, not only the first: the error, if any, is a *Error
// with a Problem for each variable that does not parse, then one for each
// value validation refuses.
func Load(spec Spec) error {
	var p problems
	unparsed := map[string]bool{}
	processEach(reflect.ValueOf(spec).Elem(), &p, unparsed)
	if err := spec.Validate(); err != nil {
		var cerr *Error
		if !errors.As(err, &cerr) {
			return err
		}
		for _, q := range cerr.Problems {
			// A variable that did not parse was left as it was; what
			// validation says of that value would only confuse.
			if !unparsed[q.Var] {
				p = append(p, q)
			}
		}
	}
	return p.err()
}

// processEach fills the fields of v (a config struct) from the environment
// one at a time, each by envconfig.Process on a struct of that one field
// with the field's tags, so envconfig reads and decodes it exactly as it
// would in the whole struct. envconfig.Process on the whole struct stops at
// the first variable that does not parse; this way each one is a Problem
// and the rest are still read and validated. A field whose variable does
// not parse keeps its value, and its variable is added to unparsed.
func processEach(v reflect.Value, p *problems, unparsed map[string]bool) {
	t := v.Type()
	for i := 0; i < t.NumField(); i++ {
		f, ft := v.Field(i), t.Field(i)
		if !ft.IsExported() || ft.Tag.Get("ignored") == "true" {
			continue
		}
		if ft.Anonymous && ft.Type.Kind() == reflect.Struct {
			processEach(f, p, unparsed)
			continue
		}
		one := reflect.New(reflect.StructOf([]reflect.StructField{{Name: ft.Name, Type: ft.Type, Tag: ft.Tag}}))
		// envconfig leaves a field alone when its variable is unset and it
		// has no default: start from the current value, as it would.
		one.Elem().Field(0).Set(f)
		if err := envconfig.Process("", one.Interface()); err != nil {
			prob := parseProblem(err, ft.Tag.Get("sensitive") == "true")
			unparsed[prob.Var] = true
			*p = append(*p, prob)
			continue
		}
		f.Set(one.Elem().Field(0))
	}
}

// Problem is one invalid variable.
type Problem struct {
	Var string
	Msg string
}

// Error lists every invalid variable found.
type Error struct {
	Problems []Problem
}

func (e *Error) Error() string {
	lines := make([]string, len(e.Problems))
	for i, p := range e.Problems {
		lines[i] = "invalid configuration: " + p.Var + ": " + p.Msg
	}
	return strings.Join(lines, "\n")
}

// problems collects Problems while a Validate method runs.
type problems []Problem

func (p *problems) add(name, format string, args ...any) {
	*p = append(*p, Problem{Var: name, Msg: fmt.Sprintf(format, args...)})
}

func (p problems) err() error {
	if len(p) == 0 {
		return nil
	}
	return &Error{Problems: p}
}

// parseProblem is the Problem of a variable envconfig could not decode.
// The value is quoted unless the variable is sensitive; then neither it nor
// the decoder's error, which may repeat it, is.
func parseProblem(err error, sensitive bool) Problem {
	var pe *envconfig.ParseError
	if !errors.As(err, &pe) {
		return Problem{Var: "environment", Msg: err.Error()}
	}
	if sensitive {
		return Problem{Var: pe.KeyName, Msg: "value is not a valid " + typeWord(pe.TypeName)}
	}
	msg := fmt.Sprintf("%q is not a valid %s", pe.Value, typeWord(pe.TypeName))
	var inner interface{ Unwrap() error }
	if errors.As(pe.Err, &inner) && inner.Unwrap() != nil {
		// strconv and time errors repeat the value; keep only their reason.
		msg += " (" + lastPart(inner.Unwrap().Error()) + ")"
	} else if pe.Err != nil && !strings.Contains(pe.Err.Error(), pe.Value) {
		msg += " (" + pe.Err.Error() + ")"
	}
	return Problem{Var: pe.KeyName, Msg: msg}
}

func typeWord(goType string) string {
	switch goType {
	case "time.Duration":
		return "duration (e.g. 500ms, 5s, 2m)"
	case "bool":
		return "boolean (true or false)"
	case "int", "int32", "int64":
		return "integer"
	case "config.Durations":
		return "comma-separated list of durations (e.g. 5s,30s,2m)"
	}
	return goType
}

func lastPart(s string) string {
	if i := strings.LastIndex(s, ": "); i >= 0 {
		return s[i+2:]
	}
	return s
}

// List is a comma-separated list of strings; blanks around items and empty
// items are dropped.
type List []string

// Decode implements envconfig.Decoder.
func (l *List) Decode(value string) error {
	var out List
	for _, item := range strings.Split(value, ",") {
		if item = strings.TrimSpace(item); item != "" {
			out = append(out, item)
		}
	}
	*l = out
	return nil
}

// Durations is a comma-separated list of durations.
type Durations []time.Duration

// Decode implements envconfig.Decoder.
func (d *Durations) Decode(value string) error {
	var out Durations
	for _, item := range strings.Split(value, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		v, err := time.ParseDuration(item)
		if err != nil {
			return fmt.Errorf("item %q: %w", item, err)
		}
		out = append(out, v)
	}
	*d = out
	return nil
}

// String formats the list as it is written in the environment.
func (d Durations) String() string {
	parts := make([]string, len(d))
	for i, v := range d {
		parts[i] = v.String()
	}
	return strings.Join(parts, ",")
}

func checkRange(p *problems, name string, v, lo, hi int64) {
	if v < lo || v > hi {
		p.add(name, "must be between %d and %d, got %s", lo, hi, strconv.FormatInt(v, 10))
	}
}

func checkPositive(p *problems, name string, d time.Duration) {
	if d <= 0 {
		p.add(name, "must be a positive duration, got %s", d)
	}
}
