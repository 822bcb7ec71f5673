package xdsserver

import (
	"maps"
	"slices"
	"sync"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/ztunnel-go/ztunnel-go/internal/api/securityapi"
	"github.com/ztunnel-go/ztunnel-go/internal/api/waypointapi"
	"github.com/ztunnel-go/ztunnel-go/internal/api/workloadapi"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/testkit"

	"github.com/ztunnel-go/ztunnel-go/internal/xds"
)

// waypointSink is a fakeSink that also takes WaypointType.
type waypointSink struct {
	*fakeSink
	mu   sync.Mutex
	cfgs map[string]*waypointapi.Config
}

func (s *waypointSink) ApplyWaypoints(upserts map[string]*waypointapi.Config, removes []string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	maps.Copy(s.cfgs, upserts)
	for _, n := range removes {
		delete(s.cfgs, n)
	}
	return nil
}

func (s *waypointSink) names() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Sorted(maps.Keys(s.cfgs))
}

func wpSet(names ...string) map[string]proto.Message {
	m := map[string]proto.Message{}
	for _, n := range names {
		m[n] = &waypointapi.Config{Name: n, Identity: "spiffe://td/ns/default/sa/" + n}
	}
	return m
}

// TestWaypointSubscription: a waypoint client receives its own WaypointType
// resource and no other; a node proxy client receives none; Synced waits for
// the waypoint's config type; changes and removals of its resource reach it.
func TestWaypointSubscription(t *testing.T) {
	srv := startServer(t, "127.0.0.1:0")
	srv.SetResources(xds.WaypointType, wpSet("default/wp", "default/other"))
	srv.SetResources(xds.AddressType, addrSet(map[string]*workloadapi.Address{
		"Kubernetes//Pod/default/a": workload("Kubernetes//Pod/default/a", "10.1.0.1"),
	}))
	srv.SetResources(xds.AuthorizationType, authzSet(map[string]*securityapi.Authorization{}))

	ws := &waypointSink{fakeSink: newFakeSink(), cfgs: map[string]*waypointapi.Config{}}
	wc := startClient(t, srv.addr, func(c *xds.ClientConfig) { c.Sink = ws; c.Waypoint = "default/wp" })
	node := startClient(t, srv.addr)
	waitClosed(t, "waypoint Synced", wc.Synced())
	waitClosed(t, "node Synced", node.Synced())

	if got := ws.names(); !slices.Equal(got, []string{"default/wp"}) {
		t.Fatalf("waypoint configs = %v, want only default/wp", got)
	}
	if got := ws.names(); len(got) == 1 && ws.cfgs["default/wp"].GetIdentity() != "spiffe://td/ns/default/sa/default/wp" {
		t.Errorf("config decoded as %v", ws.cfgs["default/wp"])
	}
	if got := ws.fakeSink.names(xds.AddressType); !slices.Equal(got, []string{"Kubernetes//Pod/default/a"}) {
		t.Errorf("waypoint addresses = %v", got)
	}
	if v := node.ResourceVersions(xds.WaypointType); len(v) != 0 {
		t.Errorf("node proxy holds waypoint configs %v, want none", v)
	}
	for _, r := range srv.reqs.all() {
		if r.GetTypeUrl() == xds.WaypointType && !slices.Equal(r.GetResourceNamesSubscribe(), []string{"default/wp"}) && r.GetResponseNonce() == "" {
			t.Errorf("waypoint subscription %v, want exactly [default/wp]", r.GetResourceNamesSubscribe())
		}
	}

	// A change of another waypoint's config is not sent; a change of ours is.
	srv.SetResources(xds.WaypointType, map[string]proto.Message{
		"default/wp":    &waypointapi.Config{Name: "default/wp", TrafficType: "all"},
		"default/other": &waypointapi.Config{Name: "default/other", TrafficType: "all"},
	})
	testkit.Eventually(t, waitTimeout, "updated config", func() bool {
		ws.mu.Lock()
		defer ws.mu.Unlock()
		return ws.cfgs["default/wp"].GetTrafficType() == "all"
	})
	if got := ws.names(); !slices.Equal(got, []string{"default/wp"}) {
		t.Errorf("after update: waypoint configs = %v", got)
	}
	srv.SetResources(xds.WaypointType, wpSet("default/other"))
	testkit.Eventually(t, waitTimeout, "removal", func() bool { return len(ws.names()) == 0 })
}

// TestWaypointNeedsSink: a Waypoint subscription needs a WaypointSink.
func TestWaypointNeedsSink(t *testing.T) {
	_, err := xds.NewClient(xds.ClientConfig{Address: "127.0.0.1:1", Insecure: true, Node: testNode, Sink: newFakeSink(), Waypoint: "default/wp"})
	if err == nil {
		t.Fatal("NewClient accepted a Waypoint without a WaypointSink")
	}
}

// TestWaypointTypeNotGated: streams are answered once the workload API types
// are set, whether or not WaypointType has been.
func TestWaypointTypeNotGated(t *testing.T) {
	srv := startServer(t, "127.0.0.1:0")
	srv.SetResources(xds.AddressType, nil)
	srv.SetResources(xds.AuthorizationType, nil)
	c := startClient(t, srv.addr)
	waitClosed(t, "Synced", c.Synced())
}
