package webhooksecrets

import (
	"bytes"
	"context"
	"errors"
	"time"

	"go.uber.org/zap"
)

// File is one secrets file and what its secrets are for.
type File struct {
	// Source names the webhook source, for the logs and the metrics.
	Source string
	// Var is the variable that named the file (WEBHOOK_SECRETS_FILE, …),
	// for the errors.
	Var string
	// Path is the file, as mounted: the kubelet's symlink, not its target,
	// so that every swap is followed.
	Path string
	// Apply puts secrets in force: it builds the source's verifier and
	// installs it (Verifier.Set). An error (a secret the scheme cannot use)
	// keeps the secrets in force; it must not quote a secret.
	Apply func(secrets []string) error
}

// Options configure a Watcher.
type Options struct {
	Files []File
	// Interval is how often every file is read again. The kubelet updates
	// a mounted Secret within about a minute; a few seconds here add little.
	Interval time.Duration
	Logger   *zap.Logger
	Metrics  *Metrics
}

// Watcher keeps the secrets of Files in force as the files change.
type Watcher struct {
	opts    Options
	applied [][]byte // content last applied, per file
}

// NewWatcher reads every file and applies its secrets: the receiver starts
// with the files' content, and an error here (a file missing, empty or
// refused) is a configuration error naming the variable.
func NewWatcher(opts Options) (*Watcher, error) {
	if opts.Interval <= 0 {
		return nil, errors.New("webhooksecrets: Interval must be positive")
	}
	if opts.Logger == nil {
		opts.Logger = zap.NewNop()
	}
	w := &Watcher{opts: opts, applied: make([][]byte, len(opts.Files))}
	var errs []error
	for i, f := range opts.Files {
		content, secrets, err := load(f.Path)
		if err == nil {
			err = f.Apply(secrets)
		}
		if err != nil {
			errs = append(errs, &Error{Var: f.Var, Err: err})
			continue
		}
		w.applied[i] = content
		w.gauge(f, len(secrets))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return w, nil
}

// Error is a secrets file that could not be put in force at the start.
type Error struct {
	Var string
	Err error
}

func (e *Error) Error() string { return e.Var + ": " + e.Err.Error() }
func (e *Error) Unwrap() error { return e.Err }

// Run reads every file each Interval and applies those that changed, until
// ctx is done.
func (w *Watcher) Run(ctx context.Context) {
	t := time.NewTicker(w.opts.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			w.Check()
		}
	}
}

// Check reads every file once and applies those whose content changed
// since it was last applied. It is what Run does on each tick.
func (w *Watcher) Check() {
	for i, f := range w.opts.Files {
		content, secrets, err := load(f.Path)
		if err == nil && bytes.Equal(content, w.applied[i]) {
			continue
		}
		if err == nil {
			err = f.Apply(secrets)
		}
		if err != nil {
			if w.opts.Metrics != nil {
				w.opts.Metrics.reloads.WithLabelValues(f.Source, ResultRefused).Inc()
			}
			// Logged on every tick until the file is fixed: a rotation
			// half done is worth the noise. The error names the path and
			// the cause, or the position of a refused secret, never one.
			w.opts.Logger.Warn("webhook secrets file not applied; the secrets in force are kept",
				zap.String("source", f.Source), zap.String("variable", f.Var), zap.Error(err))
			continue
		}
		w.applied[i] = content
		if w.opts.Metrics != nil {
			w.opts.Metrics.reloads.WithLabelValues(f.Source, ResultApplied).Inc()
		}
		w.gauge(f, len(secrets))
		w.opts.Logger.Info("webhook secrets reloaded", zap.String("source", f.Source), zap.String("variable", f.Var),
			zap.Int("secrets", len(secrets)))
	}
}

func (w *Watcher) gauge(f File, n int) {
	if w.opts.Metrics != nil {
		w.opts.Metrics.secrets.WithLabelValues(f.Source).Set(float64(n))
	}
}
