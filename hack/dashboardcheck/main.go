// Command dashboardcheck validates the Grafana dashboards of idempotent-events
// offline, for hack/check-observability.sh.
//
// For every dashboard JSON file given as an argument it checks:
//
//   - the file parses as JSON and has a uid, a title and a schemaVersion;
//   - a datasource template variable of type prometheus exists, and every
//     panel and query uses it (no data source uid hard-coded to one Grafana);
//   - every panel outside a row header has a title, a gridPos inside the
//     24-column grid and at least one query, and every query has a refId
//     (unique in its panel) and a non-empty expr;
//   - every $variable an expr uses is a template variable or a Grafana
//     built-in;
//   - every idempotent_events_* name an expr uses is one the code exports
//     (the -metrics list; a histogram stands for its _bucket/_sum/_count);
//   - strict decoding with grafana-foundation-sdk (unknown or misspelled
//     fields, wrong types, missing required fields, panel options checked
//     against the panel plugin's schema) and its Validate.
//
// With -promql-out it also writes every expr, Grafana variables replaced by
// plain values, as a recording rule to a file, so that `promtool check rules`
// can parse the PromQL (this module has no PromQL parser of its own).
//
// Files given with -names are only scanned for idempotent_events_* names
// (the alert rule file), so the dashboard and the rules stay on the exported
// metrics.
//
// It prints what it checked and exits 1 on any problem.
package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"

	"github.com/grafana/grafana-foundation-sdk/go/cog"
	"github.com/grafana/grafana-foundation-sdk/go/cog/plugins"
	"github.com/grafana/grafana-foundation-sdk/go/dashboard"
)

func main() {
	metricsFile := flag.String("metrics", "", "file listing the exported metric names (name type per line)")
	var names stringList
	flag.Var(&names, "names", "a file to scan only for idempotent_events_* names (repeatable)")
	promqlOut := flag.String("promql-out", "", "write every dashboard expr as a recording rule to this file, for promtool check rules")
	flag.Parse()
	if *metricsFile == "" || flag.NArg() == 0 {
		fmt.Fprintln(os.Stderr, "usage: dashboardcheck -metrics metrics.txt [-names rules.yaml] [-promql-out queries.rules.yaml] dashboard.json...")
		os.Exit(2)
	}
	known, err := loadMetrics(*metricsFile)
	if err != nil {
		fmt.Fprintln(os.Stderr, "dashboardcheck:", err)
		os.Exit(2)
	}
	plugins.RegisterDefaultPlugins()

	failed := false
	var exprs []namedExpr
	for _, path := range flag.Args() {
		problems, summary, e := checkDashboard(path, known)
		exprs = append(exprs, e...)
		failed = report(path, summary, problems) || failed
	}
	for _, path := range names {
		problems, summary := checkNames(path, known)
		failed = report(path, summary, problems) || failed
	}
	if *promqlOut != "" {
		if err := writeRules(*promqlOut, exprs); err != nil {
			fmt.Fprintln(os.Stderr, "dashboardcheck:", err)
			os.Exit(2)
		}
		fmt.Printf("wrote %d exprs to %s\n", len(exprs), *promqlOut)
	}
	if failed {
		os.Exit(1)
	}
}

type stringList []string

func (l *stringList) String() string     { return strings.Join(*l, ",") }
func (l *stringList) Set(v string) error { *l = append(*l, v); return nil }

func report(path, summary string, problems []string) bool {
	if len(problems) == 0 {
		fmt.Printf("ok   %s: %s\n", path, summary)
		return false
	}
	fmt.Printf("FAIL %s: %d problem(s)\n", path, len(problems))
	for _, p := range problems {
		fmt.Printf("     - %s\n", strings.ReplaceAll(p, "\n", "\n       "))
	}
	return true
}

// loadMetrics reads "name type" lines; # starts a comment.
func loadMetrics(path string) (map[string]bool, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	known := map[string]bool{}
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line, _, _ := strings.Cut(sc.Text(), "#")
		fields := strings.Fields(line)
		if len(fields) == 0 {
			continue
		}
		if len(fields) != 2 {
			return nil, fmt.Errorf("%s:%d: want \"name type\"", path, n)
		}
		switch fields[1] {
		case "counter", "gauge":
			known[fields[0]] = true
		case "histogram":
			for _, s := range []string{"_bucket", "_sum", "_count"} {
				known[fields[0]+s] = true
			}
		default:
			return nil, fmt.Errorf("%s:%d: unknown type %q", path, n, fields[1])
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(known) == 0 {
		return nil, fmt.Errorf("%s: no metric names", path)
	}
	return known, nil
}

var (
	metricName = regexp.MustCompile(`idempotent_events_[a-zA-Z0-9_]*`)
	varRef     = regexp.MustCompile(`\$\{?([a-zA-Z_][a-zA-Z0-9_]*)`)
)

// grafanaBuiltins are the variables Grafana defines for every query.
var grafanaBuiltins = []string{"__rate_interval", "__interval", "__interval_ms", "__range", "__range_s", "__range_ms", "__from", "__to", "__dashboard", "__org", "__user"}

func unknownMetrics(text string, known map[string]bool) []string {
	var bad []string
	for _, name := range metricName.FindAllString(text, -1) {
		// A name ending in "_" is a prefix mentioned in prose (idempotent_events_queue_*).
		if strings.HasSuffix(name, "_") || known[name] || slices.Contains(bad, name) {
			continue
		}
		bad = append(bad, name)
	}
	return bad
}

func checkNames(path string, known map[string]bool) ([]string, string) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return []string{err.Error()}, ""
	}
	var problems []string
	for _, name := range unknownMetrics(string(raw), known) {
		problems = append(problems, fmt.Sprintf("metric %s is not exported by idempotent-events", name))
	}
	return problems, fmt.Sprintf("%d idempotent_events_* references, all exported", len(metricName.FindAllString(string(raw), -1)))
}

// Loose views of the JSON, enough for the structural checks.
type (
	dsRef struct {
		Type string `json:"type"`
		UID  string `json:"uid"`
	}
	target struct {
		RefID      string `json:"refId"`
		Expr       string `json:"expr"`
		Datasource *dsRef `json:"datasource"`
	}
	panel struct {
		ID         int      `json:"id"`
		Type       string   `json:"type"`
		Title      string   `json:"title"`
		Datasource *dsRef   `json:"datasource"`
		Targets    []target `json:"targets"`
		GridPos    *struct {
			H, W, X, Y int
		} `json:"gridPos"`
		Panels []panel `json:"panels"`
	}
	variable struct {
		Type  string `json:"type"`
		Name  string `json:"name"`
		Query any    `json:"query"`
	}
	board struct {
		UID           string  `json:"uid"`
		Title         string  `json:"title"`
		SchemaVersion int     `json:"schemaVersion"`
		Panels        []panel `json:"panels"`
		Templating    struct {
			List []variable `json:"list"`
		} `json:"templating"`
	}
)

// checkDashboard returns the problems of the dashboard at path, a summary of
// what was checked, and the exprs of its queries.
func checkDashboard(path string, known map[string]bool) ([]string, string, []namedExpr) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return []string{err.Error()}, "", nil
	}
	var b board
	if err := json.Unmarshal(raw, &b); err != nil {
		return []string{"not valid JSON: " + err.Error()}, "", nil
	}
	var problems []string
	var exprs []namedExpr
	add := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }

	if b.UID == "" {
		add("uid is empty")
	}
	if b.Title == "" {
		add("title is empty")
	}
	if b.SchemaVersion < 36 {
		add("schemaVersion %d is older than 36", b.SchemaVersion)
	}

	vars := map[string]bool{}
	dsVar := ""
	for _, v := range b.Templating.List {
		vars[v.Name] = true
		if v.Type == "datasource" && v.Query == "prometheus" {
			dsVar = v.Name
		}
	}
	if dsVar == "" {
		add("no datasource template variable with query \"prometheus\"")
	}
	dsOK := func(ref *dsRef) bool {
		return ref != nil && ref.Type == "prometheus" && (ref.UID == "${"+dsVar+"}" || ref.UID == "$"+dsVar)
	}

	ids := map[int]string{}
	nPanels, nTargets := 0, 0
	var visit func(p panel, where string)
	visit = func(p panel, where string) {
		name := strings.TrimSpace(fmt.Sprintf("%s panel %d %q", where, p.ID, p.Title))
		if prev, dup := ids[p.ID]; dup {
			add("%s: id %d is also used by %s", name, p.ID, prev)
		}
		ids[p.ID] = name
		if p.GridPos == nil {
			add("%s: no gridPos", name)
		} else if p.GridPos.W <= 0 || p.GridPos.H <= 0 || p.GridPos.X < 0 || p.GridPos.X+p.GridPos.W > 24 {
			add("%s: gridPos %+v is outside the 24-column grid", name, *p.GridPos)
		}
		if p.Type == "row" {
			for _, c := range p.Panels {
				visit(c, fmt.Sprintf("row %q:", p.Title))
			}
			return
		}
		nPanels++
		if p.Title == "" {
			add("%s: no title", name)
		}
		if !dsOK(p.Datasource) {
			add("%s: datasource must be {type: prometheus, uid: ${%s}}, got %+v", name, dsVar, p.Datasource)
		}
		if len(p.Targets) == 0 {
			add("%s: no targets", name)
		}
		refIDs := map[string]bool{}
		for i, t := range p.Targets {
			nTargets++
			tn := fmt.Sprintf("%s target %d", name, i)
			if t.RefID == "" || refIDs[t.RefID] {
				add("%s: refId %q is empty or repeated", tn, t.RefID)
			}
			refIDs[t.RefID] = true
			if strings.TrimSpace(t.Expr) == "" {
				add("%s: empty expr", tn)
			} else {
				exprs = append(exprs, namedExpr{fmt.Sprintf("dashboard_panel_%d_%s", p.ID, t.RefID), t.Expr})
			}
			if t.Datasource != nil && !dsOK(t.Datasource) {
				add("%s: datasource %+v is not ${%s}", tn, *t.Datasource, dsVar)
			}
			for _, m := range varRef.FindAllStringSubmatch(t.Expr, -1) {
				if !vars[m[1]] && !slices.Contains(grafanaBuiltins, m[1]) {
					add("%s: uses undefined variable $%s", tn, m[1])
				}
			}
			for _, bad := range unknownMetrics(t.Expr, known) {
				add("%s: metric %s is not exported by idempotent-events", tn, bad)
			}
		}
	}
	for _, p := range b.Panels {
		visit(p, "")
	}

	// Strict decoding against Grafana's schema. UnmarshalJSONStrict returns a
	// typed-nil cog.BuildErrors on success, which is a non-nil error value.
	var d dashboard.Dashboard
	if err := noBuildErrors(d.UnmarshalJSONStrict(raw)); err != nil {
		add("strict decode (grafana-foundation-sdk): %v", err)
	} else if err := noBuildErrors(d.Validate()); err != nil {
		add("validate (grafana-foundation-sdk): %v", err)
	}

	return problems, fmt.Sprintf("uid %q, schemaVersion %d, %d panels, %d queries; structure, datasource, variables, metric names and strict schema (grafana-foundation-sdk) OK",
		b.UID, b.SchemaVersion, nPanels, nTargets), exprs
}

var (
	intervalVar = regexp.MustCompile(`\$\{?__(rate_interval|interval|range)\}?`)
	anyVar      = regexp.MustCompile(`\$\{[a-zA-Z_][a-zA-Z0-9_]*(?::[a-zA-Z]+)?\}|\$[a-zA-Z_][a-zA-Z0-9_]*`)
)

// namedExpr is a query's expr and a recording rule name that says where it
// comes from (panel id and refId), for promtool's error messages.
type namedExpr struct{ name, expr string }

// writeRules writes exprs as a Prometheus rule file of recording rules. Range
// variables become 5m and every other variable .* (they only appear inside
// regex label matchers here), which keeps the PromQL parseable.
func writeRules(path string, exprs []namedExpr) error {
	var b strings.Builder
	b.WriteString("# Generated by hack/dashboardcheck from the dashboard queries; only for promtool check rules.\ngroups:\n  - name: dashboard-queries\n    rules:\n")
	for _, ne := range exprs {
		e := intervalVar.ReplaceAllString(ne.expr, "5m")
		e = anyVar.ReplaceAllString(e, ".*")
		q, err := json.Marshal(e) // a JSON string is a valid YAML double-quoted scalar
		if err != nil {
			return err
		}
		fmt.Fprintf(&b, "      - record: %s\n        expr: %s\n", ne.name, q)
	}
	return os.WriteFile(path, []byte(b.String()), 0o644)
}

func noBuildErrors(err error) error {
	var be cog.BuildErrors
	if errors.As(err, &be) && len(be) == 0 {
		return nil
	}
	return err
}
