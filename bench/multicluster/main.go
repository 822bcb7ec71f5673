// Command multicluster measures what ambient multicluster's double HBONE
// adds to a connection, beside HBONE on one network, on loopback, and
// prints one figure per line as "name value unit" on stdout; details go
// to stderr.
//
//	go run ./bench/multicluster
//
// Four processes, one per role, as on real nodes: the echo application,
// the destination's node proxy (an hbone.Server that dials the app, as
// the inbound does), the real east-west gateway (proxy/eastwest, routing
// by a workload API snapshot in which the service is global) and this
// process, the client node proxy's hbone.Pool. The children are this
// binary re-executed with -role. Every figure is an added latency: the
// path minus a direct TCP connection to the app, measured in the same
// run in alternating rounds, and cross network minus same network (the
// comparison Istio publishes). bench/README.md gives the method.
package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"

	"github.com/ztunnel-go/ztunnel-go/bench/benchkit"
	"github.com/ztunnel-go/ztunnel-go/internal/controlplane/ca"
)

var reaper = &benchkit.Reaper{}

func main() {
	role := flag.String("role", "", "internal: run as a child process (app, dest or gateway)")
	caDir := flag.String("ca-dir", "", "internal: directory with the CA root for children")
	app := flag.String("app", "", "internal: the app's address for the dest child")
	destAddr := flag.String("dest", "", "internal: the dest node proxy's HBONE address for the gateway child")
	var o options
	flag.IntVar(&o.rounds, "rounds", 5, "alternating rounds; each measures every path")
	flag.IntVar(&o.connects, "connects", 200, "new connections per path per round")
	flag.IntVar(&o.requests, "requests", 2000, "1 KiB requests per path per round on a reused connection")
	flag.Parse()
	var err error
	switch *role {
	case "":
		if o.rounds < 1 || o.connects < 1 || o.requests < 1 {
			err = fmt.Errorf("-rounds, -connects and -requests must be at least 1")
			break
		}
		reaper.OnSignal("bench/multicluster")
		err = run(o)
	case "app":
		err = childApp()
	case "dest":
		err = childDest(*caDir, *app)
	case "gateway":
		err = childGateway(*caDir, *destAddr)
	default:
		err = fmt.Errorf("unknown role %q", *role)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench/multicluster:", err)
		os.Exit(1)
	}
}

func logf(format string, args ...any) { fmt.Fprintf(os.Stderr, format+"\n", args...) }

func emit(name string, value float64, unit string) {
	prec := 1
	if value >= 100 || value <= -100 {
		prec = 0
	}
	fmt.Printf("%s %s %s\n", name, strconv.FormatFloat(value, 'f', prec, 64), unit)
}

// ---- children ----

func startChild(args ...string) (*benchkit.Child, string, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, "", err
	}
	return benchkit.StartChild(reaper, exec.Command(exe, args...))
}

// serveCommands answers the parent's lines until its stdin closes:
// "forwarded" (the gateway only) with the counter, anything else with "?".
func serveCommands(forwarded func() (float64, error)) {
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		if sc.Text() == "forwarded" && forwarded != nil {
			n, err := forwarded()
			if err != nil {
				fmt.Println("error", err)
				continue
			}
			fmt.Println(n)
			continue
		}
		fmt.Println("?")
	}
}

func childApp() error {
	_, addr, err := startApp()
	if err != nil {
		return err
	}
	fmt.Println(addr)
	serveCommands(nil)
	return nil
}

func childDest(dir, app string) error {
	c, err := benchkit.LoadCA(dir)
	if err != nil {
		return err
	}
	certs, err := issue(c, destID)
	if err != nil {
		return err
	}
	ap, err := netip.ParseAddrPort(app)
	if err != nil {
		return err
	}
	d, err := startDest(certs, ap)
	if err != nil {
		return err
	}
	fmt.Println(d.addr)
	serveCommands(nil)
	return nil
}

func childGateway(dir, destAddr string) error {
	c, err := benchkit.LoadCA(dir)
	if err != nil {
		return err
	}
	certs, err := issue(c, gatewayID)
	if err != nil {
		return err
	}
	dp, err := netip.ParseAddrPort(destAddr)
	if err != nil {
		return err
	}
	g, err := startGateway(certs, dp)
	if err != nil {
		return err
	}
	fmt.Println(g.addr)
	serveCommands(g.forwarded)
	return nil
}

// ---- the run ----

func run(o options) error {
	logf("machine: %d cores (GOMAXPROCS %d), %s; load average %s", runtime.NumCPU(), runtime.GOMAXPROCS(0), cpuModel(), loadAvg())
	authority, err := ca.New(ca.Options{})
	if err != nil {
		return err
	}
	dir, err := reaper.TempDir("bench-multicluster-")
	if err != nil {
		return err
	}
	defer reaper.RemoveDir(dir)
	if err := benchkit.WriteCA(authority, dir); err != nil {
		return err
	}
	appCh, appAddr, err := startChild("-role", "app")
	if err != nil {
		return fmt.Errorf("app: %w", err)
	}
	defer appCh.Stop()
	destCh, destAddr, err := startChild("-role", "dest", "-ca-dir", dir, "-app", appAddr)
	if err != nil {
		return fmt.Errorf("dest: %w", err)
	}
	defer destCh.Stop()
	gwCh, gwAddr, err := startChild("-role", "gateway", "-ca-dir", dir, "-dest", destAddr)
	if err != nil {
		return fmt.Errorf("gateway: %w", err)
	}
	defer gwCh.Stop()
	certs, err := issue(authority, clientID)
	if err != nil {
		return err
	}
	cl := &client{certs: certs}
	for _, a := range []struct {
		s  string
		to *netip.AddrPort
	}{{appAddr, &cl.app}, {destAddr, &cl.dest}, {gwAddr, &cl.gateway}} {
		if *a.to, err = netip.ParseAddrPort(a.s); err != nil {
			return err
		}
	}
	logf("app %s, destination node proxy %s, east-west gateway %s (each its own process)", cl.app, cl.dest, cl.gateway)

	before, err := gwCh.Ask("forwarded")
	if err != nil {
		return err
	}
	res, err := measure(context.Background(), cl, o)
	if err != nil {
		return err
	}
	after, err := gwCh.Ask("forwarded")
	if err != nil {
		return err
	}
	b, _ := strconv.ParseFloat(before, 64)
	a, err := strconv.ParseFloat(after, 64)
	if err != nil {
		return fmt.Errorf("gateway counter %q: %w", after, err)
	}
	// Every cross-network tunnel is one outer stream the gateway forwards.
	if a-b != float64(res.crossTunnels) {
		return fmt.Errorf("the gateway forwarded %.0f streams, the run opened %d cross-network tunnels: the setup does not route as it should", a-b, res.crossTunnels)
	}
	logf("gateway forwarded %.0f outer streams during the run (%d cross-network tunnels opened)", a-b, res.crossTunnels)
	res.print()
	logf("load average after: %s", loadAvg())
	return nil
}

func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

func cpuModel() string {
	f, err := os.Open("/proc/cpuinfo")
	if err != nil {
		return "unknown CPU"
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return "unknown CPU"
}

// dialDirect is the baseline: a TCP connection straight to the app.
func dialDirect(ctx context.Context, app netip.AddrPort) (net.Conn, error) {
	var d net.Dialer
	return d.DialContext(ctx, "tcp", app.String())
}
