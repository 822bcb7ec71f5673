package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ztunnel-go/ztunnel-go/internal/api/securityapi"
	"github.com/ztunnel-go/ztunnel-go/internal/node/admin"
	"github.com/ztunnel-go/ztunnel-go/internal/node/certmanager"
	"github.com/ztunnel-go/ztunnel-go/internal/node/inpod/inpodstate"
	"github.com/ztunnel-go/ztunnel-go/internal/node/state"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/proxytest"
)

// cannedDump builds a mesh in a real state.Store and dumps it through the
// real admin Dumper, so the tests follow the admin server's format:
//
//	demo/client 10.0.0.1 (sa-client)      node0, HBONE
//	demo/other  10.0.0.2 (sa-other)       node0, HBONE
//	demo/server 10.0.1.1 (sa-server)      node1, HBONE, endpoint of echo (80→8080)
//	legacy/db   10.0.2.1                  node1, plaintext
//	service demo/echo VIP 10.96.0.10
//	policy demo/allow-client: ALLOW principal client on port 8080
func cannedDump(t *testing.T) []byte {
	t.Helper()
	s := state.NewStore()
	echo := proxytest.ServiceKey("demo", "echo")
	proxytest.Apply(t, s,
		proxytest.Pod("demo", "client", "10.0.0.1"),
		proxytest.Pod("demo", "other", "10.0.0.2"),
		proxytest.Pod("demo", "server", "10.0.1.1", proxytest.OnNode("node1"), proxytest.InService(echo, 80, 8080)),
		proxytest.Pod("legacy", "db", "10.0.2.1", proxytest.OnNode("node1"), proxytest.Plaintext()),
		proxytest.Service("demo", "echo", "10.96.0.10", []uint32{80, 8080}),
	)
	proxytest.ApplyPolicies(t, s, proxytest.Policy("demo", "allow-client", securityapi.Action_ALLOW,
		proxytest.Rule(proxytest.Principals("cluster.local/ns/demo/sa/sa-client"), proxytest.Ports(8080))))
	d := &admin.Dumper{
		State: s,
		Certs: func() []certmanager.CertDump {
			return []certmanager.CertDump{{Identity: "spiffe://cluster.local/ns/demo/sa/sa-client", State: certmanager.StateAvailable,
				CertChain: []certmanager.CertInfo{{ExpirationTime: "2030-01-01T00:00:00Z"}}, NextRefresh: "2029-12-31T12:00:00Z"}}
		},
		Sections: map[string]func() any{admin.KeyWorkloadState: func() any {
			return inpodstate.Dump{SnapshotReceived: true, Pods: map[string]inpodstate.PodState{
				"pod-uid-1": {Info: inpodstate.Workload{UID: "pod-uid-1", Name: "client", Namespace: "demo"}, State: inpodstate.StateUp, Netns: "netns[dev=4,ino=42]"},
			}}
		}},
	}
	b, err := json.Marshal(d.Build())
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestConfigDumpTables(t *testing.T) {
	d, err := parseDump(cannedDump(t))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		section string
		want    []string // each must be one line of the output, modulo spacing
	}{
		{"workloads", []string{
			"NAMESPACE NAME ADDRESSES NODE PROTOCOL IDENTITY HEALTHY WAYPOINT",
			"demo client 10.0.0.1 node0 HBONE spiffe://cluster.local/ns/demo/sa/sa-client yes -",
			"legacy db 10.0.2.1 node1 NONE spiffe://cluster.local/ns/legacy/sa/sa-db yes -",
		}},
		{"services", []string{
			"NAMESPACE HOSTNAME VIPS PORTS ENDPOINTS WAYPOINT",
			"demo echo.demo.svc.cluster.local 10.96.0.10/32 80→8080 1/1 -",
		}},
		{"policies", []string{
			"NAMESPACE NAME SCOPE ACTION RULES DRY-RUN",
			"demo allow-client NAMESPACE ALLOW 1 no",
		}},
		{"certificates", []string{
			"IDENTITY STATE EXPIRES NEXT-REFRESH ERROR",
			"spiffe://cluster.local/ns/demo/sa/sa-client Available 2030-01-01T00:00:00Z 2029-12-31T12:00:00Z -",
		}},
		{"pods", []string{
			"UID POD STATE NETNS SINCE ERROR",
			"pod-uid-1 demo/client Up netns[dev=4,ino=42] - -",
		}},
	} {
		var buf bytes.Buffer
		if err := render(&buf, d, tc.section); err != nil {
			t.Fatal(err)
		}
		lines := map[string]bool{}
		for _, l := range strings.Split(buf.String(), "\n") {
			lines[strings.Join(strings.Fields(l), " ")] = true
		}
		for _, w := range tc.want {
			if !lines[w] {
				t.Errorf("%s: no line %q in\n%s", tc.section, w, buf.String())
			}
		}
	}
	if err := render(&bytes.Buffer{}, d, "nonsense"); err == nil {
		t.Error("unknown section accepted")
	}
}

func TestCheck(t *testing.T) {
	d, err := parseDump(cannedDump(t))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, src, dst string
		denied         bool
		want           []string
	}{
		{"service VIP, allowed", "demo/client", "10.96.0.10:80", false, []string{
			"is service demo/echo.demo.svc.cluster.local",
			"route:        hbone: CONNECT 10.0.1.1:8080 to 10.0.1.1:15008",
			"peer must be: spiffe://cluster.local/ns/demo/sa/sa-server",
			"policies:     demo/allow-client",
			"policy:       ALLOW (explicitly allowed by demo/allow-client)",
		}},
		{"by source IP, other principal denied", "10.0.0.2", "10.96.0.10:80", true, []string{
			"source:       demo/other 10.0.0.2",
			"policy:       DENY (allow policies exist, but none allowed)",
		}},
		{"pod IP on a port the policy does not allow", proxytest.UID("demo", "client"), "10.0.1.1:9090", true, []string{
			"route:        hbone: CONNECT 10.0.1.1:9090 to 10.0.1.1:15008",
			"policy:       DENY",
		}},
		{"plaintext destination", "demo/client", "10.0.2.1:5432", false, []string{
			"route:        direct: plain TCP to 10.0.2.1:5432",
		}},
		{"outside the mesh", "demo/client", "192.0.2.1:443", false, []string{
			"route:        passthrough",
		}},
		{"recursive call refused", "demo/client", "127.0.0.1:15001", true, []string{
			"route:        refused at the source",
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var buf bytes.Buffer
			err := check(&buf, d, tc.src, netip.MustParseAddrPort(tc.dst))
			if tc.denied != errors.Is(err, errDenied) || (!tc.denied && err != nil) {
				t.Fatalf("err = %v, denied want %v\n%s", err, tc.denied, buf.String())
			}
			for _, w := range tc.want {
				if !strings.Contains(buf.String(), w) {
					t.Errorf("output lacks %q:\n%s", w, buf.String())
				}
			}
		})
	}
	if err := check(&bytes.Buffer{}, d, "demo/nobody", netip.MustParseAddrPort("10.96.0.10:80")); err == nil || errors.Is(err, errDenied) {
		t.Errorf("unknown source: %v", err)
	}
}

func TestRunWithFile(t *testing.T) {
	p := filepath.Join(t.TempDir(), "dump.json")
	if err := os.WriteFile(p, cannedDump(t), 0o644); err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := run([]string{"config-dump", "--file", p}, &buf); err != nil {
		t.Fatal(err)
	}
	for _, s := range sectionNames() {
		if !strings.Contains(buf.String(), "== "+s+" (generation ") {
			t.Errorf("all-sections output lacks %s:\n%s", s, buf.String())
		}
	}
	buf.Reset()
	if err := run([]string{"check", "--file", p, "demo/other", "10.96.0.10:80"}, &buf); !errors.Is(err, errDenied) {
		t.Errorf("check = %v, want errDenied", err)
	}
	if err := run([]string{"frobnicate", "--file", p}, &buf); err == nil {
		t.Error("unknown command accepted")
	}
}
