package deploytest

import (
	"debug/elf"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"
)

// TestImageBinaries runs the Dockerfile's go build step as written (its
// shell command, with the build args set and /out/ pointed at a temporary
// directory), then checks that the four binaries are static executables
// that run on a bare kernel, as in distroless/static, and report the
// version passed as the build arg.
func TestImageBinaries(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the service's four binaries; skipped with -short")
	}
	dt, err := os.ReadFile(filepath.Join(repoRoot, "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := goBuildCommand(t, parseDockerfile(t, "Dockerfile", dt))
	out := t.TempDir()
	if strings.Count(cmd, "-o /out/ ") != 1 {
		t.Fatalf("go build step %q: want exactly one `-o /out/`", cmd)
	}
	cmd = strings.Replace(cmd, "-o /out/ ", "-o "+out+"/ ", 1)
	const version = "v9.8.7-deploytest"
	root, err := filepath.Abs(repoRoot)
	if err != nil {
		t.Fatal(err)
	}
	build := exec.Command("sh", "-ec", cmd)
	build.Dir = root
	build.Env = append(os.Environ(), "TARGETOS=linux", "TARGETARCH="+runtime.GOARCH, "VERSION="+version)
	start := time.Now()
	if b, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build step failed: %v\n%s", err, b)
	}
	t.Logf("go build step: %s", time.Since(start).Round(time.Millisecond))
	for _, name := range []string{"receiver", "worker", "migrate", "eventsctl"} {
		path := filepath.Join(out, name)
		checkStatic(t, path)
		args, want := []string{"--version"}, name+" "+version
		run := exec.Command(path, args...)
		run.Env = []string{} // like a bare container: no PATH, no HOME
		b, err := run.CombinedOutput()
		if err != nil || !strings.Contains(string(b), want) {
			t.Errorf("%s %v: %v, output %q, want %q", name, args, err, b, want)
		}
	}
}

// checkStatic: no program interpreter (dynamic loader) and no needed
// shared libraries, so the binary runs on distroless/static or scratch.
func checkStatic(t *testing.T, path string) {
	t.Helper()
	f, err := elf.Open(path)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			t.Errorf("%s: has PT_INTERP (dynamically linked)", filepath.Base(path))
		}
		if p.Type == elf.PT_DYNAMIC {
			t.Errorf("%s: has a PT_DYNAMIC segment", filepath.Base(path))
		}
	}
	if libs, _ := f.ImportedLibraries(); len(libs) > 0 {
		t.Errorf("%s: needs shared libraries %v", filepath.Base(path), libs)
	}
	if f.Section(".symtab") != nil {
		t.Errorf("%s: has a symbol table (-s -w not applied)", filepath.Base(path))
	}
}
