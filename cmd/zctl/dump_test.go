package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/ztunnel-go/ztunnel-go/internal/api/workloadapi"
	"github.com/ztunnel-go/ztunnel-go/internal/node/admin"
	"github.com/ztunnel-go/ztunnel-go/internal/node/state"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/proxytest"
)

// TestConfigDumpIstioctlShape: config-dump takes istioctl ztunnel-config's
// section names (singular, "secret", "all"), its filters (namespace under
// its three names, node, address) and -o json|yaml, printing the node
// proxy's own objects filtered.
func TestConfigDumpIstioctlShape(t *testing.T) {
	p := filepath.Join(t.TempDir(), "dump.json")
	if err := os.WriteFile(p, cannedDump(t), 0o644); err != nil {
		t.Fatal(err)
	}
	zctl := func(args ...string) (string, error) {
		var buf bytes.Buffer
		err := run(append([]string{"config-dump", "--file", p}, args...), &buf, &buf)
		return buf.String(), err
	}
	for _, tc := range []struct {
		args      []string
		has, lack []string
	}{
		{[]string{"workload", "--workload-namespace", "legacy"}, []string{"legacy db"}, []string{"demo client"}},
		{[]string{"workload", "--namespace", "demo"}, []string{"demo client"}, []string{"legacy"}},
		{[]string{"workload", "--node", "node0"}, []string{"demo client"}, []string{"legacy"}},
		{[]string{"workload", "--address", "10.0.2.1"}, []string{"legacy db"}, []string{"demo client"}},
		{[]string{"service", "--service-namespace", "other"}, []string{"SERVICE VIP"}, []string{"echo"}},
		{[]string{"policy", "--policy-namespace", "demo"}, []string{"allow-client"}, nil},
		{[]string{"secret"}, []string{"CERTIFICATE NAME", "Leaf"}, nil},
		{[]string{"all"}, []string{"== workloads", "== services", "== policies", "== certificates", "== pods"}, nil},
	} {
		out, err := zctl(tc.args...)
		if err != nil {
			t.Fatalf("config-dump %v: %v\n%s", tc.args, err, out)
		}
		flat := strings.Join(strings.Fields(out), " ")
		for _, w := range tc.has {
			if !strings.Contains(flat, w) {
				t.Errorf("config-dump %v: no %q in\n%s", tc.args, w, out)
			}
		}
		for _, w := range tc.lack {
			if strings.Contains(flat, w) {
				t.Errorf("config-dump %v: %q should be filtered out of\n%s", tc.args, w, out)
			}
		}
	}

	out, err := zctl("workload", "-o", "json", "--namespace", "legacy")
	if err != nil {
		t.Fatal(err)
	}
	var wls []map[string]any
	if err := json.Unmarshal([]byte(out), &wls); err != nil || len(wls) != 1 || wls[0]["name"] != "db" {
		t.Fatalf("-o json workload --namespace legacy: %v, %v\n%s", wls, err, out)
	}
	out, err = zctl("policy", "-o", "yaml")
	if err != nil || !strings.Contains(out, "name: allow-client") || !strings.Contains(out, "action: Allow") {
		t.Fatalf("-o yaml policy: %v\n%s", err, out)
	}
	out, err = zctl("all", "-o", "json")
	var all map[string]json.RawMessage
	if err != nil || json.Unmarshal([]byte(out), &all) != nil || len(all) != len(sectionNames()) {
		t.Fatalf("-o json all: %v, %d sections\n%.300s", err, len(all), out)
	}
	if _, err := zctl("bogus"); err == nil || !strings.Contains(err.Error(), `unknown section "bogus"`) {
		t.Errorf("an unknown section: %v", err)
	}
	if _, err := zctl("workload", "-o", "xml"); err == nil {
		t.Error("-o xml accepted")
	}
}

// TestDumpRebuildsWeightedWaypointsAndAppTunnels: the state zctl rebuilds
// from a node's config dump (for explain) keeps a service's weighted
// (canary) waypoints and a sandwiched workload's application tunnel, so
// explain decides as the node proxy does.
func TestDumpRebuildsWeightedWaypointsAndAppTunnels(t *testing.T) {
	s := state.NewStore()
	svc := proxytest.ServiceKey("demo", "reviews")
	proxytest.Apply(t, s,
		proxytest.Pod("demo", "waypoint", "10.0.5.1", proxytest.OnNode("node1"), func(w *workloadapi.Workload) {
			w.ApplicationTunnel = &workloadapi.ApplicationTunnel{Protocol: workloadapi.ApplicationTunnel_PROXY, Port: 15088}
		}),
		proxytest.Pod("demo", "reviews-v1", "10.0.6.1", proxytest.OnNode("node1"), proxytest.InService(svc, 9080, 9080)),
		proxytest.Service("demo", "reviews", "10.96.0.50", []uint32{9080, 9080}, func(ps *workloadapi.Service) {
			ps.WeightedWaypoints = []*workloadapi.WeightedWaypoint{
				{Destination: &workloadapi.GatewayAddress{HboneMtlsPort: 15008, Destination: &workloadapi.GatewayAddress_Hostname{
					Hostname: &workloadapi.NamespacedHostname{Namespace: "demo", Hostname: "waypoint.demo.svc.cluster.local"}}}, Weight: 90},
				{Destination: &workloadapi.GatewayAddress{HboneMtlsPort: 15008, Destination: &workloadapi.GatewayAddress_Hostname{
					Hostname: &workloadapi.NamespacedHostname{Namespace: "demo", Hostname: "waypoint-canary.demo.svc.cluster.local"}}}, Weight: 10},
			}
		}),
	)
	b, err := json.Marshal((&admin.Dumper{State: s}).Build())
	if err != nil {
		t.Fatal(err)
	}
	d, err := parseDump(b)
	if err != nil {
		t.Fatal(err)
	}
	snap, err := d.snapshot()
	if err != nil {
		t.Fatal(err)
	}
	orig := s.Load()
	want, got := orig.ServiceByHost(svc), snap.ServiceByHost(svc)
	if got == nil || !reflect.DeepEqual(got.WeightedWaypoints, want.WeightedWaypoints) || len(got.WeightedWaypoints) != 2 {
		t.Errorf("weighted waypoints rebuilt as %+v, want %+v", got, want.WeightedWaypoints)
	}
	var out bytes.Buffer
	if err := render(&out, d, "services", dumpFilter{}); err != nil {
		t.Fatal(err)
	}
	// The waypoints are not services of this dump: shown by address.
	if !strings.Contains(out.String(), "demo/waypoint.demo.svc.cluster.local(90),demo/waypoint-canary.demo.svc.cluster.local(10)") {
		t.Errorf("services table does not show the weighted waypoints:\n%s", out.String())
	}
	uid := proxytest.UID("demo", "waypoint")
	if at := snap.WorkloadByUID(uid).ApplicationTunnel; at == nil || *at != *orig.WorkloadByUID(uid).ApplicationTunnel {
		t.Errorf("application tunnel rebuilt as %+v, want %+v", at, orig.WorkloadByUID(uid).ApplicationTunnel)
	}
}
