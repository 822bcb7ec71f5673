package e2e

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/ztunnel-go/ztunnel-go/cni/rules"
	"github.com/ztunnel-go/ztunnel-go/hbone"
	"github.com/ztunnel-go/ztunnel-go/internal/controlplane/ca"
	"github.com/ztunnel-go/ztunnel-go/internal/identity"
	"github.com/ztunnel-go/ztunnel-go/internal/netns"
	"github.com/ztunnel-go/ztunnel-go/internal/node/config"
	"github.com/ztunnel-go/ztunnel-go/internal/node/state"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/meshlab"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/testcluster"
	"github.com/ztunnel-go/ztunnel-go/proxy"
)

// meshEnv is a two-node test cluster whose captured pods run the real
// proxy.WorkloadProxy in-process, with real in-pod capture rules, a
// state.Store fed with WDS protobufs the test builds, and certificates
// from a test CA.
type meshEnv struct {
	t       *testing.T
	c       *testcluster.Cluster
	store   *state.Store
	ca      *ca.CA
	certs   *identity.StaticSource
	reg     *prometheus.Registry
	metrics *proxy.Metrics
	logs    *observer.ObservedLogs
	log     *zap.Logger
}

func newMeshEnv(t *testing.T) *meshEnv {
	t.Helper()
	c := testcluster.New(t, testcluster.Options{Nodes: 2})
	authority, err := ca.New(ca.Options{})
	if err != nil {
		t.Fatal(err)
	}
	core, logs := observer.New(zap.InfoLevel)
	reg := prometheus.NewRegistry()
	m := &meshEnv{
		t: t, c: c, store: state.NewStore(), ca: authority, certs: identity.NewStaticSource(),
		reg: reg, metrics: proxy.NewMetrics(reg), logs: logs, log: zap.New(core),
	}
	t.Cleanup(func() {
		if t.Failed() {
			for _, e := range logs.All() {
				if e.Level >= zap.WarnLevel {
					t.Logf("log: %s %s %v", e.Level, e.Message, e.ContextMap())
				}
			}
		}
	})
	return m
}

// id is the identity of service account sa in namespace ns.
func meshID(ns, sa string) identity.Identity { return identity.MustNew("cluster.local", ns, sa) }

// issue gives the identity a certificate.
func (m *meshEnv) issue(id identity.Identity) {
	m.t.Helper()
	wc, err := m.ca.Issue(id, time.Hour)
	if err != nil {
		m.t.Fatal(err)
	}
	m.certs.Set(wc)
}

// deps are node n's proxy dependencies (its NODE_NAME).
func (m *meshEnv) deps(n *testcluster.Node) *proxy.Deps {
	return &proxy.Deps{
		Store: m.store, Certs: m.certs, Metrics: m.metrics, Log: m.log,
		Config: &config.Config{
			NodeName: n.Name, TrustDomain: "cluster.local", PacketMark: rules.ZtunnelMark,
			InpodPortReuse: true, IPv6Enabled: true, EnableOrigSrc: true,
			PoolMaxStreamsPerConn: 100, PoolUnusedRelease: time.Minute,
		},
	}
}

// addPod adds a pod serving the test apps (echo on 8080, whoami on 8081).
// A captured pod gets the in-pod rules and a running WorkloadProxy.
func (m *meshEnv) addPod(n *testcluster.Node, name, sa string, captured bool) *meshPod {
	m.t.Helper()
	p, err := n.AddPod(ctxT(m.t, 30*time.Second), testcluster.PodSpec{
		Name: name, Namespace: "apps", ServiceAccount: sa, Uncaptured: !captured,
	})
	if err != nil {
		m.t.Fatal(err)
	}
	mp := &meshPod{Pod: p, env: m, id: meshID("apps", sa)}
	m.issue(mp.id)
	serveApps(m.t, p)
	if captured {
		h, err := p.Handle()
		if err != nil {
			m.t.Fatal(err)
		}
		rs, err := rules.InPod(rules.PodSettings{})
		if err != nil {
			m.t.Fatal(err)
		}
		if err := rules.NewKernelApplier(rules.KernelConfig{Netns: h, Mode: rules.DetectMode()}).Apply(rs); err != nil {
			m.t.Fatal(err)
		}
		mp.proxy = mp.startProxy()
	}
	return mp
}

// meshPod is a pod of the mesh with its proxy (nil when uncaptured).
type meshPod struct {
	*testcluster.Pod
	env   *meshEnv
	id    identity.Identity
	proxy *proxy.WorkloadProxy
}

// startProxy runs a WorkloadProxy for the pod (a second one binds the
// same ports alongside the first, as a restarting node proxy does).
func (p *meshPod) startProxy() *proxy.WorkloadProxy {
	t := p.env.t
	t.Helper()
	h, err := p.Handle()
	if err != nil {
		t.Fatal(err)
	}
	wp, err := proxy.NewWorkloadProxy(p.env.deps(p.Node), proxy.WorkloadInfo{
		UID: p.UID, Name: p.Name, Namespace: p.Namespace, ServiceAccount: p.ServiceAccount,
	}, h)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- wp.Serve(context.Background()) }()
	t.Cleanup(func() {
		wp.Close()
		if err := <-done; err != nil {
			t.Errorf("%s: Serve: %v", p.Name, err)
		}
	})
	return wp
}

// serveApps runs the pod's applications: 8080 echoes until EOF, 8081
// answers with the client address it sees (and waits for EOF).
func serveApps(t *testing.T, p *testcluster.Pod) {
	t.Helper()
	for port, handle := range map[int]func(net.Conn){
		8080: func(c net.Conn) {
			io.Copy(c, c)
			c.(*net.TCPConn).CloseWrite()
		},
		8081: func(c net.Conn) {
			fmt.Fprintf(c, "%s\n", c.RemoteAddr().(*net.TCPAddr).AddrPort().Addr().Unmap())
			// Read the request to its end before closing: closing with
			// unread data would reset the connection.
			io.Copy(io.Discard, c)
		},
	} {
		ln, err := p.Listen(fmt.Sprintf(":%d", port))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ln.Close() })
		go acceptLoop(ln, handle)
	}
}

// roundTrip connects from the pod to dst as its application would (so the
// capture rules apply), sends payload, half-closes and returns what came
// back.
func roundTrip(t *testing.T, from *testcluster.Pod, dst netip.AddrPort, payload []byte) ([]byte, error) {
	t.Helper()
	return meshlab.RoundTrip(ctxT(t, 20*time.Second), from, dst, payload)
}

// accessLines returns the access-log lines whose fields contain all of
// want (compared as strings).
func (m *meshEnv) accessLines(want map[string]string) []map[string]any {
	var out []map[string]any
	for _, e := range m.logs.FilterMessage("connection complete").All() {
		f := e.ContextMap()
		ok := true
		for k, v := range want {
			if fmt.Sprint(f[k]) != v {
				ok = false
				break
			}
		}
		if ok {
			out = append(out, f)
		}
	}
	return out
}

// metric sums the samples of the counter family name whose labels include
// all of want.
func (m *meshEnv) metric(name string, want map[string]string) float64 {
	m.t.Helper()
	mfs, err := m.reg.Gather()
	if err != nil {
		m.t.Fatal(err)
	}
	sum := 0.0
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, s := range mf.GetMetric() {
			if labelsMatch(s.GetLabel(), want) {
				sum += s.GetCounter().GetValue()
			}
		}
	}
	return sum
}

func labelsMatch(ls []*dto.LabelPair, want map[string]string) bool {
	n := 0
	for _, l := range ls {
		if v, ok := want[l.GetName()]; ok {
			if v != l.GetValue() {
				return false
			}
			n++
		}
	}
	return n == len(want)
}

// testWaypoint is a minimal waypoint: it terminates HBONE with its own
// identity, records each CONNECT's authority, and re-originates HBONE to
// the pod the test maps that authority to.
type testWaypoint struct {
	mu          sync.Mutex
	authorities []string
	peers       []string
}

func startTestWaypoint(t *testing.T, p *meshPod, routes map[netip.AddrPort]struct {
	next, authority netip.AddrPort
	id              identity.Identity
}) *testWaypoint {
	t.Helper()
	h, err := p.Handle()
	if err != nil {
		t.Fatal(err)
	}
	pool, err := hbone.NewPool(hbone.PoolConfig{ClientConfig: hbone.ClientConfig{
		Certs: p.env.certs,
		Dial: func(ctx context.Context, _ netip.Addr, hop netip.AddrPort) (net.Conn, error) {
			return h.Dial(ctx, "tcp", hop, netns.SockOpts{})
		},
	}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pool.Close() })
	w := &testWaypoint{}
	srv, err := hbone.NewServer(hbone.ServerConfig{
		Identity: p.id, Certs: p.env.certs,
		Handler: hbone.HandlerFunc(func(ctx context.Context, req *hbone.Request) hbone.Reply {
			w.mu.Lock()
			w.authorities = append(w.authorities, req.Authority.String())
			w.peers = append(w.peers, req.Peer.String())
			w.mu.Unlock()
			r, ok := routes[req.Authority]
			if !ok {
				return hbone.Reply{Status: 503}
			}
			tun, err := pool.Connect(ctx, &hbone.ConnectRequest{
				Key:       hbone.Key{Src: p.id, Dst: []identity.Identity{r.id}, SrcIP: p.IP, NextHop: r.next},
				Authority: r.authority,
			})
			if err != nil {
				return hbone.Reply{Status: 503}
			}
			return hbone.Reply{Status: 200, Upstream: tun}
		}),
	})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := p.Listen(":15008")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return w
}

func (w *testWaypoint) seen() (authorities, peers []string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]string(nil), w.authorities...), append([]string(nil), w.peers...)
}

// payload is n bytes of a recognizable pattern, so a capture can tell
// whether it ever crossed the wire in clear.
func payload(n int) []byte {
	return bytes.Repeat([]byte(payloadMarker), n/len(payloadMarker)+1)[:n]
}

const payloadMarker = "ztg-e2e-cleartext-payload-marker;"

func shortErr(err error) string {
	if err == nil {
		return "<nil>"
	}
	s := err.Error()
	if i := strings.LastIndex(s, ": "); i > 0 {
		return s[i+2:]
	}
	return s
}
