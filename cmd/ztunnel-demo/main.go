// Command demo is `make demo`: a two-node ambient mesh in network
// namespaces on this machine, built by meshlab from the real binaries and
// the Kubernetes YAML in examples/, a short tour of what the mesh does (one
// line per scenario, ✔ or ✘), then teardown. It exits 1 when a scenario
// fails.
//
//	go run ./cmd/ztunnel-demo [--examples DIR] [--teardown]
//
// Environment (read here only): BIN_DIR, prebuilt binaries (`make build`);
// KEEP=1 keeps the mesh up until Ctrl-C and prints how to look around;
// VERBOSE=1 prints the topology's log lines.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/ztunnel-go/ztunnel-go/internal/testing/meshlab"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/testkit"
)

// programName names the namespaces: zt-meshlab-demo-<hash>-...
const programName = "meshlab-demo"

const marker = "ztunnel-go-demo-cleartext-marker;"

func main() {
	examples := flag.String("examples", "examples", "directory of Kubernetes YAML to load")
	teardown := flag.Bool("teardown", false, "delete what a kept (KEEP=1) or crashed demo left behind, and exit")
	flag.Parse()
	if *teardown {
		os.Exit(doTeardown())
	}
	os.Exit(run(*examples, os.Getenv("BIN_DIR"), os.Getenv("KEEP") == "1", os.Getenv("VERBOSE") == "1"))
}

// scenario is one line of the report.
type scenario struct {
	name string
	run  func(ctx context.Context) (detail string, err error)
}

func run(examples, binDir string, keep, verbose bool) int {
	start := time.Now()
	logFile, err := os.CreateTemp("", "ztunnel-go-demo-*.log")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer logFile.Close()
	var logOut io.Writer = logFile
	if verbose {
		logOut = io.MultiWriter(logFile, os.Stderr)
	}
	prog := testkit.NewProgram(programName, logOut)
	defer prog.Close()

	fmt.Printf("ztunnel-go demo: building a two-node mesh from %s/ (log: %s)\n", examples, logFile.Name())
	m, err := meshlab.Start(prog, meshlab.Options{
		BinDir:   binDir,
		Examples: []string{examples},
		DNS:      map[string]netip.Addr{"upstream.example.": netip.MustParseAddr("10.30.0.200")},
	})
	if err != nil {
		fmt.Printf("✘ the mesh did not come up: %v\n", err)
		return 1
	}
	fmt.Printf("  mesh up in %v: control plane on %s, node agent + node proxy on %d nodes, pods created through CNI\n\n",
		time.Since(start).Round(100*time.Millisecond), m.CPAddr, len(m.Nodes))

	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	wp, err := m.StartWaypoint(ctx, "demo", "waypoint")
	if err != nil {
		fmt.Printf("✘ the waypoint did not start: %v\n", err)
		return 1
	}
	d := &demo{m: m, wp: wp}
	failed := 0
	for _, s := range d.scenarios() {
		sctx, scancel := context.WithTimeout(ctx, 20*time.Second)
		detail, err := s.run(sctx)
		scancel()
		if err != nil {
			failed++
			fmt.Printf("  ✘ %-42s %v\n", s.name, err)
			continue
		}
		fmt.Printf("  ✔ %-42s %s\n", s.name, detail)
	}
	if err := d.explain(ctx, binDir); err != nil {
		failed++
		fmt.Printf("  ✘ zctl explain: %v\n", err)
	}
	fmt.Printf("\n%d of %d scenarios passed in %v\n", len(d.scenarios())-failed, len(d.scenarios()), time.Since(start).Round(100*time.Millisecond))
	if keep {
		printKeep(m)
		sig := make(chan os.Signal, 1)
		signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
		<-sig
		fmt.Println("\ntearing down")
	}
	if failed > 0 {
		fmt.Printf("the topology's log: %s (run with KEEP=1 to look around before teardown)\n", logFile.Name())
		return 1
	}
	if !keep {
		os.Remove(logFile.Name())
	}
	return 0
}

type demo struct {
	m  *meshlab.Mesh
	wp *meshlab.Waypoint
}
