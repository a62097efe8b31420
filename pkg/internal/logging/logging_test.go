package logging

import (
	"encoding/json"
	"errors"
	"io"
	"os"
	"runtime/debug"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
)

// capture builds a logger with New while stderr is a pipe, lets logf log
// through it, and returns what came out of the pipe. New takes stderr as it
// is when it builds the logger, so the pipe is all it sees; the tests of
// this package do not run in parallel for that reason.
func capture(t *testing.T, format string, logf func(*zap.Logger)) string {
	t.Helper()
	r, w, err := os.Pipe()
	require.NoError(t, err)
	defer r.Close()
	stderr := os.Stderr
	os.Stderr = w
	log, err := New("info", format)
	os.Stderr = stderr
	require.NoError(t, err)
	logf(log.Named("worker"))
	_ = log.Sync()
	require.NoError(t, w.Close())
	out, err := io.ReadAll(r)
	require.NoError(t, err)
	return string(out)
}

// deadLetter logs what the worker logs when it dead-letters an event
// (settle.go), at the same level.
func deadLetter(log *zap.Logger) {
	log.Error("event dead-lettered", zap.String("event_id", "evt_1"), zap.String("message_id", "evt_1"),
		zap.String("reason", "rejected_by_handler"), zap.Int("attempts", 1), zap.Error(errors.New("effect: no such order")))
}

// A dead-lettered event is one line with no stack: it is an outcome, not a
// bug, and a stack per dead letter buried the reason.
func TestADeadLetterIsOneLineWithoutAStack(t *testing.T) {
	out := capture(t, "json", deadLetter)
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	require.Len(t, lines, 1, out)
	var entry map[string]any
	require.NoError(t, json.Unmarshal([]byte(lines[0]), &entry))
	require.Equal(t, "event dead-lettered", entry["msg"])
	require.Equal(t, "rejected_by_handler", entry["reason"])
	require.NotContains(t, entry, "stacktrace")

	out = capture(t, "console", deadLetter)
	require.Len(t, strings.Split(strings.TrimSuffix(out, "\n"), "\n"), 1, out)
	require.Contains(t, out, "event dead-lettered")
	require.NotContains(t, out, "goroutine")
}

// A recovered panic keeps its stack: the worker logs it as "stack", and zap
// adds no second one of the logging call.
func TestARecoveredPanicKeepsItsOwnStackOnly(t *testing.T) {
	out := capture(t, "json", func(log *zap.Logger) {
		log.Error("panic while processing", zap.Any("panic", "boom"), zap.ByteString("stack", debug.Stack()))
	})
	var entry map[string]any
	require.NoError(t, json.Unmarshal([]byte(out), &entry))
	require.Contains(t, entry["stack"], "runtime/debug.Stack")
	require.NotContains(t, entry, "stacktrace")
}

// Colour is for a terminal: a console log written to a pipe (a file, a
// collector) has no escape codes.
func TestTheConsoleFormatIsNotColouredOffATerminal(t *testing.T) {
	out := capture(t, "console", func(log *zap.Logger) {
		log.Info("worker starting")
		log.Warn("event sent to retry tier")
		deadLetter(log)
	})
	require.Contains(t, out, "INFO")
	require.Contains(t, out, "ERROR")
	require.NotContains(t, out, "\x1b[")
}
