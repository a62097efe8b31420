package app

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/idempotent-events/idempotent-events/pkg/internal/config"
	"github.com/idempotent-events/idempotent-events/pkg/internal/dedupe"
	"github.com/idempotent-events/idempotent-events/pkg/internal/logging"
	"github.com/idempotent-events/idempotent-events/pkg/internal/telemetry"
)

// Exit statuses of the binaries.
const (
	ExitOK     = 0
	ExitFailed = 1
	ExitUsage  = config.ExitCode // invalid configuration or arguments
)

// binary is what main does for one service binary.
type binary struct {
	name string
	// usage is the help text: what the binary does and its arguments.
	usage string
	// commands are the arguments besides the common flags (migrate's
	// "up" and "wait"); the first is the default.
	commands []string
	cfg      config.Spec
	// check validates what the configuration package cannot: values whose
	// meaning belongs to a domain package (signature schemes and secrets).
	// Its error is a *config.Error, reported like one from config.Load.
	check func() error
	// component, when set, names the process in its logs and in
	// idempotent_events_build_info once the configuration is loaded (the
	// worker binary running only the outbox relay is "relay"); else name.
	component func() string
	run       func(ctx context.Context, command string, log *zap.Logger, reg *prometheus.Registry) error
}

// main parses args (without the program name), loads and checks the
// configuration, builds the logger, and runs until SIGINT or SIGTERM.
//
//	(no argument)   run (or the default command)
//	--check-config  load and validate the configuration exactly as a start
//	                would, exit 0 or 2, touch no service
//	--version       print the version
//	-h, --help      print the usage
func (b binary) main(args []string, stdout, stderr io.Writer) int {
	command, checkOnly := "", false
	if len(b.commands) > 0 {
		command = b.commands[0]
	}
	switch {
	case len(args) == 0:
	case len(args) > 1:
		fmt.Fprintf(stderr, "%s: one argument at most, got %q\n\n%s", b.name, args, b.usage)
		return ExitUsage
	case args[0] == "--version" || args[0] == "version":
		fmt.Fprintln(stdout, b.name, telemetry.Version)
		return ExitOK
	case args[0] == "-h" || args[0] == "--help" || args[0] == "help":
		fmt.Fprint(stdout, b.usage)
		return ExitOK
	case args[0] == "--check-config":
		checkOnly = true
	case contains(b.commands, args[0]):
		command = args[0]
	default:
		fmt.Fprintf(stderr, "%s: unknown argument %q\n\n%s", b.name, args[0], b.usage)
		return ExitUsage
	}

	// check runs even when Load found problems, so that every bad variable
	// is on the lines printed, not only those of the configuration package.
	// Both errors are *config.Error, one line per problem; joined, they
	// print as one list.
	err := config.Load(b.cfg)
	if b.check != nil {
		err = errors.Join(err, b.check())
	}
	if err != nil {
		fmt.Fprintln(stderr, err)
		return ExitUsage
	}
	dedupe.SilenceClientLogs()
	lc := config.LoggingOf(b.cfg)
	log, err := logging.New(lc.LogLevel, lc.LogFormat)
	if err != nil {
		fmt.Fprintln(stderr, "invalid configuration: LOG_LEVEL/LOG_FORMAT:", err)
		return ExitUsage
	}
	if checkOnly {
		fmt.Fprintln(stdout, b.name+": configuration ok")
		return ExitOK
	}
	defer func() { _ = log.Sync() }()
	component := b.name
	if b.component != nil {
		component = b.component()
	}
	log = log.Named(component).With(zap.String("version", telemetry.Version))

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := b.run(ctx, command, log, telemetry.NewRegistry(component)); err != nil {
		log.Error("stopped with error", zap.Error(err))
		var cerr *config.Error
		if errors.As(err, &cerr) {
			return ExitUsage
		}
		return ExitFailed
	}
	log.Info("stopped")
	return ExitOK
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}
