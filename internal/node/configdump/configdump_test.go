package configdump

import (
	"encoding/json"
	"net/netip"
	"strings"
	"testing"

	"github.com/ztunnel-go/ztunnel-go/internal/api/securityapi"
	"github.com/ztunnel-go/ztunnel-go/internal/node/inpod/inpodstate"
	"github.com/ztunnel-go/ztunnel-go/internal/node/rbac"
	"github.com/ztunnel-go/ztunnel-go/internal/node/state"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/proxytest"
)

// TestDumpIstioShape: the keys and value shapes Istio's ztunnel writes and
// istioctl reads: workloadIps, status, waypoint destination "network/ip",
// service vips as "network/ip" strings, ports and endpoint maps keyed by
// port and workload uid, rules as rule -> clause -> match with serde's
// tagged string matches, Rust enum names.
func TestDumpIstioShape(t *testing.T) {
	s := state.NewStore()
	echo := proxytest.ServiceKey("demo", "echo")
	proxytest.Apply(t, s,
		proxytest.Pod("demo", "client", "10.0.0.1", proxytest.WorkloadWaypoint(proxytest.WaypointIP("10.96.0.99"))),
		proxytest.Pod("demo", "server", "10.0.1.1", proxytest.InService(echo, 80, 8080), proxytest.Unhealthy()),
		proxytest.Pod("legacy", "db", "10.0.2.1", proxytest.Plaintext()),
		proxytest.Service("demo", "echo", "10.96.0.10", []uint32{80, 8080}, proxytest.ServiceWaypoint(proxytest.WaypointHost("demo", "waypoint"))),
	)
	proxytest.ApplyPolicies(t, s, proxytest.Policy("demo", "allow-client", securityapi.Action_ALLOW,
		proxytest.Rule(proxytest.Principals("cluster.local/ns/demo/sa/sa-client"), proxytest.Ports(8080)),
		proxytest.Rule(proxytest.NotPrincipalsPresence())))
	wls, svcs, pols := FromSnapshot(s.Load())
	b, err := json.Marshal(map[string]any{"workloads": wls, "services": svcs, "policies": pols})
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Workloads []map[string]any
		Services  []map[string]any
		Policies  []map[string]any
	}
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatal(err)
	}
	js := func(v any) string { b, _ := json.Marshal(v); return string(b) }
	byName := func(l []map[string]any, name string) map[string]any {
		for _, m := range l {
			if m["name"] == name {
				return m
			}
		}
		t.Fatalf("no %s in %s", name, js(l))
		return nil
	}
	client, server, db := byName(d.Workloads, "client"), byName(d.Workloads, "server"), byName(d.Workloads, "db")
	for _, c := range []struct{ got, want string }{
		{js(client["workloadIps"]), `["10.0.0.1"]`},
		{js(client["waypoint"]), `{"destination":"/10.96.0.99","hboneMtlsPort":15008}`},
		{js(client["status"]), `"Healthy"`},
		{js(client["protocol"]), `"HBONE"`},
		{js(client["workloadType"]), `"pod"`},
		{js(db["protocol"]), `"TCP"`},
		{js(server["status"]), `"Unhealthy"`},
		{js(server["services"]), `["` + echo + `"]`},
	} {
		if c.got != c.want {
			t.Errorf("workload field = %s, want %s", c.got, c.want)
		}
	}
	if _, ok := client["addresses"]; ok {
		t.Errorf("workload keeps the old addresses key: %s", js(client))
	}
	svc := byName(d.Services, "echo")
	uid := proxytest.UID("demo", "server")
	for _, c := range []struct{ got, want string }{
		{js(svc["vips"]), `["/10.96.0.10"]`},
		{js(svc["ports"]), `{"80":8080}`},
		{js(svc["waypoint"]), `{"destination":"demo/waypoint.demo.svc.cluster.local","hboneMtlsPort":15008}`},
		// Keys sorted: the endpoint went through a map.
		{js(svc["endpoints"]), `{"` + uid + `":{"address":"/10.0.1.1","port":{"80":8080},"service":"` + echo + `","status":"Unhealthy","workloadUid":"` + uid + `"}}`},
		{js(svc["visibility"]), `"Public"`},
	} {
		if c.got != c.want {
			t.Errorf("service field = %s, want %s", c.got, c.want)
		}
	}
	pol := byName(d.Policies, "allow-client")
	if got, want := js(pol["rules"]), `[[[{"principals":[{"Exact":"cluster.local/ns/demo/sa/sa-client"}]}],[{"destinationPorts":[8080]}]],[[{"notPrincipals":[{"Presence":[]}]}]]]`; got != want {
		t.Errorf("rules = %s\nwant    %s", got, want)
	}
	if pol["action"] != "Allow" || pol["scope"] != "Namespace" {
		t.Errorf("action %v scope %v", pol["action"], pol["scope"])
	}

	// Round trip of the enum names and string matches readers parse.
	var p Policy
	if err := json.Unmarshal([]byte(js(pol)), &p); err != nil {
		t.Fatal(err)
	}
	if sm, err := p.Rules[1][0][0].NotPrincipals[0].RBAC(); err != nil || sm.Kind != rbac.Presence {
		t.Errorf("presence match parsed as %+v, %v", sm, err)
	}
	if a, err := Parse[rbac.Action](Actions, "Deny"); err != nil || a != rbac.Deny {
		t.Errorf("Parse Deny = %v, %v", a, err)
	}
	if _, err := Parse[rbac.Action](Actions, "DENY"); err == nil {
		t.Error("an unknown name parsed")
	}
	if _, err := (StringMatch{}).RBAC(); err == nil {
		t.Error("a string match of no kind parsed")
	}
}

// TestGatewayRoundTrip: a destination in either form converts back; one
// in neither form is an error.
func TestGatewayRoundTrip(t *testing.T) {
	for _, g := range []*state.GatewayAddress{
		{Address: state.NetworkIP{IP: netip.MustParseAddr("10.96.0.9")}, HBONEPort: 15008},
		{Address: state.NetworkIP{Network: "net1", IP: netip.MustParseAddr("fd00::9")}, HBONEPort: 15008},
		{Hostname: state.NamespacedHostname{Namespace: "ns", Hostname: "wp.ns.svc.cluster.local"}, HBONEPort: 15008},
	} {
		back, err := FromGateway(g).Gateway()
		if err != nil || *back != *g {
			t.Errorf("%+v came back as %+v, %v", g, back, err)
		}
	}
	if _, err := (&GatewayAddress{Destination: "nonsense"}).Gateway(); err == nil {
		t.Error("a destination in neither form converted")
	}
}

// TestWorkloadStates: a connection is listed under the pod proxy of its
// local end (outbound: the source; inbound: the pod served), found by IP;
// one whose local end is no pod of this node is left out; draining
// proxies go beside workloadState.
func TestWorkloadStates(t *testing.T) {
	s := state.NewStore()
	proxytest.Apply(t, s, proxytest.Pod("demo", "client", "10.0.0.1"), proxytest.Pod("demo", "server", "10.0.0.2"),
		proxytest.Pod("demo", "remote", "10.0.9.9", proxytest.OnNode("node1")))
	d := inpodstate.Dump{SnapshotReceived: true, Pods: map[string]inpodstate.PodState{
		"u1": {Info: inpodstate.Workload{UID: "u1", Name: "client", Namespace: "demo"}, State: inpodstate.StateUp},
		"u2": {Info: inpodstate.Workload{UID: "u2", Name: "server", Namespace: "demo"}, State: inpodstate.StateUp},
	}, Draining: []inpodstate.PodState{{Info: inpodstate.Workload{UID: "u0", Name: "old", Namespace: "demo"}, State: inpodstate.StateDraining}}}
	conns := []Connection{
		{Src: "10.0.0.1:4000", Dst: "10.0.0.2:15008", OriginalDst: "10.96.0.1:80", HBONE: "10.0.0.2:8080", Tunnelled: true},
		{Inbound: true, Src: "10.0.0.1:4000", Dst: "10.0.0.2:15008", HBONE: "10.0.0.2:8080", Service: "echo.demo.svc.cluster.local", Tunnelled: true},
		{Inbound: true, Src: "10.0.9.9:5000", Dst: "10.0.0.2:8080"},
		{Src: "10.0.9.9:5000", Dst: "10.0.0.2:8080"}, // remote's: not this node's pod
	}
	ws, pp := WorkloadStates(d, conns, s.Load(), "", "cluster.local")
	b, _ := json.Marshal(ws)
	out := ws["u1"].Connections
	if out == nil || len(out.Outbound) != 1 || len(out.Inbound) != 0 || out.Outbound[0] != (OutboundConnection{Src: "10.0.0.1:4000", OriginalDst: "10.96.0.1:80", ActualDst: "10.0.0.2:15008", Protocol: "HBONE"}) {
		t.Errorf("client's connections: %s", b)
	}
	in := ws["u2"].Connections
	if in == nil || len(in.Inbound) != 2 || len(in.Outbound) != 0 || *in.Inbound[0].OriginalDst != "echo.demo.svc.cluster.local" ||
		in.Inbound[0].ActualDst != "10.0.0.2:8080" || in.Inbound[1].OriginalDst != nil || in.Inbound[1].Protocol != "TCP" {
		t.Errorf("server's connections: %s", b)
	}
	if !strings.Contains(string(b), `"originalDst":null`) || ws["u1"].Info.TrustDomain != "cluster.local" {
		t.Errorf("workloadState: %s", b)
	}
	if !pp.SnapshotReceived || len(pp.Draining) != 1 || pp.Draining[0].Info.UID != "u0" {
		t.Errorf("pod proxies: %+v", pp)
	}
}
