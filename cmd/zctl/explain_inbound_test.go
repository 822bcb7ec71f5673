package main

import (
	"encoding/json"
	"testing"

	"github.com/ztunnel-go/ztunnel-go/internal/api/securityapi"
	"github.com/ztunnel-go/ztunnel-go/internal/api/workloadapi"
	"github.com/ztunnel-go/ztunnel-go/internal/node/admin"
	"github.com/ztunnel-go/ztunnel-go/internal/node/state"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/proxytest"
)

// TestExplainInbound: explain takes the destination's side from
// route.Inbound, the function its 15008 listener runs, so authorization is
// explained on what the listener dials. A pod with an application tunnel
// on 15088 is dialled there whatever port the client named, and a DENY on
// 15088 denies a connection to its port 80.
func TestExplainInbound(t *testing.T) {
	s := state.NewStore()
	tunnel := func(w *workloadapi.Workload) {
		w.ApplicationTunnel = &workloadapi.ApplicationTunnel{Protocol: workloadapi.ApplicationTunnel_PROXY, Port: 15088}
	}
	proxytest.Apply(t, s,
		proxytest.Pod("demo", "client", "10.0.0.1"),
		proxytest.Pod("demo", "tunnelled", "10.0.1.1", proxytest.OnNode("node1"), tunnel),
		proxytest.Pod("demo", "plain", "10.0.1.2", proxytest.OnNode("node1")),
	)
	proxytest.ApplyPolicies(t, s, proxytest.Policy("demo", "deny-tunnel-port", securityapi.Action_DENY,
		proxytest.Rule(proxytest.Ports(15088))))
	b, err := json.Marshal((&admin.Dumper{State: s}).Build())
	if err != nil {
		t.Fatal(err)
	}
	d, err := parseDump(b)
	if err != nil {
		t.Fatal(err)
	}
	first := func(int) int { return 0 }

	e, err := explain(d, "file dump.json", "demo/client", "10.0.1.1:80", nil, first)
	if err != nil {
		t.Fatal(err)
	}
	if in := stepOf(t, e, "inbound"); in.Result != "accepted: CONNECT 10.0.1.1:80, app at 10.0.1.1:15088" {
		t.Errorf("inbound step %+v", in)
	}
	if e.Verdict != verdictDeny || e.Policy != "demo/deny-tunnel-port" {
		t.Errorf("verdict %s by %q, want deny by demo/deny-tunnel-port (the app tunnel's port): %+v", e.Verdict, e.Policy, e.Steps)
	}

	e, err = explain(d, "file dump.json", "demo/client", "10.0.1.2:80", nil, first)
	if err != nil {
		t.Fatal(err)
	}
	if in := stepOf(t, e, "inbound"); in.Result != "accepted: CONNECT 10.0.1.2:80, app at 10.0.1.2:80" {
		t.Errorf("inbound step %+v", in)
	}
	if e.Verdict != verdictAllow {
		t.Errorf("verdict %s, want allow: %+v", e.Verdict, e.Steps)
	}
}
