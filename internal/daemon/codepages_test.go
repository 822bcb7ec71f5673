package daemon

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/ztunnel-go/ztunnel-go/internal/testing/testkit"
)

// releaseChildEnv makes the test binary, started by
// TestReleaseStartupCode, release its own code and print the result.
const releaseChildEnv = "ZTG_TEST_RELEASE_CODE_CHILD"

func TestMain(m *testing.M) {
	if os.Getenv(releaseChildEnv) != "" {
		r, err := ReleaseStartupCode()
		if err != nil {
			os.Stderr.WriteString(err.Error() + "\n")
			os.Exit(2)
		}
		_ = json.NewEncoder(os.Stdout).Encode(r)
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// TestReleaseStartupCode runs a written-back copy of this test binary
// (a file just written has dirty pages, which the kernel does not drop)
// and checks that its code left both the process and the page cache: the
// memory is free, not merely unmapped.
func TestReleaseStartupCode(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	var fs unix.Statfs_t
	if err := unix.Statfs(dir, &fs); err == nil && fs.Type == unix.TMPFS_MAGIC {
		// tmpfs pages are the file itself: without swap there is nowhere
		// to page them out to.
		t.Skipf("%s is on tmpfs", dir)
	}
	bin := filepath.Join(dir, "child")
	if err := testkit.CopyFile(self, bin, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin)
	cmd.Env = append(os.Environ(), releaseChildEnv+"=1")
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("child: %v", err)
	}
	var r CodeRelease
	if err := json.Unmarshal(out, &r); err != nil {
		t.Fatalf("child said %q: %v", out, err)
	}
	t.Logf("resident %d → %d KiB, page cache %d → %d KiB", r.ResidentBefore>>10, r.ResidentAfter>>10, r.CachedBefore>>10, r.CachedAfter>>10)
	if r.ResidentBefore < 1<<20 {
		t.Fatalf("only %d KiB of the executable resident before the release: the mappings were not found", r.ResidentBefore>>10)
	}
	// Half, not less: what the child runs to measure (smaps, mincore, the
	// JSON answer) is faulted back in before the second reading, about
	// 1.5-2 MiB of a test binary that had only ~7 MiB resident (27 % of it
	// in one CI run on an Intel machine). A release that did nothing would
	// leave all of it.
	if r.ResidentAfter > r.ResidentBefore/2 {
		t.Errorf("resident after the release %d KiB, want at most half of %d KiB", r.ResidentAfter>>10, r.ResidentBefore>>10)
	}
	// Not all of it: the child's own code, faulted back in while it
	// measures, is cached again.
	if left, freed := r.ResidentBefore-r.ResidentAfter, r.CachedBefore-min(r.CachedAfter, r.CachedBefore); freed < left/2 {
		t.Errorf("%d KiB left the process but only %d KiB left the page cache: the pages were unmapped, not freed", left>>10, freed>>10)
	}
}
