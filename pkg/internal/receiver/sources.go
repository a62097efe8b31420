package receiver

import (
	"errors"

	"github.com/idempotent-events/idempotent-events/pkg/internal/config"
	"github.com/idempotent-events/idempotent-events/pkg/internal/event"
	"github.com/idempotent-events/idempotent-events/pkg/internal/provider"
	"github.com/idempotent-events/idempotent-events/pkg/internal/webhook"
)

// SourcesOf returns the routes cfg configures: the default Stripe source
// on PaymentRoute (WEBHOOK_SECRETS), then every WEBHOOK_SOURCES entry on
// /webhooks/{name}, each with the registry's provider of its scheme. An
// unknown scheme, or a setting the provider refuses, is a *config.Error
// naming the variable (WEBHOOK_SOURCES, the source's secrets variable,
// PAYPAL_CA_FILE, …); every problem is reported at once.
func SourcesOf(cfg config.Receiver) ([]Source, error) {
	settings := provider.Settings{Tolerance: cfg.WebhookTolerance, CertHosts: cfg.PayPalCertHosts, CAFile: cfg.PayPalCAFile}
	var problems []config.Problem
	var sources []Source
	add := func(name, route, scheme, secretsVar string, secrets []string) {
		s := settings
		s.Secrets = secrets
		p, err := provider.New(scheme, s)
		var serr *webhook.SecretError
		var setErr *provider.SettingError
		switch {
		case errors.As(err, &serr):
			problems = append(problems, config.Problem{Var: secretsVar, Msg: err.Error()})
			return
		case errors.As(err, &setErr):
			problems = append(problems, config.Problem{Var: setErr.Var, Msg: setErr.Problem})
			return
		case err != nil:
			problems = append(problems, config.Problem{Var: "WEBHOOK_SOURCES", Msg: "source " + name + ": " + err.Error()})
			return
		}
		src := Source{Name: name, Route: route, Scheme: scheme, Provider: p}
		if !cfg.InsecureSkipVerify {
			src.Verifier = p
		}
		sources = append(sources, src)
	}
	add(event.DefaultSource, PaymentRoute, event.DefaultScheme, "WEBHOOK_SECRETS", cfg.WebhookSecrets)
	for _, sc := range cfg.Sources {
		add(sc.Name, "/webhooks/"+sc.Name, sc.Scheme, sc.SecretsVar, sc.Secrets)
	}
	if len(problems) > 0 {
		return nil, &config.Error{Problems: dedupeProblems(problems)}
	}
	return sources, nil
}

// dedupeProblems drops repeats: two PayPal sources with an unreadable
// PAYPAL_CA_FILE are one problem.
func dedupeProblems(ps []config.Problem) []config.Problem {
	var out []config.Problem
	seen := map[config.Problem]bool{}
	for _, p := range ps {
		if !seen[p] {
			seen[p] = true
			out = append(out, p)
		}
	}
	return out
}
