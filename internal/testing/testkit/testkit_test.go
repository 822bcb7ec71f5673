package testkit

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// recorder is a TB whose Fatalf records instead of stopping, so the
// failure paths can be checked.
type recorder struct {
	TB
	fatal []string
}

func (r *recorder) Helper() {}
func (r *recorder) Fatalf(format string, args ...any) {
	r.fatal = append(r.fatal, fmt.Sprintf(format, args...))
}

func TestEventuallyReturnsOnceCondHolds(t *testing.T) {
	var calls atomic.Int32
	r := &recorder{}
	Eventually(r, 10*time.Second, "the third call", func() bool { return calls.Add(1) >= 3 })
	if len(r.fatal) != 0 || calls.Load() != 3 {
		t.Errorf("fatal=%q after %d calls, want none after 3", r.fatal, calls.Load())
	}
}

func TestEventuallyFailsNamingWhat(t *testing.T) {
	r := &recorder{}
	var calls int
	start := time.Now()
	Eventually(r, 50*time.Millisecond, "the moon to turn blue", func() bool { calls++; return false })
	took := time.Since(start)
	if len(r.fatal) != 1 || !strings.Contains(r.fatal[0], "waiting for the moon to turn blue") || !strings.Contains(r.fatal[0], "50ms") {
		t.Errorf("fatal = %q, want one naming the timeout and what was awaited", r.fatal)
	}
	if took < 50*time.Millisecond {
		t.Errorf("gave up after %v, before the 50ms timeout", took)
	}
	if calls < 3 {
		t.Errorf("cond ran %d times in 50ms; want it polled", calls)
	}
}

func TestEventuallyErrReportsTheLastError(t *testing.T) {
	r := &recorder{}
	var calls int
	EventuallyErr(r, 30*time.Millisecond, "the answer", func() error { calls++; return fmt.Errorf("saw %d", calls) })
	if len(r.fatal) != 1 || !strings.Contains(r.fatal[0], "waiting for the answer: saw ") ||
		!strings.HasSuffix(r.fatal[0], fmt.Sprintf("saw %d", calls)) {
		t.Errorf("fatal = %q after %d calls, want one naming what and the last error", r.fatal, calls)
	}
	r = &recorder{}
	calls = 0
	EventuallyErr(r, 10*time.Second, "the second call", func() error {
		if calls++; calls < 2 {
			return fmt.Errorf("first")
		}
		return nil
	})
	if len(r.fatal) != 0 || calls != 2 {
		t.Errorf("fatal=%q after %d calls, want none after 2", r.fatal, calls)
	}
}

// skipRecorder is a TB that records a Skip.
type skipRecorder struct {
	recorder
	skipped []any
}

func (s *skipRecorder) Skip(args ...any) { s.skipped = args }

func TestSkipShort(t *testing.T) {
	s := &skipRecorder{}
	SkipShort(s, "a kernel")
	if testing.Short() {
		if len(s.skipped) != 1 || s.skipped[0] != "short: needs a kernel" {
			t.Errorf("under -short: skipped %q, want \"short: needs a kernel\"", s.skipped)
		}
	} else if s.skipped != nil {
		t.Errorf("without -short: skipped %q", s.skipped)
	}
	// A TB without Skip, the programs' one, runs on.
	SkipShort(&recorder{}, "a kernel")
}

func TestProgram(t *testing.T) {
	var out bytes.Buffer
	p := NewProgram("prog", &out)
	if p.Name() != "prog" {
		t.Errorf("Name = %q", p.Name())
	}
	dir := p.TempDir()
	if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
		t.Fatalf("TempDir %s: %v", dir, err)
	}
	var order []string
	p.Cleanup(func() { order = append(order, "first") })
	p.Cleanup(func() {
		order = append(order, "second")
		p.Cleanup(func() { order = append(order, "registered by second") })
	})
	p.Logf("hello %d", 1)
	if p.Failed() {
		t.Error("Failed before Errorf")
	}
	p.Errorf("bad %s", "thing")
	if !p.Failed() {
		t.Error("not Failed after Errorf")
	}
	p.Close()
	p.Close() // a second Close is harmless
	if want := "second,registered by second,first"; strings.Join(order, ",") != want {
		t.Errorf("cleanups ran %v, want %s", order, want)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("TempDir %s survives Close: %v", dir, err)
	}
	if got, want := out.String(), "hello 1\nbad thing\n"; got != want {
		t.Errorf("output %q, want %q", got, want)
	}
}

func TestModuleRoot(t *testing.T) {
	root, err := ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(GoTool(), "env", "GOMOD").Output()
	if err != nil {
		t.Fatal(err)
	}
	if want := filepath.Dir(strings.TrimSpace(string(out))); root != want {
		t.Errorf("ModuleRoot = %s, go env GOMOD says %s", root, want)
	}
}

func TestBuild(t *testing.T) {
	SkipShort(t, "builds of cmd/zctl")
	dir := t.TempDir()
	BuildBinaries(t, dir, "zctl")
	bin := filepath.Join(dir, "zctl")
	if out, err := exec.Command(bin, "--help").CombinedOutput(); len(out) == 0 {
		t.Errorf("%s --help printed nothing (%v)", bin, err)
	}
	if did, err := Build(dir, "zctl", "zctl"); err != nil || len(did) != 0 {
		t.Errorf("second Build into the same dir built %v (%v), want nothing", did, err)
	}
	if err := os.Remove(bin); err != nil {
		t.Fatal(err)
	}
	if did, err := Build(dir, "zctl"); err != nil || len(did) != 1 {
		t.Errorf("Build after the binary was removed built %v (%v), want zctl", did, err)
	}
	for _, bad := range []string{"", "..", "../cmd/zctl", "zctl/sub"} {
		if _, err := Build(dir, bad); err == nil {
			t.Errorf("Build(%q) succeeded", bad)
		}
	}
	if _, err := Build(dir, "no-such-command"); err == nil || !strings.Contains(err.Error(), "no-such-command") {
		t.Errorf("Build of a missing command: %v", err)
	}
}
