package service

import (
	"fmt"
	"io"
	"reflect"
	"runtime/debug"
	"strings"
	"text/tabwriter"

	"github.com/idempotent-events/idempotent-events/pkg/effects"
	"github.com/idempotent-events/idempotent-events/pkg/internal/app"
	"github.com/idempotent-events/idempotent-events/pkg/internal/config"
	"github.com/idempotent-events/idempotent-events/pkg/internal/telemetry"
)

// module is the path of the idempotent-events module, which a team's own
// worker requires.
const module = "github.com/idempotent-events/idempotent-events"

// workerMain is Worker with the process's parts passed in: name is the
// binary's own name (a team's worker is not "worker"), buildInfo is
// runtime/debug.ReadBuildInfo. --help and --version describe this binary
// (its handler set, its build); a start and --check-config are the stock
// worker's.
func workerMain(fx *effects.Registry, name string, args []string, stdout, stderr io.Writer, buildInfo func() (*debug.BuildInfo, bool)) int {
	switch {
	case len(args) == 0:
	case len(args) > 1:
		fmt.Fprintf(stderr, "%s: one argument at most, got %q\n\n%s", name, args, workerUsage(name))
		return app.ExitUsage
	case args[0] == "-h" || args[0] == "--help" || args[0] == "help":
		fmt.Fprint(stdout, workerHelp(name, fx.Set()))
		return app.ExitOK
	case args[0] == "--version" || args[0] == "version":
		fmt.Fprint(stdout, workerVersion(name, fx.Set(), buildInfo))
		return app.ExitOK
	case args[0] == "--check-config":
	default:
		fmt.Fprintf(stderr, "%s: unknown argument %q\n\n%s", name, args[0], workerUsage(name))
		return app.ExitUsage
	}
	return app.Worker(fx, args, stdout, stderr)
}

func workerUsage(name string) string {
	return fmt.Sprintf(`usage: %s [--check-config | --version | --help]
  (no argument)   run until SIGINT or SIGTERM, then drain in-flight events
  --check-config  validate the configuration as a start would (exit 0 or 2), touching no service
  --version       the build: version, main module, idempotent-events' version, Go, VCS revision
`, name)
}

// keyVariables are the variables a worker's operator sets first, with
// what each is for; the others are listed by name.
var keyVariables = []struct{ name, what string }{
	{"DATABASE_URL", "the ledger (processed_events); the handlers' own tables live in this database"},
	{"AMQP_URL", "RabbitMQ: events.main, the retry tiers, events.dlq"},
	{"REDIS_URL", "the fast path in front of the ledger, never the truth"},
	{"WORKER_RELEASE", "the deploy this worker belongs to (the chart sets it); unset: its handler set"},
	{"METRICS_ADDR", "/metrics, /livez and /readyz"},
}

// workerHelp is the --help of a worker binary called name that runs set.
func workerHelp(name string, set effects.Set) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s: a worker built on idempotent-events (%s).\n", name, module)
	b.WriteString("It consumes events.main and commits each event exactly once with the effects of the handlers\n")
	b.WriteString("below, in the transaction of the event's ledger row (docs/effects.md).\n\n")

	fmt.Fprintf(&b, "Handler set %s, recorded with every event this worker commits:\n", set.ID)
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	for _, h := range set.Handlers {
		if h.ObjectType != "" {
			fmt.Fprintf(tw, "  %s\ttransition\t%s -> %s\n", h.Name, h.ObjectType, h.To)
		} else {
			fmt.Fprintf(tw, "  %s\tevent\tsource %s, type %s\n", h.Name, h.Source, h.EventType)
		}
	}
	if len(set.Handlers) == 0 {
		fmt.Fprintf(tw, "  (none: every event commits with outcome skipped)\n")
	}
	_ = tw.Flush()

	vars := workerVariables()
	b.WriteString("\nEnvironment: the stock worker's variables, every one with its default in docs/configuration.md\n")
	b.WriteString("(sections \"Shared by receiver and worker\" and \"Worker\"):\n")
	tw = tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	key := map[string]bool{}
	for _, v := range keyVariables {
		def, ok := vars[v.name]
		if !ok {
			continue // not read (any more): not advertised
		}
		key[v.name] = true
		fmt.Fprintf(tw, "  %s\t%s\n", v.name, v.what)
		if def != "" {
			fmt.Fprintf(tw, "  \tdefault %s\n", def)
		}
	}
	_ = tw.Flush()
	var others []string
	for _, n := range workerVariableNames() {
		if !key[n] {
			others = append(others, n)
		}
	}
	b.WriteString(wrap("and "+strings.Join(others, ", ")+".", "  ", 96))
	b.WriteString("With ADMIN_TOKEN set it also serves the DLQ admin API and page; with OUTBOX_RELAY=only it runs\n")
	b.WriteString("only the outbox relay.\n\n")
	b.WriteString(workerUsage(name))
	return b.String()
}

// workerVersion is the --version of a worker binary called name that runs
// set. The first line, "<name> <version>", is the version the build
// stamped (-X …/pkg/internal/telemetry.Version, as the Makefile and the
// Dockerfiles do; "dev" otherwise): the one the logs and
// idempotent_events_build_info carry. The lines after it come from the
// binary's build information.
func workerVersion(name string, set effects.Set, buildInfo func() (*debug.BuildInfo, bool)) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s\n", name, telemetry.Version)
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	bi, ok := buildInfo()
	if !ok {
		fmt.Fprintf(tw, "build info\tnone (built without module support)\n")
	} else {
		fmt.Fprintf(tw, "main package\t%s\n", bi.Path)
		fmt.Fprintf(tw, "main module\t%s %s\n", bi.Main.Path, moduleVersion(&bi.Main))
		if bi.Main.Path == module {
			fmt.Fprintf(tw, "idempotent-events\tthe main module\n")
		} else if dep := dependency(bi, module); dep != nil {
			fmt.Fprintf(tw, "idempotent-events\t%s %s\n", dep.Path, moduleVersion(dep))
		} else {
			fmt.Fprintf(tw, "idempotent-events\tnot in the build information\n")
		}
		fmt.Fprintf(tw, "go\t%s\n", bi.GoVersion)
		if vcs := vcsOf(bi); vcs != "" {
			fmt.Fprintf(tw, "vcs\t%s\n", vcs)
		}
	}
	names := make([]string, len(set.Handlers))
	for i, h := range set.Handlers {
		names[i] = h.Name
	}
	fmt.Fprintf(tw, "handler set\t%s (%s)\n", set.ID, strings.Join(names, ", "))
	_ = tw.Flush()
	return b.String()
}

// moduleVersion is m's version, and its replacement if it has one.
func moduleVersion(m *debug.Module) string {
	v := m.Version
	if v == "" {
		v = "(unknown version)"
	}
	if m.Replace != nil {
		r := m.Replace.Path
		if m.Replace.Version != "" {
			r += " " + m.Replace.Version
		}
		v += " => " + r
	}
	return v
}

func dependency(bi *debug.BuildInfo, path string) *debug.Module {
	for _, d := range bi.Deps {
		if d.Path == path {
			return d
		}
	}
	return nil
}

// vcsOf is the version control state the go command stamped: system,
// revision, time, and whether the tree had changes.
func vcsOf(bi *debug.BuildInfo) string {
	s := map[string]string{}
	for _, kv := range bi.Settings {
		s[kv.Key] = kv.Value
	}
	if s["vcs"] == "" {
		return ""
	}
	out := strings.TrimSpace(strings.Join([]string{s["vcs"], s["vcs.revision"], s["vcs.time"]}, " "))
	if s["vcs.modified"] == "true" {
		out += " (modified)"
	}
	return out
}

// workerVariables are the environment variables the worker reads, with
// their defaults: those of its configuration, read from the same struct
// tags the configuration is loaded by, so the help cannot fall behind it.
func workerVariables() map[string]string {
	out := map[string]string{}
	walkVariables(reflect.TypeOf(config.Worker{}), func(name, def string) { out[name] = def })
	return out
}

// workerVariableNames are workerVariables' names in declaration order.
func workerVariableNames() []string {
	var names []string
	walkVariables(reflect.TypeOf(config.Worker{}), func(name, _ string) {
		for _, n := range names {
			if n == name {
				return
			}
		}
		names = append(names, name)
	})
	return names
}

func walkVariables(t reflect.Type, f func(name, def string)) {
	for i := 0; i < t.NumField(); i++ {
		field := t.Field(i)
		if field.Anonymous && field.Type.Kind() == reflect.Struct {
			walkVariables(field.Type, f)
			continue
		}
		if name := field.Tag.Get("envconfig"); name != "" && field.Tag.Get("ignored") != "true" {
			f(name, field.Tag.Get("default"))
		}
	}
}

// wrap breaks s into lines of at most width, each starting with indent.
func wrap(s, indent string, width int) string {
	var b strings.Builder
	line := indent
	for _, w := range strings.Fields(s) {
		if len(line) > len(indent) && len(line)+1+len(w) > width {
			b.WriteString(line + "\n")
			line = indent
		}
		if len(line) > len(indent) {
			line += " "
		}
		line += w
	}
	b.WriteString(line + "\n")
	return b.String()
}
