package main

import (
	"net/netip"
	"os/exec"
	"testing"

	"github.com/ztunnel-go/ztunnel-go/internal/api/waypointapi"
	"github.com/ztunnel-go/ztunnel-go/internal/controlplane/ca"
	"github.com/ztunnel-go/ztunnel-go/proxy/waypoint"
)

// TestMeshResources: the bench mesh translates into the L7 work the
// figures claim: the server's Service bound to the waypoint on an HTTP
// port, one HTTPRoute rule with its header modifier, an ALLOW for the
// client's principal on POST /api/* and a DENY on /admin*, and workload
// API addresses for the three pods and the two Services. The waypoint
// package compiles it.
func TestMeshResources(t *testing.T) {
	addrs, _, wc, err := meshResources()
	if err != nil {
		t.Fatal(err)
	}
	if len(addrs) != 5 {
		t.Errorf("%d addresses, want 3 pods and 2 services: %v", len(addrs), addrs)
	}
	svc := wc.GetServices()[0]
	if svc.GetHostname() != svcHost || len(svc.GetAddresses()) != 1 || netip.AddrFrom4([4]byte(svc.GetAddresses()[0])) != netip.MustParseAddr(svcVIP) {
		t.Errorf("bound service %s at %v, want %s at %s", svc.GetHostname(), svc.GetAddresses(), svcHost, svcVIP)
	}
	if p := svc.GetPorts(); len(p) != 1 || p[0].GetPort() != 80 || p[0].GetProtocol() != waypointapi.Protocol_HTTP {
		t.Errorf("ports %v, want 80 as HTTP", p)
	}
	rules := svc.GetRoutes()[0].GetRules()
	if len(rules) != 1 || rules[0].GetMatches()[0].GetMethod() != "POST" || rules[0].GetRequestHeaderModifiers()[0].GetSet()["x-route"] != "server-api" {
		t.Errorf("route rules %v, want POST /api setting x-route", rules)
	}
	actions := map[string]waypointapi.Action{}
	for _, p := range wc.GetPolicies() {
		actions[p.GetName()] = p.GetAction()
	}
	if actions["allow-client-api"] != waypointapi.Action_ALLOW || actions["deny-admin"] != waypointapi.Action_DENY {
		t.Errorf("policies %v, want allow-client-api ALLOW and deny-admin DENY", actions)
	}
	if _, err := waypoint.Compile(wc); err != nil {
		t.Errorf("the waypoint does not compile the config: %v", err)
	}
}

// TestHAProxyConfig: the peer's configuration is one HAProxy accepts.
func TestHAProxyConfig(t *testing.T) {
	bin, err := exec.LookPath("haproxy")
	if err != nil {
		t.Skip("haproxy not installed (make deps)")
	}
	authority, err := ca.New(ca.Options{})
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := writeHAProxyConfig(authority, t.TempDir(), "127.0.0.1:15443")
	if err != nil {
		t.Fatal(err)
	}
	if err := checkHAProxyConfig(bin, cfg); err != nil {
		t.Fatal(err)
	}
}
