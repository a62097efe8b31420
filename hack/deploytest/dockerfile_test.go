package deploytest

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/moby/buildkit/client/llb"
	"github.com/moby/buildkit/client/llb/sourceresolver"
	"github.com/moby/buildkit/frontend/dockerfile/dockerfile2llb"
	"github.com/moby/buildkit/frontend/dockerfile/dockerignore"
	"github.com/moby/buildkit/frontend/dockerfile/instructions"
	"github.com/moby/buildkit/frontend/dockerfile/linter"
	"github.com/moby/buildkit/frontend/dockerfile/parser"
	"github.com/moby/patternmatcher"
	digest "github.com/opencontainers/go-digest"
	"go.starlark.net/starlark"
)

// stubResolver answers every base image lookup with an empty linux/amd64
// config, so BuildKit's lint runs without a registry.
type stubResolver struct{}

func (stubResolver) ResolveImageConfig(_ context.Context, ref string, _ sourceresolver.Opt) (string, digest.Digest, []byte, error) {
	return ref, digest.FromString(ref), []byte(`{"architecture":"amd64","os":"linux","config":{}}`), nil
}

// lintDockerfile runs `docker build --check`'s rules (BuildKit's linter)
// and returns every warning and the build error, if any.
func lintDockerfile(t *testing.T, name string, dt []byte) []string {
	t.Helper()
	src := llb.NewSourceMap(nil, name, "Dockerfile", dt)
	src.Definition = &llb.Definition{}
	res, err := dockerfile2llb.DockerfileLint(context.Background(), dt, dockerfile2llb.ConvertOpt{
		MetaResolver: stubResolver{},
		SourceMap:    src,
	})
	if err != nil {
		t.Fatalf("%s: lint: %v", name, err)
	}
	var out []string
	for _, w := range res.Warnings {
		out = append(out, w.RuleName+": "+w.Detail)
	}
	if res.Error != nil {
		out = append(out, "build error: "+res.Error.Message)
	}
	return out
}

type dockerfile struct {
	stages   []instructions.Stage
	metaArgs []instructions.ArgCommand
}

func parseDockerfile(t *testing.T, name string, dt []byte) dockerfile {
	t.Helper()
	ast, err := parser.Parse(bytes.NewReader(dt))
	if err != nil {
		t.Fatalf("%s: parse: %v", name, err)
	}
	var warnings []string
	lint := linter.New(&linter.Config{Warn: func(rule, _, _, msg string, _ []parser.Range) {
		warnings = append(warnings, rule+": "+msg)
	}})
	stages, metaArgs, err := instructions.Parse(ast.AST, lint)
	if err != nil {
		t.Fatalf("%s: instructions: %v", name, err)
	}
	for _, w := range warnings {
		t.Errorf("%s: %s", name, w)
	}
	return dockerfile{stages: stages, metaArgs: metaArgs}
}

// TestDockerfile lints the Dockerfile with BuildKit and checks the image's
// shape: a named build stage, COPY --from naming an earlier stage, a
// distroless nonroot final stage with OCI labels, and the Makefile's flags.
func TestDockerfile(t *testing.T) {
	dt, err := os.ReadFile(filepath.Join(repoRoot, "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range lintDockerfile(t, "Dockerfile", dt) {
		t.Errorf("Dockerfile: %s", w)
	}
	df := parseDockerfile(t, "Dockerfile", dt)
	checkCopyFrom(t, "Dockerfile", df)
	if len(df.stages) != 2 || df.stages[0].Name != "build" || df.stages[1].Name != "runtime" {
		t.Fatalf("want stages build and runtime, got %d", len(df.stages))
	}
	final := df.stages[len(df.stages)-1]
	if final.BaseName != "gcr.io/distroless/static-debian12:nonroot" {
		t.Errorf("final stage FROM %s, want gcr.io/distroless/static-debian12:nonroot", final.BaseName)
	}
	var user string
	labels := map[string]string{}
	var entrypoint []string
	var copied []string
	for _, c := range final.Commands {
		switch c := c.(type) {
		case *instructions.UserCommand:
			user = c.User
		case *instructions.LabelCommand:
			for _, kv := range c.Labels {
				labels[kv.Key] = strings.Trim(kv.Value, `"`)
			}
		case *instructions.EntrypointCommand:
			entrypoint = c.CmdLine
		case *instructions.CopyCommand:
			copied = append(copied, c.DestPath)
		}
	}
	if user != "65532:65532" {
		t.Errorf("USER %q, want 65532:65532 (distroless nonroot)", user)
	}
	for _, k := range []string{"title", "description", "source", "version", "revision", "created"} {
		if labels["org.opencontainers.image."+k] == "" {
			t.Errorf("missing OCI label org.opencontainers.image.%s", k)
		}
	}
	if labels["org.opencontainers.image.version"] != "${VERSION}" {
		t.Errorf("org.opencontainers.image.version = %q, want ${VERSION}", labels["org.opencontainers.image.version"])
	}
	if !slices.Equal(entrypoint, []string{"/usr/local/bin/receiver"}) || !slices.Equal(copied, []string{"/usr/local/bin/"}) {
		t.Errorf("entrypoint %v, copies %v: binaries must be in /usr/local/bin (the chart runs them from there)", entrypoint, copied)
	}
	// The go build step uses the Makefile's flags.
	cmd := goBuildCommand(t, df)
	mk, err := os.ReadFile(filepath.Join(repoRoot, "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	ldflags := regexp.MustCompile(`(?m)^LDFLAGS\s*:=\s*(.*)$`).FindSubmatch(mk)
	gflags := regexp.MustCompile(`(?m)^GOFLAGS_BUILD\s*:=\s*(.*)$`).FindSubmatch(mk)
	if ldflags == nil || gflags == nil {
		t.Fatal("Makefile: LDFLAGS or GOFLAGS_BUILD not found")
	}
	wantLd := strings.ReplaceAll(strings.TrimSpace(string(ldflags[1])), "$(VERSION)", "${VERSION}")
	for _, want := range []string{"CGO_ENABLED=0", strings.TrimSpace(string(gflags[1])), `-ldflags "` + wantLd + `"`} {
		if !strings.Contains(cmd, want) {
			t.Errorf("Dockerfile go build %q lacks the Makefile's %q", cmd, want)
		}
	}
	for _, c := range []string{"receiver", "worker", "migrate", "eventsctl"} {
		if !strings.Contains(cmd, "./cmd/"+c) {
			t.Errorf("Dockerfile go build does not build ./cmd/%s", c)
		}
	}
	checkBuildContext(t, df)
}

// checkCopyFrom: BuildKit treats an unknown --from name as an image to pull,
// so a typo there only shows at build time. Each must name an earlier stage.
func checkCopyFrom(t *testing.T, name string, df dockerfile) {
	t.Helper()
	var earlier []string
	for i, s := range df.stages {
		for _, c := range s.Commands {
			if cp, ok := c.(*instructions.CopyCommand); ok && cp.From != "" {
				if !slices.Contains(earlier, cp.From) {
					t.Errorf("%s: stage %d: COPY --from=%s names no earlier stage (have %v)", name, i, cp.From, earlier)
				}
			}
		}
		earlier = append(earlier, s.Name)
	}
}

// goBuildCommand returns the shell command of the RUN step with `go build`.
func goBuildCommand(t *testing.T, df dockerfile) string {
	t.Helper()
	for _, c := range df.stages[0].Commands {
		if r, ok := c.(*instructions.RunCommand); ok {
			line := strings.Join(r.CmdLine, " ")
			if strings.Contains(line, "go build") {
				return line
			}
		}
	}
	t.Fatal("no RUN ... go build in the build stage")
	return ""
}

// checkBuildContext: every COPY source exists and is not excluded by
// .dockerignore, and the context leaves tests and tooling out.
func checkBuildContext(t *testing.T, df dockerfile) {
	t.Helper()
	f, err := os.Open(filepath.Join(repoRoot, ".dockerignore"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	patterns, err := dockerignore.ReadAll(f)
	if err != nil {
		t.Fatal(err)
	}
	pm, err := patternmatcher.New(patterns)
	if err != nil {
		t.Fatal(err)
	}
	excluded := func(p string) bool {
		ok, err := pm.MatchesOrParentMatches(p)
		if err != nil {
			t.Fatal(err)
		}
		return ok
	}
	for _, c := range df.stages[0].Commands {
		cp, ok := c.(*instructions.CopyCommand)
		if !ok || cp.From != "" {
			continue
		}
		for _, src := range cp.SourcePaths {
			p := strings.TrimSuffix(src, "/")
			if _, err := os.Stat(filepath.Join(repoRoot, p)); err != nil {
				t.Errorf("COPY %s: %v", src, err)
			}
			if excluded(p) {
				t.Errorf("COPY %s: excluded by .dockerignore", src)
			}
		}
	}
	for _, p := range []string{"pkg/receiver/receiver.go", "cmd/worker/main.go", "migrations/migrations.go", "go.sum"} {
		if excluded(p) {
			t.Errorf(".dockerignore excludes %s, which the build needs", p)
		}
	}
	for _, p := range []string{"charts/idempotent-events/Chart.yaml", "bin/envtest/etcd", ".git/HEAD", "pkg/receiver/handler_test.go", "hack/check-deploy.sh"} {
		if !excluded(p) {
			t.Errorf(".dockerignore lets %s into the build context", p)
		}
	}
}

// TestTiltDevDockerfile lints the dev image the Tiltfile builds inline.
func TestTiltDevDockerfile(t *testing.T) {
	_, globals := runTiltfile(t)
	v, ok := globals["DEV_DOCKERFILE"]
	if !ok {
		t.Fatal("DEV_DOCKERFILE not defined")
	}
	s, _ := starlark.AsString(v)
	dt := []byte(strings.TrimLeft(s, "\n"))
	for _, w := range lintDockerfile(t, "Tiltfile DEV_DOCKERFILE", dt) {
		t.Errorf("Tiltfile DEV_DOCKERFILE: %s", w)
	}
	df := parseDockerfile(t, "Tiltfile DEV_DOCKERFILE", dt)
	checkCopyFrom(t, "Tiltfile DEV_DOCKERFILE", df)
}
