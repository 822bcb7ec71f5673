package main

import (
	"bytes"
	"encoding/json"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/ztunnel-go/ztunnel-go/internal/daemon"
	"github.com/ztunnel-go/ztunnel-go/internal/identity"
	"github.com/ztunnel-go/ztunnel-go/internal/node/admin"
	"github.com/ztunnel-go/ztunnel-go/internal/node/state"
	"github.com/ztunnel-go/ztunnel-go/proxy"
)

// connLab opens two connections in a real proxy.Metrics (an outbound HBONE
// one from demo/client to demo/server, an inbound plaintext one from
// 10.0.9.9 to demo/client) and serves the node proxy's real admin handler.
func connLab(t *testing.T) (string, *proxy.Metrics) {
	t.Helper()
	m := proxy.NewMetrics(prometheus.NewRegistry())
	out := proxy.NewResult(m, nil, proxy.Outbound, netip.MustParseAddrPort("10.0.0.1:40000"), netip.MustParseAddrPort("10.0.1.1:15008"))
	out.Src = proxy.Peer{Workload: "client", Namespace: "demo", Identity: identity.MustNew("cluster.local", "demo", "sa-client")}
	out.Dst = proxy.Peer{Workload: "server", Namespace: "demo", Identity: identity.MustNew("cluster.local", "demo", "sa-server")}
	out.Service, out.MTLS, out.HBONEAddr = proxy.Service{Hostname: "echo.demo.svc.cluster.local"}, true, netip.MustParseAddrPort("10.0.1.1:8080")
	out.Opened()
	out.Counters.Sent.Store(1234)
	out.Counters.Received.Store(56)
	in := proxy.NewResult(m, nil, proxy.Inbound, netip.MustParseAddrPort("10.0.9.9:5000"), netip.MustParseAddrPort("10.0.0.1:8080"))
	in.Dst = proxy.Peer{Workload: "client", Namespace: "demo", Identity: identity.MustNew("cluster.local", "demo", "sa-client")}
	in.Opened()
	t.Cleanup(func() { out.Record(nil); in.Record(nil) })
	srv := httptest.NewServer(admin.AdminHandler(admin.Deps{Level: zap.NewAtomicLevel(), Gatherer: prometheus.NewRegistry(),
		Dump: &admin.Dumper{State: state.NewStore()}, Readiness: daemon.NewReadiness(),
		Connections: func() any { return m.Connections() }}))
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "http://"), m
}

func TestConnectionsLive(t *testing.T) {
	addr, m := connLab(t)
	norm := func(s string) map[string]bool {
		lines := map[string]bool{}
		for _, l := range strings.Split(s, "\n") {
			f := strings.Fields(l)
			if len(f) > 0 && !strings.HasPrefix(l, "#") {
				f = f[:len(f)-1] // AGE moves
			}
			lines[strings.Join(f, " ")] = true
		}
		return lines
	}
	for _, tc := range []struct {
		args []string
		want []string
		not  string
	}{
		{nil, []string{
			"# node proxy: admin http://" + addr + "/connections (2 open connections)",
			"DIRECTION SOURCE SOURCE IDENTITY DESTINATION DESTINATION IDENTITY SERVICE PROTOCOL SENT RECEIVED",
			"outbound demo/client 10.0.0.1:40000 spiffe://cluster.local/ns/demo/sa/sa-client demo/server 10.0.1.1:15008 (target 10.0.1.1:8080) " +
				"spiffe://cluster.local/ns/demo/sa/sa-server echo.demo.svc.cluster.local HBONE 1234 56",
			"inbound 10.0.9.9:5000 - demo/client 10.0.0.1:8080 spiffe://cluster.local/ns/demo/sa/sa-client - TCP 0 0",
		}, ""},
		{[]string{"--direction", "in"}, []string{"# node proxy: admin http://" + addr + "/connections (1 open connections)"}, "outbound"},
		{[]string{"--workload", "demo/server"}, []string{"# node proxy: admin http://" + addr + "/connections (1 open connections)"}, "inbound"},
		{[]string{"--workload", "10.0.9.9", "--direction", "inbound"}, []string{"# node proxy: admin http://" + addr + "/connections (1 open connections)"}, "outbound"},
		{[]string{"--workload", "client", "--direction", "out"}, []string{"# node proxy: admin http://" + addr + "/connections (1 open connections)"}, "inbound"},
		{[]string{"--workload", "nobody"}, []string{"# node proxy: admin http://" + addr + "/connections (0 open connections)"}, "demo/"},
	} {
		var out bytes.Buffer
		if err := run(append([]string{"connections", "--admin", addr}, tc.args...), &out, &out); err != nil {
			t.Fatalf("%q: %v\n%s", tc.args, err, out.String())
		}
		lines := norm(out.String())
		for _, w := range tc.want {
			if !lines[w] {
				t.Errorf("%q: no line %q in\n%s", tc.args, w, out.String())
			}
		}
		if tc.not != "" && strings.Contains(strings.SplitN(out.String(), "\n", 3)[2], tc.not) {
			t.Errorf("%q: filtered output still has %q:\n%s", tc.args, tc.not, out.String())
		}
	}

	// The mirror carries every field of proxy.Connection.
	var out bytes.Buffer
	if err := run([]string{"connections", "--admin", addr, "-o", "json"}, &out, &out); err != nil {
		t.Fatal(err)
	}
	var got connections
	if err := json.Unmarshal(out.Bytes(), &got); err != nil {
		t.Fatal(err)
	}
	srvJSON, _ := json.Marshal(map[string]any{"connections": m.Connections()})
	if got.Proxy != "admin http://"+addr+"/connections" {
		t.Errorf("json proxy %q", got.Proxy)
	}
	got.Proxy = ""
	mirrorJSON, _ := json.Marshal(got)
	var a, b any
	_ = json.Unmarshal(srvJSON, &a)
	_ = json.Unmarshal(mirrorJSON, &b)
	if !reflect.DeepEqual(a, b) {
		t.Errorf("mirror differs:\nproxy  %s\nmirror %s", srvJSON, mirrorJSON)
	}
	p := filepath.Join(t.TempDir(), "conns.json")
	if err := os.WriteFile(p, srvJSON, 0o644); err != nil {
		t.Fatal(err)
	}
	out.Reset()
	if err := run([]string{"connections", "-f", p, "-o", "yaml", "--direction", "out"}, &out, &out); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "proxy: file "+p) || strings.Count(out.String(), "direction:") != 1 {
		t.Errorf("yaml from file:\n%s", out.String())
	}
	if err := run([]string{"connections", "-f", p, "--direction", "sideways"}, &out, &out); err == nil {
		t.Error("bad --direction accepted")
	}
}
