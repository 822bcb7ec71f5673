package meshlab

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
)

// Teardown removes what a mesh left behind when its process could not
// clean up (a kept demo in another terminal, a crash): every process in a
// network namespace whose name starts with prefix is killed, the namespaces
// are deleted, and their /etc/netns entries removed. It returns how many
// namespaces it deleted.
func Teardown(prefix string) (int, error) {
	if !strings.HasPrefix(prefix, "zt-") || len(prefix) < 5 {
		return 0, fmt.Errorf("meshlab: teardown prefix %q: want zt-<name>-", prefix)
	}
	entries, err := os.ReadDir("/var/run/netns")
	if errors.Is(err, os.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("meshlab: %w", err)
	}
	var errs []error
	n := 0
	for _, e := range entries {
		name := e.Name()
		if !strings.HasPrefix(name, prefix) {
			continue
		}
		killIn(filepath.Join("/var/run/netns", name))
		if out, err := exec.Command("ip", "netns", "del", name).CombinedOutput(); err != nil {
			errs = append(errs, fmt.Errorf("ip netns del %s: %w: %s", name, err, out))
			continue
		}
		_ = os.RemoveAll(filepath.Join(etcNetns, name))
		n++
	}
	_ = os.Remove(etcNetns) // only if empty
	return n, errors.Join(errs...)
}

// killIn SIGKILLs the processes whose network namespace is the one bound at
// path.
func killIn(path string) {
	var want syscall.Stat_t
	if syscall.Stat(path, &want) != nil {
		return
	}
	procs, _ := filepath.Glob("/proc/[0-9]*/ns/net")
	for _, p := range procs {
		var st syscall.Stat_t
		if syscall.Stat(p, &st) != nil || st.Dev != want.Dev || st.Ino != want.Ino {
			continue
		}
		var pid int
		if _, err := fmt.Sscanf(p, "/proc/%d/ns/net", &pid); err == nil && pid != os.Getpid() {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}
