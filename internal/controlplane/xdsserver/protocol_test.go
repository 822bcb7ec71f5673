package xdsserver

import (
	"context"
	"slices"
	"testing"
	"time"

	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/ztunnel-go/ztunnel-go/internal/api/workloadapi"

	"github.com/ztunnel-go/ztunnel-go/internal/xds"
)

// rawStream is a hand-driven ADS stream for protocol-level server tests.
type rawStream struct {
	t  *testing.T
	st discovery.AggregatedDiscoveryService_DeltaAggregatedResourcesClient
}

func dialRaw(t *testing.T, addr string) *rawStream {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	t.Cleanup(cancel)
	st, err := discovery.NewAggregatedDiscoveryServiceClient(conn).DeltaAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return &rawStream{t: t, st: st}
}

func (r *rawStream) send(req *discovery.DeltaDiscoveryRequest) {
	r.t.Helper()
	if err := r.st.Send(req); err != nil {
		r.t.Fatal(err)
	}
}

// recv returns the next response with its upserted names sorted, and ACKs it.
func (r *rawStream) recv() (resp *discovery.DeltaDiscoveryResponse, names []string) {
	r.t.Helper()
	resp, err := r.st.Recv()
	if err != nil {
		r.t.Fatal(err)
	}
	for _, res := range resp.GetResources() {
		names = append(names, res.GetName())
	}
	slices.Sort(names)
	r.send(&discovery.DeltaDiscoveryRequest{TypeUrl: resp.GetTypeUrl(), ResponseNonce: resp.GetNonce()})
	return resp, names
}

func TestServerProtocol(t *testing.T) {
	srv := startServer(t, "127.0.0.1:0")
	srv.SetResources(xds.AddressType, addrSet(map[string]*workloadapi.Address{
		"a": workload("a", "10.0.0.1"), "b": workload("b", "10.0.0.2"), "c": workload("c", "10.0.0.3"),
	}))
	srv.SetResources(xds.AuthorizationType, nil)
	v := srv.Versions(xds.AddressType)

	t.Run("resume: unchanged skipped, stale resent, unknown removed", func(t *testing.T) {
		r := dialRaw(t, srv.addr)
		r.send(&discovery.DeltaDiscoveryRequest{TypeUrl: xds.AddressType, InitialResourceVersions: map[string]string{
			"a": v["a"], "b": "stale", "gone": "v0",
		}})
		resp, names := r.recv()
		if !slices.Equal(names, []string{"b", "c"}) || !slices.Equal(resp.GetRemovedResources(), []string{"gone"}) {
			t.Errorf("got upserts %v removes %v, want [b c] and [gone]", names, resp.GetRemovedResources())
		}
	})

	t.Run("explicit names (on-demand)", func(t *testing.T) {
		r := dialRaw(t, srv.addr)
		r.send(&discovery.DeltaDiscoveryRequest{TypeUrl: xds.AddressType, ResourceNamesSubscribe: []string{"a", "missing"}})
		if _, names := r.recv(); !slices.Equal(names, []string{"a"}) {
			t.Fatalf("first response %v, want [a]", names)
		}
		r.send(&discovery.DeltaDiscoveryRequest{TypeUrl: xds.AddressType, ResourceNamesSubscribe: []string{"b"}})
		if _, names := r.recv(); !slices.Equal(names, []string{"b"}) {
			t.Fatalf("after subscribing b: %v, want [b]", names)
		}
		// A change to c (not subscribed) and then to a: only a arrives.
		srv.SetResources(xds.AddressType, addrSet(map[string]*workloadapi.Address{
			"a": workload("a", "10.0.0.1"), "b": workload("b", "10.0.0.2"), "c": workload("c", "10.0.0.33"),
		}))
		srv.SetResources(xds.AddressType, addrSet(map[string]*workloadapi.Address{
			"a": workload("a", "10.0.0.11"), "b": workload("b", "10.0.0.2"), "c": workload("c", "10.0.0.33"),
		}))
		if _, names := r.recv(); !slices.Equal(names, []string{"a"}) {
			t.Fatalf("after changes: %v, want [a]", names)
		}
	})

	t.Run("no type URL is rejected", func(t *testing.T) {
		r := dialRaw(t, srv.addr)
		r.send(&discovery.DeltaDiscoveryRequest{})
		if _, err := r.st.Recv(); err == nil {
			t.Fatal("stream without type_url was served")
		}
	})
}

// TestServerWaitsForACK: a change made while a response is unacknowledged is
// sent only after the ACK, together with later ones.
func TestServerWaitsForACK(t *testing.T) {
	srv := startServer(t, "127.0.0.1:0")
	srv.SetResources(xds.AddressType, addrSet(map[string]*workloadapi.Address{"a": workload("a", "10.0.0.1")}))
	srv.SetResources(xds.AuthorizationType, nil)
	r := dialRaw(t, srv.addr)
	r.send(&discovery.DeltaDiscoveryRequest{TypeUrl: xds.AddressType})
	first, err := r.st.Recv() // not ACKed yet
	if err != nil {
		t.Fatal(err)
	}
	srv.SetResources(xds.AddressType, addrSet(map[string]*workloadapi.Address{"a": workload("a", "10.0.0.1"), "b": workload("b", "10.0.0.2")}))
	srv.SetResources(xds.AddressType, addrSet(map[string]*workloadapi.Address{"a": workload("a", "10.0.0.1"), "b": workload("b", "10.0.0.2"), "c": workload("c", "10.0.0.3")}))
	r.send(&discovery.DeltaDiscoveryRequest{TypeUrl: xds.AddressType, ResponseNonce: first.GetNonce()})
	if _, names := r.recv(); !slices.Equal(names, []string{"b", "c"}) {
		t.Errorf("after ACK got %v, want [b c] in one response", names)
	}
}
