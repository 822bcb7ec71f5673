package meshlab

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/ztunnel-go/ztunnel-go/internal/testing/testcluster"
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
		testcluster.KillNetNSProcesses(filepath.Join("/var/run/netns", name))
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
