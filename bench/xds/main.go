// Command xds is `make bench-xds`: the node state's footprint and full-sync
// speed at 100,000 workloads and 10,000 services, and the control plane's push
// latency to 100 node clients while pods churn. It prints one figure per line
// as `name value unit`:
//
//	xds_bytes_per_workload       node-proxy state per workload after a full sync (heap, GC'd)
//	xds_apply_workloads_per_sec  workloads per second of a full sync over real gRPC into the node state
//	cp_push_p99_ms               p99 time from a pod change to 100 node clients holding it (10 changes/s)
//
// Everything runs in one process on loopback.
package main

import (
	"bufio"
	"context"
	"crypto/x509"
	"flag"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"runtime/pprof"
	"sort"
	"strconv"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ztunnel-go/ztunnel-go/internal/api/securityapi"
	"github.com/ztunnel-go/ztunnel-go/internal/api/workloadapi"
	"github.com/ztunnel-go/ztunnel-go/internal/cluster"
	"github.com/ztunnel-go/ztunnel-go/internal/controlplane"
	"github.com/ztunnel-go/ztunnel-go/internal/controlplane/ca"
	"github.com/ztunnel-go/ztunnel-go/internal/controlplane/caserver"
	"github.com/ztunnel-go/ztunnel-go/internal/controlplane/translate"
	"github.com/ztunnel-go/ztunnel-go/internal/controlplane/xdsserver"
	"github.com/ztunnel-go/ztunnel-go/internal/node/state"
	"github.com/ztunnel-go/ztunnel-go/internal/xds"
)

const (
	addressType = "type.googleapis.com/istio.workload.Address"
	authzType   = "type.googleapis.com/istio.security.Authorization"
)

func main() {
	workloads := flag.Int("workloads", 100_000, "workloads in the full-sync test")
	services := flag.Int("services", 10_000, "services in the full-sync test")
	clients := flag.Int("clients", 100, "node clients in the push test")
	pods := flag.Int("pods", 2_000, "pods in the push test")
	churn := flag.Duration("churn", 10*time.Second, "how long pods churn at 10 changes/s")
	cpuprofile := flag.String("cpuprofile", "", "write a CPU profile of the whole run to this file (the full-sync server's to FILE.server)")
	syncOnly := flag.Bool("sync-only", false, "run only the full-sync test (for profiling it alone)")
	serveOnly := flag.Bool("serve", false, "internal: be the full-sync test's server process")
	flag.Parse()
	if *cpuprofile != "" {
		f, err := os.Create(*cpuprofile)
		if err != nil {
			fmt.Fprintln(os.Stderr, "bench-xds:", err)
			os.Exit(1)
		}
		pprof.StartCPUProfile(f)
		defer pprof.StopCPUProfile()
	}
	if *serveOnly {
		if err := serveChild(*workloads, *services); err != nil {
			fmt.Fprintln(os.Stderr, "bench-xds: server:", err)
			pprof.StopCPUProfile()
			os.Exit(1)
		}
		return
	}
	if err := fullSync(*workloads, *services, *cpuprofile); err != nil {
		fmt.Fprintln(os.Stderr, "bench-xds: full sync:", err)
		pprof.StopCPUProfile()
		os.Exit(1)
	}
	if *syncOnly {
		return
	}
	if err := push(*clients, *pods, *churn); err != nil {
		fmt.Fprintln(os.Stderr, "bench-xds: push:", err)
		os.Exit(1)
	}
}

func heap() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// resources builds a realistic mesh: workloads spread over 100 namespaces and
// 100 nodes, each selected by one service.
func resources(nw, ns int) map[string]proto.Message {
	out := make(map[string]proto.Message, nw+ns)
	for s := 0; s < ns; s++ {
		nsName := fmt.Sprintf("ns-%d", s%100)
		host := fmt.Sprintf("svc-%d.%s.svc.cluster.local", s, nsName)
		vip := netip.AddrFrom4([4]byte{10, 96, byte(s >> 8), byte(s)})
		out[nsName+"/"+host] = &workloadapi.Address{Type: &workloadapi.Address_Service{Service: &workloadapi.Service{
			Name: fmt.Sprintf("svc-%d", s), Namespace: nsName, Hostname: host,
			Addresses: []*workloadapi.NetworkAddress{{Address: vip.AsSlice()}},
			Ports:     []*workloadapi.Port{{ServicePort: 80, TargetPort: 8080}},
		}}}
	}
	for w := 0; w < nw; w++ {
		s := w % ns
		nsName := fmt.Sprintf("ns-%d", s%100)
		host := fmt.Sprintf("svc-%d.%s.svc.cluster.local", s, nsName)
		name := fmt.Sprintf("app-%d-%x", s, w)
		uid := "Kubernetes//Pod/" + nsName + "/" + name
		ip := netip.AddrFrom4([4]byte{10, byte(w >> 16), byte(w >> 8), byte(w)})
		out[uid] = &workloadapi.Address{Type: &workloadapi.Address_Workload{Workload: &workloadapi.Workload{
			Uid: uid, Name: name, Namespace: nsName, Addresses: [][]byte{ip.AsSlice()},
			TunnelProtocol: workloadapi.TunnelProtocol_HBONE, ServiceAccount: fmt.Sprintf("sa-%d", s),
			Node: fmt.Sprintf("node-%d", w%100), CanonicalName: fmt.Sprintf("app-%d", s), CanonicalRevision: "v1",
			WorkloadName: fmt.Sprintf("app-%d", s), WorkloadType: workloadapi.WorkloadType_DEPLOYMENT, ClusterId: "Kubernetes",
			Services: map[string]*workloadapi.PortList{nsName + "/" + host: {Ports: []*workloadapi.Port{{ServicePort: 80, TargetPort: 8080}}}},
		}}}
	}
	return out
}

func serve(x *xdsserver.Server) (string, func(), error) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	g := grpc.NewServer(grpc.MaxSendMsgSize(200 << 20))
	x.Register(g)
	go g.Serve(lis)
	return lis.Addr().String(), g.Stop, nil
}

// serveChild is the full-sync test's server: this program run again with
// -serve, so that the node client's process holds (and garbage-collects)
// only its own heap, as a node proxy does. It prints its address, serves
// until its standard input closes, then prints its CPU time.
func serveChild(nw, ns int) error {
	x := xdsserver.NewServer(xdsserver.ServerConfig{})
	x.SetResources(addressType, resources(nw, ns))
	x.SetResources(authzType, map[string]proto.Message{})
	addr, stop, err := serve(x)
	if err != nil {
		return err
	}
	cpu0 := cpuTime()
	fmt.Println(addr)
	io.Copy(io.Discard, os.Stdin)
	stop()
	fmt.Println((cpuTime() - cpu0).Nanoseconds())
	return nil
}

func fullSync(nw, ns int, profile string) error {
	self, err := os.Executable()
	if err != nil {
		return err
	}
	args := []string{"-serve", "-workloads", strconv.Itoa(nw), "-services", strconv.Itoa(ns)}
	if profile != "" {
		args = append(args, "-cpuprofile", profile+".server")
	}
	child := exec.Command(self, args...)
	child.Stderr = os.Stderr
	in, err := child.StdinPipe()
	if err != nil {
		return err
	}
	out, err := child.StdoutPipe()
	if err != nil {
		return err
	}
	if err := child.Start(); err != nil {
		return fmt.Errorf("server process: %w", err)
	}
	defer child.Process.Kill()
	lines := bufio.NewScanner(out)
	if !lines.Scan() {
		return fmt.Errorf("server process printed no address")
	}
	addr := lines.Text()

	base := heap()
	store := state.NewStore()
	timed := &timingSink{Store: store}
	ctx, cancel := context.WithCancel(context.Background())
	client, err := xds.NewClient(xds.ClientConfig{
		Address: addr, Insecure: true, Sink: timed,
		Node: xds.NodeInfo{PodName: "ztunnel-bench", PodNamespace: "istio-system", InstanceIPs: []string{"10.0.0.1"}, NodeName: "node-0"},
	})
	if err != nil {
		cancel()
		return err
	}
	start, cpu0 := time.Now(), cpuTime()
	timed.start = start
	done := make(chan error, 1)
	go func() { done <- client.Run(ctx) }()
	select {
	case <-client.Synced():
	case err := <-done:
		cancel()
		return fmt.Errorf("client ended before sync: %v", err)
	case <-time.After(2 * time.Minute):
		cancel()
		return fmt.Errorf("no full sync within 2 minutes")
	}
	elapsed, cpu := time.Since(start), cpuTime()-cpu0
	if got := countWorkloads(store.Load()); got != nw {
		cancel()
		return fmt.Errorf("store holds %d workloads, want %d", got, nw)
	}
	cancel()
	<-done
	in.Close()
	var serverCPU time.Duration
	if lines.Scan() {
		ns, _ := strconv.ParseInt(lines.Text(), 10, 64)
		serverCPU = time.Duration(ns)
	}
	child.Wait()
	// What stays is the node proxy's state: the store, and the client's
	// record of accepted resource versions (used on reconnect).
	held := heap() - base
	runtime.KeepAlive(store)
	runtime.KeepAlive(client)
	fmt.Printf("xds_bytes_per_workload %d bytes\n", held/uint64(nw))
	fmt.Printf("xds_apply_workloads_per_sec %.0f workloads/s\n", float64(nw)/elapsed.Seconds())
	fmt.Fprintf(os.Stderr, "full sync of %d workloads + %d services: %v wall; CPU %v in the node client (GC included), %v in the server process; state %d MiB\n",
		nw, ns, elapsed.Round(time.Millisecond), cpu.Round(time.Millisecond), serverCPU.Round(time.Millisecond), held>>20)
	fmt.Fprintf(os.Stderr, "  phases: Addresses handed to the store at %v (server response, transfer, gRPC and Any decode), store apply %v (conversion, index build, publish), synced at %v (the client's version records, ACK)\n",
		timed.applyStart.Round(time.Millisecond), timed.applyTook.Round(time.Millisecond), elapsed.Round(time.Millisecond))
	return nil
}

// timingSink times the first (full-sync) ApplyAddresses call of a store.
type timingSink struct {
	*state.Store
	start      time.Time
	once       sync.Once
	applyStart time.Duration // since start
	applyTook  time.Duration
}

func (s *timingSink) ApplyAddresses(up map[string]*workloadapi.Address, rm []string) error {
	t0 := time.Now()
	err := s.Store.ApplyAddresses(up, rm)
	s.once.Do(func() { s.applyStart, s.applyTook = t0.Sub(s.start), time.Since(t0) })
	return err
}

// cpuTime is the process's user+system CPU time so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func countWorkloads(s *state.Snapshot) int {
	n := 0
	for range s.Workloads() {
		n++
	}
	return n
}

// staticSource is a cluster.Source the benchmark drives through Apply.
type staticSource struct{}

func (staticSource) Run(ctx context.Context) error { <-ctx.Done(); return nil }
func (staticSource) Current() (*cluster.Objects, <-chan struct{}) {
	return nil, make(chan struct{})
}

func pod(i int, rev string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name: fmt.Sprintf("pod-%d", i), Namespace: fmt.Sprintf("ns-%d", i%10),
			Labels: map[string]string{"app": fmt.Sprintf("app-%d", i%100), "version": rev, "istio.io/dataplane-mode": "ambient"},
		},
		Spec: corev1.PodSpec{NodeName: fmt.Sprintf("node-%d", i%100), ServiceAccountName: "default"},
		Status: corev1.PodStatus{
			Phase:      corev1.PodRunning,
			PodIP:      netip.AddrFrom4([4]byte{10, 1, byte(i >> 8), byte(i)}).String(),
			PodIPs:     []corev1.PodIP{{IP: netip.AddrFrom4([4]byte{10, 1, byte(i >> 8), byte(i)}).String()}},
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}},
		},
	}
}

// watchSink is a node client's state store that notes when a watched
// workload reaches a wanted revision.
type watchSink struct {
	*state.Store
	mu    sync.Mutex
	want  map[string]string // uid → canonical revision awaited
	seen  map[string]time.Time
	ready chan struct{}
	once  sync.Once
}

func (s *watchSink) ApplyAddresses(up map[string]*workloadapi.Address, rm []string) error {
	err := s.Store.ApplyAddresses(up, rm)
	now := time.Now()
	s.mu.Lock()
	for uid, a := range up {
		if w := a.GetWorkload(); w != nil && s.want[uid] == w.GetCanonicalRevision() {
			s.seen[uid+"@"+w.GetCanonicalRevision()] = now
		}
	}
	s.mu.Unlock()
	s.once.Do(func() { close(s.ready) })
	return err
}

func (s *watchSink) ApplyAuthorizations(up map[string]*securityapi.Authorization, rm []string) error {
	return s.Store.ApplyAuthorizations(up, rm)
}

func push(nClients, nPods int, churn time.Duration) error {
	authority, err := ca.New(ca.Options{})
	if err != nil {
		return err
	}
	tokens := map[string]string{}
	for i := 0; i < nClients; i++ {
		tokens[fmt.Sprintf("node-%d", i)] = fmt.Sprintf("token-%d", i)
	}
	auth, err := caserver.NewNodeTokens(tokens)
	if err != nil {
		return err
	}
	cp, err := controlplane.New(controlplane.Config{Source: staticSource{}, Translate: translate.LocalDefaults(), CA: authority, Auth: auth, Debounce: time.Millisecond})
	if err != nil {
		return err
	}
	objs := &cluster.Objects{}
	for n := 0; n < 10; n++ {
		objs.Namespaces = append(objs.Namespaces, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("ns-%d", n)}})
	}
	for i := 0; i < nPods; i++ {
		objs.Pods = append(objs.Pods, pod(i, "v0"))
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go cp.Run(ctx, lis)
	cp.Apply(objs)
	pool := x509.NewCertPool()
	pool.AddCert(authority.Root())

	sinks := make([]*watchSink, nClients)
	for i := range sinks {
		s := &watchSink{Store: state.NewStore(), want: map[string]string{}, seen: map[string]time.Time{}, ready: make(chan struct{})}
		sinks[i] = s
		c, err := xds.NewClient(xds.ClientConfig{
			Address: lis.Addr().String(), RootCAs: pool, ServerName: "istiod.istio-system.svc", Token: tokens[fmt.Sprintf("node-%d", i)],
			Node: xds.NodeInfo{PodName: fmt.Sprintf("ztunnel-%d", i), PodNamespace: "istio-system", InstanceIPs: []string{"10.30.0.1"}, NodeName: fmt.Sprintf("node-%d", i)},
			Sink: s,
		})
		if err != nil {
			return err
		}
		go c.Run(ctx)
		select {
		case <-c.Synced():
		case <-time.After(time.Minute):
			return fmt.Errorf("client %d did not sync", i)
		}
	}

	// Churn: every 100 ms one pod gets a new version label (→ canonical revision).
	type change struct {
		uid, rev string
		at       time.Time
	}
	var changes []change
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	end := time.Now().Add(churn)
	for i := 0; time.Now().Before(end); i++ {
		<-tick.C
		idx := (i * 7919) % nPods
		rev := fmt.Sprintf("v%d", i+1)
		p := pod(idx, rev)
		uid := "Kubernetes//Pod/" + p.Namespace + "/" + p.Name
		for _, s := range sinks {
			s.mu.Lock()
			s.want[uid] = rev
			s.mu.Unlock()
		}
		next := *objs
		next.Pods = append([]*corev1.Pod(nil), objs.Pods...)
		next.Pods[idx] = p
		objs = &next
		at := time.Now()
		cp.Apply(objs)
		changes = append(changes, change{uid: uid, rev: rev, at: at})
	}
	time.Sleep(2 * time.Second) // let the last pushes land
	var lat []time.Duration
	missing := 0
	for _, ch := range changes {
		for _, s := range sinks {
			s.mu.Lock()
			t, ok := s.seen[ch.uid+"@"+ch.rev]
			s.mu.Unlock()
			if !ok {
				missing++
				continue
			}
			lat = append(lat, t.Sub(ch.at))
		}
	}
	if len(lat) == 0 {
		return fmt.Errorf("no client saw any change")
	}
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	p := func(q float64) time.Duration { return lat[int(q*float64(len(lat)-1))] }
	fmt.Printf("cp_push_p99_ms %.1f ms\n", float64(p(0.99).Microseconds())/1000)
	fmt.Fprintf(os.Stderr, "push to %d clients, %d changes: p50 %v p90 %v p99 %v max %v; %d deliveries missing (superseded by a later change of the same pod)\n",
		nClients, len(changes), p(0.5), p(0.9), p(0.99), lat[len(lat)-1], missing)
	return nil
}
