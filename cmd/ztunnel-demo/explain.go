package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// explains are the zctl explain runs the demo prints after its scenarios:
// the waypoint scenario's flow and the denial's.
var explains = []struct{ title, src, dst string }{
	{"through the waypoint", "demo/client", "ratings.demo.svc.cluster.local:80"},
	{"the denial", "demo/intruder", "server.demo.svc.cluster.local:80"},
}

// explain prints `zctl explain` of each flow of explains, run by the zctl
// binary on a saved /config_dump of the source pod's node proxy (what an
// operator would do with `-f`). zctl exits 3 for a denied flow; that is
// the expected answer for the denial, not a failure.
func (d *demo) explain(ctx context.Context, binDir string) error {
	zctl := "zctl"
	if binDir != "" {
		zctl = filepath.Join(binDir, "zctl")
	}
	dir, err := os.MkdirTemp("", "ztunnel-go-demo-explain-*")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	for _, e := range explains {
		ns, name, _ := strings.Cut(e.src, "/")
		src := d.m.Pod(ns, name)
		if src == nil {
			return fmt.Errorf("no pod %s", e.src)
		}
		dump, err := d.m.ConfigDump(ctx, src.Node.Index)
		if err != nil {
			return err
		}
		file := filepath.Join(dir, fmt.Sprintf("node%d.json", src.Node.Index))
		if err := os.WriteFile(file, dump, 0o600); err != nil {
			return err
		}
		cctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		out, err := exec.CommandContext(cctx, zctl, "explain", "-f", file, e.src, e.dst).CombinedOutput()
		cancel()
		var exit *exec.ExitError
		if err != nil && !(errors.As(err, &exit) && exit.ExitCode() == 3) {
			return fmt.Errorf("zctl explain %s %s: %w\n%s", e.src, e.dst, err, out)
		}
		fmt.Printf("\n$ zctl explain -f node%d-config-dump.json %s %s   # %s\n", src.Node.Index, e.src, e.dst, e.title)
		for _, line := range strings.Split(strings.TrimRight(string(out), "\n"), "\n") {
			fmt.Println("  " + line)
		}
	}
	return nil
}
