package xdsserver

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	"github.com/ztunnel-go/ztunnel-go/internal/api/securityapi"
	"github.com/ztunnel-go/ztunnel-go/internal/api/workloadapi"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/testpki"

	"github.com/ztunnel-go/ztunnel-go/internal/xds"
)

// waitTimeout bounds every testkit.Eventually here: a generous deadline that
// only guards against hangs (no timing is asserted).
const waitTimeout = 15 * time.Second

// fakeSink is an in-memory Sink. It rejects resources named "bad*" with a
// ResourceErrors naming them and applies the rest.
type fakeSink struct {
	mu    sync.Mutex
	addrs map[string]*workloadapi.Address
	authz map[string]*securityapi.Authorization
	calls []sinkCall
}

type sinkCall struct {
	typeURL string
	upserts []string // sorted
	removes []string // sorted
}

func newFakeSink() *fakeSink {
	return &fakeSink{addrs: map[string]*workloadapi.Address{}, authz: map[string]*securityapi.Authorization{}}
}

func applyFake[M proto.Message](s *fakeSink, typeURL string, store map[string]M, upserts map[string]M, removes []string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	call := sinkCall{typeURL: typeURL, removes: slices.Sorted(slices.Values(removes))}
	bad := xds.ResourceErrors{}
	for name, m := range upserts {
		call.upserts = append(call.upserts, name)
		if strings.HasPrefix(name, "bad") {
			bad[name] = errors.New("fake sink refuses bad names")
			continue
		}
		store[name] = m
	}
	sort.Strings(call.upserts)
	for _, n := range removes {
		delete(store, n)
	}
	s.calls = append(s.calls, call)
	if len(bad) > 0 {
		return bad
	}
	return nil
}

func (s *fakeSink) ApplyAddresses(upserts map[string]*workloadapi.Address, removes []string) error {
	return applyFake(s, xds.AddressType, s.addrs, upserts, removes)
}

func (s *fakeSink) ApplyAuthorizations(upserts map[string]*securityapi.Authorization, removes []string) error {
	return applyFake(s, xds.AuthorizationType, s.authz, upserts, removes)
}

// names returns the sorted names held for typeURL.
func (s *fakeSink) names(typeURL string) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	if typeURL == xds.AddressType {
		for n := range s.addrs {
			out = append(out, n)
		}
	} else {
		for n := range s.authz {
			out = append(out, n)
		}
	}
	sort.Strings(out)
	return out
}

func (s *fakeSink) address(name string) *workloadapi.Address {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.addrs[name]
}

func (s *fakeSink) callCount() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.calls)
}

// callsSince returns the calls after the first n.
func (s *fakeSink) callsSince(n int) []sinkCall {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.calls[n:])
}

func waitClosed(t *testing.T, what string, ch <-chan struct{}) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(15 * time.Second):
		t.Fatalf("timed out waiting for %s", what)
	}
}

func workload(uid, ip string) *workloadapi.Address {
	return &workloadapi.Address{Type: &workloadapi.Address_Workload{Workload: &workloadapi.Workload{
		Uid: uid, Name: uid, Namespace: "default", Addresses: [][]byte{net.ParseIP(ip).To4()},
		TunnelProtocol: workloadapi.TunnelProtocol_HBONE,
	}}}
}

func policy(ns, name string) *securityapi.Authorization {
	return &securityapi.Authorization{Name: name, Namespace: ns, Scope: securityapi.Scope_NAMESPACE}
}

func addrSet(m map[string]*workloadapi.Address) map[string]proto.Message {
	out := map[string]proto.Message{}
	for k, v := range m {
		out[k] = v
	}
	return out
}

func authzSet(m map[string]*securityapi.Authorization) map[string]proto.Message {
	out := map[string]proto.Message{}
	for k, v := range m {
		out[k] = v
	}
	return out
}

// testServer is a Server behind a real grpc.Server on 127.0.0.1.
type testServer struct {
	*Server
	addr string
	gs   *grpc.Server
	logs *observer.ObservedLogs
	reg  *prometheus.Registry
	reqs *requestRecorder
}

// startServer serves a new Server on addr ("127.0.0.1:0" for a fresh port).
func startServer(t *testing.T, addr string, opts ...grpc.ServerOption) *testServer {
	t.Helper()
	core, logs := observer.New(zap.DebugLevel)
	reg := prometheus.NewRegistry()
	rec := &requestRecorder{}
	srv := NewServer(ServerConfig{Log: zap.New(core), Registerer: reg})
	opts = append(opts, grpc.ChainStreamInterceptor(rec.intercept))
	gs := grpc.NewServer(opts...)
	srv.Register(gs)
	var lis net.Listener
	var err error
	// Re-listening on a just-closed port can race the kernel briefly.
	for range 100 {
		if lis, err = net.Listen("tcp", addr); err == nil {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("listen %s: %v", addr, err)
	}
	go func() { _ = gs.Serve(lis) }()
	ts := &testServer{Server: srv, addr: lis.Addr().String(), gs: gs, logs: logs, reg: reg, reqs: rec}
	t.Cleanup(gs.Stop)
	return ts
}

// requestRecorder keeps every DeltaDiscoveryRequest the server receives.
type requestRecorder struct {
	mu      sync.Mutex
	reqs    []*discovery.DeltaDiscoveryRequest
	started int // streams that reached the service
}

func (r *requestRecorder) intercept(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, h grpc.StreamHandler) error {
	r.mu.Lock()
	r.started++
	r.mu.Unlock()
	return h(srv, &recordingStream{ServerStream: ss, r: r})
}

func (r *requestRecorder) streams() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.started
}

func (r *requestRecorder) all() []*discovery.DeltaDiscoveryRequest {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.reqs)
}

type recordingStream struct {
	grpc.ServerStream
	r *requestRecorder
}

func (s *recordingStream) RecvMsg(m any) error {
	err := s.ServerStream.RecvMsg(m)
	if req, ok := m.(*discovery.DeltaDiscoveryRequest); ok && err == nil {
		s.r.mu.Lock()
		s.r.reqs = append(s.r.reqs, proto.Clone(req).(*discovery.DeltaDiscoveryRequest))
		s.r.mu.Unlock()
	}
	return err
}

var testNode = xds.NodeInfo{PodName: "ztunnel-abc", PodNamespace: "istio-system", NodeName: "node-1", InstanceIPs: []string{"10.0.0.5"}}

type testClient struct {
	*xds.Client
	sink *fakeSink
	logs *observer.ObservedLogs
	reg  *prometheus.Registry
}

// startClient runs a client against addr until the test ends.
func startClient(t *testing.T, addr string, mods ...func(*xds.ClientConfig)) *testClient {
	t.Helper()
	core, logs := observer.New(zap.DebugLevel)
	reg := prometheus.NewRegistry()
	sink := newFakeSink()
	cfg := xds.ClientConfig{
		Address: addr, Insecure: true, Node: testNode, Sink: sink,
		Log: zap.New(core), Registerer: reg,
		MaxBackoff: 50 * time.Millisecond,
	}
	for _, m := range mods {
		m(&cfg)
	}
	c, err := xds.NewClient(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	return &testClient{Client: c, sink: sink, logs: logs, reg: reg}
}

// counter sums the counter name (label filter: key=value pairs) in reg.
func counter(t *testing.T, reg *prometheus.Registry, name string, labels ...string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	metric:
		for _, m := range mf.GetMetric() {
			for i := 0; i+1 < len(labels); i += 2 {
				found := false
				for _, lp := range m.GetLabel() {
					if lp.GetName() == labels[i] && lp.GetValue() == labels[i+1] {
						found = true
					}
				}
				if !found {
					continue metric
				}
			}
			switch {
			case m.GetCounter() != nil:
				sum += m.GetCounter().GetValue()
			case m.GetGauge() != nil:
				sum += m.GetGauge().GetValue()
			}
		}
	}
	return sum
}

// testPKI is a throwaway CA and a server certificate for 127.0.0.1.
type testPKI struct {
	pool   *x509.CertPool
	server tls.Certificate
}

func newTestPKI(t *testing.T) testPKI {
	t.Helper()
	ca := testpki.NewRoot(t, "xds test CA")
	return testPKI{pool: ca.Pool(), server: ca.Server(t, "127.0.0.1", "xds.test").TLS()}
}
