// Command cpscale is `make bench-cp-scale`: the control plane at cluster
// sizes, on a synthetic but realistic cluster built in memory
// (translate/synth: 100 nodes, 500 namespaces, a Service and an
// EndpointSlice per 10 pods, 5 % of pods in ambient namespaces bound to a
// waypoint with an HTTPRoute, one AuthorizationPolicy per namespace, a
// ServiceEntry and a PeerAuthentication in every tenth) fed through the real
// control plane: translation, the xDS server, TLS gRPC to 100 node clients
// (xds.Client into a state.Store each, subscribed as node proxies). For
// each size it prints, one `name value unit` per line:
//
//	cp_full_translate_ms_<N>k        one translation of the whole cluster (median of 3)
//	cp_change_translate_p99_ms_<N>k  p99 of one pod change: translate, placement, hand to the xDS server (controlplane.Apply)
//	cp_push_p99_ms_<N>k              p99 of (time every node client's store holds the change − time of the change)
//	cp_change_translate_p99_ms_<N>k_<kind>  p99 of Apply for 150 changes of one kind (namespace, policy,
//	                                 peerauthn, serviceentry, route; each alters the output, see kindChanges)
//	cp_rss_mb_<N>k                   peak RSS of the control-plane process (VmHWM)
//
// Every size runs in its own process (so RSS is that size's), and the node
// clients in another one (so their stores are not counted as the control
// plane's). One pod changes every -interval for -churn.
//
// Node clients subscribe as Istio's ztunnel does by default (wildcard:
// XDS_ON_DEMAND=false, which its DNS proxy needs): istiod sends every
// workload and service to every ztunnel, and so does ours. The filtering
// the protocol allows per node is per resource: a stream is sent only the
// resources that changed (delta xDS), never the set again, and a client may
// subscribe to names instead of the wildcard (as ztunnel's on-demand mode
// does). -subscribe=node (the default) is that: each client subscribes to
// its own node's pods and their Services, as an on-demand ztunnel that has
// been told its local pods, so a pod change is pushed to the node that
// runs it. -subscribe=wildcard gives every client everything: on this
// 2-core machine 100 such clients need ~2 GB per 10k pods and their CPU,
// not the control plane's, bounds the push latency.
package main

import (
	"bufio"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"
)

type options struct {
	pods      []int
	churn     time.Duration
	interval  time.Duration
	clients   int
	profile   string
	subscribe string
}

func main() {
	var o options
	pods := flag.String("pods", "10000,50000", "cluster sizes (pods), comma-separated")
	flag.DurationVar(&o.churn, "churn", 30*time.Second, "how long one pod changes every -interval")
	flag.DurationVar(&o.interval, "interval", 20*time.Millisecond, "time between pod changes")
	flag.IntVar(&o.clients, "clients", 100, "node clients (one per node)")
	flag.StringVar(&o.subscribe, "subscribe", "node", "node clients' Address subscription: node (own pods and their Services) or wildcard (everything)")
	flag.StringVar(&o.profile, "cpuprofile", "", "write a CPU profile of each size's control-plane process to FILE.<N>")
	size := flag.Int("size", 0, "internal: run one size in this process")
	nodes := flag.String("nodes", "", "internal: run the node clients against this address")
	root := flag.String("root", "", "internal: the CA root PEM file for -nodes")
	flag.Parse()
	for _, f := range strings.Split(*pods, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n <= 0 {
			fail(fmt.Errorf("-pods: %q is not a positive number", f))
		}
		o.pods = append(o.pods, n)
	}
	if o.subscribe != "node" && o.subscribe != "wildcard" {
		fail(fmt.Errorf("-subscribe: %q is neither node nor wildcard", o.subscribe))
	}
	var err error
	switch {
	case *nodes != "":
		err = runNodes(*nodes, *root, *size, o)
	case *size > 0:
		err = runSize(*size, o)
	default:
		err = runAll(o)
	}
	if err != nil {
		fail(err)
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "cpscale:", err)
	os.Exit(1)
}

// runAll runs each size in a child process and passes its figures on.
func runAll(o options) error {
	self, err := os.Executable()
	if err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "cpscale: %d node clients (%s subscription), one pod change every %v for %v; load average %s\n",
		o.clients, o.subscribe, o.interval, o.churn, loadAvg())
	for _, n := range o.pods {
		cmd := exec.Command(self, append(passFlags(o), "-size", strconv.Itoa(n))...)
		cmd.Stderr = os.Stderr
		out, err := cmd.StdoutPipe()
		if err != nil {
			return err
		}
		if err := cmd.Start(); err != nil {
			return err
		}
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			fmt.Println(sc.Text())
		}
		if err := cmd.Wait(); err != nil {
			return fmt.Errorf("size %d: %w", n, err)
		}
	}
	fmt.Fprintf(os.Stderr, "cpscale: done; load average %s\n", loadAvg())
	return nil
}

func passFlags(o options) []string {
	return []string{
		"-churn", o.churn.String(), "-interval", o.interval.String(), "-clients", strconv.Itoa(o.clients),
		"-cpuprofile", o.profile, "-subscribe", o.subscribe,
	}
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

// procStatus returns a /proc/self/status field in KiB (VmRSS, VmHWM).
func procStatus(field string) int64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, field+":"); ok {
			f := strings.Fields(v)
			if len(f) > 0 {
				n, _ := strconv.ParseInt(f[0], 10, 64)
				return n
			}
		}
	}
	return 0
}
