// Package logging builds the zap logger every binary injects into its
// components. JSON is the production encoding; console is for a terminal.
//
// No entry carries a stack trace of zap's making. zap's presets attach one
// to every Error, and an error logged here is an outcome an operator acts
// on (a dead-lettered event, a refused connection), not a bug: a stack of
// the logging call only buries it. The one stack worth reading, a recovered
// panic's, is logged as the field "stack" by whoever recovers it (the
// worker, in worker.go).
package logging

import (
	"fmt"
	"os"
	"strings"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// New returns a logger writing to stderr at level ("debug", "info", "warn",
// "error") in format ("json" or "console"). The console format colours the
// level only when stderr is a terminal: escape codes in a file or a log
// collector are noise that breaks grep.
func New(level, format string) (*zap.Logger, error) {
	out := os.Stderr
	lvl, err := zapcore.ParseLevel(strings.ToLower(level))
	if err != nil {
		return nil, fmt.Errorf("log level %q: %w", level, err)
	}
	var enc zapcore.Encoder
	switch format {
	case "json":
		ec := zap.NewProductionEncoderConfig()
		ec.TimeKey = "ts"
		ec.EncodeTime = zapcore.ISO8601TimeEncoder
		enc = zapcore.NewJSONEncoder(ec)
	case "console":
		ec := zap.NewDevelopmentEncoderConfig()
		if isTerminal(out) {
			ec.EncodeLevel = zapcore.CapitalColorLevelEncoder
		}
		enc = zapcore.NewConsoleEncoder(ec)
	default:
		return nil, fmt.Errorf("log format %q: want json or console", format)
	}
	// Not sampled: sampling would drop lines of a retry storm that an
	// operator needs.
	sink := zapcore.Lock(out)
	core := zapcore.NewCore(enc, sink, zap.NewAtomicLevelAt(lvl))
	// A stack only at DPanic and above, which is a panic of the logger's
	// own; see the package comment.
	return zap.New(core, zap.AddCaller(), zap.ErrorOutput(sink), zap.AddStacktrace(zapcore.DPanicLevel)), nil
}

// isTerminal says whether f is a terminal. A character device is one, or
// /dev/null, where colour does no harm; a file, a pipe or a socket is not.
// The standard library is enough here: golang.org/x/term is not a
// dependency of this module.
func isTerminal(f *os.File) bool {
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}
