package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"runtime/pprof"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	networkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	securityv1 "istio.io/client-go/pkg/apis/security/v1"
	corev1 "k8s.io/api/core/v1"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/ztunnel-go/ztunnel-go/internal/cluster"
	"github.com/ztunnel-go/ztunnel-go/internal/controlplane"
	"github.com/ztunnel-go/ztunnel-go/internal/controlplane/ca"
	"github.com/ztunnel-go/ztunnel-go/internal/controlplane/caserver"
	"github.com/ztunnel-go/ztunnel-go/internal/controlplane/translate"
	"github.com/ztunnel-go/ztunnel-go/internal/controlplane/translate/synth"
)

// staticSource is a cluster.Source the benchmark drives through Apply.
type staticSource struct{}

func (staticSource) Run(ctx context.Context) error { <-ctx.Done(); return nil }
func (staticSource) Current() (*cluster.Objects, <-chan struct{}) {
	return nil, make(chan struct{})
}

func nodeToken(i int) string { return fmt.Sprintf("token-node-%d", i) }

func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

func quantile(d []time.Duration, q float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := append([]time.Duration(nil), d...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[int(q*float64(len(s)-1))]
}

// runSize measures one cluster size in this process.
func runSize(n int, o options) error {
	suffix := fmt.Sprintf("%dk", n/1000)
	if n%1000 != 0 {
		suffix = strconv.Itoa(n)
	}
	if o.profile != "" {
		f, err := os.Create(o.profile + "." + strconv.Itoa(n))
		if err != nil {
			return err
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	spec := synth.Default(n)
	objs := synth.Build(spec)
	cfg := translate.LocalDefaults()

	// Full translation: one warm-up, then the median of three.
	translate.NewTranslator(cfg).Update(objs, nil)
	var walls, cpus []time.Duration
	for range 3 {
		start, cpu0 := time.Now(), cpuTime()
		res, _ := translate.NewTranslator(cfg).Update(objs, nil)
		walls, cpus = append(walls, time.Since(start)), append(cpus, cpuTime()-cpu0)
		// Pods, Services, and per ServiceEntry its service and the
		// workload of its DNS host.
		if got, want := res.Addresses.Len(), n+len(objs.Services)+2*len(objs.ServiceEntries); got != want {
			return fmt.Errorf("translation has %d addresses, want %d", got, want)
		}
	}
	fmt.Printf("cp_full_translate_ms_%s %.0f ms\n", suffix, ms(quantile(walls, 0.5)))
	fmt.Fprintf(os.Stderr, "%s: full translation of %d pods, %d Services, %d EndpointSlices, %d policies: wall %v, CPU %v (median of 3; GC on the other core included)\n",
		suffix, n, len(objs.Services), len(objs.EndpointSlices), len(objs.AuthorizationPolicies),
		quantile(walls, 0.5).Round(time.Millisecond), quantile(cpus, 0.5).Round(time.Millisecond))

	authority, err := ca.New(ca.Options{})
	if err != nil {
		return err
	}
	tokens := map[string]string{}
	for i := 0; i < o.clients; i++ {
		tokens[fmt.Sprintf("node-%d", i)] = nodeToken(i)
	}
	auth, err := caserver.NewNodeTokens(tokens)
	if err != nil {
		return err
	}
	cp, err := controlplane.New(controlplane.Config{Source: staticSource{}, Translate: cfg, CA: authority, Auth: auth})
	if err != nil {
		return err
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cpDone := make(chan error, 1)
	go func() { cpDone <- cp.Run(ctx, lis) }()
	cp.Apply(objs)

	rootFile, err := os.CreateTemp("", "cpscale-root-*.pem")
	if err != nil {
		return err
	}
	defer os.Remove(rootFile.Name())
	if _, err := rootFile.Write(authority.RootPEM()); err != nil {
		return err
	}
	rootFile.Close()

	self, err := os.Executable()
	if err != nil {
		return err
	}
	child := exec.Command(self, append(passFlags(o), "-size", strconv.Itoa(n), "-nodes", lis.Addr().String(), "-root", rootFile.Name())...)
	child.Stderr = os.Stderr
	out, err := child.StdoutPipe()
	if err != nil {
		return err
	}
	stdin, err := child.StdinPipe() // closing it ends the child
	if err != nil {
		return err
	}
	syncStart := time.Now()
	if err := child.Start(); err != nil {
		return err
	}
	defer func() { stdin.Close(); child.Wait() }()

	var mu sync.Mutex
	changes := map[string]time.Time{} // uid@rev → when it changed
	var push []time.Duration
	ready := make(chan error, 1)
	go readNodes(out, ready, func(id string, at time.Time) {
		mu.Lock()
		if t, ok := changes[id]; ok {
			push = append(push, at.Sub(t))
		}
		mu.Unlock()
	})
	select {
	case err := <-ready:
		if err != nil {
			return err
		}
	case err := <-cpDone:
		return fmt.Errorf("control plane stopped: %v", err)
	}
	fmt.Fprintf(os.Stderr, "%s: %d node clients fully synced in %v\n", suffix, o.clients, time.Since(syncStart).Round(time.Millisecond))

	// Churn: one pod changes (its readiness and canonical revision) every
	// interval; Apply is what the control plane's loop runs per change.
	var applies []time.Duration
	tick := time.NewTicker(o.interval)
	defer tick.Stop()
	end := time.Now().Add(o.churn)
	cpu0 := cpuTime()
	gen := 0
	for time.Now().Before(end) {
		<-tick.C
		gen++
		idx := (gen * 7919) % n
		next := synth.WithPod(objs, spec, idx, gen)
		p := synth.Pod(spec, idx, gen)
		id := "Kubernetes//Pod/" + p.Namespace + "/" + p.Name + "@" + synth.Revision(gen)
		at := time.Now()
		mu.Lock()
		changes[id] = at
		mu.Unlock()
		cp.Apply(next)
		applies = append(applies, time.Since(at))
		objs = next
	}
	churnCPU := cpuTime() - cpu0
	want := gen * o.clients
	if o.subscribe == "node" {
		want = gen // only the node that runs the pod subscribed to it
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		mu.Lock()
		got := len(push)
		mu.Unlock()
		if got >= want || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	mu.Lock()
	lat := append([]time.Duration(nil), push...)
	mu.Unlock()
	if len(lat) == 0 {
		return fmt.Errorf("no node client saw any change")
	}
	fmt.Printf("cp_change_translate_p99_ms_%s %.2f ms\n", suffix, ms(quantile(applies, 0.99)))
	fmt.Printf("cp_push_p99_ms_%s %.1f ms\n", suffix, ms(quantile(lat, 0.99)))
	if err := kindChanges(cp, spec, objs, suffix, o.interval); err != nil {
		return err
	}
	fmt.Printf("cp_rss_mb_%s %d MB\n", suffix, procStatus("VmHWM")/1024)
	fmt.Fprintf(os.Stderr, "%s: %d changes in %v (%.0f/s), control plane CPU %v; Apply p50 %v p99 %v max %v\n",
		suffix, gen, o.churn, float64(gen)/o.churn.Seconds(), churnCPU.Round(time.Millisecond),
		quantile(applies, 0.5), quantile(applies, 0.99), quantile(applies, 1))
	fmt.Fprintf(os.Stderr, "%s: push to %d clients: %d of %d deliveries seen; p50 %v p90 %v p99 %v max %v\n",
		suffix, o.clients, len(lat), want, quantile(lat, 0.5), quantile(lat, 0.9), quantile(lat, 0.99), quantile(lat, 1))
	fmt.Fprintf(os.Stderr, "%s: control plane RSS now %d MB, peak %d MB\n", suffix, procStatus("VmRSS")/1024, procStatus("VmHWM")/1024)
	return nil
}

// readNodes parses the node process's lines: "ready", "error <text>", and
// "seen <uid@rev> <unix ns>".
func readNodes(r io.Reader, ready chan<- error, seen func(string, time.Time)) {
	sc := bufio.NewScanner(r)
	signalled := false
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		switch {
		case len(f) == 1 && f[0] == "ready" && !signalled:
			signalled = true
			ready <- nil
		case len(f) > 0 && f[0] == "error" && !signalled:
			signalled = true
			ready <- fmt.Errorf("node clients: %s", strings.Join(f[1:], " "))
		case len(f) == 3 && f[0] == "seen":
			ns, err := strconv.ParseInt(f[2], 10, 64)
			if err == nil {
				seen(f[1], time.Unix(0, ns))
			}
		}
	}
	if !signalled {
		ready <- fmt.Errorf("node clients exited before syncing")
	}
}

// kindChanges measures Apply for changes of the kinds translated as a
// whole before issue 29 (translate's global unit) and of routes: for each,
// kindSeries changes one every interval (as the pod churn; the previous
// change's pushes to the node clients run in between), each one object of
// one namespace (round-robin over
// the namespaces that have one), every change altering the output (a
// namespace's dataplane mode, a policy's selector, a PeerAuthentication's
// mode, a ServiceEntry's port, an HTTPRoute's path; see synth). It prints
// cp_change_translate_p99_ms_<size>_<kind> per kind.
func kindChanges(cp *controlplane.ControlPlane, s synth.Spec, objs *cluster.Objects, suffix string, interval time.Duration) error {
	all := make([]int, s.Namespaces)
	for i := range all {
		all[i] = i
	}
	kinds := []struct {
		name string
		nss  []int
		with func(objs *cluster.Objects, n, gen int) *cluster.Objects
	}{
		{"namespace", all, func(o *cluster.Objects, n, gen int) *cluster.Objects {
			return synth.With(o, func(o *cluster.Objects) *[]*corev1.Namespace { return &o.Namespaces }, synth.Namespace(s, n, gen))
		}},
		{"policy", all, func(o *cluster.Objects, n, gen int) *cluster.Objects {
			return synth.With(o, func(o *cluster.Objects) *[]*securityv1.AuthorizationPolicy { return &o.AuthorizationPolicies }, synth.Policy(s, n, gen))
		}},
		{"peerauthn", synth.PeerAuthnNamespaces(s), func(o *cluster.Objects, n, gen int) *cluster.Objects {
			return synth.With(o, func(o *cluster.Objects) *[]*securityv1.PeerAuthentication { return &o.PeerAuthentications }, synth.PeerAuthentication(s, n, gen))
		}},
		{"serviceentry", synth.ServiceEntryNamespaces(s), func(o *cluster.Objects, n, gen int) *cluster.Objects {
			return synth.With(o, func(o *cluster.Objects) *[]*networkingv1.ServiceEntry { return &o.ServiceEntries }, synth.ServiceEntry(s, n, gen))
		}},
		{"route", synth.AmbientNamespaces(s), func(o *cluster.Objects, n, gen int) *cluster.Objects {
			return synth.With(o, func(o *cluster.Objects) *[]*gatewayv1.HTTPRoute { return &o.HTTPRoutes }, synth.Route(s, n, gen))
		}},
	}
	for _, k := range kinds {
		if len(k.nss) == 0 {
			continue
		}
		gens := map[int]int{} // namespace → its object's generation
		var applies []time.Duration
		tick := time.NewTicker(interval)
		cpu0 := cpuTime()
		for i := range kindSeries {
			<-tick.C
			n := k.nss[i%len(k.nss)]
			gens[n]++
			next := k.with(objs, n, gens[n])
			at := time.Now()
			cp.Apply(next)
			applies = append(applies, time.Since(at))
			objs = next
		}
		tick.Stop()
		cpu := cpuTime() - cpu0
		fmt.Printf("cp_change_translate_p99_ms_%s_%s %.2f ms\n", suffix, k.name, ms(quantile(applies, 0.99)))
		fmt.Fprintf(os.Stderr, "%s: %d %s changes, one every %v: Apply p50 %v p99 %v max %v; control plane CPU %v per change (pushes and GC included)\n",
			suffix, len(applies), k.name, interval, quantile(applies, 0.5), quantile(applies, 0.99), quantile(applies, 1),
			(cpu / time.Duration(len(applies))).Round(10*time.Microsecond))
	}
	return nil
}

// kindSeries is how many changes kindChanges makes of each kind.
const kindSeries = 150
