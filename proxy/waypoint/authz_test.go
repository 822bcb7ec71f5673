package waypoint

import (
	"net/netip"
	"testing"

	"github.com/ztunnel-go/ztunnel-go/internal/api/waypointapi"
)

func TestAuthorize(t *testing.T) {
	sm := func(kind int, v string) *waypointapi.StringMatch {
		switch kind {
		case 1:
			return &waypointapi.StringMatch{MatchType: &waypointapi.StringMatch_Prefix{Prefix: v}}
		case 2:
			return &waypointapi.StringMatch{MatchType: &waypointapi.StringMatch_Suffix{Suffix: v}}
		case 3:
			return &waypointapi.StringMatch{MatchType: &waypointapi.StringMatch_Presence{Presence: true}}
		}
		return &waypointapi.StringMatch{MatchType: &waypointapi.StringMatch_Exact{Exact: v}}
	}
	compile := func(ps ...*waypointapi.Policy) []*policy {
		var out []*policy
		for _, p := range ps {
			out = append(out, compilePolicy(p))
		}
		return out
	}
	httpReq := func(method, host, path string, hdr map[string]string) *Attrs {
		return &Attrs{
			Principal: "cluster.local/ns/demo/sa/client", Namespace: "demo",
			SrcIP: netip.MustParseAddr("10.0.0.5"), DstIP: netip.MustParseAddr("10.96.0.1"), DstPort: 80,
			Service: "server.demo.svc.cluster.local", HTTP: true, Host: host, Method: method, Path: path,
			Header: func(n string) (string, bool) { v, ok := hdr[n]; return v, ok },
		}
	}
	hostAllow := &waypointapi.Policy{Name: "hosts", Namespace: "demo", Rules: []*waypointapi.Rule{{
		From: []*waypointapi.Source{{RemoteIpBlocks: []*waypointapi.Cidr{{Address: []byte{10, 0, 0, 0}, Length: 24}}}},
		To:   []*waypointapi.Operation{{Hosts: []*waypointapi.StringMatch{sm(2, ".demo.svc.cluster.local")}, Ports: []uint32{80}}},
		When: []*waypointapi.Condition{{Key: "source.ip", Values: []*waypointapi.StringMatch{sm(0, "10.0.0.0/16")}}, {Key: "request.headers[x-a]", Values: []*waypointapi.StringMatch{sm(3, "")}}},
	}}}
	scoped := &waypointapi.Policy{Name: "scoped", Namespace: "demo", Action: waypointapi.Action_DENY, Services: []string{"other.demo.svc.cluster.local"}, Rules: []*waypointapi.Rule{{}}}
	audit := &waypointapi.Policy{Name: "audit", Namespace: "demo", Action: waypointapi.Action_AUDIT, Rules: []*waypointapi.Rule{{}}}
	for _, tc := range []struct {
		name   string
		pols   []*policy
		a      *Attrs
		allow  bool
		policy string
	}{
		{"no policy allows", nil, httpReq("GET", "x", "/", nil), true, ""},
		{"host suffix with port, cidr, presence", compile(hostAllow), httpReq("GET", "server.demo.svc.cluster.local:80", "/", map[string]string{"x-a": "1"}), true, "demo/hosts"},
		{"header missing", compile(hostAllow), httpReq("GET", "server.demo.svc.cluster.local", "/", nil), false, ""},
		{"wrong host", compile(hostAllow), httpReq("GET", "evil.example.com", "/", map[string]string{"x-a": "1"}), false, ""},
		{"DENY scoped to another service does not apply", compile(scoped), httpReq("GET", "x", "/", nil), true, ""},
		{"AUDIT never denies", compile(audit), httpReq("GET", "x", "/", nil), true, ""},
		{"DENY before ALLOW", compile(hostAllow, &waypointapi.Policy{Name: "d", Namespace: "demo", Action: waypointapi.Action_DENY,
			Rules: []*waypointapi.Rule{{To: []*waypointapi.Operation{{Methods: []*waypointapi.StringMatch{sm(0, "GET")}}}}}}),
			httpReq("GET", "server.demo.svc.cluster.local", "/", map[string]string{"x-a": "1"}), false, "demo/d"},
		{"TCP: HTTP field in a DENY matches (fail closed)", compile(&waypointapi.Policy{Name: "d", Namespace: "demo", Action: waypointapi.Action_DENY,
			Rules: []*waypointapi.Rule{{To: []*waypointapi.Operation{{Paths: []*waypointapi.StringMatch{sm(0, "/x")}}}}}}),
			&Attrs{Namespace: "demo", DstPort: 9000}, false, "demo/d"},
	} {
		v := authorize(tc.pols, tc.a)
		if v.Allow != tc.allow || v.Policy != tc.policy {
			t.Errorf("%s: %+v, want allow=%v policy=%q", tc.name, v, tc.allow, tc.policy)
		}
	}
	if v := authorize(compile(audit), httpReq("GET", "x", "/", nil)); len(v.DryRun) != 1 || v.DryRun[0] != "demo/audit=audit" {
		t.Errorf("audit dry-run record = %v", v.DryRun)
	}
}
