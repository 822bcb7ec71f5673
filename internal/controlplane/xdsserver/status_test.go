package xdsserver

import (
	"testing"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/ztunnel-go/ztunnel-go/internal/api/workloadapi"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/testkit"

	"github.com/ztunnel-go/ztunnel-go/internal/xds"
)

// typeStatus returns the status of typeURL on the only stream of nodeID.
func typeStatus(t *testing.T, s *Server, nodeID, typeURL string) (xds.StreamStatus, xds.TypeStatus, bool) {
	t.Helper()
	for _, ss := range s.Status() {
		if ss.NodeID != nodeID {
			continue
		}
		for _, ts := range ss.Types {
			if ts.TypeURL == typeURL {
				return ss, ts, true
			}
		}
		return ss, xds.TypeStatus{}, false
	}
	return xds.StreamStatus{}, xds.TypeStatus{}, false
}

// TestStatusSyncStates drives a raw stream through sent-not-acked (STALE),
// ACK (SYNCED), a push left unacked (STALE) and a NACK (STALE with its
// message), and checks the node metadata Status reports.
func TestStatusSyncStates(t *testing.T) {
	srv := startServer(t, "127.0.0.1:0")
	srv.SetResources(xds.AddressType, addrSet(map[string]*workloadapi.Address{"a": workload("a", "10.0.0.1")}))
	srv.SetResources(xds.AuthorizationType, nil)
	// The node as the client sends it (xds.NodeInfo), plus ISTIO_VERSION.
	n := &core.Node{Id: testNode.ID(), Metadata: &structpb.Struct{Fields: map[string]*structpb.Value{
		"NAME":          structpb.NewStringValue(testNode.PodName),
		"NAMESPACE":     structpb.NewStringValue(testNode.PodNamespace),
		"NODE_NAME":     structpb.NewStringValue(testNode.NodeName),
		"ISTIO_VERSION": structpb.NewStringValue("1.2.3-test"),
	}}}
	r := dialRaw(t, srv.addr)
	r.send(&discovery.DeltaDiscoveryRequest{TypeUrl: xds.AddressType, Node: n})
	first, err := r.st.Recv()
	if err != nil {
		t.Fatal(err)
	}
	want := func(sync, nack string) xds.TypeStatus {
		t.Helper()
		var got xds.TypeStatus
		testkit.Eventually(t, waitTimeout, "status "+sync, func() bool {
			_, ts, ok := typeStatus(t, srv.Server, n.GetId(), xds.AddressType)
			got = ts
			return ok && ts.Sync == sync && ts.NACK == nack
		})
		return got
	}
	ts := want(xds.SyncStale, "")
	if ts.LastSent != first.GetNonce() || ts.LastAcked != "" || !ts.Wildcard || ts.Held != 1 {
		t.Errorf("before ACK: %+v, want nonce %s sent, none acked, wildcard, 1 held", ts, first.GetNonce())
	}
	ss, _, _ := typeStatus(t, srv.Server, n.GetId(), xds.AddressType)
	if ss.Kind != xds.KindNodeProxy || ss.Pod != "istio-system/ztunnel-abc" || ss.Node != "node-1" ||
		ss.Version != "1.2.3-test" || ss.Connected.IsZero() || time.Since(ss.Connected) > time.Minute || ss.Peer == "" {
		t.Errorf("stream: %+v", ss)
	}

	r.send(&discovery.DeltaDiscoveryRequest{TypeUrl: xds.AddressType, ResponseNonce: first.GetNonce()})
	if ts := want(xds.SyncSynced, ""); ts.LastAcked != first.GetNonce() || ts.AckedAt.IsZero() {
		t.Errorf("after ACK: %+v", ts)
	}

	srv.SetResources(xds.AddressType, addrSet(map[string]*workloadapi.Address{"a": workload("a", "10.0.0.1"), "b": workload("b", "10.0.0.2")}))
	second, err := r.st.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if ts := want(xds.SyncStale, ""); ts.LastSent != second.GetNonce() || ts.LastAcked != first.GetNonce() || ts.Held != 2 {
		t.Errorf("push unacked: %+v", ts)
	}
	r.send(&discovery.DeltaDiscoveryRequest{TypeUrl: xds.AddressType, ResponseNonce: second.GetNonce(),
		ErrorDetail: &rpcstatus.Status{Message: "b is bad"}})
	if ts := want(xds.SyncStale, "b is bad"); ts.LastAcked != first.GetNonce() {
		t.Errorf("after NACK: %+v", ts)
	}
	// A later accepted push clears the NACK.
	srv.SetResources(xds.AddressType, addrSet(map[string]*workloadapi.Address{"a": workload("a", "10.0.0.1"), "b": workload("b", "10.0.0.22")}))
	r.recv()
	want(xds.SyncSynced, "")

	// A waypoint's stream is told apart by its subscription; a type
	// subscribed and not answered yet is NOT SENT.
	w := dialRaw(t, srv.addr)
	wn := &core.Node{Id: "waypoint-1"}
	w.send(&discovery.DeltaDiscoveryRequest{TypeUrl: xds.WaypointType, Node: wn, ResourceNamesSubscribe: []string{"ns/wp"}})
	w.recv()
	testkit.Eventually(t, waitTimeout, "waypoint kind", func() bool {
		ss, ts, ok := typeStatus(t, srv.Server, "waypoint-1", xds.WaypointType)
		return ok && ss.Kind == xds.KindWaypoint && ts.Names == 1 && !ts.Wildcard && ts.Sync == xds.SyncSynced
	})
	var ss2 streamStatus
	ss2.noteSubscription(xds.AddressType, &subscription{wildcard: true})
	if types, _, _, _, _ := ss2.snapshot(); len(types) != 1 || types[0].Sync != xds.SyncNotSent {
		t.Errorf("subscribed, nothing sent: %+v", types)
	}
}
