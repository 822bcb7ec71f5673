package main

import (
	"bytes"
	"encoding/json"
	"errors"
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
		Pods: func() inpodstate.Dump {
			return inpodstate.Dump{SnapshotReceived: true, Pods: map[string]inpodstate.PodState{
				"pod-uid-1": {Info: inpodstate.Workload{UID: "pod-uid-1", Name: "client", Namespace: "demo"}, State: inpodstate.StateUp, Netns: "netns[dev=4,ino=42]"},
			}}
		},
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
			"NAMESPACE POD NAME ADDRESS NODE WAYPOINT PROTOCOL",
			"demo client 10.0.0.1 node0 None HBONE",
			"legacy db 10.0.2.1 node1 None TCP",
		}},
		{"services", []string{
			"NAMESPACE SERVICE NAME SERVICE VIP WAYPOINT ENDPOINTS",
			"demo echo 10.96.0.10 None 1/1",
		}},
		{"policies", []string{
			"NAMESPACE POLICY NAME ACTION SCOPE",
			"demo allow-client Allow Namespace",
		}},
		{"certificates", []string{
			"CERTIFICATE NAME TYPE STATUS VALID CERT SERIAL NUMBER NOT AFTER NOT BEFORE",
			"spiffe://cluster.local/ns/demo/sa/sa-client Leaf Available false NA 2030-01-01T00:00:00Z NA",
		}},
		{"pods", []string{
			"UID POD STATE NETNS SINCE ERROR",
			"pod-uid-1 demo/client Up netns[dev=4,ino=42] - -",
		}},
	} {
		var buf bytes.Buffer
		if err := render(&buf, d, tc.section, dumpFilter{}); err != nil {
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
	if err := render(&bytes.Buffer{}, d, "nonsense", dumpFilter{}); err == nil {
		t.Error("unknown section accepted")
	}
}

func TestRunWithFile(t *testing.T) {
	p := filepath.Join(t.TempDir(), "dump.json")
	if err := os.WriteFile(p, cannedDump(t), 0o644); err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := run([]string{"config-dump", "--file", p}, &buf, &buf); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(buf.String(), "# node proxy: file "+p+" (generation ") {
		t.Errorf("config-dump does not say which proxy it read:\n%s", buf.String())
	}
	for _, s := range sectionNames() {
		if !strings.Contains(buf.String(), "== "+s+" (generation ") {
			t.Errorf("all-sections output lacks %s:\n%s", s, buf.String())
		}
	}
	for _, cmd := range []string{"check", "explain"} {
		buf.Reset()
		// Flags after the positional arguments work too.
		if err := run([]string{cmd, "demo/other", "10.96.0.10:80", "-f", p}, &buf, &buf); !errors.Is(err, errDenied) {
			t.Errorf("%s = %v, want errDenied\n%s", cmd, err, buf.String())
		}
		if !strings.Contains(buf.String(), "proxy:        file "+p) {
			t.Errorf("%s does not say which proxy it read:\n%s", cmd, buf.String())
		}
	}
	if err := run([]string{"frobnicate", "--file", p}, &buf, &buf); err == nil {
		t.Error("unknown command accepted")
	}
	if err := run([]string{"explain", "-f", p, "-o", "xml", "demo/client", "10.96.0.10:80"}, &buf, &buf); err == nil {
		t.Error("unknown output format accepted")
	}
}
