package config_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
	"unicode"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotent-events/idempotent-events/pkg/internal/worker"
)

// readmeMaxLines keeps the README a product page: reference material goes
// to docs/ and is linked from it.
const readmeMaxLines = 300

// Every relative link in README.md and docs/ points at a file or directory
// that exists, and a #fragment into a Markdown file names one of its headings.
func TestREADMEAndDocsLinksResolve(t *testing.T) {
	root := repoRoot(t)
	pages := markdownPages(t, root)
	anchors := map[string]map[string]bool{}
	for _, page := range pages {
		for _, l := range links(t, root, page) {
			target, fragment, external := resolve(page, l.target)
			if external {
				continue
			}
			if target == "" {
				target = page
			}
			info, err := os.Stat(filepath.Join(root, filepath.FromSlash(target)))
			if err != nil {
				assert.Fail(t, "broken link", "%s:%d: %s: no file %s", page, l.line, l.target, target)
				continue
			}
			if fragment == "" || info.IsDir() || !strings.HasSuffix(target, ".md") {
				continue
			}
			if anchors[target] == nil {
				anchors[target] = headingAnchors(t, root, target)
			}
			assert.True(t, anchors[target][fragment], "%s:%d: %s: %s has no heading with anchor #%s", page, l.line, l.target, target, fragment)
		}
	}
}

// Every page in docs/ can be reached from README.md by following links, so
// nothing moved out of the README is lost to its readers.
func TestREADMEReachesEveryDocsPage(t *testing.T) {
	root := repoRoot(t)
	reached := map[string]bool{"README.md": true}
	queue := []string{"README.md"}
	for len(queue) > 0 {
		page := queue[0]
		queue = queue[1:]
		for _, l := range links(t, root, page) {
			target, _, external := resolve(page, l.target)
			if external || !strings.HasSuffix(target, ".md") || reached[target] {
				continue
			}
			if _, err := os.Stat(filepath.Join(root, filepath.FromSlash(target))); err != nil {
				continue // reported by TestREADMEAndDocsLinksResolve
			}
			reached[target] = true
			queue = append(queue, target)
		}
	}
	for _, page := range markdownPages(t, root) {
		assert.True(t, reached[page], "%s is not linked from README.md, directly or through other pages", page)
	}
}

// The README stays a product page.
func TestREADMEStaysShort(t *testing.T) {
	readme, err := os.ReadFile(filepath.Join(repoRoot(t), "README.md"))
	require.NoError(t, err)
	lines := strings.Count(string(readme), "\n")
	assert.LessOrEqual(t, lines, readmeMaxLines, "README.md has %d lines: move reference material to docs/ and link it", lines)
}

// markdownPages is README.md and every .md file under docs/, as
// slash-separated paths relative to the repository root.
func markdownPages(t *testing.T, root string) []string {
	t.Helper()
	pages := []string{"README.md"}
	err := filepath.WalkDir(filepath.Join(root, "docs"), func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() && strings.HasSuffix(p, ".md") {
			rel, err := filepath.Rel(root, p)
			if err != nil {
				return err
			}
			pages = append(pages, filepath.ToSlash(rel))
		}
		return nil
	})
	require.NoError(t, err)
	sort.Strings(pages[1:])
	return pages
}

type link struct {
	line   int
	target string
}

var (
	inlineCode = regexp.MustCompile("`[^`]*`")
	// [text](target) or ![alt](target "title"); the text may hold code spans,
	// removed before matching.
	linkPattern = regexp.MustCompile(`\]\(\s*<?([^)\s>]+)>?(?:\s+"[^"]*")?\s*\)`)
	fence       = regexp.MustCompile("^\\s*(```|~~~)")
)

// links returns the link targets of page outside fenced code blocks and
// code spans.
func links(t *testing.T, root, page string) []link {
	t.Helper()
	var out []link
	for i, line := range markdownLines(t, root, page) {
		if line == "" {
			continue
		}
		for _, m := range linkPattern.FindAllStringSubmatch(inlineCode.ReplaceAllString(line, ""), -1) {
			out = append(out, link{line: i + 1, target: m[1]})
		}
	}
	return out
}

// markdownLines returns page's lines with those inside fenced code blocks
// blanked, so line numbers stay true.
func markdownLines(t *testing.T, root, page string) []string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(page)))
	require.NoError(t, err)
	lines := strings.Split(string(b), "\n")
	inFence := false
	for i, line := range lines {
		if fence.MatchString(line) {
			inFence = !inFence
			lines[i] = ""
			continue
		}
		if inFence {
			lines[i] = ""
		}
	}
	return lines
}

// resolve turns a link target written in page into a path relative to the
// repository root and a fragment. external is true for links with a scheme
// (https:, mailto:) or to an absolute path, which this test does not follow.
func resolve(page, target string) (resolved, fragment string, external bool) {
	u, err := url.Parse(target)
	if err != nil || u.Scheme != "" || u.Host != "" || strings.HasPrefix(u.Path, "/") {
		return "", "", true
	}
	if u.Path == "" {
		return "", u.Fragment, false
	}
	return path.Clean(path.Join(path.Dir(page), u.Path)), u.Fragment, false
}

var (
	headingPattern = regexp.MustCompile(`^#{1,6}\s+(.*?)\s*#*\s*$`)
	headingLink    = regexp.MustCompile(`!?\[([^\]]*)\]\([^)]*\)`)
)

// headingAnchors returns the anchors GitHub generates for page's headings:
// the heading's text, lower case, without punctuation, spaces as hyphens,
// and -1, -2, … on repeats.
func headingAnchors(t *testing.T, root, page string) map[string]bool {
	t.Helper()
	anchors := map[string]bool{}
	seen := map[string]int{}
	for _, line := range markdownLines(t, root, page) {
		m := headingPattern.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		text := headingLink.ReplaceAllString(m[1], "$1")
		var b strings.Builder
		for _, r := range strings.ToLower(text) {
			switch {
			case unicode.IsLetter(r), unicode.IsDigit(r), r == '-', r == '_':
				b.WriteRune(r)
			case r == ' ':
				b.WriteRune('-')
			}
		}
		slug := b.String()
		if n := seen[slug]; n > 0 {
			anchors[slug+"-"+strconv.Itoa(n)] = true
		} else {
			anchors[slug] = true
		}
		seen[slug]++
	}
	return anchors
}

// The pages an operator reads when a DLQ reason or a worker outcome turns
// up in a header, a filter or a graph.
const (
	dlqPage        = "docs/dlq.md"
	operationsPage = "docs/operations.md"
)

// Every DLQ reason defined in pkg/internal/broker is named on the DLQ page
// and the operations page, and every outcome label of the worker's
// idempotent_events_worker_events_total is named on the operations page and
// in the counter's help: a reason or outcome added to the code without a
// word in the docs fails here (rejected_by_handler was missing from both
// pages, conflict from the help).
func TestDocsNameEveryDLQReasonAndWorkerOutcome(t *testing.T) {
	root := repoRoot(t)
	page := func(name string) string {
		b, err := os.ReadFile(filepath.Join(root, name))
		require.NoError(t, err)
		return string(b)
	}
	dlq, ops := page(dlqPage), page(operationsPage)
	reasons := dlqReasons(t, filepath.Join(root, "pkg", "internal", "broker"))
	require.NotEmpty(t, reasons, "no DLQReason constant found in pkg/internal/broker")
	for _, r := range reasons {
		assert.Contains(t, dlq, "`"+r+"`", "%s does not name the DLQ reason %s", dlqPage, r)
		assert.Contains(t, ops, "`"+r+"`", "%s does not name the DLQ reason %s", operationsPage, r)
	}
	help, outcomes := workerOutcomes(t)
	require.NotEmpty(t, outcomes, "idempotent_events_worker_events_total has no outcome label")
	for _, o := range outcomes {
		assert.Contains(t, ops, "`"+o+"`", "%s does not name the worker outcome %s", operationsPage, o)
		assert.Contains(t, help, " "+o, "the help of idempotent_events_worker_events_total does not name the outcome %s", o)
	}
}

// dlqReasons returns the values of the constants of type DLQReason declared
// in the package in dir, read from its source so that one missing from
// broker.DLQReasons() is found too.
func dlqReasons(t *testing.T, dir string) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.go"))
	require.NoError(t, err)
	var out []string
	fset := token.NewFileSet()
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		require.NoError(t, err)
		for _, decl := range f.Decls {
			gd, ok := decl.(*ast.GenDecl)
			if !ok || gd.Tok != token.CONST {
				continue
			}
			for _, spec := range gd.Specs {
				vs := spec.(*ast.ValueSpec)
				if typ, ok := vs.Type.(*ast.Ident); !ok || typ.Name != "DLQReason" {
					continue
				}
				for _, v := range vs.Values {
					lit, ok := v.(*ast.BasicLit)
					require.True(t, ok && lit.Kind == token.STRING, "%s: a DLQReason that is not a string literal", fset.Position(v.Pos()))
					s, err := strconv.Unquote(lit.Value)
					require.NoError(t, err)
					out = append(out, s)
				}
			}
		}
	}
	return out
}

// workerOutcomes returns the help and the outcome label values of the
// worker's events counter, as a registry it registered on exports them.
func workerOutcomes(t *testing.T) (help string, outcomes []string) {
	t.Helper()
	reg := prometheus.NewRegistry()
	worker.NewMetrics(reg)
	families, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range families {
		if mf.GetName() != "idempotent_events_worker_events_total" {
			continue
		}
		help = mf.GetHelp()
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == "outcome" {
					outcomes = append(outcomes, lp.GetValue())
				}
			}
		}
	}
	return help, outcomes
}
