package main

import (
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"sort"
	"strings"
	"time"
)

// dashboard is what the panel check needs of a Grafana dashboard: its
// template variables and every panel target's query.
type dashboard struct {
	File, Title string
	Vars        []variable
	Targets     []target
}

// variable is a template variable.
type variable struct {
	Name, Type string
	// Query is a query variable's query, e.g. label_values(metric, label).
	Query string
	// All says the current selection is "All"; AllValue is what Grafana
	// then substitutes ("" means every option, joined as a regex).
	All      bool
	AllValue string
	// Current are the selected values when not All.
	Current []string
}

// target is one query of one panel.
type target struct {
	Panel   string
	PanelID int
	RefID   string
	Expr    string
	// Instant marks a stat panel's instant query (the others are range
	// queries).
	Instant bool
}

type rawPanel struct {
	ID      int        `json:"id"`
	Title   string     `json:"title"`
	Type    string     `json:"type"`
	Panels  []rawPanel `json:"panels"`
	Targets []struct {
		RefID   string `json:"refId"`
		Expr    string `json:"expr"`
		Instant bool   `json:"instant"`
	} `json:"targets"`
}

// loadDashboard reads a dashboard JSON file.
func loadDashboard(path string) (dashboard, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return dashboard{}, err
	}
	var raw struct {
		Title      string     `json:"title"`
		Panels     []rawPanel `json:"panels"`
		Templating struct {
			List []struct {
				Name     string          `json:"name"`
				Type     string          `json:"type"`
				Query    json.RawMessage `json:"query"`
				AllValue string          `json:"allValue"`
				Current  struct {
					Value json.RawMessage `json:"value"`
				} `json:"current"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(b, &raw); err != nil {
		return dashboard{}, fmt.Errorf("%s: %w", path, err)
	}
	d := dashboard{File: path, Title: raw.Title}
	for _, v := range raw.Templating.List {
		nv := variable{Name: v.Name, Type: v.Type, AllValue: v.AllValue}
		// query is a string, or an object with a "query" field (newer Grafana).
		var q struct {
			Query string `json:"query"`
		}
		if err := json.Unmarshal(v.Query, &nv.Query); err != nil && json.Unmarshal(v.Query, &q) == nil {
			nv.Query = q.Query
		}
		var one string
		if json.Unmarshal(v.Current.Value, &nv.Current) != nil && json.Unmarshal(v.Current.Value, &one) == nil {
			nv.Current = []string{one}
		}
		if len(nv.Current) == 1 && nv.Current[0] == "$__all" {
			nv.All, nv.Current = true, nil
		}
		d.Vars = append(d.Vars, nv)
	}
	var walk func([]rawPanel)
	walk = func(ps []rawPanel) {
		for _, p := range ps {
			walk(p.Panels)
			for _, t := range p.Targets {
				if strings.TrimSpace(t.Expr) == "" {
					continue
				}
				d.Targets = append(d.Targets, target{Panel: p.Title, PanelID: p.ID, RefID: t.RefID, Expr: t.Expr, Instant: t.Instant})
			}
		}
	}
	walk(raw.Panels)
	if len(d.Targets) == 0 {
		return d, fmt.Errorf("%s: no panel has a query", path)
	}
	return d, nil
}

var labelValues = regexp.MustCompile(`^\s*label_values\(\s*(.+?)\s*,\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\)\s*$`)

// parseLabelValues splits a label_values(metric, label) variable query.
func parseLabelValues(q string) (match, label string, ok bool) {
	m := labelValues.FindStringSubmatch(q)
	if m == nil {
		return "", "", false
	}
	return m[1], m[2], true
}

// grafanaInterval is $__interval and $__rate_interval as Grafana computes
// them for a range query of step over a Prometheus data source whose
// scrape interval setting is scrape: $__interval is the step (never below
// the scrape interval); $__rate_interval is max($__interval + scrape,
// 4 × scrape), so that a rate() window always holds enough samples.
func grafanaInterval(step, scrape time.Duration) (interval, rateInterval time.Duration) {
	interval = max(step, scrape)
	return interval, max(interval+scrape, 4*scrape)
}

// expand substitutes the template variables (values by name) and
// Grafana's built-in interval variables in expr, in each of Grafana's
// syntaxes ($name, ${name}, ${name:format}, [[name]]). A variable that is
// not in values is left as it is, and reported.
func expand(expr string, values map[string]string, interval, rateInterval, rng time.Duration) (string, []string) {
	builtins := map[string]string{
		"__rate_interval": promDuration(rateInterval),
		"__interval":      promDuration(interval),
		"__interval_ms":   fmt.Sprint(interval.Milliseconds()),
		"__range":         promDuration(rng),
		"__range_s":       fmt.Sprint(int64(rng.Seconds())),
		"__range_ms":      fmt.Sprint(rng.Milliseconds()),
	}
	var unknown []string
	out := varRef.ReplaceAllStringFunc(expr, func(ref string) string {
		m := varRef.FindStringSubmatch(ref)
		name := m[1] + m[2] + m[3]
		if v, ok := builtins[name]; ok {
			return v
		}
		if v, ok := values[name]; ok {
			return v
		}
		unknown = append(unknown, name)
		return ref
	})
	return out, unknown
}

// varRef matches ${name}, ${name:format}, [[name]] and $name (longest
// names first: $__interval_ms is not $__interval followed by _ms).
var varRef = regexp.MustCompile(`\$\{([A-Za-z0-9_]+)(?::[^}]*)?\}|\[\[([A-Za-z0-9_]+)\]\]|\$([A-Za-z0-9_]+)`)

// promDuration formats d as PromQL does (1m30s, 4s, 250ms).
func promDuration(d time.Duration) string {
	if d%time.Second != 0 {
		return fmt.Sprintf("%dms", d.Milliseconds())
	}
	var b strings.Builder
	s := int64(d / time.Second)
	for _, u := range []struct {
		n    int64
		name string
	}{{86400, "d"}, {3600, "h"}, {60, "m"}, {1, "s"}} {
		if s >= u.n {
			fmt.Fprintf(&b, "%d%s", s/u.n, u.name)
			s %= u.n
		}
	}
	if b.Len() == 0 {
		return "0s"
	}
	return b.String()
}

// selection is what Grafana substitutes for a multi-value variable with
// these values selected: the value itself, or (a|b) with each value
// regex-escaped, as its Prometheus data source does.
func selection(values []string) string {
	if len(values) == 1 {
		return values[0]
	}
	esc := make([]string, len(values))
	for i, v := range values {
		esc[i] = regexp.QuoteMeta(v)
	}
	sort.Strings(esc)
	return "(" + strings.Join(esc, "|") + ")"
}
