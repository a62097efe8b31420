package main

import (
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/prometheus/common/model"
)

// rule is one alert of the rule file, as far as the suite needs it.
type rule struct {
	Name string
	// For is the alert's "for:" duration in the shipped file.
	For time.Duration
}

var (
	alertLine = regexp.MustCompile(`^\s*- alert:\s*(\S+)\s*$`)
	forLine   = regexp.MustCompile(`^(\s*)for:\s*(\S+)\s*$`)
	groupLine = regexp.MustCompile(`^\s*- name:\s*`)
	exprLine  = regexp.MustCompile(`^(\s*)expr:`)
	metricRef = regexp.MustCompile(`\bidempotent_events_[a-z_]+`)
)

// parseRules lists the alerts of a Prometheus rule file in file order with
// their "for:" (0 when an alert has none). The file is read as text: the
// suite rewrites it line by line, and a line it does not expect is an
// error rather than a guess.
func parseRules(text string) ([]rule, error) {
	var out []rule
	for i, line := range strings.Split(text, "\n") {
		if m := alertLine.FindStringSubmatch(line); m != nil {
			out = append(out, rule{Name: m[1]})
			continue
		}
		if m := forLine.FindStringSubmatch(line); m != nil {
			if len(out) == 0 {
				return nil, fmt.Errorf("line %d: for: before any alert", i+1)
			}
			d, err := model.ParseDuration(m[2])
			if err != nil {
				return nil, fmt.Errorf("line %d: for: %w", i+1, err)
			}
			out[len(out)-1].For = time.Duration(d)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no alerts (no line \"- alert: NAME\")")
	}
	return out, nil
}

// scaleFor returns the rule file with every "for:" divided by factor,
// rounded up to whole seconds and at least 1s, and changes nothing else:
// the expressions, labels and annotations stay byte for byte.
func scaleFor(text string, factor int) (string, error) {
	if factor < 1 {
		return "", fmt.Errorf("scale factor %d: must be at least 1", factor)
	}
	lines := strings.Split(text, "\n")
	for i, line := range lines {
		m := forLine.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		d, err := model.ParseDuration(m[2])
		if err != nil {
			return "", fmt.Errorf("line %d: for: %w", i+1, err)
		}
		lines[i] = m[1] + "for: " + model.Duration(scaledFor(time.Duration(d), factor)).String()
	}
	return strings.Join(lines, "\n"), nil
}

// scaledFor is d divided by factor, rounded up to whole seconds, so at
// least 1s (0 stays 0: an alert without "for:" fires at its first
// evaluation).
func scaledFor(d time.Duration, factor int) time.Duration {
	unit := time.Duration(factor) * time.Second
	return (d + unit - 1) / unit * time.Second
}

// onlyForDiffers checks that changed is original with nothing but "for:"
// lines changed: the suite's promise that the expressions it evaluates are
// the shipped ones.
func onlyForDiffers(original, changed string) error {
	a, b := strings.Split(original, "\n"), strings.Split(changed, "\n")
	if len(a) != len(b) {
		return fmt.Errorf("the copy has %d lines, the shipped file %d", len(b), len(a))
	}
	for i := range a {
		if a[i] != b[i] && (forLine.FindString(a[i]) == "" || forLine.FindString(b[i]) == "") {
			return fmt.Errorf("line %d differs beyond for: %q -> %q", i+1, a[i], b[i])
		}
	}
	return nil
}

// exprLines returns, for each line of the rule file that belongs to an
// alert's expression, the alert's name (by line index).
func exprLines(lines []string) map[int]string {
	out := map[int]string{}
	name, inExpr, exprIndent := "", false, ""
	for i, line := range lines {
		if m := alertLine.FindStringSubmatch(line); m != nil || groupLine.MatchString(line) {
			name, inExpr = "", false
			if m != nil {
				name = m[1]
			}
			continue
		}
		if name == "" {
			continue
		}
		if m := exprLine.FindStringSubmatch(line); m != nil {
			inExpr, exprIndent = true, m[1]
		} else if inExpr && strings.TrimSpace(line) != "" && !strings.HasPrefix(line, exprIndent+" ") {
			inExpr = false // the next key of the alert (for:, labels:)
		}
		if inExpr {
			out[i] = name
		}
	}
	return out
}

// exprMetrics returns the idempotent_events_* names the alerts'
// expressions use (not the comments).
func exprMetrics(text string) []string {
	lines := strings.Split(text, "\n")
	var out []string
	for i := range exprLines(lines) {
		out = append(out, metricRef.FindAllString(lines[i], -1)...)
	}
	return out
}

// breakExpr returns the rule file with the expression of alert name
// pointing at metric names no process exports (idempotent_events_… turned
// into idempotent_events_broken_…), as a rename that forgot the alert
// would: the expression still parses, and an alert on absent() fires where
// it should not while the others never fire. It is the suite's negative
// control.
func breakExpr(text, name string) (string, error) {
	lines := strings.Split(text, "\n")
	changed := 0
	for i, alert := range exprLines(lines) {
		if alert == name && metricRef.MatchString(lines[i]) {
			lines[i] = strings.ReplaceAll(lines[i], "idempotent_events_", "idempotent_events_broken_")
			changed++
		}
	}
	if changed == 0 {
		return "", fmt.Errorf("alert %s: not in the rule file, or its expression names no idempotent_events_ metric", name)
	}
	return strings.Join(lines, "\n"), nil
}
