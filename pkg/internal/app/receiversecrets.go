package app

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/idempotent-events/idempotent-events/pkg/internal/config"
	"github.com/idempotent-events/idempotent-events/pkg/internal/event"
	"github.com/idempotent-events/idempotent-events/pkg/internal/httpserver"
	"github.com/idempotent-events/idempotent-events/pkg/internal/provider"
	"github.com/idempotent-events/idempotent-events/pkg/internal/receiver"
	"github.com/idempotent-events/idempotent-events/pkg/internal/webhooksecrets"
)

// watchSecretFiles makes every source whose secrets come from a file
// (WEBHOOK_SECRETS_FILE, WEBHOOK_SECRETS_<NAME>_FILE) verify with the
// file's current secrets: its Verifier in sources becomes a swappable one,
// which the returned Watcher replaces as the file changes. It returns nil
// when no source reads a file, or when verification is off.
func watchSecretFiles(cfg config.Receiver, sources []receiver.Source, log *zap.Logger, reg prometheus.Registerer) (*webhooksecrets.Watcher, error) {
	type file struct{ variable, path string }
	files := map[string]file{}
	if cfg.WebhookSecretsFile != "" {
		files[event.DefaultSource] = file{"WEBHOOK_SECRETS_FILE", cfg.WebhookSecretsFile}
	}
	for _, sc := range cfg.Sources {
		if sc.SecretsFile != "" {
			files[sc.Name] = file{config.SecretsFileVar(sc.SecretsVar), sc.SecretsFile}
		}
	}
	var watched []webhooksecrets.File
	for i := range sources {
		src := &sources[i]
		f, ok := files[src.Name]
		if !ok || src.Verifier == nil {
			continue
		}
		swap := webhooksecrets.NewVerifier(src.Verifier)
		src.Verifier = swap
		scheme := src.Scheme
		watched = append(watched, webhooksecrets.File{Source: src.Name, Var: f.variable, Path: f.path,
			Apply: func(secrets []string) error {
				// The settings receiver.SourcesOf gives the source, with the
				// file's secrets.
				p, err := provider.New(scheme, provider.Settings{Secrets: secrets, Tolerance: cfg.WebhookTolerance,
					CertHosts: cfg.PayPalCertHosts, CAFile: cfg.PayPalCAFile})
				if err != nil {
					return err
				}
				swap.Set(p)
				return nil
			}})
	}
	if len(watched) == 0 {
		return nil, nil
	}
	w, err := webhooksecrets.NewWatcher(webhooksecrets.Options{Files: watched, Interval: cfg.WebhookSecretsReload,
		Logger: log, Metrics: webhooksecrets.NewMetrics(reg)})
	if err != nil {
		// A file changed for the worse since the configuration was read:
		// reported as the configuration error it is, a line per variable.
		var problems []config.Problem
		for _, e := range unjoin(err) {
			var ferr *webhooksecrets.Error
			if errors.As(e, &ferr) {
				problems = append(problems, config.Problem{Var: ferr.Var, Msg: ferr.Err.Error()})
			} else {
				return nil, err
			}
		}
		return nil, &config.Error{Problems: problems}
	}
	return w, nil
}

// guardOptions are the limits on webhook senders (config.ReceiverLimits).
func guardOptions(cfg config.Receiver, reg prometheus.Registerer) httpserver.GuardOptions {
	return httpserver.GuardOptions{BodyTimeout: cfg.WebhookBodyTimeout, FailureRate: cfg.FailureRate, FailureBurst: cfg.FailureBurst,
		ClientIPHeader: cfg.ClientIPHeader, Metrics: httpserver.NewGuardMetrics(reg, "receiver")}
}

// unjoin returns the errors errors.Join joined into err, or err alone.
func unjoin(err error) []error {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		return j.Unwrap()
	}
	return []error{err}
}
