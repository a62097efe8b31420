package app_test

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

const module = "github.com/idempotent-events/idempotent-events/"

// layers places every package of the product. A package may import only
// packages of a lower layer: the graph reads bottom to top, and a low
// package (event, webhook, store, broker, dedupe) never learns of what is
// built on it. A new package fails this test until it is given a layer.
var layers = map[string]int{
	// Vocabulary and plumbing that import nothing of ours.
	"pkg/internal/backoff": 0, "pkg/internal/event": 0, "pkg/internal/webhook": 0, "pkg/internal/logging": 0,
	"pkg/internal/httpserver": 0, "pkg/internal/config": 0, "pkg/internal/options": 0, "migrations": 0,
	// TLS to the services from mounted files, reloaded when they change.
	"pkg/internal/tlsconfig": 0,
	// The public effects API, and the built-in payment effect written on it.
	"pkg/effects": 0, "pkg/payments": 1,
	// Webhook providers, one package each, and their registry (the
	// receiver's; the worker decodes with event, below them).
	"pkg/internal/provider/stripe": 1, "pkg/internal/provider/standard": 1, "pkg/internal/provider/github": 1,
	"pkg/internal/provider/paypal": 1, "pkg/internal/provider": 2,
	// Clients of one service each, and the metrics registry.
	"pkg/internal/telemetry": 1, "pkg/internal/store": 1, "pkg/internal/dedupe": 1, "pkg/internal/migrate": 1,
	"pkg/internal/broker": 2, "pkg/internal/queuestats": 2,
	// Webhook secrets read from mounted files, reloaded as they change.
	"pkg/internal/webhooksecrets": 1,
	// The pipeline and the DLQ engine.
	"pkg/internal/receiver": 3, "pkg/internal/worker": 3, "pkg/internal/dlq": 3, "pkg/internal/outbox": 3,
	// The reconciler: the provider's record of events against the ledger.
	"pkg/internal/reconcile": 3,
	// Where an event is and what happened to it (eventsctl events, the admin page).
	"pkg/internal/lookup": 2,
	// Backfills of handlers added later, and the event archive they need.
	"pkg/internal/backfill": 2,
	// Pruning the ledger and the audit trails by age.
	"pkg/internal/retention": 2,
	// What operators use.
	"pkg/internal/admin": 4, "pkg/internal/eventsctl": 4,
	// The consumer kit of downstream services (public).
	"pkg/consumer": 4,
	// The composition root, the public door, the binaries.
	"pkg/internal/app": 5, "pkg/service": 6,
	"cmd/receiver": 7, "cmd/worker": 7, "cmd/migrate": 7, "cmd/eventsctl": 7,
	// A team's own worker binary, as users write one.
	"examples/orders": 7, "examples/confirmations": 7,
}

// testOnly are the packages that exist for tests and the development
// harnesses. They may import anything; no product package may import them.
var testOnly = map[string]bool{
	"pkg/internal/servicetest": true, "pkg/internal/faulttest": true, "pkg/internal/pipelinetest": true,
	"pkg/internal/event/eventtest": true, "pkg/internal/harness": true, "pkg/internal/e2etest": true,
	"pkg/internal/cmd/chaos": true, "pkg/internal/cmd/bench": true, "pkg/internal/cmd/k8sload": true,
	"pkg/internal/cmd/benchorders": true,
	// The flood of invalid webhooks beside valid ones (docs/security.md).
	"pkg/internal/cmd/flood": true,
	// The live alert and dashboard suite: a real Prometheus and Alertmanager over the running binaries.
	"pkg/internal/cmd/alerts": true,
	// A private RabbitMQ cluster whose nodes the chaos suite kills.
	"pkg/internal/rabbitcluster": true,
	// Private PostgreSQL clusters that fail over, for the tests and the chaos suite.
	"pkg/internal/pgcluster": true,
	// A private Sentinel-managed Redis whose master the chaos suite kills.
	"pkg/internal/redissentinel": true,
	// The pause container of the one-node cluster make k8s-e2e builds.
	"hack/k8s/cmd/pause": true,
	// Test CAs, certificates, Secret volumes and private TLS servers.
	"pkg/internal/tlsconfig/tlstest": true,
	// The providers' conformance suite, and PayPal's certificate host.
	"pkg/internal/provider/providertest": true, "pkg/internal/provider/paypal/paypaltest": true,
	// The public test kit of the effects API.
	"pkg/effects/effectstest": true,
}

func TestImportsPointDown(t *testing.T) {
	out, err := exec.Command("go", "list", "-f", "{{.ImportPath}} {{join .Imports \" \"}}", module+"...").CombinedOutput()
	require.NoError(t, err, "%s", out)
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		fields := strings.Fields(line)
		pkg := strings.TrimPrefix(fields[0], module)
		if testOnly[pkg] {
			continue
		}
		layer, ok := layers[pkg]
		if !ok {
			t.Errorf("package %s has no layer: place it in layers (or testOnly) in %s", pkg, "layers_test.go")
			continue
		}
		for _, imp := range fields[1:] {
			dep, ours := strings.CutPrefix(imp, module)
			if !ours {
				continue
			}
			switch depLayer, known := layers[dep]; {
			case testOnly[dep]:
				t.Errorf("%s imports %s, which exists for tests only", pkg, dep)
			case !known:
				t.Errorf("%s imports %s, which has no layer", pkg, dep)
			case depLayer >= layer:
				t.Errorf("%s (layer %d) imports %s (layer %d): imports must point down", pkg, layer, dep, depLayer)
			}
		}
	}
}
