package worker

import (
	"strings"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idempotent-events/idempotent-events/pkg/internal/broker"
	"github.com/idempotent-events/idempotent-events/pkg/internal/telemetry"
)

// Metrics are the worker's Prometheus series.
type Metrics struct {
	events       *prometheus.CounterVec
	duplicates   *prometheus.CounterVec
	retries      *prometheus.CounterVec
	deadLetters  *prometheus.CounterVec
	batchSize    prometheus.Histogram
	batchSeconds prometheus.Histogram
	txSeconds    prometheus.Histogram
	endToEnd     prometheus.Histogram
	redisLookups *prometheus.CounterVec
	redisWrites  *prometheus.CounterVec
	inFlight     prometheus.Gauge
	ackFailures  prometheus.Counter
	// Broker is the connection state Supervise reports.
	Broker *broker.ConnMetrics
	paused prometheus.Gauge
	pauses prometheus.Counter
	// durability is the ledger database's replication as last read;
	// allowAsync says DURABILITY_ALLOW_ASYNC=true.
	durability *prometheus.GaugeVec
	allowAsync prometheus.Gauge
	// fenced and handlerSet: the worker's handler set and whether it is
	// the current generation's (see fence.go).
	fenced     prometheus.Gauge
	handlerSet *prometheus.GaugeVec
}

// SetDurability exports the ledger's replication mode (single, sync,
// async, standby) and whether asynchronous standbys are allowed.
func (m *Metrics) SetDurability(mode string, allowAsync bool) {
	m.durability.Reset()
	m.durability.WithLabelValues(mode).Set(1)
	if allowAsync {
		m.allowAsync.Set(1)
	} else {
		m.allowAsync.Set(0)
	}
}

// settledOutcomes are the outcome label values of events_total: every
// Outcome settle counts. A Requeue is given back unsettled and never counted.
var settledOutcomes = []Outcome{Processed, Duplicate, Retry, DeadLetter, Conflict}

func outcomeNames() string {
	names := make([]string, len(settledOutcomes))
	for i, o := range settledOutcomes {
		names[i] = o.String()
	}
	return strings.Join(names, ", ")
}

var latencyBuckets = []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300, 3600}

// NewMetrics registers the worker's metrics on reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	const sub = "worker"
	m := &Metrics{
		events: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: telemetry.Namespace, Subsystem: sub, Name: "events_total",
			Help: "Deliveries settled, by outcome: " + outcomeNames() + ".",
		}, []string{"outcome"}),
		duplicates: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: telemetry.Namespace, Subsystem: sub, Name: "duplicates_total",
			Help: "Duplicate deliveries acked, by the layer that recognised them: redis or postgres.",
		}, []string{"layer"}),
		retries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: telemetry.Namespace, Subsystem: sub, Name: "retries_total",
			Help: "Deliveries sent to a retry tier, by tier delay.",
		}, []string{"tier"}),
		deadLetters: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: telemetry.Namespace, Subsystem: sub, Name: "dead_letters_total",
			Help: "Deliveries sent to events.dlq, by reason.",
		}, []string{"reason"}),
		batchSize: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: telemetry.Namespace, Subsystem: sub, Name: "batch_size",
			Help:    "Deliveries per processed batch.",
			Buckets: []float64{1, 2, 4, 8, 16, 32, 64, 128, 256, 512},
		}),
		batchSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: telemetry.Namespace, Subsystem: sub, Name: "batch_duration_seconds",
			Help:    "Time to process one batch, from decode to the last settle decision.",
			Buckets: latencyBuckets,
		}),
		txSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: telemetry.Namespace, Subsystem: sub, Name: "postgres_transaction_seconds",
			Help:    "Duration of the Postgres transaction that commits a batch.",
			Buckets: latencyBuckets,
		}),
		endToEnd: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: telemetry.Namespace, Subsystem: sub, Name: "end_to_end_seconds",
			Help:    "Time from the receiver accepting an event to its effect committing.",
			Buckets: latencyBuckets,
		}),
		redisLookups: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: telemetry.Namespace, Subsystem: sub, Name: "redis_lookups_total",
			Help: "Redis fast-path lookups per event, by result: hit, miss, error.",
		}, []string{"result"}),
		redisWrites: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: telemetry.Namespace, Subsystem: sub, Name: "redis_writes_total",
			Help: "Post-commit Redis writes per batch, by result: ok, error.",
		}, []string{"result"}),
		inFlight: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: telemetry.Namespace, Subsystem: sub, Name: "in_flight",
			Help: "Deliveries being processed right now.",
		}),
		ackFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: telemetry.Namespace, Subsystem: sub, Name: "ack_failures_total",
			Help: "Acks that failed because the channel was gone; those deliveries are redelivered.",
		}),
	}
	m.paused = prometheus.NewGauge(prometheus.GaugeOpts{
		Namespace: telemetry.Namespace, Subsystem: sub, Name: "dependency_paused",
		Help: "1 while consumption is paused because Postgres is unreachable.",
	})
	m.pauses = prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: telemetry.Namespace, Subsystem: sub, Name: "dependency_pauses_total",
		Help: "Times consumption was paused because Postgres became unreachable.",
	})
	m.durability = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: telemetry.Namespace, Subsystem: sub, Name: "ledger_durability",
		Help: "1 for the ledger database's replication as the worker last read it: single (no standby), sync, async, standby.",
	}, []string{"mode"})
	m.allowAsync = prometheus.NewGauge(prometheus.GaugeOpts{
		Namespace: telemetry.Namespace, Subsystem: sub, Name: "durability_allow_async",
		Help: "1 when DURABILITY_ALLOW_ASYNC=true: the worker runs on a primary whose standbys are asynchronous.",
	})
	m.fenced = prometheus.NewGauge(prometheus.GaugeOpts{
		Namespace: telemetry.Namespace, Subsystem: sub, Name: "fenced",
		Help: "1 while the worker's handler set is not the current generation's: it takes no events and commits none.",
	})
	m.handlerSet = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: telemetry.Namespace, Subsystem: sub, Name: "handler_set",
		Help: "1 for the handler set the worker runs and the generation it registered it as.",
	}, []string{"set", "generation"})
	reg.MustRegister(m.paused, m.pauses, m.durability, m.allowAsync, m.fenced, m.handlerSet)
	reg.MustRegister(m.events, m.duplicates, m.retries, m.deadLetters, m.batchSize, m.batchSeconds, m.txSeconds,
		m.endToEnd, m.redisLookups, m.redisWrites, m.inFlight, m.ackFailures)
	// Every outcome's series exists from the start, at 0: a rate over an
	// outcome that has not happened yet is 0, not absent, for the
	// dashboard, the alerts and the docs test that reads the labels here.
	for _, o := range settledOutcomes {
		m.events.WithLabelValues(o.String())
	}
	m.Broker = broker.NewConnMetrics(reg, sub)
	return m
}
